"""``collect --workers N``: the rollouts run in N worker processes on this machine; this process writes the files.

Why: a collection against a fast model is bound by the one core that runs its event loop (about 1 ms of
CPU a math rollout, ``bench/README.md``), so a machine's other cores sat idle. As with ``--ray``
(:mod:`gym_bridge.collect.ray_shards`), the parent keeps everything the exactly-once and ``--resume``
guarantees rest on (task file, routing, materialized inputs, the one output file, failures, metrics), and
only the rollouts move: each worker (:mod:`gym_bridge.collect.local_worker`) starts its own envs and its
own HTTP pool, runs the rollouts it is sent and sends each back encoded as its output line
(:mod:`gym_bridge.collect.encoded`), so the parent's share of a rollout is little more than writing it.

Work is spread by slot, as on Ray: the run loop's worker ``i`` always uses process ``i mod N``, so each
holds ``concurrency / N`` rollouts in flight. A worker process that dies mid-run stops the run with its
number, process id and exit status named; the rollouts already written stay and ``--resume`` makes the
rest. The parent dying (even SIGKILL) closes the workers' sockets, and they end themselves.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gym_bridge.collect.config import CollectError
from gym_bridge.collect.encoded import EncodedRollout, decode
from gym_bridge.collect.frames import Outbox, read_frame, write_frame
from gym_bridge.collect.routing import EnvRoute
from gym_bridge.rollout.agent import AgentConfig

__all__ = ["WORKER_MODULE", "LocalShards"]

WORKER_MODULE = "gym_bridge.collect.local_worker"
T = TypeVar("T")


@dataclass(eq=False)
class _Worker:
    index: int
    proc: subprocess.Popen[bytes]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    outbox: Outbox
    pid: int = 0
    env_urls: dict[str, str] = field(default_factory=dict)
    pending: dict[int, asyncio.Future[Any]] = field(default_factory=dict)
    lost: CollectError | None = None
    rollouts: int = 0
    failed: int = 0


class LocalShards:
    """The parent's side of ``--workers N`` (a :class:`~gym_bridge.collect.run.RolloutExecutor`): start the
    worker processes (:meth:`start`), send each rollout to its slot's worker (:meth:`run`), count what each
    made (:meth:`run_metrics`), stop them (:meth:`close`); :meth:`around` does all but :meth:`run`."""

    same_machine = True
    """The rollouts run here: this machine's open-file and port limits bound how many are in flight."""

    def __init__(
        self, count: int, routes: list[EnvRoute], env_transport: str, *, report: Callable[[str], None] = print
    ) -> None:
        self.count, self.routes, self.env_transport, self.report = count, routes, env_transport, report
        self.workers: list[_Worker] = []
        self.readers: list[asyncio.Task[None]] = []
        self.ids = itertools.count()
        self.closing = False

    async def around(self, main: Coroutine[Any, Any, T], agent_config: AgentConfig, slots: int, hosts: int) -> T:
        """Start the workers, run ``main`` (the collection), then stop them, whatever ``main`` did."""
        try:
            await self.start(agent_config, slots, hosts)
        except BaseException:
            main.close()
            await self.close()
            raise
        try:
            return await main
        finally:
            await self.close()

    async def start(self, agent_config: AgentConfig, slots: int, hosts: int, timeout_s: float = 300.0) -> None:
        """Start :attr:`count` workers, each to hold up to ``slots`` rollouts against envs it starts itself
        and ``hosts`` servers over HTTP; wait until every one is ready (an env that does not start there
        is a :class:`CollectError` naming it)."""
        setup = {"routes": self.routes, "env_transport": self.env_transport, "agent_config": agent_config,
                 "slots": slots, "hosts": hosts}  # fmt: skip
        for i in range(self.count):
            ours, theirs = socket.socketpair()
            with theirs:
                proc = subprocess.Popen(
                    [sys.executable, "-m", WORKER_MODULE, str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                )  # fmt: skip
            reader, writer = await asyncio.open_connection(sock=ours)
            self.workers.append(_Worker(i, proc, reader, writer, Outbox(writer)))
            write_frame(writer, setup)
        for w in self.workers:
            try:
                answer = await asyncio.wait_for(read_frame(w.reader), timeout_s)
            except TimeoutError:
                raise CollectError(f"--workers: worker {w.index} (pid {w.proc.pid}) not ready after {timeout_s:.0f} s") from None
            if answer is None:
                raise CollectError(f"--workers: worker {w.index} (pid {w.proc.pid}) {await _ended(w.proc)} before it was ready")
            kind, detail = answer
            if kind != "ready":
                raise CollectError(f"--workers: worker {w.index}: {detail}")
            w.pid, w.env_urls = detail["pid"], detail["env_urls"]
        self.readers = [asyncio.ensure_future(self._read(w)) for w in self.workers]

    async def run(
        self, worker: int, task: dict[str, Any], env_name: str, agent_config: AgentConfig, extra: dict[str, Any] | None
    ) -> EncodedRollout:
        """Run the rollout on the slot's worker process (the agent config is the one it was started with)."""
        w = self.workers[worker % self.count]
        if w.lost is not None:
            raise w.lost
        job_id = next(self.ids)
        answer = w.pending[job_id] = asyncio.get_running_loop().create_future()
        w.outbox.put((job_id, task, env_name, extra))
        try:
            values = await answer
        finally:
            w.pending.pop(job_id, None)
        if values[0] == "raised":
            raise CollectError(f"--workers: worker {w.index} (pid {w.pid}): the agent raised {values[1]}")
        rollout = decode(values)
        if rollout.line is not None:
            w.rollouts += 1
        else:
            w.failed += 1
        return rollout

    async def _read(self, w: _Worker) -> None:
        """Hand each answer of ``w`` to its waiting :meth:`run`; when ``w``'s stream ends before
        :meth:`close`, the process is gone: every rollout waiting on it fails with the reason."""
        how = None
        try:
            while (answers := await read_frame(w.reader)) is not None:
                for job_id, values in answers:
                    waiting = w.pending.pop(job_id, None)
                    if waiting is not None and not waiting.done():
                        waiting.set_result(values)
        except Exception as e:  # a frame that does not unpickle: nothing more from it can be trusted
            how = f"sent a message that could not be read ({type(e).__name__}: {e})"
            w.proc.kill()
        if self.closing:
            return
        w.lost = CollectError(
            f"--workers: worker process {w.index} (pid {w.pid}) {how or await _ended(w.proc)} mid-run; the finished "
            "rollouts are written, rerun with --resume for the rest"
        )
        for waiting in w.pending.values():
            if not waiting.done():
                waiting.set_exception(w.lost)

    def run_metrics(self) -> dict[str, Any]:
        """``run.workers`` (how many processes) and ``run.worker_processes``: each one's pid and counts."""
        processes = [{"worker": w.index, "pid": w.pid, "rollouts": w.rollouts, "failed": w.failed} for w in self.workers]
        return {"workers": self.count, "worker_processes": processes}

    async def close(self) -> None:
        """Close each worker's socket (it cancels what it still runs and stops its envs), wait for it to
        exit, and kill one that does not within 30 s."""
        self.closing = True
        for w in self.workers:
            w.outbox.flush()
            w.writer.close()
        for w in self.workers:
            try:
                await asyncio.to_thread(w.proc.wait, 30.0)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                await asyncio.to_thread(w.proc.wait)
        for task in self.readers:
            task.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)


async def _ended(proc: subprocess.Popen[bytes]) -> str:
    """How ``proc`` ended, in words (waits up to 5 s for it to be reaped)."""
    try:
        code = await asyncio.to_thread(proc.wait, 5.0)
    except subprocess.TimeoutExpired:
        return "closed its end of the pipe"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"
