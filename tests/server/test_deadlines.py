"""``gym_bridge.serving.deadlines``: many deadlines of one length served by one timer, on keys or on awaits; and
the request path's use of it (a body that stops arriving is cut off; a body that arrives leaves no
deadline behind).

The servers' own deadlines are held over real sockets in ``tests/reliability/test_slow_clients.py``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import uvloop

from gym_bridge.serving.deadlines import Deadlines, task_deadlines
from gym_bridge.serving.json_http import JsonApp, Route


def run(coro: Any, loop_kind: str) -> Any:
    loop = uvloop.new_event_loop() if loop_kind == "uvloop" else asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


LOOPS = pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])


@LOOPS
def test_each_key_expires_once_its_length_after_it_was_set_unless_cleared(loop_kind: str) -> None:
    async def main() -> dict[str, float]:
        loop = asyncio.get_running_loop()
        expired: dict[str, float] = {}
        deadlines = Deadlines(loop, 0.2, lambda key: expired.setdefault(key, loop.time()))
        start = loop.time()
        deadlines.set("a")
        deadlines.set("cleared")
        await asyncio.sleep(0.05)
        deadlines.set("b")
        deadlines.set("a")  # already set: keeps its first deadline
        deadlines.clear("cleared")
        deadlines.clear("never set")
        await asyncio.sleep(0.4)
        assert len(deadlines) == 0
        return {key: when - start for key, when in expired.items()}

    expired = run(main(), loop_kind)
    assert set(expired) == {"a", "b"}
    assert 0.19 <= expired["a"] < 0.3
    assert 0.24 <= expired["b"] < 0.35


@LOOPS
def test_one_timer_serves_a_stream_of_deadlines_and_stops_when_none_is_left(loop_kind: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        expired: list[int] = []
        deadlines = Deadlines(loop, 0.1, expired.append)
        for i in range(50):  # set and cleared at once, as a request's deadline usually is
            deadlines.set(i)
            if i % 10:
                deadlines.clear(i)
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.2)
        assert expired == [0, 10, 20, 30, 40]
        assert deadlines._timer is None and len(deadlines) == 0

    run(main(), loop_kind)


def test_a_failing_callback_does_not_keep_the_others_from_expiring() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        seen: list[str] = []
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: errors.append(context))

        def expire(key: str) -> None:
            seen.append(key)
            if key == "bad":
                raise RuntimeError("boom")

        deadlines = Deadlines(loop, 0.05, expire)
        for key in ("bad", "good"):
            deadlines.set(key)
        await asyncio.sleep(0.15)
        assert len(errors) == 1 and isinstance(errors[0]["exception"], RuntimeError)
        return seen

    assert run(main(), "asyncio") == ["bad", "good"]


def _app(body_timeout_s: float) -> JsonApp:
    async def echo(body: Any, _: Any) -> Any:
        return body

    return JsonApp([Route("POST", "/echo", echo, body=dict[str, Any], raw_json=True)], title="t",
                   body_timeout_s=body_timeout_s)  # fmt: skip


async def _call(app: JsonApp, chunks: list[bytes], stall: bool = False) -> tuple[int, bytes]:
    messages = [{"type": "http.request", "body": c, "more_body": True} for c in chunks]
    if not stall:
        messages[-1]["more_body"] = False

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # a client that stopped sending
        raise AssertionError("not cut off")

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/echo", "headers": [], "query_string": b""}
    await app(scope, receive, send)
    return sent[0]["status"], sent[1]["body"]


@LOOPS
def test_a_stalled_body_is_cut_off_and_a_sent_one_leaves_no_deadline_behind(loop_kind: str) -> None:
    async def main() -> None:
        app = _app(body_timeout_s=0.2)
        loop = asyncio.get_running_loop()
        for _ in range(3):
            assert await _call(app, [b'{"a"', b": 1}"]) == (200, b'{"a":1}')
        assert len(task_deadlines(0.2)) == 0
        start = loop.time()
        status, body = await _call(app, [b'{"a"'], stall=True)
        waited = loop.time() - start
        assert status == 408 and b"request body not received within 0.2 s" in body
        assert 0.19 <= waited < 1.5
        assert len(task_deadlines(0.2)) == 0
        assert await _call(app, [json.dumps({"b": 2}).encode()]) == (200, b'{"b":2}')  # the app serves on

    run(main(), loop_kind)


def test_a_cancellation_from_outside_is_not_taken_for_the_body_deadline() -> None:
    async def main() -> None:
        app = _app(body_timeout_s=30.0)
        task = asyncio.ensure_future(_call(app, [b"{"], stall=True))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(task_deadlines(30.0)) == 0

    run(main(), "asyncio")


@LOOPS
def test_an_await_past_its_deadline_ends_in_timeout_error_and_one_timer_serves_many(loop_kind: str) -> None:
    """``TaskDeadlines.within`` is ``asyncio.timeout`` with a shared timer: the result when in time,
    ``TimeoutError`` when not (the task goes on and can await again), a cancellation from elsewhere
    stays a cancellation."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadlines = task_deadlines(0.1)
        assert task_deadlines(0.1) is deadlines and task_deadlines(0.2) is not deadlines

        async def answer(after: float) -> str:
            await asyncio.sleep(after)
            return "done"

        assert await asyncio.gather(*(deadlines.within(answer(0.01)) for _ in range(20))) == ["done"] * 20
        start = loop.time()
        with pytest.raises(TimeoutError):
            await deadlines.within(answer(5))
        assert 0.09 <= loop.time() - start < 1.0
        assert await deadlines.within(answer(0.01)) == "done"  # the task was not left cancelled
        mixed = (deadlines.within(answer(after)) for after in (0.01, 5, 0.02, 5))
        results = await asyncio.gather(*mixed, return_exceptions=True)
        assert [type(r).__name__ if isinstance(r, BaseException) else r for r in results] == [
            "done", "TimeoutError", "done", "TimeoutError"]  # fmt: skip
        outside = asyncio.ensure_future(deadlines.within(answer(5)))
        await asyncio.sleep(0.01)
        outside.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outside
        assert len(deadlines) == 0

    run(main(), loop_kind)


def test_each_loop_has_its_own_shared_deadlines_and_a_let_go_one_still_expires() -> None:
    async def first() -> Any:
        return task_deadlines(0.1)

    a, b = run(first(), "asyncio"), run(first(), "asyncio")
    assert a is not b and a.loop is not b.loop

    async def many_lengths() -> None:
        held = task_deadlines(0.05)
        waiting = asyncio.ensure_future(held.within(asyncio.sleep(5)))
        await asyncio.sleep(0)
        for i in range(40):  # more lengths than are kept: the first ones are let go
            task_deadlines(1.0 + i)
        assert task_deadlines(0.05) is not held
        with pytest.raises(TimeoutError):
            await waiting  # ... and their deadlines still expire

    run(many_lengths(), "uvloop")
