"""Rollouts in a child process, so that async GRPO's sampling and training run on separate cores.

In one process the sampling side (policy server, agent loop, resources servers: mostly Python) and the
trainer share one interpreter lock, and overlapping them gained little. The worker process owns a
copy of the policy, the embedded policy server, the built-in environments and the agent loop; the
trainer sends it prompts and weights and gets :class:`~gym_bridge.train.batches.rollouts.Sample` lists back.
Only async GRPO uses it: synchronous steps wait for their rollouts anyway.
"""

from __future__ import annotations

import signal
import threading
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.multiprocessing
from transformers.utils import logging as hf_logging

from gym_bridge.generation.transformers_backend import TransformersBackend
from gym_bridge.generation.weights import MergedLoraWeights, tensor_identity
from gym_bridge.models.registry import load_model_and_tokenizer
from gym_bridge.rollout.env_router import ReplicaEndpoints
from gym_bridge.train.batches.rollouts import Sample
from gym_bridge.train.config import MasterConfig
from gym_bridge.train.samplers.data import Prompt
from gym_bridge.train.samplers.rollout_failures import TooManyFailedRollouts
from gym_bridge.train.samplers.sampling import OnlineSampler

__all__ = ["ProcessSampler", "RolloutProcessDied", "RolloutWorkerError"]


class RolloutWorkerError(RuntimeError):
    """The worker process failed; the message carries its traceback."""


class RolloutProcessDied(RolloutWorkerError):
    """The rollout process ended without answering (``kill -9``, the out-of-memory killer, a crash in native
    code): a run stop like a lost Ray actor, said in one line naming how it ended and the checkpoint a rerun
    resumes from (``gym-bridge train`` exits 2), not a traceback ending in "exit code None".

    The checkpoint is looked up when the message is read, not when the death is noticed: the producer thread
    notices it a step or two ahead, and the trainer saves the steps it already has before it stops."""

    def __init__(self, what: str, checkpoints: Any = None) -> None:
        super().__init__(what)
        self.what, self.checkpoints = what, checkpoints

    def __str__(self) -> str:
        if self.checkpoints is None:
            resume = "checkpointing is off, so a rerun starts over"
        elif (latest := self.checkpoints.latest()) is None:
            resume = "there is no checkpoint of this run yet, so a rerun starts over"
        else:
            resume = f"the same command resumes from the last complete checkpoint, {latest.path} (step {latest.step})"
        return f"{self.what}; the run cannot go on without it: {resume}"


DOING = {"ready": "starting", "sample": "sampling rollouts", "load_weights": "loading new weights"}
"""What the rollout process was asked to do, by command, as its death names it."""


class ProcessSampler:
    """Parent-side handle of the rollout process: a :class:`~gym_bridge.train.samplers.sampling.Sampler` whose
    :class:`~gym_bridge.train.samplers.sampling.OnlineSampler` runs in the child."""

    def __init__(
        self,
        cfg: MasterConfig,
        tokenizer: Any,
        weights: dict[str, Any],
        threads: int = 1,
        replicas: Mapping[str, ReplicaEndpoints] | None = None,
        checkpoints: Any = None,
    ) -> None:
        """``checkpoints`` (the run's checkpoint manager, None with checkpointing off) is asked for the
        latest checkpoint when the process dies, so the error names what a rerun resumes from."""
        # spawn: the trainer has threads, never fork it. Not a daemon: environments start their own
        # worker processes; the child exits when the pipe closes, even if the trainer dies.
        context = torch.multiprocessing.get_context("spawn")
        self.tokenizer = tokenizer
        self._checkpoints = checkpoints
        self._lock = threading.Lock()
        # Weights live in one shared-memory copy that the child's model uses as its own parameters: a
        # refit is one memcpy here and nothing in the child. Tied tensors (embeddings) stay one tensor.
        self._shared = _shared_copy(weights)
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, cfg, self._shared, threads, dict(replicas or {})), name="gym-bridge-rollouts"
        )
        self._process.start()
        child.close()
        self._call("ready")

    def sample(
        self, prompts: Sequence[Prompt], seeds: list[list[int]], group_offset: int = 0
    ) -> tuple[list[Sample], dict[str, float]]:
        return self._call("sample", list(prompts), seeds, group_offset)

    def load_weights(self, weights: dict[str, Any]) -> None:
        """Refit the worker's policy copy (called between batches, never while the worker samples)."""
        with self._lock:
            written: set[int] = set()
            for name, tensor in weights.items():
                target = self._shared[name]
                if id(target) not in written:  # a tied tensor once
                    target.copy_(tensor)
                    written.add(id(target))
        self._call("load_weights")

    def close(self) -> None:
        with self._lock:
            if self._process.is_alive():
                try:
                    self._conn.send(("close",))
                except (BrokenPipeError, OSError):
                    pass
            self._process.join(timeout=30)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
            self._conn.close()

    def _call(self, command: str, *args: Any) -> Any:
        with self._lock:
            try:
                self._conn.send((command, *args))
                ok, value = self._conn.recv()
            except (EOFError, BrokenPipeError, ConnectionResetError):
                raise self._died(command) from None
        if not ok:
            if isinstance(value, TooManyFailedRollouts):  # the run's error, not the process's
                raise value
            raise RolloutWorkerError(value)
        return value

    def _died(self, command: str) -> RolloutProcessDied:
        self._process.join(timeout=10)  # reap it: until then its exit code reads None
        code = self._process.exitcode
        if code is None:
            how = "stopped answering (its pipe closed)"
        elif code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = "a signal"
            oom = ", often the out-of-memory killer: see dmesg" if -code == signal.SIGKILL else ""
            how = f"was killed by {name} (signal {-code}{oom})"
        else:
            how = f"exited with code {code}"
        doing = DOING.get(command, command)
        return RolloutProcessDied(
            f"the rollout process (async GRPO, pid {self._process.pid}) {how} while {doing}", self._checkpoints
        )


def _shared_copy(weights: Any) -> dict[str, torch.Tensor]:
    """``weights`` copied into shared memory, tensors that share memory (tied ones) copied once."""
    copies: dict[Any, torch.Tensor] = {}
    shared = {}
    for name, tensor in weights.items():
        # A freshly merged tensor is freed after its copy, so its address says nothing: key it by name.
        fresh = isinstance(weights, MergedLoraWeights) and weights.is_merged(name)
        key = ("merged", name) if fresh else tensor_identity(tensor)
        if key not in copies:
            copies[key] = tensor.detach().clone().share_memory_()
        shared[name] = copies[key]
    return shared


def _serve(
    conn: Any, cfg: MasterConfig, shared: dict[str, Any], threads: int, replicas: dict[str, ReplicaEndpoints]
) -> None:
    """The child: build the policy copy and the services (env replicas: the trainer's), then answer
    the parent's calls."""
    sampler = None
    # A SIGTERM or a terminal's Ctrl-C (SIGINT) to the process group is the trainer's to handle (it finishes
    # its step, saves, and closes this process's pipe, which ends it): see gym_bridge.train.bookkeeping.graceful_stop
    for each in (signal.SIGTERM, signal.SIGINT):
        signal.signal(each, signal.SIG_IGN)
    try:
        hf_logging.disable_progress_bar()  # no loading bars between the trainer's lines
        torch.set_num_threads(threads)
        policy = cfg.policy
        model, tokenizer = load_model_and_tokenizer(
            policy.model_name, tokenizer_name=policy.tokenizer.name, chat_template=policy.tokenizer.chat_template
        )
        # The shared tensors become the parameters (the loaded ones are freed): one copy of the
        # weights between both processes, refit by the parent's memcpy.
        model.load_state_dict(shared, assign=True)
        model.eval()
        backend = TransformersBackend(
            model,
            tokenizer,
            model_name="policy",
            seed=cfg.grpo.seed,
            max_context=policy.max_total_sequence_length,
            stop_token_ids=policy.generation.stop_token_ids or (),
            logprobs_mode="processed",  # as the trainer's own log-probs are
            precision=policy.generation.precision,
        )
        sampler = OnlineSampler(cfg, backend, tokenizer, threads=threads, replicas=replicas)
        _answer_calls(conn, sampler, backend)
    except BaseException:  # start-up failed: tell the parent why, if it still listens
        try:
            conn.send((False, traceback.format_exc()))
        except (BrokenPipeError, OSError):
            pass
    finally:
        if sampler is not None:
            sampler.close()
        conn.close()


def _answer_calls(conn: Any, sampler: OnlineSampler, backend: TransformersBackend) -> None:
    while True:
        try:
            command, *args = conn.recv()
        except EOFError:
            return
        if command == "close":
            return
        try:
            if command == "ready":
                result: Any = True
            elif command == "sample":
                result = sampler.sample(*args)
            elif command == "load_weights":  # the parent wrote the model's own (shared) tensors
                result = backend.update_weights(backend.model)  # (a copy in another precision: refresh)
            else:
                raise ValueError(f"unknown command {command!r}")
            conn.send((True, result))
        except TooManyFailedRollouts as err:
            conn.send((False, err))
        except Exception:
            conn.send((False, traceback.format_exc()))
