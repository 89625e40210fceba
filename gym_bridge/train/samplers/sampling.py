"""Where a step's samples come from: one :class:`Sampler` protocol, three samplers behind it.

- :class:`OnlineSampler`: completions from the current policy through the same agent loop as
  ``collect`` (:func:`gym_bridge.rollout.agent.run_rollout`), served by the embedded OpenAI-compatible policy
  server over the generation backend and scored by the resources servers over HTTP (the embedded
  servers' apps called in-process when no env is given by URL: :mod:`gym_bridge.serving.in_process`).
  Token ids and log-probs come back on the output items, so nothing is re-tokenized.
- :class:`OfflineSampler`: the scored completions of offline groups (tokenized once, cached).
- :class:`~gym_bridge.train.samplers.rollout_worker.ProcessSampler`: an :class:`OnlineSampler` in a child
  process, so that async GRPO's sampling and training run on separate cores.

:func:`sample_step` draws a step's prompts and samples them, refilling with dynamic sampling (DAPO).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from typing import Any, Protocol

import torch

from gym_bridge.policy.server import build_policy_app
from gym_bridge.records.chat import items_to_messages
from gym_bridge.records.seeding import rollout_seed
from gym_bridge.rollout.agent import AgentConfig, make_session, run_rollout
from gym_bridge.rollout.env_router import ReplicaEndpoints, SessionRouter
from gym_bridge.rollout.envs import env_app, running_env
from gym_bridge.rollout.user_sim import UserSimConfig
from gym_bridge.serving.auth import bearer
from gym_bridge.serving.event_loop import new_event_loop
from gym_bridge.serving.in_process import InProcessClient
from gym_bridge.serving.retry import RetryPolicy
from gym_bridge.serving.uvicorn_thread import start_in_thread
from gym_bridge.train.algorithm.reward_components import informative_samples
from gym_bridge.train.batches.rollouts import (
    Sample,
    TurnMismatch,
    sequence_from_chat,
    sequence_from_items,
    sequence_from_text,
)
from gym_bridge.train.config import ConfigError, MasterConfig
from gym_bridge.train.samplers.data import OfflineGroup, Prompt, TrainBatches
from gym_bridge.train.samplers.rollout_failures import BadReward, FailureTally, TooManyFailedRollouts
from gym_bridge.train.samplers.rollout_timeouts import RolloutDeadline, is_timed_out, zero_reward_record

__all__ = [
    "GenerationTimer",
    "OfflineSampler",
    "OnlineSampler",
    "Sampler",
    "produce_step",
    "sample_step",
]


class Sampler(Protocol):
    """Turns prompts into scored :class:`Sample` lists; what the training loop and validation call."""

    tokenizer: Any

    def sample(
        self, prompts: Sequence[Any], seeds: list[list[int]], group_offset: int = 0
    ) -> tuple[list[Sample], dict[str, float]]:
        """``len(seeds[i])`` completions of ``prompts[i]`` (group ``group_offset + i``), and timings.

        ``seeds[i][g]`` seeds completion g of prompt i (offline groups carry their completions and
        their count already)."""
        ...

    def load_weights(self, weights: Any) -> None:
        """Refit the sampling policy with a model or a ``state_dict`` (a no-op where it is shared)."""
        ...

    def close(self) -> None: ...


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
            torch.set_num_threads(self.threads)  # this thread's OpenMP team; the trainer's is its own
            self._thread_configured.done = True
        started = time.perf_counter()
        results = self.backend.generate(requests)
        self.seconds += time.perf_counter() - started
        self.tokens += sum(len(r.token_ids) for r in results)
        self.calls += 1
        return results


class OnlineSampler:
    """Completions for prompts through the agent loop, as :class:`Sample` lists.

    Starts (or connects to) the resources servers of ``cfg.env`` and serves ``backend`` on loopback;
    the rollouts run concurrently on a private event loop whose HTTP session (keep-alive) lasts the run.
    ``in_process`` (when every env is built in, none given by URL or replicated): the policy and env
    apps run on that loop and are called without a socket (:mod:`gym_bridge.serving.in_process`: same
    requests and answers, a fraction of the CPU); False serves them over loopback HTTP. ``replicas``:
    where the ``env.<name>.replicas`` envs' replicas listen (started by the trainer,
    :mod:`gym_bridge.train.samplers.env_replicas`); their sessions are spread by a
    :class:`~gym_bridge.rollout.env_router.SessionRouter` each.
    """

    def __init__(
        self,
        cfg: MasterConfig,
        backend: Any,
        tokenizer: Any,
        *,
        threads: int | None = None,
        in_process: bool = True,
        replicas: Mapping[str, ReplicaEndpoints] | None = None,
    ) -> None:
        self.cfg = cfg
        self.replicas = dict(replicas or {})
        self.routers: dict[str, SessionRouter] = {}
        self.in_process = in_process and all(env.url is None and not env.replicas for env in cfg.env.values())
        self._client: InProcessClient | None = None
        self.tokenizer = tokenizer
        self.timer = GenerationTimer(backend, threads=threads)
        self.max_concurrency = max(256, cfg.grpo.samples_per_step)
        self.deadline = RolloutDeadline(cfg.grpo)
        self._services = ExitStack()
        self._session: Any = None
        self._loop = new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="rollout-loop", daemon=True)
        self._loop_thread.start()
        try:
            self._start_services()
        except BaseException:
            self.close()
            raise

    def _start_services(self) -> None:
        cfg = self.cfg
        self.env_urls: dict[str, str | SessionRouter] = {}
        apps: dict[str, Any] = {}  # in-process: name -> ASGI app, mounted on the rollout loop below
        for name, env in cfg.env.items():
            if env.url is not None:
                self.env_urls[name] = env.url.rstrip("/")
            elif env.replicas:
                if name not in self.replicas:
                    raise ValueError(f"env.{name}.replicas: no replica endpoints were given for it")
                self.env_urls[name] = self.routers[name] = SessionRouter(name, self.replicas[name])
            else:
                try:
                    if self.in_process:
                        apps[name] = env_app(env.server or name, workers=env.num_workers, **env.config)
                    else:
                        started = running_env(env.server or name, workers=env.num_workers, **env.config)
                        self.env_urls[name] = self._services.enter_context(started)
                except ValueError as err:
                    if env.num_workers is None or "worker pool" not in str(err):
                        raise
                    raise ConfigError([f"env.{name}.num_workers: {err}"]) from None
        generation = cfg.policy.generation
        app = build_policy_app(
            self.timer,
            model_name="policy",
            return_token_ids=True,  # training fields on every output item: no re-tokenization
            max_batch_size=cfg.policy.generation_batch_size,
            # A step's requests reach the policy server over ~20-60 ms (each rollout opens its env session
            # first); a batch that waits for all of them runs one decode loop instead of two. A full batch
            # starts at once, so the wait only costs when fewer requests than a batch are in flight.
            batch_wait_ms=100.0,
            max_output_tokens=generation.max_new_tokens,
        )
        if self.in_process:
            self._client = InProcessClient()
            urls = self._on_loop(_mount_all(self._client, {"policy": app, **{f"env-{n}": a for n, a in apps.items()}}))
            policy_url = urls.pop("policy")
            self.env_urls.update({n: urls[f"env-{n}"] for n in apps})
        else:
            policy_url = self._services.enter_context(start_in_thread(app)).url
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
        # One attempt of a model request may take 600 s; of an environment request (session set-up,
        # tool calls, /verify), env.<name>.timeout_s. Three attempts each, then the rollout fails. A timed
        # out model request is not sent again: the embedded server is still working on it.
        model_retry = RetryPolicy(max_attempts=3, request_timeout=600.0, retry_timeouts=False)
        self.agent_configs = {
            name: AgentConfig(
                model_url=f"{policy_url}/v1",
                max_steps=env.max_steps or cfg.grpo.max_rollout_turns,
                overrides=dict(overrides),
                model_retry=model_retry,
                env_retry=RetryPolicy(max_attempts=3, request_timeout=env.timeout_s),
                env_headers=bearer(self._env_token(name)),
                user=UserSimConfig(
                    model_url=f"{policy_url}/v1" if env.user_model_url == "policy" else env.user_model_url,
                    responses_create_params=dict(env.user_params),
                    retry=model_retry,
                    max_user_turns=env.max_user_turns,
                    max_conversation_tokens=env.max_conversation_tokens,
                ),
            )
            for name, env in cfg.env.items()
        }

    def _env_token(self, name: str) -> str | None:
        """The bearer token env ``name`` wants: its ``api_key``, or its replicas' run token."""
        endpoints = self.replicas.get(name) if self.cfg.env[name].replicas else None
        return endpoints.token if endpoints is not None else self.cfg.env[name].api_key

    # ------------------------------------------------------------------ the Sampler protocol

    def sample(
        self, prompts: Sequence[Prompt], seeds: list[list[int]], group_offset: int = 0
    ) -> tuple[list[Sample], dict[str, float]]:
        self.timer.reset()
        deadline = self.deadline.seconds()
        started, cpu_started = time.perf_counter(), time.process_time()
        results = self._on_loop(self._rollouts(prompts, seeds, deadline))
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        policy = self.cfg.grpo.on_rollout_timeout
        timed_out_groups = {i for (i, _), result in results if is_timed_out(result)}
        samples: list[Sample] = []
        failures = FailureTally()
        dropped = scored_zero = 0
        for (i, prompt), result in results:
            if policy == "drop_group" and i in timed_out_groups and result.ok:
                dropped += 1  # a sibling of a timed-out rollout: its group leaves the batch
                continue
            try:
                if result.ok:
                    sample = self.to_sample(result.record, i + group_offset, prompt)
                elif is_timed_out(result) and policy == "zero_reward" and result.partial_output:
                    sample = self._zero_reward_sample(result, results, i, group_offset, prompt)
                    scored_zero += sample is not None
                else:
                    failure = result.failure
                    message = failure.message
                    if failure.failure_class == "rollout_timeout":
                        how = "set" if self.cfg.grpo.rollout_timeout_s is not None else "automatic"
                        message += f" (grpo.rollout_timeout_s: {how})"
                    elif "attempt" not in message:
                        message += f" ({failure.attempts} attempts)"
                    failures.add(f"{failure.stage}/{failure.failure_class}", message)
                    continue
            except TurnMismatch as err:
                failures.add("sequence/turn_mismatch", str(err))
                continue
            except BadReward as err:
                failures.add("verify/bad_reward", str(err))
                continue
            if sample is None:
                failures.add("sequence/no_token_ids", "the rollout's output items carry no token ids")
                continue
            if sample.masked:  # kept out of the loss, but counted: a judge down masks every sample
                failures.add_masked(sample.record or {})
            samples.append(sample)
        # The pace the next batch's automatic deadline builds on: rollouts that needed no timed-out retry.
        in_time = [r.metrics.total_s for _, r in results if r.ok and not r.metrics.timeouts]
        self.deadline.observe(in_time)
        self._report_lost_replicas()
        in_loss = any(not s.masked for s in samples)
        failures.check(len(results), self.cfg.grpo.max_failed_rollouts_fraction, any_kept=in_loss)
        stats = {
            "time_rollouts_s": wall,
            "time_generation_s": self.timer.seconds,
            "time_reward_and_http_s": max(0.0, wall - self.timer.seconds),
            # CPU of every thread of the sampling process (the rollout process's, in async GRPO):
            # what the rollouts cost, whatever else the machine runs.
            "time_rollouts_cpu_s": cpu,
            "rollouts_requested": len(results),
            "rollout_failures": failures.count,
            # kept in the batch but out of the loss: the env set mask_sample (a judge that failed)
            "rollouts_masked": failures.masked_count,
            # Cut off at the rollout deadline, and what became of their groups (grpo.on_rollout_timeout).
            "rollouts_timed_out": sum(is_timed_out(r) for _, r in results),
            "groups_dropped_for_timeout": len(timed_out_groups) if policy == "drop_group" else 0,
            "rollouts_dropped_with_group": dropped,
            "rollouts_scored_zero_for_timeout": scored_zero,
            # HTTP attempts sent again (any cause), and attempts that ran out of their request timeout:
            # a request retried after a timeout is counted here, never silent.
            "request_retries": sum(r.metrics.retries for _, r in results),
            "request_timeouts": sum(r.metrics.timeouts for _, r in results),
            "generate_calls": self.timer.calls,
        }
        if deadline is not None:
            stats["rollout_deadline_s"] = deadline
        if in_time:
            stats["rollout_slowest_s"] = max(in_time)
        if self.routers:  # how many env replicas stopped answering so far (they get no new sessions)
            stats["env_replicas_lost"] = sum(len(r.replicas) - r.alive for r in self.routers.values())
        return samples, stats

    def _zero_reward_sample(
        self, result: Any, results: list[tuple[Any, Any]], i: int, group_offset: int, prompt: Prompt
    ) -> Sample | None:
        """A timed-out rollout as a sample of what it generated, scored 0 (``on_rollout_timeout:
        zero_reward``), with 0 for each reward component its group's other rollouts carry."""
        names = {
            name
            for (j, _), other in results
            if j == i and other.ok
            for name in (other.record.get("reward_components") or {})
        }
        record = zero_reward_record(prompt.row, result.failure.message, result.partial_output, names)
        return self.to_sample(record, i + group_offset, prompt)

    def _report_lost_replicas(self) -> None:
        """Say once, on stderr, which env replica stopped answering and how many are left."""
        for router in self.routers.values():
            for replica in router.newly_lost:
                print(
                    f"warning: {replica.label} stopped answering ({replica.lost}); new sessions go to the "
                    f"{router.alive} replica(s) left",
                    file=sys.stderr,
                    flush=True,
                )
            router.newly_lost.clear()

    def load_weights(self, weights: Any) -> None:
        self.timer.backend.update_weights(weights)

    def close(self) -> None:
        if self._loop.is_running():
            if self._session is not None:
                self._on_loop(self._session.close())
            if self._client is not None:
                self._on_loop(self._client.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=10)
        self._loop.close()
        self._services.close()

    # ------------------------------------------------------------------ internals

    def _on_loop(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the rollout loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _rollouts(
        self, prompts: Sequence[Prompt], seeds: list[list[int]], deadline: float | None = None
    ) -> list[tuple[Any, Any]]:
        """Every (prompt, seed) through the agent loop, each within ``deadline`` seconds (None: no
        rollout deadline); results in prompt-then-seed order."""
        client: Any = self._client
        if client is None:
            if self._session is None:  # created on the loop's thread, kept for later steps
                self._session = make_session(max_connections=2 * self.max_concurrency)
            client = self._session
        limit = asyncio.Semaphore(self.max_concurrency)
        configs = {
            name: dataclasses.replace(config, rollout_timeout_s=deadline)
            for name, config in self.agent_configs.items()
        }

        async def one(prompt: Prompt, seed: int) -> Any:
            env = prompt.env_name or ""
            async with limit:
                return await run_rollout(
                    client, prompt.row, self.env_urls[env], configs[env], extra_params={"seed": seed}
                )

        jobs = [(i, p, seed) for i, p in enumerate(prompts) for seed in seeds[i]]
        results = await asyncio.gather(*(one(p, seed) for _, p, seed in jobs))
        return [((i, p), r) for (i, p, _), r in zip(jobs, results, strict=True)]

    def to_sample(self, record: dict[str, Any], group: int, prompt: Prompt) -> Sample | None:
        """The record as a training sequence; None without token ids; raises :class:`TurnMismatch`, and
        :class:`BadReward` when the record's reward is not a finite number or its ``mask_sample`` is
        neither a boolean nor null."""
        reward = record.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            # a null reward trained as 0, a string crashed the run, NaN made every weight NaN
            raise BadReward(f"the verify answer's reward is {json.dumps(reward)[:60]}, not a finite number")
        mask_sample = record.get("mask_sample")
        if mask_sample is not None and not isinstance(mask_sample, bool):  # "false" had masked it: bool("false")
            raise BadReward(f"the verify answer's mask_sample is {json.dumps(mask_sample)[:60]}, not a boolean")
        response = record.get("response") or {}
        built = sequence_from_items(response.get("output") or [])
        if built is None:
            return None
        token_ids, mask, logprobs, turns = built
        incomplete = (response.get("incomplete_details") or {}).get("reason") == "max_output_tokens"
        sample = Sample(
            group=group,
            token_ids=token_ids,
            loss_mask=mask,
            reward=float(reward),
            generation_logprobs=logprobs,
            truncated=incomplete or self._hit_length_limit(token_ids, mask),
            masked=mask_sample is True,
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


async def _mount_all(client: InProcessClient, apps: dict[str, Any]) -> dict[str, str]:
    """Start each app on the running loop; name -> its base URL."""
    return {name: await client.mount(name, app) for name, app in apps.items()}


_Sequence = tuple[list[int], list[int], "list[float] | None", float]


class OfflineSampler:
    """The scored completions of offline groups as :class:`Sample` lists (tokenized once, cached)."""

    def __init__(self, cfg: MasterConfig, tokenizer: Any) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self._cache: dict[tuple[str, int], list[_Sequence]] = {}

    def sample(
        self, prompts: Sequence[OfflineGroup], seeds: list[list[int]] | None = None, group_offset: int = 0
    ) -> tuple[list[Sample], dict[str, float]]:
        started = time.perf_counter()
        samples = []
        for g, group in enumerate(prompts):
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

    def load_weights(self, weights: Any) -> None:
        """Nothing to refit: the completions were sampled before the run."""

    def close(self) -> None:
        """Nothing to stop."""

    def _sequences(self, group: OfflineGroup) -> list[_Sequence]:
        key = (group.dataset, group.idx)
        if key not in self._cache:
            self._cache[key] = [self._sequence(group, completion) for completion in group.completions]
        return self._cache[key]

    def _sequence(self, group: OfflineGroup, completion: Any) -> _Sequence:
        logprobs = None
        if completion.output_items is None:
            token_ids, mask = sequence_from_text(self.tokenizer, group.messages, completion.text or "", group.tools)
            return token_ids, mask, logprobs, completion.reward
        from_items = sequence_from_items(completion.output_items)
        if from_items is not None:
            token_ids, mask, logprobs, _ = from_items
        else:
            messages = items_to_messages(completion.output_items)
            token_ids, mask = sequence_from_chat(self.tokenizer, group.messages, messages, group.tools)
        return token_ids, mask, logprobs, completion.reward


# ------------------------------------------------------------------ one step's samples


_LARGEST_OF_BATCHES = frozenset({"rollout_deadline_s", "rollout_slowest_s", "env_replicas_lost"})
"""Batch stats that are a level, not a count: a step of several batches logs the largest, not the sum."""


def sample_step(
    cfg: MasterConfig, sampler: Sampler, data: TrainBatches, step: int
) -> tuple[list[Sample], dict[str, float]]:
    """The step's samples: one batch of prompts, or with dynamic sampling (DAPO) batches until
    ``num_prompts_per_step`` groups whose rewards differ are kept or ``dynamic_sampling_max_gen_batches``
    batches were drawn. Completion g of prompt i in batch ``attempt`` is seeded by
    ``rollout_seed(seed, step, attempt, i, g)``."""
    grpo = cfg.grpo
    n = grpo.num_generations_per_prompt
    stats: dict[str, float] = defaultdict(float)
    if not grpo.use_dynamic_sampling:
        prompts = data.next_batch()
        seeds = [[rollout_seed(grpo.seed, step, 1, i, g) for g in range(n)] for i in range(len(prompts))]
        samples, drawn = _sample_batch(sampler, prompts, seeds, 0, step)
        stats.update(drawn)
        stats["generation_batches"] = 1.0
        return samples, stats
    samples = []
    kept_groups, next_group, attempt = 0, 0, 0
    generated_rewards: list[float] = []
    informative_groups, generated_groups = 0, 0
    while kept_groups < grpo.num_prompts_per_step and attempt < grpo.dynamic_sampling_max_gen_batches:
        attempt += 1
        prompts = data.next_batch(math.ceil(grpo.num_prompts_per_step * grpo.batch_multiplier))
        seeds = [[rollout_seed(grpo.seed, step, attempt, i, g) for g in range(n)] for i in range(len(prompts))]
        new, drawn = _sample_batch(sampler, prompts, seeds, next_group, step)
        next_group += len(prompts)  # group ids stay unique across batches
        for key, value in drawn.items():
            stats[key] = max(stats.get(key, value), value) if key in _LARGEST_OF_BATCHES else stats[key] + value
        generated_rewards += [s.reward for s in new]
        informative = informative_samples(new, grpo)  # the rewards the advantages use (components with GDPO)
        kept_here = sorted({s.group for s, keep in zip(new, informative, strict=True) if keep})
        informative_groups += len(kept_here)
        generated_groups += len({s.group for s in new})
        for group_id in kept_here:
            if kept_groups == grpo.num_prompts_per_step:
                break
            samples.extend(s for s in new if s.group == group_id)
            kept_groups += 1
    stats["generation_batches"] = float(attempt)
    # what was sampled, not only what was kept: reward_mean is over the kept groups, which dynamic
    # sampling chose for having right and wrong answers both
    if generated_rewards:
        stats["generated_reward_mean"] = sum(generated_rewards) / len(generated_rewards)
    if generated_groups:
        stats["informative_group_fraction"] = informative_groups / generated_groups
    return samples, stats


def _sample_batch(
    sampler: Sampler, prompts: Sequence[Any], seeds: list[list[int]], group_offset: int, step: int
) -> tuple[list[Sample], dict[str, float]]:
    """One generation batch; a :class:`TooManyFailedRollouts` names the step."""
    try:
        return sampler.sample(prompts, seeds, group_offset)
    except TooManyFailedRollouts as err:
        raise err.at_step(step) from None


def produce_step(
    cfg: MasterConfig, sampler: Sampler, data: TrainBatches, step: int
) -> tuple[list[Sample], dict[str, float], dict[str, Any]] | None:
    """:func:`sample_step` for async GRPO's producer: also the epoch and the loader's position after it;
    None once ``grpo.max_num_epochs`` are done."""
    if data.epochs_done >= cfg.grpo.max_num_epochs:
        return None
    samples, stats = sample_step(cfg, sampler, data, step)
    return samples, {**stats, "epoch": data.epochs_done}, data.state_dict()
