"""The GRPO training loop, readable top to bottom (in the spirit of CleanRL and nanoGPT).

``train(cfg)`` sets up, then repeats one GRPO step until ``grpo.max_num_steps``:

1. **prompts**: the next ``num_prompts_per_step`` prompts from the training data;
2. **rollouts** (online): ``num_generations_per_prompt`` completions per prompt from the current
   policy, run through the same agent loop as ``collect`` (``gym_bridge.agent``): the policy is
   served by the embedded OpenAI-compatible policy server over the training model's own weights,
   the rewards come from the resources servers over HTTP. Token ids and log-probs come back on the
   output items, so nothing is re-tokenized. Offline, the step's scored completions come from the
   dataset instead;
3. **advantages**: group-relative (leave-one-out baseline, std normalisation); with dynamic
   sampling, groups whose rewards are all equal are dropped and more prompts are generated;
4. **log-probs**: of the step's starting policy (``prev``) and the reference policy (KL > 0);
5. **updates**: the samples are cut into ``train_global_batch_size`` batches, each one optimizer
   step with micro-batches and gradient accumulation, clipped gradients, NeMo RL's clipped loss;
6. **metrics**, **validation** every ``grpo.val_period`` steps, **checkpoint** every
   ``checkpointing.save_period`` steps. A restarted run resumes from the latest checkpoint.
"""

from __future__ import annotations

import copy
import importlib
import math
import os
import random
import threading
import time
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_bridge.chat import tools_to_chat_tools as chat_tools
from gym_bridge.train.async_rollouts import RolloutPipeline
from gym_bridge.train.checkpoint import CheckpointManager
from gym_bridge.train.data import (
    OfflineGroup,
    Prompt,
    TrainBatches,
    drop_long_prompts,
    load_offline_groups,
    load_prompts,
)
from gym_bridge.train.logging import TerminalView, open_metrics_logger, plot_curves
from gym_bridge.train.preflight import check_machine
from gym_bridge.train.rollouts import (
    RolloutJob,
    RolloutRunner,
    Sample,
    TurnMismatch,
    render_prompt,
    sequence_from_chat,
    sequence_from_items,
    sequence_from_text,
)

if TYPE_CHECKING:
    import torch

    from gym_bridge.train.config import MasterConfig
    from gym_bridge.train.packing import PackedRows
    from gym_bridge.train.shared_prefix import PrefixPlan

__all__ = ["TrainResult", "train"]


@dataclass
class TrainResult:
    """What a finished run reports: where things went and the last metrics."""

    steps: int
    log_dir: Path
    checkpoint_dir: Path | None
    last_train: dict[str, Any] = field(default_factory=dict)
    validations: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: int | None = None
    curves: Path | None = None


# ================================================================================================
# set-up helpers
# ================================================================================================


def weights_snapshot(model: Any) -> dict[str, Any]:
    """A detached copy of the model's weights (what async GRPO's sampler is refit with)."""
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def load_policy(name_or_path: str, tokenizer_name: str | None = None) -> tuple[Any, Any]:
    """Model and tokenizer by built-in name ("tiny", ...) or local directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        from gym_bridge.models.registry import load_model_and_tokenizer
    except ImportError:  # the registry is optional: a local directory is enough
        load_model_and_tokenizer = None
    if load_model_and_tokenizer is not None:
        model, tokenizer = load_model_and_tokenizer(name_or_path)
    else:
        path = name_or_path
        if name_or_path == "tiny":
            from gym_bridge.models.tiny import ensure_tiny

            path = str(ensure_tiny())
        model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
        tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer_name not in (None, name_or_path):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
    return model, tokenizer


def build_optimizer(cfg: MasterConfig, model: Any, total_optimizer_steps: int) -> tuple[Any, Any]:
    """``policy.optimizer`` (AdamW by default) and a LambdaLR following ``policy.scheduler``."""
    import torch

    module_name, _, class_name = cfg.policy.optimizer.name.rpartition(".")
    optimizer_class = getattr(importlib.import_module(module_name), class_name)
    kwargs = {k: v for k, v in cfg.policy.optimizer.kwargs.model_dump().items() if v is not None}
    optimizer = optimizer_class([p for p in model.parameters() if p.requires_grad], **kwargs)
    schedule = cfg.policy.scheduler
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: schedule.lr_factor(s, total_optimizer_steps)
    )
    return optimizer, scheduler


def _dtype(precision: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[precision]


# ================================================================================================
# log-probs
# ================================================================================================


def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    token_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """(b, T-1) log-probs of tokens 1..T-1 where ``token_mask`` (b, T-1) is set, 0 elsewhere.

    Only the masked positions go through the output layer: on RL batches most positions are
    prompt or padding, and the vocabulary projection is the costliest part of small models.
    Packed rows (:mod:`gym_bridge.train.packing`) pass ``position_ids`` and no attention mask.
    """
    import torch

    from gym_bridge.train.loss import gather_token_logprobs
    from gym_bridge.train.shared_prefix import projects_hidden_states_plainly

    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    if position_ids is not None:
        inputs["position_ids"] = position_ids
    if not projects_hidden_states_plainly(model):
        logprobs = gather_token_logprobs(model(**inputs).logits, input_ids)
        return logprobs * token_mask
    hidden = model.base_model(**inputs).last_hidden_state[:, :-1]
    where = token_mask.bool()
    logits = model.get_output_embeddings()(hidden[where]).float()
    targets = input_ids[:, 1:][where]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    out = torch.zeros(token_mask.shape, dtype=picked.dtype, device=picked.device)
    out[where] = picked
    return out


@dataclass
class MicroBatch:
    """Padded tensors of a few samples; ``token_mask`` etc. are shifted to next-token positions."""

    index: list[int]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_mask: torch.Tensor
    generation_logprobs: torch.Tensor | None
    prefixes: PrefixPlan | None = None
    """Set when the rows' prompts run once each (:mod:`gym_bridge.train.shared_prefix`)."""
    token_ids: list[list[int]] = field(default_factory=list)
    packed: PackedRows | None = None
    """Set when the forward pass runs the samples packed into rows (:mod:`gym_bridge.train.packing`)."""


def make_micro_batch(
    samples: list[Sample],
    index: list[int],
    pad_token_id: int,
    *,
    share_prompts: bool = False,
    packing: tuple[int, int] | None = None,
) -> MicroBatch:
    """``packing``: (row tokens, length rounding) to run the samples packed into rows."""
    from gym_bridge.train.batching import pad_and_stack
    from gym_bridge.train.packing import pack_rows
    from gym_bridge.train.shared_prefix import plan_prefixes

    chosen = [samples[i] for i in index]
    plan = (
        plan_prefixes([s.token_ids for s in chosen], [s.loss_mask for s in chosen]) if share_prompts else None
    )
    has_gen = all(s.generation_logprobs is not None for s in chosen)
    padded = pad_and_stack(
        [s.token_ids for s in chosen],
        pad_token_id=pad_token_id,
        loss_masks=[s.loss_mask for s in chosen],
        values={"gen": [s.generation_logprobs for s in chosen]} if has_gen else None,
    )
    return MicroBatch(
        index=list(index),
        input_ids=padded.input_ids,
        attention_mask=padded.attention_mask,
        token_mask=padded.loss_mask[:, 1:],
        generation_logprobs=padded.values["gen"][:, 1:] if has_gen else None,
        prefixes=plan if plan is not None and plan.repeats else None,
        token_ids=[s.token_ids for s in chosen],
        packed=(
            pack_rows([s.token_ids for s in chosen], packing[0], pad_token_id=pad_token_id, round_to=packing[1])
            if packing is not None
            else None
        ),
    )


def micro_batch_logprobs(model: Any, mb: MicroBatch, pad_token_id: int) -> torch.Tensor:
    """(b, T-1) next-token log-probs of a micro-batch, one prompt pass per distinct prompt if planned."""
    from gym_bridge.train.shared_prefix import shared_prefix_logprobs

    if mb.prefixes is not None:
        return shared_prefix_logprobs(model, mb.token_ids, mb.token_mask, mb.prefixes, pad_token_id)
    if mb.packed is not None:
        packed = token_logprobs(
            model, mb.packed.input_ids, None, mb.packed.pack(mb.token_mask), mb.packed.position_ids
        )
        return mb.packed.unpack(packed, mb.token_mask.shape[1])
    return token_logprobs(model, mb.input_ids, mb.attention_mask, mb.token_mask)


def packing_layout(cfg: MasterConfig) -> tuple[int, int] | None:
    """(row tokens, length rounding) of packed rows when ``policy.sequence_packing`` is on, else None."""
    packing = cfg.policy.sequence_packing
    if not packing.enabled:
        return None
    return cfg.policy.max_total_sequence_length, packing.sequence_length_round


def shares_prompts(cfg: MasterConfig, model: Any) -> bool:
    """Whether micro-batches run each distinct prompt once (fixed-size micro-batches, capable model)."""
    from gym_bridge.train.shared_prefix import shares_prefixes

    policy = cfg.policy
    fixed = not (policy.dynamic_batching.enabled or policy.sequence_packing.enabled)
    return policy.share_prompt_prefix and fixed and shares_prefixes(model)


def micro_batches(
    cfg: MasterConfig,
    samples: list[Sample],
    index: list[int],
    *,
    for_logprobs: bool,
    share_prompts: bool = False,
) -> list[list[int]]:
    """Index groups for forward passes: rows of packed sequences (sequence packing), token-budget
    (dynamic batching) or fixed-size, all length-sorted; with ``share_prompts``, fixed-size groups that
    keep each prompt's rows together."""
    from gym_bridge.train.batching import dynamic_micro_batches
    from gym_bridge.train.packing import packed_micro_batches
    from gym_bridge.train.shared_prefix import prefix_micro_batches

    policy = cfg.policy
    layout = packing_layout(cfg)
    if layout is not None:  # rows of packed sequences, as many rows as fit the token budget
        budget = policy.logprob_mb_tokens if for_logprobs else policy.train_mb_tokens
        lengths = [len(samples[i].token_ids) for i in index]
        groups = packed_micro_batches(lengths, layout[0], budget, round_to=layout[1])
        return [[index[j] for j in group] for group in groups]
    if share_prompts:
        size = policy.logprob_batch_size if for_logprobs else policy.train_micro_batch_size
        return prefix_micro_batches(
            [s.token_ids for s in samples], [s.loss_mask for s in samples], index, size
        )
    lengths = [len(samples[i].token_ids) for i in index]
    if policy.dynamic_batching.enabled:
        budget = policy.logprob_mb_tokens if for_logprobs else policy.train_mb_tokens
        round_to = policy.dynamic_batching.sequence_length_round
    else:  # fixed sizes, but similar lengths together (same number of passes, less padding)
        budget, round_to = 1 << 62, 1
    size = policy.logprob_batch_size if for_logprobs else policy.train_micro_batch_size
    if policy.dynamic_batching.enabled:
        size = None
    groups = dynamic_micro_batches(lengths, budget, max_batch_size=size, round_to=round_to)
    return [[index[j] for j in group] for group in groups]


def per_sample_logprobs(
    cfg: MasterConfig, model: Any, samples: list[Sample], pad_token_id: int
) -> list[torch.Tensor]:
    """Each sample's (len-1,) next-token log-probs under ``model`` (no grad, batched passes)."""
    import torch

    out: list[torch.Tensor | None] = [None] * len(samples)
    was_training = model.training
    share = shares_prompts(cfg, model)
    model.eval()
    with torch.inference_mode():
        index = list(range(len(samples)))
        for group in micro_batches(cfg, samples, index, for_logprobs=True, share_prompts=share):
            mb = make_micro_batch(samples, group, pad_token_id, share_prompts=share, packing=packing_layout(cfg))
            logprobs = micro_batch_logprobs(model, mb, pad_token_id)
            for row, i in enumerate(group):
                out[i] = logprobs[row, : len(samples[i].token_ids) - 1].clone()
    model.train(was_training)
    return out  # type: ignore[return-value]


def _pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    import torch

    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row[:width]
    return out


# ================================================================================================
# the policy update
# ================================================================================================


def update_policy(
    cfg: MasterConfig,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    loss_fn: Any,
    samples: list[Sample],
    advantages: torch.Tensor,
    sample_mask: torch.Tensor,
    prev_logprobs: list[torch.Tensor] | None,
    reference_logprobs: list[torch.Tensor] | None,
    pad_token_id: int,
) -> dict[str, float]:
    """Optimizer steps over the samples, ``train_global_batch_size`` at a time.

    ``prev_logprobs`` None means the policy has not moved since generation started and there is a
    single optimizer step: the first forward pass's own (detached) log-probs are then exactly the
    step-start policy's, which saves a whole forward pass.
    """
    import torch

    from gym_bridge.train.loss import reduce_microbatch_metrics

    model.train()
    batch_size = cfg.policy.train_global_batch_size
    order = list(range(len(samples)))
    step_metrics: list[dict[str, float]] = []
    share = shares_prompts(cfg, model)
    for start in range(0, len(order), batch_size):
        batch_index = order[start : start + batch_size]
        groups = micro_batches(cfg, samples, batch_index, for_logprobs=False, share_prompts=share)
        packing = packing_layout(cfg)
        batches = [
            make_micro_batch(samples, g, pad_token_id, share_prompts=share, packing=packing) for g in groups
        ]
        valid_toks = sum(float((mb.token_mask * sample_mask[mb.index].unsqueeze(-1)).sum()) for mb in batches)
        valid_seqs = float(sample_mask[batch_index].sum())
        if valid_toks == 0:
            continue
        optimizer.zero_grad(set_to_none=True)
        metrics: list[dict[str, float]] = []
        for mb in batches:
            width = mb.token_mask.shape[1]
            current = micro_batch_logprobs(model, mb, pad_token_id)
            prev = (
                current.detach()
                if prev_logprobs is None
                else _pad_rows([prev_logprobs[i] for i in mb.index], width)
            )
            generation = mb.generation_logprobs if mb.generation_logprobs is not None else prev
            reference = (
                _pad_rows([reference_logprobs[i] for i in mb.index], width) if reference_logprobs else None
            )
            loss, mb_metrics = loss_fn(
                current,
                prev_logprobs=prev,
                generation_logprobs=generation * mb.token_mask,
                advantages=advantages[mb.index],
                token_mask=mb.token_mask,
                sample_mask=sample_mask[mb.index],
                reference_logprobs=reference,
                global_valid_toks=valid_toks,
                global_valid_seqs=valid_seqs,
            )
            loss.backward()
            metrics.append(mb_metrics)
        max_norm = cfg.policy.max_grad_norm if cfg.policy.max_grad_norm is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        scheduler.step()
        reduced = reduce_microbatch_metrics(metrics)
        reduced["grad_norm"] = float(grad_norm)
        step_metrics.append(reduced)
    if not step_metrics:
        return {"optimizer_steps": 0}
    # Means over the step's optimizer steps (min/max kept as such).
    out: dict[str, float] = {}
    for key in step_metrics[0]:
        values = [m[key] for m in step_metrics if key in m]
        out[key] = (
            min(values)
            if key.endswith("_min")
            else max(values)
            if key.endswith("_max")
            else sum(values) / len(values)
        )
    out["optimizer_steps"] = len(step_metrics)
    out["clip_fraction"] = out.get("clip_fraction_low", 0.0) + out.get("clip_fraction_high", 0.0)
    return out


# ================================================================================================
# sampling: online through the agent loop, offline from scored data
# ================================================================================================


def rollout_seed(seed: int, step: int, prompt: int, generation: int, salt: int = 0) -> int:
    """A per-completion sampling seed: the same run draws the same completions, resumed or not."""
    return ((((seed * 1_000_003 + salt) * 1_000_003 + step) * 10_007 + prompt) * 1_009 + generation) % (2**62)


class OnlineSampler:
    """Completions for prompts through the agent loop, as :class:`Sample` lists."""

    def __init__(
        self, cfg: MasterConfig, runner: RolloutRunner, tokenizer: Any, timer: GenerationTimer
    ) -> None:
        self.cfg = cfg
        self.runner = runner
        self.tokenizer = tokenizer
        self.timer = timer
        self.turn_mismatches = 0

    def sample(
        self, prompts: list[Prompt], n: int, seeds: list[list[int]], group_offset: int = 0
    ) -> tuple[list[Sample], dict[str, Any]]:
        jobs = [
            RolloutJob(p.row, p.env_name or "", {"seed": seeds[i][g]})
            for i, p in enumerate(prompts)
            for g in range(n)
        ]
        self.timer.reset()
        started = time.perf_counter()
        results = self.runner.run(jobs)
        wall = time.perf_counter() - started
        samples: list[Sample] = []
        failures: list[str] = []
        for k, result in enumerate(results):
            prompt = prompts[k // n]
            if not result.ok:
                failures.append(
                    f"{result.failure.stage}: {result.failure.failure_class}: {result.failure.message}"
                )
                continue
            sample = self.to_sample(result.record, k // n + group_offset, prompt)
            if sample is not None:
                samples.append(sample)
        if not samples:
            detail = failures[0] if failures else "no rollout carried token ids"
            raise RuntimeError(f"every rollout of the step failed; first failure: {detail}")
        stats = {
            "time_rollouts_s": wall,
            "time_generation_s": self.timer.seconds,
            "time_reward_and_http_s": max(0.0, wall - self.timer.seconds),
            "rollout_failures": len(failures),
            "generate_calls": self.timer.calls,
        }
        return samples, stats

    def to_sample(self, record: dict[str, Any], group: int, prompt: Prompt) -> Sample | None:
        response = record.get("response") or {}
        try:
            built = sequence_from_items(response.get("output") or [])
        except TurnMismatch:
            self.turn_mismatches += 1
            built = None
        if built is None:
            return None
        token_ids, mask, logprobs, turns = built
        incomplete = (response.get("incomplete_details") or {}).get("reason") == "max_output_tokens"
        sample = Sample(
            group=group,
            token_ids=token_ids,
            loss_mask=mask,
            reward=float(record.get("reward") or 0.0),
            generation_logprobs=logprobs,
            truncated=incomplete or self._hit_length_limit(token_ids, mask),
            masked=bool(record.get("mask_sample")),
            task_name=prompt.task_name,
            dataset=prompt.dataset,
            turns=turns,
            record=record,
        )
        sample.cut(self.cfg.policy.max_total_sequence_length)
        return sample

    def _hit_length_limit(self, token_ids: list[int], mask: list[int]) -> bool:
        """The last turn ended without an end-of-turn or stop token (and so was cut off)."""
        stops = {self.tokenizer.eos_token_id, *(self.cfg.policy.generation.stop_token_ids or ())}
        generated = [t for t, m in zip(token_ids, mask, strict=True) if m]
        return (
            bool(generated)
            and generated[-1] not in stops
            and len(token_ids) >= self.cfg.policy.max_total_sequence_length
        )


class OfflineSampler:
    """The scored completions of offline groups as :class:`Sample` lists (tokenized once, cached)."""

    def __init__(self, cfg: MasterConfig, tokenizer: Any) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self._cache: dict[tuple[str, int], list[tuple[list[int], list[int], list[float] | None, float]]] = {}

    def _sequences(self, group: OfflineGroup) -> list[tuple[list[int], list[int], list[float] | None, float]]:
        key = (group.dataset, group.idx)
        if key not in self._cache:
            from gym_bridge.chat import items_to_messages

            built = []
            for completion in group.completions:
                logprobs = None
                if completion.output_items is not None:
                    from_items = sequence_from_items(completion.output_items)
                    if from_items is not None:
                        token_ids, mask, logprobs, _ = from_items
                    else:
                        messages = items_to_messages(completion.output_items)
                        token_ids, mask = sequence_from_chat(
                            self.tokenizer, group.messages, messages, group.tools
                        )
                else:
                    token_ids, mask = sequence_from_text(
                        self.tokenizer, group.messages, completion.text or "", group.tools
                    )
                built.append((token_ids, mask, logprobs, completion.reward))
            self._cache[key] = built
        return self._cache[key]

    def sample(
        self, groups: list[OfflineGroup], group_offset: int = 0
    ) -> tuple[list[Sample], dict[str, Any]]:
        started = time.perf_counter()
        samples = []
        for g, group in enumerate(groups):
            for token_ids, mask, logprobs, reward in self._sequences(group):
                sample = Sample(
                    group=g + group_offset,
                    token_ids=list(token_ids),
                    loss_mask=list(mask),
                    reward=reward,
                    generation_logprobs=list(logprobs) if logprobs is not None else None,
                    task_name=group.task_name,
                    dataset=group.dataset,
                )
                sample.cut(self.cfg.policy.max_total_sequence_length)
                samples.append(sample)
        return samples, {"time_data_s": time.perf_counter() - started}


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


def torch_threads(model: Any) -> tuple[int, int]:
    """Torch threads for (training, generation): small models generate on one thread and train on
    one unless ``OMP_NUM_THREADS`` asks for more; larger ones use every core torch may use for both."""
    import torch

    available = max(1, min(torch.get_num_threads(), os.cpu_count() or 1))
    if sum(p.numel() for p in model.parameters()) > SMALL_MODEL_MAX_PARAMS:
        return available, available
    return (available if os.environ.get("OMP_NUM_THREADS") else 1), 1


class GenerationTimer:
    """Wraps a generation backend to add up the time spent in ``generate`` (the generation phase).

    ``threads``: torch threads for ``generate`` in whichever thread calls it (the policy server runs it
    in worker threads, each with its own setting); None leaves torch's setting alone.
    """

    def __init__(self, backend: Any, threads: int | None = None) -> None:
        self.backend = backend
        self.threads = threads
        self._thread_configured = threading.local()
        self.seconds = 0.0
        self.tokens = 0
        self.calls = 0

    def reset(self) -> None:
        self.seconds, self.tokens, self.calls = 0.0, 0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def generate(self, requests: list[Any]) -> list[Any]:
        if self.threads is not None and not getattr(self._thread_configured, "done", False):
            import torch

            torch.set_num_threads(self.threads)  # this thread's OpenMP team; the trainer's is its own
            self._thread_configured.done = True
        started = time.perf_counter()
        results = self.backend.generate(requests)
        self.seconds += time.perf_counter() - started
        self.tokens += sum(len(r.token_ids) for r in results)
        self.calls += 1
        return results


# ================================================================================================
# environments and the embedded policy server
# ================================================================================================


def start_services(cfg: MasterConfig, stack: ExitStack, backend: Any) -> RolloutRunner:
    """Start (or connect to) the resources servers and serve the policy on loopback; return a runner."""
    from gym_bridge.envs import running_env
    from gym_bridge.policy.server import build_policy_app
    from gym_bridge.server import start_in_thread
    from gym_bridge.train.config import ConfigError

    env_urls: dict[str, str] = {}
    max_steps: dict[str, int | None] = {}
    for name, env in cfg.env.items():
        if env.url is not None:
            env_urls[name] = env.url.rstrip("/")
        else:
            try:
                started = running_env(env.server or name, workers=env.num_workers, **env.config)
                env_urls[name] = stack.enter_context(started)
            except ValueError as err:
                if env.num_workers is None or "worker pool" not in str(err):
                    raise
                raise ConfigError([f"env.{name}.num_workers: {err}"]) from None
        max_steps[name] = env.max_steps or cfg.grpo.max_rollout_turns
    generation = cfg.policy.generation
    app = build_policy_app(
        backend,
        model_name="policy",
        return_token_ids=True,  # training fields on every output item: no re-tokenization
        max_batch_size=cfg.policy.generation_batch_size,
        # A step's requests reach the policy server over ~20-60 ms (each rollout opens its env session
        # first); a batch that waits for all of them runs one decode loop instead of two. A full batch
        # starts at once, so the wait only costs when fewer requests than a batch are in flight.
        batch_wait_ms=100.0,
        max_output_tokens=generation.max_new_tokens,
    )
    policy_server = stack.enter_context(start_in_thread(app))
    overrides: dict[str, Any] = {
        "model": "policy",
        "temperature": generation.temperature,
        "top_p": generation.top_p,
        "max_output_tokens": generation.max_new_tokens,
    }
    if generation.top_k is not None:
        overrides["top_k"] = generation.top_k
    if generation.stop_strings:
        overrides["stop"] = generation.stop_strings
    runner = RolloutRunner(
        f"{policy_server.url}/v1",
        env_urls,
        max_steps=max_steps,
        overrides=overrides,
        max_concurrency=max(256, cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt),
        env_timeouts_s={name: env.timeout_s for name, env in cfg.env.items()},
    )
    stack.callback(runner.close)
    return runner


# ================================================================================================
# metrics
# ================================================================================================


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def sample_metrics(samples: list[Sample], advantages: torch.Tensor) -> dict[str, float]:
    rewards = [s.reward for s in samples]
    lengths = [s.generated_tokens for s in samples]
    metrics = {
        "reward_mean": _mean(rewards),
        "reward_std": float(_std(rewards)),
        "advantage_mean": float(advantages.mean()),
        "advantage_std": float(advantages.std()) if len(samples) > 1 else 0.0,
        "advantage_min": float(advantages.min()),
        "advantage_max": float(advantages.max()),
        "gen_length_mean": _mean(lengths),
        "gen_length_max": float(max(lengths)),
        "sequence_length_mean": _mean([len(s.token_ids) for s in samples]),
        "truncation_rate": _mean([float(s.truncated) for s in samples]),
        "num_samples": float(len(samples)),
    }
    by_task: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        by_task[s.task_name].append(s.reward)
    if len(by_task) > 1:
        for task, values in by_task.items():
            metrics[f"reward_mean/{task}"] = _mean(values)
    return metrics


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


# ================================================================================================
# one step's samples and advantages
# ================================================================================================


def collect_samples(grpo: Any, data: TrainBatches, draw: Any) -> tuple[list[Sample], dict[str, float]]:
    """The step's samples: ``draw(prompts, group_offset, attempt)`` once, or with dynamic sampling
    (DAPO) repeatedly, keeping only groups whose rewards differ until ``num_prompts_per_step``
    groups are collected or ``dynamic_sampling_max_gen_batches`` batches were drawn."""
    import torch

    from gym_bridge.train.advantages import samples_in_groups_with_variance

    stats: dict[str, float] = defaultdict(float)
    if not grpo.use_dynamic_sampling:
        samples, drawn = draw(data.next_batch(), 0, 1)
        stats.update(drawn)
        stats["generation_batches"] = 1.0
        return samples, stats
    samples: list[Sample] = []
    kept_groups, next_group, attempt = 0, 0, 0
    while kept_groups < grpo.num_prompts_per_step and attempt < grpo.dynamic_sampling_max_gen_batches:
        attempt += 1
        prompts = data.next_batch(math.ceil(grpo.num_prompts_per_step * grpo.batch_multiplier))
        new, drawn = draw(prompts, next_group, attempt)
        next_group += len(prompts)  # group ids stay unique across batches
        for key, value in drawn.items():
            stats[key] += value
        informative = samples_in_groups_with_variance(
            torch.tensor([s.reward for s in new]),
            torch.tensor([s.group for s in new]),
            torch.tensor([float(not s.masked) for s in new]),
        ).tolist()
        for group_id in sorted({s.group for s, keep in zip(new, informative, strict=True) if keep}):
            if kept_groups == grpo.num_prompts_per_step:
                break
            samples.extend(s for s in new if s.group == group_id)
            kept_groups += 1
    stats["generation_batches"] = float(attempt)
    return samples, stats


def step_advantages(grpo: Any, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantages (b,) and the loss's sample mask (b,): masked samples and, with
    ``overlong_filtering``, truncated ones are out of the loss (truncated ones still count in their
    group's baseline, as in NeMo RL)."""
    import torch

    from gym_bridge.train.advantages import grpo_advantages

    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    groups = torch.tensor([s.group for s in samples])
    valid = torch.tensor([float(not s.masked) for s in samples])
    advantages = grpo_advantages(rewards, groups, grpo, valid_mask=valid)
    sample_mask = valid.clone()
    if grpo.overlong_filtering:
        sample_mask *= torch.tensor([float(not s.truncated) for s in samples])
    return advantages, sample_mask


# ================================================================================================
# validation
# ================================================================================================


def validate(
    cfg: MasterConfig, sampler: OnlineSampler, prompts: list[Prompt], step: int, view: TerminalView
) -> dict[str, float]:
    """Accuracy (mean reward) per validation dataset: one completion per prompt, fixed seeds."""
    if not prompts:
        return {}
    limit = cfg.grpo.max_val_samples or len(prompts)
    chosen = prompts[:limit]
    batch = cfg.grpo.val_batch_size or len(chosen)
    started = time.perf_counter()
    samples: list[Sample] = []
    for start in range(0, len(chosen), batch):
        part = chosen[start : start + batch]
        seeds = [[rollout_seed(cfg.grpo.seed, 0, start + i, 0, salt=7)] for i in range(len(part))]
        got, _ = sampler.sample(part, 1, seeds, group_offset=start)
        samples.extend(got)
    rewards_by_dataset: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        rewards_by_dataset[s.dataset].append(s.reward)
    metrics: dict[str, float] = {
        "accuracy": _mean([s.reward for s in samples]),
        "num_samples": float(len(samples)),
        "gen_length_mean": _mean([float(s.generated_tokens) for s in samples]),
        "time_validation_s": time.perf_counter() - started,
    }
    if len(rewards_by_dataset) > 1:
        for name, rewards in rewards_by_dataset.items():
            metrics[f"accuracy/{name}"] = _mean(rewards)
    for s in samples[: cfg.logger.num_val_samples_to_print]:
        text = sampler.tokenizer.decode(
            [t for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m], skip_special_tokens=True
        )
        question = (s.record or {}).get("question") or ""
        view.print(f"  [val sample] {question!r} -> {text!r} reward={s.reward:g}")
    return metrics


# ================================================================================================
# the loop
# ================================================================================================


def train(cfg: MasterConfig, *, show_progress: bool = True) -> TrainResult:
    """Run GRPO as configured; resume from the latest checkpoint in ``checkpointing.checkpoint_dir``."""
    import torch
    from transformers.utils import logging as hf_logging

    from gym_bridge.train.config import config_to_yaml
    from gym_bridge.train.loss import ClippedPGLossFn

    hf_logging.disable_progress_bar()  # no "Writing model shards" bars between metric lines
    check_machine(cfg)  # keys this machine cannot honour are refused before the model loads
    grpo, policy = cfg.grpo, cfg.policy
    online = grpo.mode == "online"

    # --- checkpoints: find where to start -------------------------------------------------------
    checkpoints = CheckpointManager(
        cfg.checkpointing.checkpoint_dir,
        keep_top_k=cfg.checkpointing.keep_top_k,
        metric_name=cfg.checkpointing.metric_name,
        higher_is_better=cfg.checkpointing.higher_is_better,
    )
    resume = None
    if cfg.checkpointing.enabled:
        checkpoints.clean_leftovers()
        resume = checkpoints.latest()

    # --- model, reference, optimizer ------------------------------------------------------------
    seed_everything(grpo.seed)
    model, tokenizer = load_policy(policy.model_name, policy.tokenizer.name)
    if policy.tokenizer.chat_template:
        tokenizer.chat_template = policy.tokenizer.chat_template
    model.to(_dtype(policy.precision))
    if policy.sequence_packing.enabled:
        from gym_bridge.train.packing import require_packing_support

        require_packing_support(model, policy.model_name)
    threads, generation_threads = torch_threads(model)
    # The rollout process samples with transformers; Ray replicas and vLLM already run outside the
    # trainer's interpreter, so async GRPO with them keeps its producer in-process.
    rollout_process = (
        online
        and grpo.async_grpo.enabled
        and grpo.async_grpo.rollout_process
        and policy.generation.backend == "transformers"
    )
    if rollout_process:
        # The rollout process samples on its own cores meanwhile: leave them to it.
        threads = max(1, min(threads, (os.cpu_count() or 1) - generation_threads))
    torch.set_num_threads(threads)
    loss_fn = ClippedPGLossFn(cfg.loss_fn)
    reference = None
    if loss_fn.needs_reference_logprobs:  # the initial policy, frozen
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    if resume is not None:
        resume.load_weights(model)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    samples_per_step = grpo.num_prompts_per_step * grpo.num_generations_per_prompt
    updates_per_step = max(1, math.ceil(samples_per_step / policy.train_global_batch_size))
    optimizer, scheduler = build_optimizer(cfg, model, grpo.max_num_steps * updates_per_step)

    # --- data --------------------------------------------------------------------------------------
    def prompt_tokens(p: Prompt) -> int:
        tools = chat_tools(p.row["responses_create_params"].get("tools"))
        return len(render_prompt(tokenizer, p.messages(), tools))

    max_prompt = cfg.data.max_input_seq_length or policy.max_total_sequence_length
    if online:
        train_items, held_out = load_prompts(cfg.data, "train")
        train_items, dropped = drop_long_prompts(train_items, prompt_tokens, max_prompt)
    else:
        train_items, held_out, dropped = load_offline_groups(cfg.data), [], 0
    val_prompts = (load_prompts(cfg.data, "validation")[0] if cfg.data.validation else []) + held_out
    val_prompts, _ = drop_long_prompts(
        [p for p in val_prompts if p.env_name in cfg.env], prompt_tokens, max_prompt
    )
    data = TrainBatches(
        train_items,
        num_prompts_per_step=grpo.num_prompts_per_step,
        shuffle=cfg.data.shuffle,
        seed=grpo.seed,
        use_multiple_dataloader=cfg.data.use_multiple_dataloader,
        num_prompts_per_dataloader=cfg.data.num_prompts_per_dataloader,
        custom_dataloader=cfg.data.custom_dataloader,
    )

    # --- resume ------------------------------------------------------------------------------------
    step = 0
    validations: list[dict[str, Any]] = []
    if resume is not None:
        restored = resume.load_training_state(optimizer, scheduler)
        data.load_state_dict(restored["data"])
        step = int(restored["info"]["step"])
        validations = list(restored["info"].get("validations", []))

    log_dir = Path(cfg.logger.log_dir)
    logger = open_metrics_logger(cfg, resume_step=step if resume else None)
    view = TerminalView(grpo.max_num_steps, step, every=cfg.logger.print_every_steps, enabled=show_progress)
    if resume is not None:
        view.print(f"resuming from {resume.path} (step {step})")
    if dropped:
        view.print(f"dropped {dropped} training prompts longer than {max_prompt} tokens")
    last_train: dict[str, Any] = {}
    last_val: dict[str, Any] = validations[-1] if validations else {}

    with ExitStack() as stack:
        stack.callback(view.close)
        stack.callback(logger.close)
        needs_services = online or bool(val_prompts)
        asynchronous = online and grpo.async_grpo.enabled
        sampler = backend = None
        refit: Any = None  # loads a weights snapshot into whatever samples (async GRPO)
        if needs_services and rollout_process:
            from gym_bridge.train.rollout_worker import RolloutWorker

            view.print("starting the rollout process (async GRPO) ...")
            sampler = RolloutWorker(cfg, tokenizer, weights_snapshot(model), threads=generation_threads)
            stack.callback(sampler.close)
            refit = sampler.load_weights
        elif needs_services:
            from gym_bridge.generation.transformers_backend import TransformersBackend

            local = {
                "model_name": "policy",
                "seed": grpo.seed,
                "max_context": policy.max_total_sequence_length,
                "stop_token_ids": policy.generation.stop_token_ids or (),
            }
            if policy.generation.backend == "ray":  # replicas with their own weights, refit after each update
                from gym_bridge.generation.ray_backend import RayBackend

                generator = RayBackend(model, tokenizer, **local, **policy.generation.ray.model_dump())
                stack.callback(generator.close)
            elif policy.generation.backend == "vllm":  # GPU: an engine on the same weights, refit each step
                from gym_bridge.generation.vllm_backend import VllmBackend
                from gym_bridge.models.registry import resolve_model

                engine = policy.generation.vllm_cfg
                generator = VllmBackend(
                    resolve_model(policy.model_name).path,
                    model_name="policy",
                    stop_token_ids=policy.generation.stop_token_ids or (),
                    tensor_parallel_size=engine.tensor_parallel_size,
                    gpu_memory_utilization=engine.gpu_memory_utilization,
                    max_model_len=engine.max_model_len or policy.max_total_sequence_length,
                    enforce_eager=engine.enforce_eager,
                    seed=grpo.seed,
                    dtype=policy.precision,
                )
                stack.callback(generator.close)
                generator.update_weights(model)  # a resumed run's weights, not the directory's
            else:  # Async GRPO samples from its own copy of the policy, refit after every step.
                generator = TransformersBackend(
                    copy.deepcopy(model).eval() if asynchronous else model, tokenizer, **local
                )
            backend = GenerationTimer(generator, threads=generation_threads)
            runner = start_services(cfg, stack, backend)
            sampler = OnlineSampler(cfg, runner, tokenizer, backend)
            refit = backend.update_weights
        offline_sampler = None if online else OfflineSampler(cfg, tokenizer)

        pipeline: RolloutPipeline | None = None

        def run_validation() -> None:
            nonlocal last_val
            if sampler is None or not val_prompts:
                return
            if pipeline is not None:  # validate the trainer's current weights, not the sampler's
                metrics = pipeline.exclusive(
                    weights_snapshot(model), step, lambda: validate(cfg, sampler, val_prompts, step, view)
                )
            else:
                metrics = validate(cfg, sampler, val_prompts, step, view)
            logger.log(step, metrics, split="val")
            view.step(step, metrics, split="val")
            last_val = metrics
            validations.append({"step": step, **metrics})

        def rollouts(for_step: int) -> tuple[list[Sample], dict[str, float]]:
            """Step ``for_step``'s prompts -> completions and rewards (dynamic sampling refills)."""

            def draw(
                prompts: list[Any], group_offset: int, attempt: int
            ) -> tuple[list[Sample], dict[str, Any]]:
                if not online:
                    return offline_sampler.sample(prompts, group_offset)
                n = grpo.num_generations_per_prompt
                seeds = [
                    [rollout_seed(grpo.seed, for_step, 1000 * attempt + i, g) for g in range(n)]
                    for i in range(len(prompts))
                ]
                return sampler.sample(prompts, n, seeds, group_offset)

            return collect_samples(grpo, data, draw)

        def produce(for_step: int) -> tuple[list[Sample], dict[str, float], dict[str, Any]] | None:
            if data.epochs_done >= grpo.max_num_epochs:
                return None
            samples, stats = rollouts(for_step)
            return samples, {**stats, "epoch": data.epochs_done}, data.state_dict()

        if grpo.val_at_start and step == 0:
            run_validation()
        if asynchronous:
            pipeline = RolloutPipeline(
                produce,
                refit,
                first_step=step + 1,
                last_step=grpo.max_num_steps,
                max_age=grpo.async_grpo.max_trajectory_age_steps,
                initial_version=step,
            )
            stack.callback(pipeline.close)
            pipeline.publish(step, weights_snapshot(model))
        data_state, epochs_done = data.state_dict(), data.epochs_done

        while step < grpo.max_num_steps and epochs_done < grpo.max_num_epochs:
            step += 1
            step_started = time.perf_counter()

            # 1-2. prompts -> completions and rewards (made ahead of time by the pipeline when async)
            if pipeline is None:
                samples, step_stats = rollouts(step)
                data_state, epochs_done = data.state_dict(), data.epochs_done
            else:
                batch = pipeline.take(step)
                if batch is None:
                    break
                samples, step_stats = batch.samples, dict(batch.stats)
                data_state, epochs_done = batch.data_state, step_stats.pop("epoch")
                step_stats["time_waiting_for_rollouts_s"] = time.perf_counter() - step_started
                step_stats["trajectory_age_steps"] = float(step - 1 - batch.weights_version)
            if not samples:
                view.print(f"step {step}: no group with differing rewards; step skipped")
                continue

            # 3. advantages
            advantages, sample_mask = step_advantages(grpo, samples)

            # 4. log-probs of the step's starting policy and of the reference
            started = time.perf_counter()
            single_update = len(samples) <= policy.train_global_batch_size
            prev_logprobs = None if single_update else per_sample_logprobs(cfg, model, samples, pad_token_id)
            reference_logprobs = (
                per_sample_logprobs(cfg, reference, samples, pad_token_id) if reference is not None else None
            )
            step_stats["time_logprobs_s"] = time.perf_counter() - started

            # 5. updates
            started = time.perf_counter()
            train_metrics = update_policy(
                cfg,
                model,
                optimizer,
                scheduler,
                loss_fn,
                samples,
                advantages,
                sample_mask,
                prev_logprobs,
                reference_logprobs,
                pad_token_id,
            )
            step_stats["time_training_s"] = time.perf_counter() - started
            if pipeline is not None:
                pipeline.publish(step, weights_snapshot(model))
            elif backend is not None:  # Ray replicas refit; a no-op for a backend sharing the model
                backend.update_weights(model)

            # 6. metrics
            step_time = time.perf_counter() - step_started
            generated = sum(s.generated_tokens for s in samples)
            metrics = {
                **sample_metrics(samples, advantages),
                **train_metrics,
                **step_stats,
                "lr": scheduler.get_last_lr()[0],
                "time_step_s": step_time,
                "tokens_per_s": generated / step_time if step_time > 0 else float("nan"),
                "epoch": epochs_done,
            }
            if online and step_stats.get("time_generation_s"):
                metrics["generation_tokens_per_s"] = generated / step_stats["time_generation_s"]
            logger.log(step, metrics)
            view.step(step, metrics)
            data.set_records(reward=metrics["reward_mean"], step=step)
            last_train = metrics

            # validation and checkpoint
            last_step = step >= grpo.max_num_steps or epochs_done >= grpo.max_num_epochs
            periodic = bool(grpo.val_period) and step % grpo.val_period == 0
            if periodic or (last_step and grpo.val_at_end):
                run_validation()
            if cfg.checkpointing.enabled and (step % cfg.checkpointing.save_period == 0 or last_step):
                ranked = {f"train:{k}": v for k, v in metrics.items()}
                if last_val:
                    ranked.update({f"val:{k}": v for k, v in last_val.items()})
                checkpoints.save(
                    step,
                    model=model,
                    tokenizer=tokenizer,
                    optimizer=optimizer,
                    scheduler=scheduler,
                    data_state=data_state,
                    config_yaml=config_to_yaml(cfg),
                    metrics={k: v for k, v in ranked.items() if isinstance(v, (int, float))},
                    extra_info={"validations": validations},
                )

    curves = plot_curves(log_dir)
    return TrainResult(
        steps=step,
        log_dir=log_dir,
        checkpoint_dir=Path(cfg.checkpointing.checkpoint_dir) if cfg.checkpointing.enabled else None,
        last_train=last_train,
        validations=validations,
        resumed_from=resume.step if resume is not None else None,
        curves=curves,
    )
