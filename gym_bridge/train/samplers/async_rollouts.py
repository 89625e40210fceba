"""Asynchronous GRPO: the next steps' rollouts run while the current step trains.

A synchronous step is rollouts, then training; on CPU each phase leaves a core idle and the rollouts'
HTTP round trips leave both mostly idle. Here a producer thread samples step s+1's groups with a copy
of the policy while the trainer updates the policy on step s's groups (NeMo RL's ``async_grpo``).

Which weights sample which step is fixed, not raced: step s's rollouts use exactly the weights after
step ``s - 1 - max_age`` (the initial ones for the first steps), so a seeded run gives the same
completions every time. The trainer publishes a snapshot after each update; the producer waits for the
version it needs and loads it into the generation copy before the batch, so a batch never mixes
versions. The importance-sampling correction (``loss_fn.use_importance_sampling_correction``) accounts
for the difference between the sampling and the trained policy.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["RolloutBatch", "RolloutPipeline"]


@dataclass
class RolloutBatch:
    """One step's rollouts as the producer made them."""

    step: int
    samples: list[Any]
    stats: dict[str, float]
    weights_version: int
    """The trainer step whose weights sampled it (0: the initial weights)."""
    data_state: dict[str, Any]
    """The prompt loader's position after this batch's prompts (what a checkpoint after it saves)."""


class RolloutPipeline:
    """Runs ``produce(step)`` ahead of training in a thread, at most ``max_age`` steps ahead.

    ``produce(step)`` returns ``(samples, stats, data_state)``, or None when the prompts ran out; ``load_weights(weights)`` puts a published
    snapshot into the generation model. Publish the starting weights as ``initial_version`` first, then
    call :meth:`take` for each step in order, :meth:`publish` after each update, :meth:`exclusive` around anything else that generates (validation), :meth:`close` at
    the end.
    """

    def __init__(
        self,
        produce: Callable[[int], tuple[list[Any], dict[str, float], dict[str, Any]] | None],
        load_weights: Callable[[Any], None],
        *,
        first_step: int,
        last_step: int,
        max_age: int,
        initial_version: int = 0,
    ) -> None:
        self._produce = produce
        self._load_weights = load_weights
        self.max_age = max_age
        self._first_version = initial_version
        self._loaded_version: int | None = None
        self._published: dict[int, Any] = {}
        self._latest_version = initial_version
        self._versions = threading.Condition()
        self._generating = threading.Lock()  # held while a batch (or validation) generates
        self._ready: queue.Queue[RolloutBatch | BaseException | None] = queue.Queue(maxsize=max_age)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(first_step, last_step), name="rollout-producer", daemon=True
        )
        self._thread.start()

    def version_for(self, step: int) -> int:
        """The weights version that samples ``step``."""
        return max(self._first_version, step - 1 - self.max_age)

    def publish(self, version: int, weights: Any) -> None:
        """Make the weights after trainer step ``version`` available to the producer."""
        with self._versions:
            self._published[version] = weights
            self._latest_version = max(self._latest_version, version)
            # Keep only what a future batch can still ask for.
            for old in [v for v in self._published if v < version - self.max_age]:
                del self._published[old]
            self._versions.notify_all()

    def take(self, step: int) -> RolloutBatch | None:
        """Step ``step``'s rollouts (waits for them), None when the data ran out; re-raises the
        producer's error."""
        while True:
            try:
                item = self._ready.get(timeout=0.5)
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("the rollout producer stopped") from None
                continue
            if item is None or isinstance(item, BaseException):
                if item is None:
                    return None
                raise item
            if item.step != step:
                raise RuntimeError(f"rollouts for step {item.step} arrived when step {step} was expected")
            return item

    def exclusive(self, weights: Any, version: int, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` with the generation model to itself, holding ``weights`` (e.g. to validate them)."""
        with self._generating:
            self._load(weights, version)
            return fn()

    def close(self) -> None:
        self._stop.set()
        with self._versions:
            self._versions.notify_all()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._ready.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=60)

    # ------------------------------------------------------------------ producer thread

    def _load(self, weights: Any, version: int) -> None:
        if version != self._loaded_version:
            self._load_weights(weights)
            self._loaded_version = version

    def _wait_for(self, version: int) -> Any | None:
        with self._versions:
            while not self._stop.is_set():
                if version in self._published:
                    return self._published[version]
                self._versions.wait(timeout=0.5)
        return None

    def _run(self, first_step: int, last_step: int) -> None:
        for step in range(first_step, last_step + 1):
            version = self.version_for(step)
            waited = time.perf_counter()
            weights = self._wait_for(version)
            if self._stop.is_set():
                return
            try:
                with self._generating:
                    self._load(weights, version)
                    started = time.perf_counter()
                    produced = self._produce(step)
                if produced is None:  # out of data
                    item: RolloutBatch | BaseException | None = None
                else:
                    samples, stats, data_state = produced
                    stats = {
                        **stats,
                        "time_producer_wait_s": started - waited,
                        "time_producer_batch_s": time.perf_counter() - started,
                    }
                    item = RolloutBatch(step, samples, stats, version, data_state)
            except BaseException as exc:  # handed to the trainer, which raises it
                item = exc
            while not self._stop.is_set():
                try:
                    self._ready.put(item, timeout=0.5)
                    break
                except queue.Full:
                    continue
            if not isinstance(item, RolloutBatch):
                return
