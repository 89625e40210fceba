"""The GRPO run configuration: NeMo RL's key names and layout, typed and checked at start-up.

A NeMo RL user should feel at home: the sections (``grpo``, ``loss_fn``, ``policy``, ``data``,
``env``, ``checkpointing``, ``logger``, ``cluster``) and their keys follow NeMo RL's
``examples/configs/grpo_math_1B.yaml``. Defaults follow that file for the algorithm's knobs and
are CPU-sized where it matters (``float32``, the ``transformers`` generation backend).

Every field is documented with an attribute docstring (read them with
``Model.model_fields[name].description``). Unknown keys and wrong types fail in
:func:`load_config` with a message naming the full key path.

YAML extras, as in NeMo RL:

- ``defaults: base.yaml`` (or a list) inherits from other files, relative to the including file;
  mappings merge key by key, and a mapping holding ``_override_: true`` replaces instead.
- ``${dotted.key}`` refers to another value (e.g. ``tokenizer.name: ${policy.model_name}``).
- Overrides ``a.b.c=value`` on the command line; values are YAML scalars or lists
  (``=1e-4``, ``=true``, ``=null``, ``=[1,2]``); ``data.train.0.data_path=...`` indexes lists.
"""

from __future__ import annotations

import difflib
import math
import re
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

__all__ = [
    "CheckpointingConfig",
    "ClippedPGLossConfig",
    "ClusterConfig",
    "ConfigError",
    "DataConfig",
    "DatasetConfig",
    "DynamicBatchingConfig",
    "EnvConfig",
    "GRPOConfig",
    "GenerationConfig",
    "LoggerConfig",
    "MasterConfig",
    "OptimizerConfig",
    "OptimizerKwargs",
    "PolicyConfig",
    "RayConfig",
    "SchedulerConfig",
    "SequencePackingConfig",
    "TokenizerConfig",
    "VllmConfig",
    "WandbConfig",
    "config_to_dict",
    "config_to_yaml",
    "load_config",
    "validate_config",
]


class ConfigError(ValueError):
    """A configuration that cannot run; ``problems`` holds one message per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid config:\n  " + "\n  ".join(problems))


class _Section(BaseModel):
    """Base for every section: unknown keys are errors, attribute docstrings are field docs."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


# ----------------------------------------------------------------------------------------------
# grpo
# ----------------------------------------------------------------------------------------------


class AsyncGRPOConfig(_Section):
    """Overlap rollouts with training (NeMo RL's ``grpo.async_grpo``): step s+1's completions are
    sampled while step s trains, from a copy of the policy refit after every step."""

    enabled: bool = False
    """Sample the next steps' rollouts while the current one trains. Pair it with
    ``loss_fn.use_importance_sampling_correction: true``. Default false."""

    rollout_process: bool = True
    """gym-bridge: sample in a child process (a policy copy, the policy server, the built-in
    environments and the agent loop), so sampling and training use separate cores instead of sharing
    one interpreter. false keeps everything in the trainer's process. Default true."""

    max_trajectory_age_steps: int = Field(1, ge=1)
    """Step s trains on completions sampled by the policy of step s-1-age (exactly that one, so a
    seeded run is reproducible); this many steps' rollouts run ahead of training. Default 1."""


class GRPOConfig(_Section):
    """Algorithm settings (NeMo RL's ``grpo:`` section)."""

    mode: Literal["online", "offline"] = "online"
    """``online``: each step samples ``num_generations_per_prompt`` completions per prompt from the
    current policy and scores them in ``env``. ``offline``: no generation; scored rollouts come from
    ``data.train`` (ResponseDataset JSONL with input, output and reward keys), grouped by input."""

    num_prompts_per_step: int = Field(32, ge=1)
    """Distinct prompts per step (P). Default 32."""

    num_generations_per_prompt: int = Field(16, ge=1)
    """Completions sampled per prompt (G, the group size); a step trains on P x G samples. Default 16."""

    max_num_steps: int = Field(1_000_000, ge=1)
    """Stop after this many steps. Default 1000000."""

    max_num_epochs: int = Field(1, ge=1)
    """Stop after this many passes over the training prompts. Default 1."""

    max_rollout_turns: int = Field(1, ge=1)
    """Model turns per rollout in multi-turn environments (1 for single-answer tasks). Default 1."""

    normalize_rewards: bool = True
    """Divide advantages by the group's reward std (groups with zero std are left unscaled). Default true."""

    use_leave_one_out_baseline: bool = True
    """Baseline each sample by the mean reward of the *other* samples of its prompt (RLOO) instead of
    the group mean. Default true."""

    advantage_clip_low: float | None = None
    """Lower bound for advantages after normalisation; null disables. Default null."""

    advantage_clip_high: float | None = None
    """Upper bound for advantages after normalisation; null disables. Default null."""

    val_period: int = Field(10, ge=0)
    """Validate every this many steps; 0 disables periodic validation. Default 10."""

    val_at_start: bool = False
    """Validate once before the first step. Default false."""

    val_at_end: bool = False
    """Validate after the last step. Default false."""

    max_val_samples: int | None = Field(256, ge=1)
    """At most this many validation prompts per validation; null uses all. Default 256."""

    val_batch_size: int | None = Field(256, ge=1)
    """Validation prompts generated per batch; null means all at once. Default 256."""

    seed: int = 42
    """Seed for python, torch and the data order. Default 42."""

    overlong_filtering: bool = False
    """Drop from the loss samples that hit the length limit without finishing (truncated). Default false."""

    use_dynamic_sampling: bool = False
    """DAPO dynamic sampling: discard prompt groups whose rewards are all equal and keep generating
    until P informative groups are collected. Default false."""

    dynamic_sampling_max_gen_batches: int = Field(10, ge=1)
    """With dynamic sampling, give up after generating this many batches in one step. Default 10."""

    batch_multiplier: float = Field(1.0, ge=1.0)
    """With dynamic sampling, generate ``num_prompts_per_step * batch_multiplier`` prompts per batch. Default 1."""

    async_grpo: AsyncGRPOConfig = Field(default_factory=AsyncGRPOConfig)
    """Asynchronous GRPO (rollouts overlap training)."""

    @model_validator(mode="after")
    def _clip_bounds_ordered(self) -> GRPOConfig:
        lo, hi = self.advantage_clip_low, self.advantage_clip_high
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(
                f"grpo.advantage_clip_low ({lo}) must not exceed grpo.advantage_clip_high ({hi})"
            )
        return self


# ----------------------------------------------------------------------------------------------
# loss_fn
# ----------------------------------------------------------------------------------------------


class ClippedPGLossConfig(_Section):
    """Clipped policy-gradient loss with reference KL (NeMo RL's ``loss_fn:`` section)."""

    reference_policy_kl_penalty: float = Field(0.01, ge=0.0)
    """KL penalty coefficient beta against the reference (initial) policy; 0 disables the KL term and
    the reference forward pass. Default 0.01."""

    reference_policy_kl_type: Literal["k1", "k2", "k3"] = "k3"
    """Schulman's KL estimator: k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r, with
    r = pi_ref / pi. Default k3."""

    kl_input_clamp_value: float | None = Field(20.0, gt=0.0)
    """Clamp log r to [-v, v] before the KL estimator; null disables. Default 20."""

    kl_output_clamp_value: float | None = Field(10.0, gt=0.0)
    """Clamp the per-token KL estimate to [-v, v]; null disables. Default 10."""

    ratio_clip_min: float = Field(0.2, ge=0.0)
    """Lower PPO clip: the ratio is clipped at 1 - ratio_clip_min. Default 0.2."""

    ratio_clip_max: float = Field(0.2, ge=0.0)
    """Upper PPO clip: the ratio is clipped at 1 + ratio_clip_max (DAPO's clip-higher sets it above
    ratio_clip_min). Default 0.2."""

    ratio_clip_c: float | None = Field(None, gt=1.0)
    """Dual-clip constant c > 1 (Ye et al. 2019): for negative advantages the loss is capped at
    -c * A; null disables. Default null."""

    use_on_policy_kl_approximation: bool = False
    """Weight the KL term by pi / pi_gen so the estimate is unbiased for the current policy. Default false."""

    use_importance_sampling_correction: bool = False
    """Weight the actor term by pi_prev / pi_gen to correct for generation/training mismatch. Default false."""

    truncated_importance_sampling_ratio: float | None = Field(None, gt=0.0)
    """Cap the importance weights at this value (TIS); needs use_importance_sampling_correction.
    Default null."""

    token_level_loss: bool = True
    """true: mean over all valid tokens of the global batch; false: mean over tokens per sequence,
    then mean over sequences. Default true."""

    @model_validator(mode="after")
    def _tis_needs_is(self) -> ClippedPGLossConfig:
        if (
            self.truncated_importance_sampling_ratio is not None
            and not self.use_importance_sampling_correction
        ):
            raise ValueError(
                "loss_fn.truncated_importance_sampling_ratio needs "
                "loss_fn.use_importance_sampling_correction=true"
            )
        return self


# ----------------------------------------------------------------------------------------------
# policy
# ----------------------------------------------------------------------------------------------


class TokenizerConfig(_Section):
    """Which tokenizer to use."""

    name: str | None = None
    """Tokenizer name or path; null uses ``policy.model_name``. Default null."""

    chat_template: str | None = None
    """Jinja chat template overriding the tokenizer's own; null keeps the tokenizer's. Default null."""


class OptimizerKwargs(_Section):
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


class OptimizerConfig(_Section):
    """The optimizer (NeMo RL's ``policy.optimizer``)."""

    name: str = "torch.optim.AdamW"
    """Dotted import path of the optimizer class. Default torch.optim.AdamW."""

    kwargs: OptimizerKwargs = Field(default_factory=OptimizerKwargs)
    """Arguments for the optimizer class."""

    @field_validator("name")
    @classmethod
    def _dotted(cls, value: str) -> str:
        if not _DOTTED_PATH.fullmatch(value):
            raise ValueError(f"expects a dotted import path like 'torch.optim.AdamW', got {value!r}")
        return value


class SchedulerConfig(_Section):
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


class DynamicBatchingConfig(_Section):
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


class SequencePackingConfig(_Section):
    """Pack several sequences into one row under a token budget (first-fit decreasing), each with its
    own position ids and attending only to itself (:mod:`gym_bridge.train.packing`)."""

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


class VllmConfig(_Section):
    """vLLM engine settings, used only when ``policy.generation.backend`` is vllm (GPU only)."""

    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs one vLLM engine spans. Default 1."""

    gpu_memory_utilization: float = Field(0.6, gt=0.0, le=1.0)
    """Fraction of GPU memory vLLM may take. Default 0.6."""

    max_model_len: int | None = Field(None, ge=1)
    """Context length vLLM allocates for; null means policy.max_total_sequence_length. Default null."""

    enforce_eager: bool = False
    """Disable CUDA graphs (slower, less memory, easier debugging). Default false."""


class RayConfig(_Section):
    """Ray generation replicas, used only when ``policy.generation.backend`` is ray (``[ray]`` extra).

    Replicas are CPU processes on this one node (cluster.num_nodes is 1) in a private Ray on
    127.0.0.1; they reserve num_workers x threads_per_worker of Ray's logical CPUs and do not use
    cluster.gpus_per_node (that is for vllm). Weights are refit into every replica after each update.
    """

    num_workers: int = Field(2, ge=1)
    """Generation replicas (Ray actors), each with its own copy of the model. Default 2."""

    threads_per_worker: int = Field(1, ge=1)
    """Torch threads per replica. Default 1."""

    object_store_memory_mb: int = Field(200, ge=80)
    """Ray object store size in MB; it holds one copy of the weights during a refit. Default 200."""


class GenerationConfig(_Section):
    """How completions are sampled (NeMo RL's ``policy.generation``)."""

    backend: Literal["transformers", "vllm", "ray"] = "transformers"
    """``transformers`` runs ``generate`` in-process (CPU or GPU); ``vllm`` needs a GPU; ``ray`` runs
    policy.generation.ray.num_workers CPU replicas in Ray actors. Default transformers."""

    max_new_tokens: int = Field(512, ge=1)
    """Most tokens generated per completion (per turn); generation also stops at
    policy.max_total_sequence_length. Default 512."""

    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature; GRPO wants 1.0 so that log-probs match the sampler. Default 1.0."""

    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass. Default 1.0."""

    top_k: int | None = Field(None, ge=1)
    """Sample only among the k most likely tokens; null disables. Default null."""

    stop_token_ids: list[int] | None = None
    """Extra token ids that end a completion, kept as its last token (the EOS token always does);
    every generation backend applies them. Default null."""

    stop_strings: list[str] | None = None
    """Strings that end a completion. Default null."""

    vllm_cfg: VllmConfig = Field(default_factory=VllmConfig)
    """vLLM engine settings (vllm backend only)."""

    ray: RayConfig = Field(default_factory=RayConfig)
    """Ray replica settings (ray backend only)."""


class PolicyConfig(_Section):
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

    max_total_sequence_length: int = Field(512, ge=2)
    """Most tokens of prompt plus completion. Default 512."""

    precision: Literal["float32", "bfloat16", "float16"] = "float32"
    """Training dtype; bfloat16 is much slower on CPUs without native bf16. Default float32."""

    max_grad_norm: float | None = Field(1.0, gt=0.0)
    """Clip the global gradient norm to this; null disables. Default 1.0."""

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


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------


class DatasetConfig(_Section):
    """One dataset. Keys left out inherit from ``data.default``, then from the defaults below."""

    dataset_name: str = "ResponseDataset"
    """Dataset kind, as in NeMo RL: ResponseDataset (input_key / output_key rows), OpenMathInstruct-2
    (problem / expected_answer), DeepScaler (problem / answer). Rows that already are NeMo Gym task
    rows (``responses_create_params``) pass through whatever the kind. Default ResponseDataset."""

    data_path: str | None = None
    """Path of the JSONL file (relative paths are relative to the working directory). Default null."""

    input_key: str = "input"
    """Record key holding the prompt. Default input."""

    output_key: str = "output"
    """Record key holding the reference answer (online, sent as expected_answer) or the response
    (offline). Default output."""

    reward_key: str = "reward"
    """Record key holding the reward (offline mode). Default reward."""

    split_validation_size: float = Field(0.0, ge=0.0, lt=1.0)
    """Fraction of this training set held out for validation. Default 0."""

    seed: int = 42
    """Seed of the train/validation split. Default 42."""

    prompt_file: str | None = None
    """Text file with a ``{}`` placeholder the input is formatted into. Default null."""

    system_prompt_file: str | None = None
    """Text file with a system prompt. Default null."""

    env_name: str | None = None
    """Which ``env`` entry scores this dataset's rollouts (online mode). Default null."""

    task_name: str | None = None
    """Task label attached to each record; null means env_name. Default null."""

    @model_serializer(mode="wrap")
    def _only_set_keys(self, handler: Any) -> dict[str, Any]:
        # Unset keys inherit from data.default, so saving them would change what a reload means.
        return {key: value for key, value in handler(self).items() if key in self.model_fields_set}


class DataConfig(_Section):
    """Prompts and datasets (NeMo RL's ``data:`` section)."""

    max_input_seq_length: int | None = Field(None, ge=1)
    """Prompts longer than this (in tokens) are dropped; null means policy.max_total_sequence_length.
    Default null."""

    shuffle: bool = True
    """Shuffle training prompts each epoch. Default true."""

    train: list[DatasetConfig] | None = None
    """Training dataset(s): one mapping or a list of them. Default null."""

    validation: list[DatasetConfig] | None = None
    """Validation dataset(s): one mapping, a list, or null. Default null."""

    default: DatasetConfig = Field(default_factory=DatasetConfig)
    """Values every train/validation dataset inherits for keys it does not set."""

    use_multiple_dataloader: bool = False
    """One dataloader per training dataset, each giving num_prompts_per_dataloader prompts per step.
    Default false."""

    num_prompts_per_dataloader: int | None = Field(None, ge=1)
    """Prompts each dataloader contributes per step (with use_multiple_dataloader). Default null."""

    custom_dataloader: str | None = None
    """Dotted import path of a function choosing prompts from several dataloaders. Default null."""

    @field_validator("train", "validation", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @field_validator("custom_dataloader")
    @classmethod
    def _dotted(cls, value: str | None) -> str | None:
        if value is not None and not _DOTTED_PATH.fullmatch(value):
            raise ValueError(f"expects a dotted import path like 'pkg.module.function', got {value!r}")
        return value

    def resolved(self, which: Literal["train", "validation"]) -> list[DatasetConfig]:
        """The ``train`` or ``validation`` datasets with ``data.default`` merged in, task_name filled."""
        base = self.default.model_dump(exclude_unset=True)
        out = []
        for dataset in getattr(self, which) or []:
            merged = DatasetConfig(**{**base, **dataset.model_dump(exclude_unset=True)})
            if merged.task_name is None:
                merged.task_name = merged.env_name
            out.append(merged)
        return out


# ----------------------------------------------------------------------------------------------
# env, checkpointing, logger, cluster
# ----------------------------------------------------------------------------------------------


class EnvConfig(_Section):
    """One scoring environment: a built-in resources server or the URL of a running one."""

    server: str | None = None
    """Built-in resources server to start (e.g. math); null with no url means the env's own name.
    Default null."""

    url: str | None = None
    """Base URL of a running NeMo Gym-compatible resources server; the trainer then starts nothing.
    Default null."""

    max_steps: int | None = Field(None, ge=1)
    """Most agent steps (model calls) per rollout; null means grpo.max_rollout_turns. Default null."""

    num_workers: int | None = Field(None, ge=1)
    """Worker pool of the built-in server (math: verifier processes; code: sandboxes at once); refused
    for a url or a server without a pool. Null keeps the server's own (one per CPU core). Default null."""

    timeout_s: float = Field(60.0, gt=0.0)
    """Seconds one attempt of a request to this environment (session set-up, tool call, /verify) may
    take; three attempts, then the rollout fails. Default 60."""

    config: dict[str, Any] = Field(default_factory=dict)
    """Settings passed to the built-in server. Default {}."""

    @model_validator(mode="after")
    def _one_source(self) -> EnvConfig:
        if self.server is not None and self.url is not None:
            raise ValueError("set either server or url, not both")
        return self


class CheckpointingConfig(_Section):
    """When and where checkpoints are written."""

    enabled: bool = True
    """Write checkpoints. Default true."""

    checkpoint_dir: str = "results/grpo"
    """Directory of ``step_<n>`` checkpoints; a run resumes from the latest one. Default results/grpo."""

    save_period: int = Field(10, ge=1)
    """Save every this many steps (and at the end). Default 10."""

    keep_top_k: int | None = Field(3, ge=1)
    """Keep the k best checkpoints by metric_name (the latest is always kept); null keeps all. Default 3."""

    metric_name: str | None = "val:accuracy"
    """Metric ranking checkpoints, ``val:<name>`` or ``train:<name>``; null ranks by recency.
    Default val:accuracy."""

    higher_is_better: bool = True
    """Whether a larger metric_name is better. Default true."""

    @field_validator("metric_name")
    @classmethod
    def _prefixed(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"(val|train):\S+", value):
            raise ValueError(f"expects 'val:<metric>' or 'train:<metric>', got {value!r}")
        return value


class WandbConfig(_Section):
    """Weights & Biases run naming."""

    project: str = "grpo-dev"
    """W&B project. Default grpo-dev."""

    name: str = "grpo-dev-logger"
    """W&B run name. Default grpo-dev-logger."""


class LoggerConfig(_Section):
    """Where metrics go."""

    log_dir: str = "logs"
    """Directory for logs and metrics. Default logs."""

    tensorboard_enabled: bool = False
    """Write TensorBoard event files under log_dir. Default false."""

    wandb_enabled: bool = False
    """Log every record to Weights & Biases (the ``[wandb]`` extra; refused at start-up without it;
    ``WANDB_MODE=offline`` needs no network). Default false."""

    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """W&B settings."""

    monitor_gpus: bool = False
    """Add each GPU's utilisation and memory to every train record (NVML, the ``[gpu]`` extra);
    refused at start-up where no NVIDIA GPU is visible. Default false."""

    num_val_samples_to_print: int = Field(0, ge=0)
    """Validation samples printed to the terminal after each validation. Default 0."""

    print_every_steps: int = Field(1, ge=1)
    """Print a metrics line every this many steps. Default 1."""


class ClusterConfig(_Section):
    """Hardware. gym-bridge runs on one node; GPUs are optional."""

    gpus_per_node: int = Field(0, ge=0)
    """GPUs for the vllm generation backend (refused at start-up when torch sees fewer); 0 runs on CPU.
    Default 0."""

    num_nodes: Literal[1] = 1
    """Nodes; only 1 is supported. Default 1."""


# ----------------------------------------------------------------------------------------------
# the whole config
# ----------------------------------------------------------------------------------------------


class MasterConfig(_Section):
    """A whole GRPO run. Construct directly, or with :func:`load_config` from YAML."""

    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    """Algorithm settings."""

    loss_fn: ClippedPGLossConfig = Field(default_factory=ClippedPGLossConfig)
    """Loss settings."""

    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """Model, optimizer and generation settings."""

    data: DataConfig = Field(default_factory=DataConfig)
    """Datasets."""

    env: dict[str, EnvConfig] = Field(default_factory=dict)
    """Scoring environments by name; datasets pick one with env_name."""

    checkpointing: CheckpointingConfig = Field(default_factory=CheckpointingConfig)
    """Checkpoint settings."""

    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    """Logging settings."""

    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """Hardware settings."""

    @model_validator(mode="after")
    def _consistent(self) -> MasterConfig:
        problems = _cross_section_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        # Resolve "null means <other key>" defaults so the saved config is explicit.
        if self.policy.tokenizer.name is None:
            self.policy.tokenizer.name = self.policy.model_name
        if self.data.max_input_seq_length is None:
            self.data.max_input_seq_length = self.policy.max_total_sequence_length
        for name, env in self.env.items():
            if env.server is None and env.url is None:
                env.server = name
        return self


def _cross_section_problems(cfg: MasterConfig) -> list[str]:
    grpo, policy = cfg.grpo, cfg.policy
    problems = []
    samples = grpo.num_prompts_per_step * grpo.num_generations_per_prompt
    if grpo.mode == "online" and samples % policy.train_global_batch_size:
        problems.append(
            f"grpo.num_prompts_per_step x grpo.num_generations_per_prompt ({samples}) must be a multiple "
            f"of policy.train_global_batch_size ({policy.train_global_batch_size})"
        )
    packed = policy.dynamic_batching.enabled or policy.sequence_packing.enabled
    if not packed and policy.train_global_batch_size % policy.train_micro_batch_size:
        problems.append(
            f"policy.train_global_batch_size ({policy.train_global_batch_size}) must be a multiple of "
            f"policy.train_micro_batch_size ({policy.train_micro_batch_size})"
        )
    if policy.dynamic_batching.enabled and policy.sequence_packing.enabled:
        problems.append("policy.dynamic_batching.enabled and policy.sequence_packing.enabled are exclusive")
    if policy.generation.max_new_tokens > policy.max_total_sequence_length:
        problems.append(
            f"policy.generation.max_new_tokens ({policy.generation.max_new_tokens}) must not exceed "
            f"policy.max_total_sequence_length ({policy.max_total_sequence_length})"
        )
    if policy.generation.backend == "vllm" and cfg.cluster.gpus_per_node < 1:
        problems.append("policy.generation.backend 'vllm' needs a GPU: set cluster.gpus_per_node >= 1")
    for name, env in cfg.env.items():
        if env.url is not None and env.num_workers is not None:
            problems.append(
                f"env.{name}.num_workers sizes a built-in server's worker pool; the server at "
                f"env.{name}.url runs its own"
            )
    if grpo.async_grpo.enabled and grpo.mode != "online":
        problems.append("grpo.async_grpo.enabled needs grpo.mode 'online' (offline steps generate nothing)")
    if cfg.data.use_multiple_dataloader:
        per = cfg.data.num_prompts_per_dataloader
        if per is None:
            problems.append("data.use_multiple_dataloader needs data.num_prompts_per_dataloader")
        elif grpo.num_prompts_per_step % per:
            problems.append(
                f"grpo.num_prompts_per_step ({grpo.num_prompts_per_step}) must be a multiple of "
                f"data.num_prompts_per_dataloader ({per})"
            )
    for which in ("train", "validation"):
        for i, dataset in enumerate(cfg.data.resolved(which)):
            where = f"data.{which}[{i}]"
            known = ", ".join(sorted(cfg.env)) or "none configured"
            scored_online = grpo.mode == "online" or which == "validation"
            if scored_online and dataset.env_name is None:
                problems.append(
                    f"{where}.env_name is not set (set it or data.default.env_name; envs: {known})"
                )
            elif scored_online and dataset.env_name not in cfg.env:
                problems.append(f"{where}.env_name {dataset.env_name!r} is not an env entry (envs: {known})")
            if grpo.mode == "offline" and which == "train" and dataset.data_path is None:
                problems.append(f"{where}.data_path is required in offline mode (scored rollouts JSONL)")
    return problems


# ----------------------------------------------------------------------------------------------
# YAML loading, overrides, interpolation and error messages
# ----------------------------------------------------------------------------------------------

_DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-8`` as a float (YAML 1.1 wants ``1.0e-8``)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _read_yaml(text: str, origin: str) -> Any:
    try:
        return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError([f"{origin}: not valid YAML: {exc}"]) from exc


def _merge(base: Any, over: Any) -> Any:
    """Merge ``over`` into ``base``: mappings key by key (unless ``_override_: true``), else replace."""
    if not isinstance(base, dict) or not isinstance(over, dict):
        return over
    if over.get("_override_") is True:
        return {k: v for k, v in over.items() if k != "_override_"}
    merged = dict(base)
    for key, value in over.items():
        merged[key] = _merge(base.get(key), value) if key in base else _strip_markers(value)
    return merged


def _strip_markers(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_markers(v) for k, v in value.items() if k != "_override_"}
    return value


def _load_tree(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in chain:
        raise ConfigError([f"{path}: circular 'defaults' chain: {' -> '.join(map(str, chain + (path,)))}"])
    if not path.is_file():
        raise ConfigError([f"config file not found: {path}"])
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError([f"{path}: not UTF-8 text ({err.reason} at byte {err.start})"]) from None
    tree = _read_yaml(text, str(path))
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise ConfigError([f"{path}: the top level must be a mapping of sections"])
    parents = tree.pop("defaults", None)
    if parents is None:
        return _strip_markers(tree)
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise ConfigError([f"{path}: 'defaults' expects a file name or a list of file names"])
    base: dict[str, Any] = {}
    for parent in parents:
        base = _merge(base, _load_tree(path.parent / parent, chain + (path,)))
    return _merge(base, tree)


def _apply_override(tree: dict[str, Any], item: str) -> None:
    key, sep, raw = item.partition("=")
    key = key.strip().lstrip("+")
    if not sep or not key:
        raise ConfigError([f"override {item!r} must look like section.key=value"])
    value = _read_yaml(raw, f"override {item!r}") if raw.strip() else None
    parts = key.split(".")
    node: Any = tree
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    [f"override {item!r}: '{where}' is not an index of a {len(node)}-item list"]
                )
            index: Any = int(part)
        elif isinstance(node, dict):
            index = part
        else:
            raise ConfigError([f"override {item!r}: '{'.'.join(parts[:depth])}' is not a mapping"])
        if last:
            node[index] = value
        else:
            if isinstance(node, dict) and node.get(index) is None:
                node[index] = {}
            node = node[index]


def _resolve_interpolations(tree: dict[str, Any]) -> dict[str, Any]:
    """Replace ``${dotted.key}`` strings with the values they name (typed when the whole string)."""

    defaults = MasterConfig().model_dump(mode="json")  # refs may name keys the YAML leaves at default

    def find(root: Any, ref: str) -> tuple[bool, Any]:
        node = root
        for part in ref.split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return False, None
        return True, node

    def lookup(ref: str, where: str, stack: tuple[str, ...]) -> Any:
        if ref in stack:
            raise ConfigError([f"config key '{where}': circular interpolation ${{{ref}}}"])
        if not re.fullmatch(r"[\w.]+", ref):
            raise ConfigError(
                [f"config key '{where}': unsupported interpolation ${{{ref}}} (only ${{section.key}})"]
            )
        for root in (tree, defaults):
            found, node = find(root, ref)
            if found:
                return resolve(node, ref, stack + (ref,))
        raise ConfigError([f"config key '{where}' refers to unknown key '{ref}'"])

    def resolve(value: Any, where: str, stack: tuple[str, ...]) -> Any:
        if isinstance(value, dict):
            return {k: resolve(v, f"{where}.{k}" if where else k, stack) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v, f"{where}.{i}", stack) for i, v in enumerate(value)]
        if not isinstance(value, str) or "${" not in value:
            return value
        whole = _INTERPOLATION.fullmatch(value)
        if whole:
            return lookup(whole.group(1), where, stack)
        if "${" in _INTERPOLATION.sub("", value):
            raise ConfigError(
                [f"config key '{where}': unsupported interpolation in {value!r} (only ${{section.key}})"]
            )
        return _INTERPOLATION.sub(lambda m: str(lookup(m.group(1), where, stack)), value)

    return resolve(tree, "", ())


_EXPECTS = {
    "float_parsing": "a float",
    "float_type": "a float",
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "bool_parsing": "a boolean (true/false)",
    "bool_type": "a boolean (true/false)",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def _inner_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The section model inside an annotation, and whether a dict key comes first."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is dict:
        return _inner_model(args[1])[0], True
    if origin in (list, tuple, Union, types.UnionType):
        for arg in args:
            model, keyed = _inner_model(arg)
            if model is not None:
                return model, keyed
    return None, False


def _model_at(loc: Iterable[Any]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = MasterConfig
    expect_key = False
    for part in loc:
        if isinstance(part, int):
            continue
        if expect_key:
            expect_key = False
            continue
        field = model.model_fields.get(part) if model else None
        if field is None:
            return None
        model, expect_key = _inner_model(field.annotation)
    return model


def _all_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, field in model.model_fields.items():
        inner, keyed = _inner_model(field.annotation)
        if inner is None:
            paths.append(prefix + name)
        elif not keyed and get_origin(field.annotation) is None:
            paths.extend(_all_paths(inner, f"{prefix}{name}."))
    return paths


def _suggestion(loc: tuple[Any, ...], path: str) -> str:
    parent = _model_at(loc[:-1])
    key = str(loc[-1])
    if parent is not None:
        close = difflib.get_close_matches(key, list(parent.model_fields), n=1, cutoff=0.6)
        if close:
            return f" (did you mean '{path.rsplit('.', 1)[0] + '.' if '.' in path else ''}{close[0]}'?)"
    elsewhere = [p for p in _all_paths(MasterConfig) if p.rsplit(".", 1)[-1] == key]
    if elsewhere:
        return f" (did you mean '{elsewhere[0]}'?)"
    return ""


def _key_path(loc: tuple[Any, ...], raw: Any) -> str:
    """Dotted key path; list indices print as [i] unless the user wrote a single mapping."""
    out = ""
    node = raw
    for part in loc:
        if isinstance(part, int):
            if isinstance(node, list):
                out += f"[{part}]"
                node = node[part] if part < len(node) else None
            continue
        out += f".{part}" if out else str(part)
        node = node.get(part) if isinstance(node, dict) else None
    return out


def _describe(error: Any, raw: Any) -> list[str]:
    loc, kind = tuple(error["loc"]), error["type"]
    path = _key_path(loc, raw)
    got = error.get("input")
    if kind == "extra_forbidden":
        return [f"unknown config key '{path}'{_suggestion(loc, path)}"]
    if kind == "missing" and loc and isinstance(loc[-1], int):
        return [f"config key '{_key_path(loc[:-1], raw)}' has too few items"]
    if kind == "missing":
        return [f"config key '{path}' is required"]
    if kind in _EXPECTS:
        return [f"config key '{path}' expects {_EXPECTS[kind]}, got {got!r}"]
    if kind == "literal_error":
        return [f"config key '{path}' expects one of {error['ctx']['expected']}, got {got!r}"]
    message = error["msg"].removeprefix("Value error, ")
    if kind == "value_error":
        if message.startswith("expects"):
            return [f"config key '{path}' {message}"]
        lines = message.split("\n")
        return lines if not path or lines[0].startswith(path) else [f"{path}: {line}" for line in lines]
    return [f"config key '{path}': {message[0].lower() + message[1:]}, got {got!r}"]


def validate_config(tree: dict[str, Any]) -> MasterConfig:
    """Build a :class:`MasterConfig` from a plain mapping, or raise :class:`ConfigError`."""
    try:
        return MasterConfig.model_validate(tree)
    except ValidationError as exc:
        problems: list[str] = []
        for error in exc.errors():
            problems.extend(_describe(error, tree))
        raise ConfigError(problems) from None


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> MasterConfig:
    """Load a YAML recipe (with ``defaults:`` inheritance), apply ``a.b.c=value`` overrides and validate.

    ``path=None`` starts from the built-in defaults. Raises :class:`ConfigError` naming every bad key.
    """
    tree = _load_tree(Path(path)) if path is not None else {}
    for item in overrides:
        _apply_override(tree, item)
    tree = _resolve_interpolations(tree)
    cfg = validate_config(tree)
    if not cfg.data.train:
        raise ConfigError(["data.train: no training dataset configured"])
    return cfg


def config_to_dict(cfg: MasterConfig) -> dict[str, Any]:
    """The resolved config as plain YAML/JSON-ready data; ``validate_config`` of it gives ``cfg`` back."""
    return cfg.model_dump(mode="json")


def config_to_yaml(cfg: MasterConfig) -> str:
    """The resolved config as YAML text, in section order (for checkpoints and logs)."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
