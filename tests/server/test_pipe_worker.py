"""PipeWorker, the verifier pools' view of one worker process, and discard_start, on real processes and pipes."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import subprocess
import sys
import time

from gym_bridge.serving.pipe_worker import PipeWorker, discard_start


def test_a_check_is_answered_once_and_a_let_go_worker_is_killed() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        ours, theirs = mp.Pipe()
        w: PipeWorker[str] = PipeWorker(process=process, conn=ours, pid=process.pid)
        loop.add_reader(ours.fileno(), lambda: None)
        try:
            w.task_id, w.future = 1, loop.create_future()
            w.deadline = loop.call_later(60, lambda: None)
            first, deadline = w.future, w.deadline
            w.answer("ok")
            assert first.result() == "ok" and deadline.cancelled()
            assert (w.task_id, w.future, w.deadline) == (None, None, None)

            w.future = loop.create_future()
            pending = w.future
            assert w.detach(loop, "stopped") and not w.alive
            assert pending.result() == "stopped"
            assert not w.detach(loop, "again")  # let go once only
            assert not loop.remove_reader(ours.fileno())  # the pipe is off the loop already
            w.kill()
            assert process.wait(timeout=10) == -9 and ours.closed
        finally:
            process.kill()
            theirs.close()

    asyncio.run(main())


def test_a_failed_start_is_killed_reaped_and_its_pipe_closed() -> None:
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe()
    process = ctx.Process(target=time.sleep, args=(60,), daemon=True)
    process.start()
    discard_start(process, ours)
    assert process.exitcode == -9 and ours.closed
    theirs.close()
