"""Everything a GRPO run sets up before its first step, one function per piece.

Seeds and torch threads, the checkpoint to resume from (or the news that the run is complete), the
model with its optimizer and reference (:class:`~gym_bridge.train.learner.update.Learner`), the prompts, and
the samplers with the services behind them: in-process (the transformers backend on the training
model, Ray replicas, or vLLM) or the rollout process of async GRPO, and the env replicas on Ray.
"""

from __future__ import annotations

import copy
import functools
import importlib
import math
import os
import random
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gym_bridge.distributed.ray_cluster import resolve_address
from gym_bridge.generation.ray_backend import RayBackend
from gym_bridge.generation.transformers_backend import TransformersBackend
from gym_bridge.generation.vllm_backend import VllmBackend, colocation_problem
from gym_bridge.generation.weights import weights_snapshot as frozen_weights
from gym_bridge.models.registry import load_model_and_tokenizer, resolve_model
from gym_bridge.records.chat import tools_to_chat_tools
from gym_bridge.train.algorithm.loss import ClippedPGLossFn
from gym_bridge.train.batches.packing import require_packing_support
from gym_bridge.train.batches.rollouts import render_prompt
from gym_bridge.train.bookkeeping.checkpoint import Checkpoint, CheckpointManager
from gym_bridge.train.config import ConfigError, MasterConfig
from gym_bridge.train.learner.device import DTYPES, placement_for, resolve_device
from gym_bridge.train.learner.lora import LORA_KEY, apply_lora, load_adapter, merged_model
from gym_bridge.train.learner.update import Learner
from gym_bridge.train.samplers.data import (
    DataError,
    Prompt,
    TrainBatches,
    drop_long_prompts,
    load_offline_groups,
    load_prompts,
)
from gym_bridge.train.samplers.env_replicas import start_env_replicas
from gym_bridge.train.samplers.rollout_worker import ProcessSampler
from gym_bridge.train.samplers.sampling import OfflineSampler, OnlineSampler, Sampler

__all__ = [
    "RunAlreadyComplete",
    "RunData",
    "build_learner",
    "build_optimizer",
    "enable_activation_checkpointing",
    "find_resume_point",
    "freeze_embeddings",
    "load_run_data",
    "seed_everything",
    "start_samplers",
    "torch_threads",
    "weights_snapshot",
]

# Models up to this size generate on one torch thread, and train on one unless OMP_NUM_THREADS asks
# for more. Their ops are tiny, so more threads gain little, and they are fragile: every op is an
# OpenMP barrier, so when another process takes a core the whole step waits for the descheduled
# thread, op after op. Measured with the tiny recipe on a shared 2-core machine, s/step:
#   light load:  2 threads median 0.35-0.42, max 0.7-4.1     1 thread median 0.43-0.46, max 0.8-0.9
#   heavier:     2 threads median 0.55, mean 1.22, max 8.3    1 thread median 0.45, mean 0.51, max 0.9
# Generation stays on one thread even then: each thread that runs torch ops has its own OpenMP team,
# and two 2-thread teams on 2 cores made the trainer's team sleep between ops (training 0.14 -> 0.20 s)
# while one-thread generation was no slower.
SMALL_MODEL_MAX_PARAMS = 20_000_000


class RunAlreadyComplete(RuntimeError):
    """The checkpoint directory already holds the run's last step: nothing to train."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def weights_snapshot(model: Any) -> Mapping[str, Any]:
    """The model's weights as of now (what async GRPO's sampler is refit with), LoRA merged in: see
    :func:`gym_bridge.generation.weights.weights_snapshot` (under LoRA, no copy of the base)."""
    return frozen_weights(model)


def torch_threads(model: Any) -> tuple[int, int]:
    """Torch threads for (training, generation): small models generate on one thread and train on
    one unless ``OMP_NUM_THREADS`` asks for more; larger ones use every core torch may use for both."""
    available = max(1, min(torch.get_num_threads(), os.cpu_count() or 1))
    if sum(p.numel() for p in model.parameters()) > SMALL_MODEL_MAX_PARAMS:
        return available, available
    return (available if os.environ.get("OMP_NUM_THREADS") else 1), 1


def uses_rollout_process(cfg: MasterConfig) -> bool:
    """Whether async GRPO samples in a child process. It samples with transformers; Ray replicas and
    vLLM already run outside the trainer's interpreter, so async GRPO with them stays in-process.
    A policy on CUDA samples in-process too, from its copy on the same GPU (a CPU child would
    generate far slower than the GPU, and CUDA tensors do not go through its shared memory)."""
    return (
        cfg.grpo.mode == "online"
        and cfg.grpo.async_grpo.enabled
        and cfg.grpo.async_grpo.rollout_process
        and cfg.policy.generation.backend == "transformers"
        and resolve_device(cfg).type == "cpu"
    )


def optimizer_steps_per_step(cfg: MasterConfig) -> int:
    samples = cfg.grpo.samples_per_step
    return max(1, math.ceil(samples / cfg.policy.train_global_batch_size))


def build_optimizer(cfg: MasterConfig, model: Any, total_optimizer_steps: int) -> tuple[Any, Any]:
    """``policy.optimizer`` (AdamW by default) and a LambdaLR following ``policy.scheduler``."""
    module_name, _, class_name = cfg.policy.optimizer.name.rpartition(".")
    optimizer_class = getattr(importlib.import_module(module_name), class_name)
    kwargs = {k: v for k, v in cfg.policy.optimizer.kwargs.model_dump().items() if v is not None}
    optimizer = optimizer_class([p for p in model.parameters() if p.requires_grad], **kwargs)
    schedule = cfg.policy.scheduler
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: schedule.lr_factor(s, total_optimizer_steps)
    )
    return optimizer, scheduler


def freeze_embeddings(model: Any) -> int:
    """Stop training the token embeddings and the output layer (``policy.freeze_embeddings``); returns
    how many parameters that froze (a tied matrix counted once)."""
    frozen = 0
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        for parameter in module.parameters() if module is not None else ():
            if parameter.requires_grad:  # a tied matrix is frozen (and counted) on its first sight only
                frozen += parameter.requires_grad_(False).numel()
    return frozen


def find_resume_point(cfg: MasterConfig, *, fresh: bool = False) -> tuple[CheckpointManager, Checkpoint | None]:
    """The run's checkpoint manager and the checkpoint to resume from (None: start at step 0).

    ``fresh`` starts at step 0 whatever the directory holds (the earlier run is moved aside later, once
    the new one has started: :mod:`gym_bridge.train.bookkeeping.run_dirs`). Raises :class:`RunAlreadyComplete` when
    the latest checkpoint is at ``grpo.max_num_steps`` already, before anything heavy starts.
    """
    checkpointing = cfg.checkpointing
    manager = CheckpointManager(
        checkpointing.checkpoint_dir,
        keep_top_k=checkpointing.keep_top_k,
        metric_name=checkpointing.metric_name,
        higher_is_better=checkpointing.higher_is_better,
    )
    if not checkpointing.enabled:
        return manager, None
    manager.clean_leftovers()
    if fresh:
        return manager, None
    resume = manager.latest()
    if resume is not None and resume.step >= cfg.grpo.max_num_steps:
        raise RunAlreadyComplete(
            f"the run is already complete: {resume.path} is step {resume.step} of grpo.max_num_steps="
            f"{cfg.grpo.max_num_steps}. To train again from step 0, pass --fresh (moves this run to "
            f"{checkpointing.checkpoint_dir}.previous-<time> once the new one has started) or set "
            "checkpointing.checkpoint_dir to a new directory; to train further, raise grpo.max_num_steps."
        )
    if resume is not None:
        _check_resumable(cfg, resume)
    return manager, resume


FIXED_ON_RESUME = ("policy.model_name", "policy.tokenizer.name", "policy.optimizer.name", "policy.optimizer.kwargs.",
                   f"{LORA_KEY}.")
"""Keys a resumed run cannot change: the checkpoint's weights, adapter and optimizer state are loaded over
them (torch's ``load_state_dict`` keeps the saved learning rate, betas, eps and weight decay), so a new
value would be ignored without a word."""
APPLIED_ON_RESUME = ("policy.optimizer.kwargs.foreach", "policy.optimizer.kwargs.fused", f"{LORA_KEY}.use_triton")
"""Implementation switches among those, which change no state."""


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): value}


def _check_resumable(cfg: MasterConfig, resume: Checkpoint) -> None:
    """Refuse to resume with a changed key of :data:`FIXED_ON_RESUME`, naming each key with both values."""
    import yaml

    from gym_bridge.train.config import config_to_dict

    saved_file = resume.path / "config.yaml"
    if not saved_file.is_file():
        return
    saved, now = _flat(yaml.safe_load(saved_file.read_text()) or {}), _flat(config_to_dict(cfg))
    lora, lora_before = now.get(f"{LORA_KEY}.enabled"), saved.get(f"{LORA_KEY}.enabled")
    if lora != lora_before:  # LoRA on one side only: _check_checkpoint_kind refuses it in its own words
        return
    lora_both = lora is True  # LoRA's other settings matter only when it is on
    changed = [
        key
        for key in sorted(set(saved) | set(now))
        if key.startswith(FIXED_ON_RESUME)
        and key not in APPLIED_ON_RESUME
        and (lora_both or not key.startswith(f"{LORA_KEY}."))
        and saved.get(key) != now.get(key)
    ]
    if changed:
        raise ConfigError([
            f"{key} is {now.get(key)!r} but {resume.path} was trained with {saved.get(key)!r}: a resumed run "
            "continues from its checkpoint's weights and optimizer state, so the new value would be ignored. "
            "Keep the checkpoint's value to resume, or train with the new one from step 0 (--fresh, or a new "
            "checkpointing.checkpoint_dir)"
            for key in changed
        ])


def build_learner(cfg: MasterConfig, resume: Checkpoint | None, *, rollout_process: bool) -> tuple[Learner, int]:
    """The policy (resumed weights if any), its frozen reference when the loss has a KL penalty, the
    optimizer and LR schedule, all on the run's device (:mod:`gym_bridge.train.learner.device`); and the torch
    threads generation gets."""
    policy = cfg.policy
    placement = placement_for(cfg)
    seed_everything(cfg.grpo.seed)
    model, tokenizer = load_model_and_tokenizer(
        policy.model_name, tokenizer_name=policy.tokenizer.name, chat_template=policy.tokenizer.chat_template
    )
    placement.place(model)  # before LoRA (its adapters follow their base layers) and the optimizer
    if policy.sequence_packing.enabled:
        require_packing_support(model, policy.model_name)
    if policy.dtensor_cfg.activation_checkpointing:
        enable_activation_checkpointing(model)
    threads, generation_threads = torch_threads(model)
    if rollout_process:  # the rollout process samples on its own cores meanwhile: leave them to it
        threads = max(1, min(threads, (os.cpu_count() or 1) - generation_threads))
    torch.set_num_threads(threads)
    loss_fn = ClippedPGLossFn(cfg.loss_fn, max_completion_length=policy.generation.max_new_tokens)
    lora = policy.dtensor_cfg.lora_cfg
    reference, peft_model = None, None
    if lora.enabled:  # adapters only train; the reference is the base model with them switched off
        try:
            peft_model = apply_lora(model, lora)
        except ValueError as err:
            raise ConfigError([str(err)]) from None
    elif loss_fn.needs_reference_logprobs:  # the initial policy, frozen
        reference = placement.place(copy.deepcopy(model).eval().requires_grad_(False), placement.reference_dtype)
    if resume is not None:
        _check_checkpoint_kind(resume, lora.enabled)
        if peft_model is not None:
            load_adapter(peft_model, resume.adapter_dir)
        else:
            resume.load_weights(model)
    if policy.freeze_embeddings:
        freeze_embeddings(model)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    total = cfg.grpo.max_num_steps * optimizer_steps_per_step(cfg)
    optimizer, scheduler = build_optimizer(cfg, model, total)
    learner = Learner(
        model, tokenizer, optimizer, scheduler, loss_fn, reference, pad_token_id, peft_model, placement=placement
    )
    return learner, generation_threads


def enable_activation_checkpointing(model: Any) -> None:
    """transformers' activation checkpointing, non-reentrant (works with frozen base weights under
    LoRA); a ConfigError naming the key when the model cannot do it."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError([
            f"policy.dtensor_cfg.activation_checkpointing: {type(model).__name__} does not support it"
        ])
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:  # transformers >= 5.2x
        enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _check_checkpoint_kind(resume: Checkpoint, lora: bool) -> None:
    """Refuse to resume a LoRA checkpoint as full fine-tuning or the other way round."""
    if resume.is_lora and not lora:
        raise ConfigError([
            f"{LORA_KEY}.enabled is false but {resume.path} holds a LoRA adapter: enable LoRA with the "
            "same settings to resume it, or train in a new checkpointing.checkpoint_dir (or --fresh)"
        ])
    if lora and not resume.is_lora:
        raise ConfigError([
            f"{LORA_KEY}.enabled is true but {resume.path} holds full fine-tuning weights: train LoRA in a "
            "new checkpointing.checkpoint_dir (or --fresh)"
        ])


@dataclass
class RunData:
    """The run's training prompts (or offline groups) and validation prompts."""

    train: TrainBatches
    validation: list[Prompt]
    dropped: int
    """Training prompts dropped for being longer than ``max_prompt_tokens``."""
    validation_dropped: int
    """Validation prompts dropped for the same reason."""
    max_prompt_tokens: int


def _prompt_tokens(tokenizer: Any, prompt: Prompt) -> int:
    tools = tools_to_chat_tools(prompt.row["responses_create_params"].get("tools"))
    return len(render_prompt(tokenizer, prompt.messages(), tools))


def load_run_data(cfg: MasterConfig, tokenizer: Any) -> RunData:
    """Training prompts (online) or scored groups (offline), and the validation prompts, without the
    prompts whose chat-templated length exceeds ``data.max_input_seq_length``."""
    data, grpo = cfg.data, cfg.grpo
    max_prompt = data.max_input_seq_length or cfg.policy.max_total_sequence_length
    count = functools.partial(_prompt_tokens, tokenizer)
    limit = "data.max_input_seq_length" if data.max_input_seq_length else "policy.max_total_sequence_length"
    if grpo.mode == "online":
        train_items, held_out = load_prompts(data, "train")
        train_items, dropped = drop_long_prompts(train_items, count, max_prompt)
        if not train_items:  # used to end in a traceback ("a loader needs at least one item")
            raise DataError(f"data.train: all {dropped} training prompts are longer than {limit} ({max_prompt} tokens)")
    else:
        train_items, held_out, dropped = load_offline_groups(data), [], 0
    validation = (load_prompts(data, "validation")[0] if data.validation else []) + held_out
    validation = [p for p in validation if p.env_name in cfg.env]
    validation, val_dropped = drop_long_prompts(validation, count, max_prompt)
    if val_dropped and not validation:  # used to leave the run without a single validation, without a word
        raise DataError(
            f"data.validation: all {val_dropped} validation prompts are longer than {limit} ({max_prompt} tokens)"
        )
    batches = TrainBatches(
        train_items,
        num_prompts_per_step=grpo.num_prompts_per_step,
        shuffle=data.shuffle,
        seed=grpo.seed,
        use_multiple_dataloader=data.use_multiple_dataloader,
        num_prompts_per_dataloader=data.num_prompts_per_dataloader,
        custom_dataloader=data.custom_dataloader,
    )
    return RunData(batches, validation, dropped, val_dropped, max_prompt)


def _training_bytes_to_come(model: Any) -> int:
    """Bytes of GPU memory training allocates at its first step: a gradient and AdamW's two moments
    per trainable parameter (an estimate for other optimizers; activations come on top)."""
    return 3 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _generation_backend(cfg: MasterConfig, stack: ExitStack, learner: Learner) -> Any:
    """The in-process generation backend ``policy.generation.backend`` names, refit with ``load_weights``."""
    policy, grpo = cfg.policy, cfg.grpo
    model, tokenizer = learner.model, learner.tokenizer
    local = {
        "model_name": "policy",
        "seed": grpo.seed,
        "max_context": policy.max_total_sequence_length,
        "stop_token_ids": policy.generation.stop_token_ids or (),
        "logprobs_mode": "processed",  # the sampled distribution's, as the trainer's own log-probs are
        "precision": policy.generation.precision,
    }
    if policy.generation.backend == "ray":  # replicas with their own weights, refit after each update
        where = {"ray_address": resolve_address(cfg.cluster.ray_address), "placement_timeout_s": cfg.cluster.placement_timeout_s}
        generator = RayBackend(model, tokenizer, **local, **where, **policy.generation.ray.model_dump())
        stack.callback(generator.close)
        return generator
    if policy.generation.backend == "vllm":  # GPU: an engine on the same weights, refit each step
        engine = policy.generation.vllm_cfg
        colocated = learner.placement.device.type == "cuda"
        if colocated:  # the policy is on the GPU already: vLLM's share must fit beside it
            problem = colocation_problem(
                engine.gpu_memory_utilization, _training_bytes_to_come(model), learner.placement.device
            )
            if problem:
                raise ConfigError([problem])
        generator = VllmBackend(
            resolve_model(policy.model_name).path,
            model_name="policy",
            stop_token_ids=policy.generation.stop_token_ids or (),
            logprobs_mode="processed",
            tensor_parallel_size=engine.tensor_parallel_size,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            max_model_len=engine.max_model_len or policy.max_total_sequence_length,
            enforce_eager=engine.enforce_eager,
            seed=grpo.seed,
            dtype=policy.generation.precision or policy.precision,
            colocated=colocated,
        )
        stack.callback(generator.close)
        generator.update_weights(model)  # a resumed run's weights, not the directory's
        return generator
    # Async GRPO samples from its own copy of the policy, refit after every step; synchronous GRPO
    # samples from the training model itself.
    # With LoRA that copy is a plain model with the adapters merged in (what every refit sends).
    asynchronous = grpo.mode == "online" and grpo.async_grpo.enabled
    if asynchronous:
        model = merged_model(learner.peft) if learner.peft is not None else copy.deepcopy(model)
        if policy.generation.precision is not None:  # the copy's weights in that dtype, refits cast into
            dtype = DTYPES[policy.generation.precision]  # them (its rotary tables stay float32)
            for parameter in model.parameters():
                parameter.data = parameter.data.to(dtype)
        model.eval()
    backend = TransformersBackend(model, tokenizer, **local)
    if model is learner.model:  # one model: generation and the update never overlap
        learner.model_lock = backend.lock
    return backend


def start_samplers(
    cfg: MasterConfig, stack: ExitStack, learner: Learner, generation_threads: int, *, needs_validation: bool
) -> tuple[Sampler | None, Sampler | None]:
    """(training sampler, validation sampler), closed with ``stack``. Online both are the same
    policy sampler; offline, training reads the scored groups and validation (if any) samples."""
    online = cfg.grpo.mode == "online"
    policy_sampler: Sampler | None = None
    if online or needs_validation:
        # Env replicas first: a private Ray they start is sized for the generation replicas too.
        replicas = {name: r.endpoints() for name, r in start_env_replicas(cfg, stack).items()}
        if uses_rollout_process(cfg):
            checkpoints = CheckpointManager(cfg.checkpointing.checkpoint_dir) if cfg.checkpointing.enabled else None
            policy_sampler = ProcessSampler(  # its death names the checkpoint a rerun resumes from
                cfg, learner.tokenizer, weights_snapshot(learner.model), threads=generation_threads, replicas=replicas,
                checkpoints=checkpoints,
            )  # fmt: skip
        else:
            backend = _generation_backend(cfg, stack, learner)
            policy_sampler = OnlineSampler(
                cfg, backend, learner.tokenizer, threads=generation_threads, replicas=replicas
            )
        stack.callback(policy_sampler.close)
    train_sampler = policy_sampler if online else OfflineSampler(cfg, learner.tokenizer)
    return train_sampler, policy_sampler
