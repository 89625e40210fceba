"""The ``policy`` section: model, tokenizer, optimizer, scheduler, batching and generation keys."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gym_bridge.train.config.base import DOTTED_PATH, Section


class TokenizerConfig(Section):
    """Which tokenizer to use."""

    name: str | None = None
    """Tokenizer name or path; null uses ``policy.model_name``. Default null."""

    chat_template: str | None = None
    """Jinja chat template overriding the tokenizer's own; null keeps the tokenizer's. Default null."""


class OptimizerKwargs(Section):
    """Keyword arguments for the optimizer class (AdamW's); null values are not passed."""

    lr: float = Field(5.0e-6, gt=0.0)
    """Peak learning rate. Default 5e-6."""

    weight_decay: float = Field(0.01, ge=0.0)
    """Decoupled weight decay. Default 0.01."""

    betas: tuple[float, float] = (0.9, 0.999)
    """Adam's moment decay rates. Default [0.9, 0.999]."""

    eps: float = Field(1.0e-8, gt=0.0)
    """Adam's denominator epsilon. Default 1e-8."""

    foreach: bool | None = None
    """Use the multi-tensor implementation; null lets torch decide. Default null."""

    fused: bool | None = None
    """Use the fused implementation; null lets torch decide. Default null."""


class OptimizerConfig(Section):
    """The optimizer (NeMo RL's ``policy.optimizer``)."""

    name: str = "torch.optim.AdamW"
    """Dotted import path of the optimizer class. Default torch.optim.AdamW."""

    kwargs: OptimizerKwargs = Field(default_factory=OptimizerKwargs)
    """Arguments for the optimizer class."""

    @field_validator("name")
    @classmethod
    def _dotted(cls, value: str) -> str:
        if not DOTTED_PATH.fullmatch(value):
            raise ValueError(f"expects a dotted import path like 'torch.optim.AdamW', got {value!r}")
        return value


class SchedulerConfig(Section):
    """Learning-rate schedule over optimizer steps: linear warm-up, then constant, cosine or linear decay."""

    name: Literal["constant", "cosine", "linear"] = "constant"
    """Shape after warm-up. Default constant."""

    warmup_steps: int = Field(0, ge=0)
    """Optimizer steps of linear warm-up from ``warmup_start_factor * lr`` to ``lr``. Default 0."""

    warmup_start_factor: float = Field(0.1, gt=0.0, le=1.0)
    """Fraction of lr at the first warm-up step (NeMo RL's LinearLR start_factor). Default 0.1."""

    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    """Floor of the cosine / linear decay as a fraction of lr. Default 0."""

    total_steps: int | None = Field(None, ge=1)
    """Optimizer steps the decay spans; null means the run's total optimizer steps. Default null."""

    def lr_factor(self, step: int, total_steps: int | None = None) -> float:
        """Multiplier of the peak lr for optimizer step ``step`` (0-based); use with LambdaLR."""
        total = self.total_steps or total_steps or 1
        if self.warmup_steps and step < self.warmup_steps:
            return self.warmup_start_factor + (1.0 - self.warmup_start_factor) * step / self.warmup_steps
        if self.name == "constant":
            return 1.0
        progress = min(1.0, max(0.0, (step - self.warmup_steps) / max(1, total - self.warmup_steps)))
        floor = self.min_lr_ratio
        if self.name == "cosine":
            return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - (1.0 - floor) * progress


class DynamicBatchingConfig(Section):
    """Length-sorted micro-batches under a token budget instead of fixed-size ones (less padding)."""

    enabled: bool = False
    """Use token-budget micro-batches for training and log-prob passes. Default false."""

    train_mb_tokens: int | None = Field(None, ge=1)
    """Padded tokens per training micro-batch; null means max_total_sequence_length x
    train_micro_batch_size. Default null."""

    logprob_mb_tokens: int | None = Field(None, ge=1)
    """Padded tokens per log-prob micro-batch; null means max_total_sequence_length x
    logprob_batch_size. Default null."""

    sequence_length_round: int = Field(1, ge=1)
    """Pad each micro-batch's length up to a multiple of this (NeMo RL uses 64 on GPU). Default 1."""


class SequencePackingConfig(Section):
    """Pack several sequences into one row under a token budget (first-fit decreasing), each with its
    own position ids and attending only to itself (:mod:`gym_bridge.train.batches.packing`)."""

    enabled: bool = False
    """Pack sequences instead of padding them (same log-probs and gradients, less padding). Refused at
    start-up for a model whose attention would mix packed sequences. Default false."""

    train_mb_tokens: int | None = Field(None, ge=1)
    """Tokens per packed training micro-batch: rows of up to max_total_sequence_length tokens, each
    holding several sequences, as many rows as fit; null means max_total_sequence_length x
    train_micro_batch_size. Default null."""

    logprob_mb_tokens: int | None = Field(None, ge=1)
    """Tokens per packed log-prob micro-batch (as train_mb_tokens); null means
    max_total_sequence_length x logprob_batch_size. Default null."""

    algorithm: Literal["first_fit_decreasing"] = "first_fit_decreasing"
    """Bin-packing algorithm. Default first_fit_decreasing."""

    sequence_length_round: int = Field(1, ge=1)
    """Round each packed sequence's length up to a multiple of this. Default 1."""


class VllmConfig(Section):
    """vLLM engine settings, used only when ``policy.generation.backend`` is vllm (GPU only)."""

    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs one vLLM engine spans. Default 1."""

    gpu_memory_utilization: float = Field(0.6, gt=0.0, le=1.0)
    """Fraction of GPU memory vLLM may take. Default 0.6."""

    max_model_len: int | None = Field(None, ge=1)
    """Context length vLLM allocates for; null means policy.max_total_sequence_length. Default null."""

    enforce_eager: bool = False
    """Disable CUDA graphs (slower, less memory, easier debugging). Default false."""


class RayConfig(Section):
    """Ray generation replicas, used only when ``policy.generation.backend`` is ray (``[ray]`` extra).

    Replicas are CPU processes in a private Ray on 127.0.0.1, or on the Ray cluster at
    cluster.ray_address (one placement group, PACK: on as few nodes as fit); they reserve
    num_workers x threads_per_worker of Ray's logical CPUs and do not use
    cluster.gpus_per_node (that is for vllm). Weights are refit into every replica after each update.
    """

    num_workers: int = Field(2, ge=1)
    """Generation replicas (Ray actors), each with its own copy of the model. Default 2."""

    threads_per_worker: int = Field(1, ge=1)
    """Torch threads per replica. Default 1."""

    object_store_memory_mb: int = Field(200, ge=80)
    """Ray object store size in MB; it holds one copy of the weights during a refit. Default 200."""


class GenerationConfig(Section):
    """How completions are sampled (NeMo RL's ``policy.generation``)."""

    backend: Literal["transformers", "vllm", "ray"] = "transformers"
    """``transformers`` runs ``generate`` in-process (CPU or GPU); ``vllm`` needs a GPU; ``ray`` runs
    policy.generation.ray.num_workers CPU replicas in Ray actors. Default transformers."""

    max_new_tokens: int = Field(512, ge=1)
    """Most tokens generated per completion (per turn); generation also stops at
    policy.max_total_sequence_length. Default 512."""

    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature. The trainer's log-probs (policy, step start, reference) are those of the
    distribution sampled from, ``log_softmax(logits / temperature)``, as in NeMo RL and TRL, and the
    trainer's own generation backends report generation log-probs the same way (vLLM's
    ``processed_logprobs``). Offline rollouts: set it to the temperature they were sampled at.
    Default 1.0."""

    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass. Default 1.0."""

    top_k: int | None = Field(None, ge=1)
    """Sample only among the k most likely tokens; null disables. Default null."""

    stop_token_ids: list[int] | None = None
    """Extra token ids that end a completion, kept as its last token (the EOS token always does);
    every generation backend applies them. Default null."""

    stop_strings: list[str] | None = None
    """Strings that end a completion. Default null."""

    precision: Literal["float32", "bfloat16", "float16"] | None = None
    """gym-bridge: the dtype completions are generated in; null is policy.precision. ``bfloat16`` with
    a float32 policy samples from a bfloat16 copy of it (LoRA merged in), refreshed after every update:
    faster on CPUs with native bfloat16 matrix units (``amx_bf16`` in ``lscpu``'s flags), slower on
    others. The trainer's own log-probs stay float32. With vllm it is the engine's dtype. Default null."""

    vllm_cfg: VllmConfig = Field(default_factory=VllmConfig)
    """vLLM engine settings (vllm backend only)."""

    ray: RayConfig = Field(default_factory=RayConfig)
    """Ray replica settings (ray backend only)."""


class LoRAConfig(Section):
    """LoRA adapters trained with ``peft`` instead of every weight (NeMo RL's
    ``policy.dtensor_cfg.lora_cfg``, same keys and defaults). Only the adapters get gradients and
    optimizer state; the KL reference is the base model with the adapters switched off; generation
    sees the merged weights; checkpoints hold the adapter (``adapter_model.safetensors``)."""

    enabled: bool = False
    """Train LoRA adapters instead of the full model. Default false."""

    target_modules: list[str] = Field(default_factory=list)
    """Modules to adapt, each a module name (``q_proj`` matches every ``*.q_proj``), a full dotted
    name, or a wildcard pattern (``*.layers.0.*.q_proj``). Used when match_all_linear is false.
    Default []."""

    exclude_modules: list[str] = Field(default_factory=list)
    """With match_all_linear false and target_modules empty: adapt every linear layer except these
    (names or wildcard patterns as in target_modules). Default []."""

    match_all_linear: bool = True
    """Adapt every linear layer of the decoder; the output layer (``lm_head``) is left out, as in
    peft's ``all-linear`` (adapting it would untie tied embeddings). Needs target_modules and
    exclude_modules empty. Default true."""

    dim: int = Field(8, ge=1)
    """LoRA rank r. Default 8."""

    alpha: float = Field(32, gt=0)
    """LoRA scaling: the adapter's output is multiplied by alpha / dim. Default 32."""

    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout probability on the adapter path while training. Default 0."""

    dropout_position: Literal["pre", "post"] = "post"
    """``pre``: dropout on the adapter's input (peft's own); ``post``: on its output, as NeMo
    Automodel does. Default post."""

    lora_A_init: Literal["xavier", "uniform"] = "xavier"
    """Initialisation of the A matrices (B starts at zero, so the initial policy is the base model):
    ``xavier`` Glorot-uniform, ``uniform`` Kaiming-uniform as ``nn.Linear`` (peft's default). NeMo
    Automodel's ``xavier`` draws U(0, 1) instead; only the first steps' dynamics differ.
    Default xavier."""

    use_triton: bool = True
    """Accepted for NeMo RL recipes and ignored: it picks GPU kernels, not results; gym-bridge runs
    peft's plain PyTorch LoRA. Default true."""

    @model_validator(mode="after")
    def _one_way_to_choose(self) -> LoRAConfig:
        if self.match_all_linear and (self.target_modules or self.exclude_modules):
            raise ValueError(
                "match_all_linear adapts every linear layer: set it to false to use target_modules or "
                "exclude_modules"
            )
        if self.target_modules and self.exclude_modules:
            raise ValueError("target_modules and exclude_modules are exclusive (as in NeMo RL): set one")
        if self.enabled and not (self.match_all_linear or self.target_modules or self.exclude_modules):
            raise ValueError("nothing to adapt: set match_all_linear, target_modules or exclude_modules")
        return self


class DTensorConfig(Section):
    """NeMo RL's ``policy.dtensor_cfg``: here its LoRA and activation checkpointing settings.
    gym-bridge has one training path (plain PyTorch on one device), so the sharding keys have no
    counterpart."""

    enabled: bool = True
    """NeMo RL's switch between its DTensor and Megatron paths; gym-bridge's one path counts as the
    DTensor one, so only true is accepted. Default true."""

    lora_cfg: LoRAConfig = Field(default_factory=LoRAConfig)
    """LoRA settings."""

    activation_checkpointing: bool = False
    """Keep only each decoder layer's input during training passes and recompute the layer in the
    backward pass (transformers' activation checkpointing): less activation memory for about one
    more forward pass of compute. Training passes then run each prompt per row (the shared-prompt
    pass needs the KV cache, which checkpointed layers do not keep). Default false."""

    @field_validator("enabled")
    @classmethod
    def _only_path(cls, value: bool) -> bool:
        if not value:
            raise ValueError("gym-bridge has no Megatron path: leave policy.dtensor_cfg.enabled true")
        return value


class PolicyConfig(Section):
    """The trained model and how it is optimised (NeMo RL's ``policy:`` section)."""

    model_name: str = "tiny"
    """Built-in model name (e.g. tiny, smollm2-135m), local directory, or Hugging Face id. Default tiny."""

    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    """Tokenizer settings."""

    train_global_batch_size: int = Field(512, ge=1)
    """Samples per optimizer step; P x G must be a multiple of it (several optimizer steps per GRPO
    step otherwise one). Default 512."""

    train_micro_batch_size: int = Field(4, ge=1)
    """Samples per forward/backward pass; gradients accumulate up to train_global_batch_size. Default 4."""

    generation_batch_size: int = Field(32, ge=1)
    """Sequences per ``generate`` call with the transformers backend. Default 32."""

    logprob_batch_size: int = Field(4, ge=1)
    """Samples per forward pass when computing previous / reference log-probs. Default 4."""

    logprob_chunk_size: int | None = Field(None, ge=1)
    """Token positions projected through the output layer at a time when taking log-probs (NeMo RL's
    key): at most (chunk, vocabulary) logits exist at once instead of (trained tokens of the
    micro-batch, vocabulary); in training passes each chunk's logits are recomputed in the backward
    pass rather than kept (one more output-layer matmul). Same log-probs and gradients up to float
    rounding. Models with soft-capped or scaled logits are not chunked. Default null (one chunk)."""

    max_total_sequence_length: int = Field(512, ge=2)
    """Most tokens of prompt plus completion. Default 512."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """gym-bridge: where the policy, its KL reference, the optimizer state and every micro-batch live.
    ``auto`` is ``cuda`` when cluster.gpus_per_node > 0 and ``cpu`` otherwise; ``cuda`` is the first
    visible GPU (choose it with CUDA_VISIBLE_DEVICES). Refused at start-up when CUDA is asked for and
    torch cannot use it. Default auto."""

    precision: Literal["float32", "bfloat16", "float16"] = "float32"
    """Training precision on either device. ``bfloat16``: bf16 weights and compute (slow on CPUs without
    native bf16). ``float16``: float32 master weights, float16 autocast forward passes and a loss scaler
    (steps with overflowing gradients are skipped and counted as ``amp_skipped_steps``); it runs on
    the CPU but several times slower than float32 there. Default float32."""

    max_grad_norm: float | None = Field(1.0, gt=0.0)
    """Clip the global gradient norm to this; null disables. Default 1.0."""

    freeze_embeddings: bool = False
    """gym-bridge: keep the token embeddings and the output layer (one matrix when they are tied, as in
    SmolLM2) fixed in full fine-tuning; only the decoder layers and norms train. Adam moves every
    trainable weight by about the learning rate a step however small its gradient, so each step shifts
    all ~49k rows of a large vocabulary's output layer by noise; freezing them keeps the model's token
    distribution stable on small batches and saves their gradients and optimizer state. With LoRA they
    are frozen anyway. Default false."""

    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    """Optimizer class and arguments."""

    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    """Learning-rate schedule."""

    dynamic_batching: DynamicBatchingConfig = Field(default_factory=DynamicBatchingConfig)
    """Token-budget micro-batches."""

    sequence_packing: SequencePackingConfig = Field(default_factory=SequencePackingConfig)
    """Sequence packing."""

    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    """Sampling settings."""

    dtensor_cfg: DTensorConfig = Field(default_factory=DTensorConfig)
    """NeMo RL's training-backend section; here it holds LoRA (``dtensor_cfg.lora_cfg``)."""

    share_prompt_prefix: bool = True
    """gym-bridge: run each distinct prompt once per micro-batch in the trainer's forward passes and
    fan its KV cache out to its G completions (same log-probs and gradients as the plain pass, up to
    float rounding; about 2x faster training on short-answer tasks). Micro-batches then keep a
    prompt's rows together. Applies with fixed-size micro-batches on decoders with a plain KV cache;
    dynamic batching and sequence packing use the plain pass. Default true."""

    @property
    def train_mb_tokens(self) -> int:
        """Token budget of a training micro-batch (explicit, or length x micro-batch size)."""
        explicit = self.sequence_packing.train_mb_tokens if self.sequence_packing.enabled else None
        explicit = explicit or self.dynamic_batching.train_mb_tokens
        return explicit or self.max_total_sequence_length * self.train_micro_batch_size

    @property
    def logprob_mb_tokens(self) -> int:
        """Token budget of a log-prob micro-batch (explicit, or length x log-prob batch size)."""
        explicit = self.sequence_packing.logprob_mb_tokens if self.sequence_packing.enabled else None
        explicit = explicit or self.dynamic_batching.logprob_mb_tokens
        return explicit or self.max_total_sequence_length * self.logprob_batch_size

