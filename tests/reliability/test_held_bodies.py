"""Request bodies held at once are bounded per server, over real HTTP (``max_held_body_bytes``).

The per-request limit (16 MiB) bounds one body, not many clients each sending one at the limit. Here
the budget is 2 MB (the default is 256 MiB): while two uploads of 900 KB are in progress, a third that
declares 900 KB waits for room and goes through once one of them is answered, or gets 503 with
``Retry-After`` when no room comes within ``body_timeout_s``; a chunked body that streams past the budget
gets 503 at once. A body alone is never refused for the budget (only by the per-request limit).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from pydantic import BaseModel, Field

from gym_bridge.serving.server import ServerSettings, Session, tool
from gym_bridge.serving.uvicorn_thread import start_in_thread

from .envs import ArithmeticEnv

SIZE = 900_000
BODY = b'{"a": 1, "b": 2}' + b" " * (SIZE - 16)


def start_upload(url: str) -> socket.socket:
    """A POST whose body is sent but for its last 100 KB (the server holds what came)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    head = f"POST /add HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {SIZE}\r\n\r\n"
    sock.sendall(head.encode() + BODY[:-100_000])
    return sock


def finish_upload(sock: socket.socket) -> bytes:
    sock.sendall(BODY[-100_000:])
    answer = b""
    while b'{"sum":3}' not in answer and b"HTTP/1.1 5" not in answer:
        more = sock.recv(65536)
        if not more:
            break
        answer += more
    sock.close()
    return answer


def assert_busy(answer: httpx.Response) -> None:
    assert answer.status_code == 503, answer.text[:300]
    assert answer.headers["retry-after"] == "1"
    assert "the most request bodies it may at once (2000000 bytes)" in answer.json()["detail"]


def chunks() -> Iterator[bytes]:
    yield BODY[:300_000]
    yield BODY[300_000:600_000]
    yield BODY[600_000:]


def post(url: str, content: bytes | Iterator[bytes]) -> httpx.Response:
    return httpx.post(url + "/add", content=content, headers={"content-type": "application/json"}, timeout=10)


def wait_until_held(app: Any, nbytes: int) -> None:
    """Until the server holds ``nbytes`` of the uploads in progress (they arrive asynchronously). Read from the
    app's budget, not probed with requests: a probe that got in first would take their room."""
    deadline = time.monotonic() + 5
    while app.bodies.held < nbytes:
        assert time.monotonic() < deadline, f"the uploads in progress were never counted ({app.bodies.held} bytes)"
        time.sleep(0.02)


def test_a_body_waits_for_room_then_goes_through():
    env = ArithmeticEnv(ServerSettings(max_body_bytes=1_000_000, max_held_body_bytes=2_000_000))
    app = env.build_app()
    with start_in_thread(app) as running:
        url = running.url
        assert post(url, BODY).json() == {"sum": 3}
        first, second = start_upload(url), start_upload(url)
        wait_until_held(app, 2 * (SIZE - 100_000))
        assert_busy(post(url, chunks()))  # chunked: refused as soon as it passes the budget
        answers: list[httpx.Response] = []
        waiting = threading.Thread(target=lambda: answers.append(post(url, BODY)))
        waiting.start()
        time.sleep(0.5)
        assert not answers, "a body past the budget was read while the others were held"
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        assert b'{"sum":3}' in finish_upload(first)
        waiting.join(5)
        assert answers and answers[0].status_code == 200 and answers[0].json() == {"sum": 3}
        assert b'{"sum":3}' in finish_upload(second)
        assert post(url, chunks()).json() == {"sum": 3}  # everything released


class NapArgs(BaseModel):
    seconds: float = Field(ge=0, le=5)


class NappingEnv(ArithmeticEnv):
    @tool
    async def nap(self, args: NapArgs, session: Session) -> dict[str, Any]:
        """Answer after ``seconds``: a slow handler holds its request's body meanwhile."""
        await asyncio.sleep(args.seconds)
        return {"slept": args.seconds}


def test_a_body_that_gets_no_room_in_time_is_a_503():
    """Two slow requests hold 1.8 MB while they are handled; a third waits ``body_timeout_s`` (1 s), then 503."""
    settings = ServerSettings(max_body_bytes=1_000_000, max_held_body_bytes=2_000_000, body_timeout_s=1.0)
    app = NappingEnv(settings).build_app()
    with start_in_thread(app) as running:
        nap = b'{"seconds": 3}'
        nap += b" " * (SIZE - len(nap))
        with ThreadPoolExecutor(2) as pool:
            json_type = {"content-type": "application/json"}
            naps = [pool.submit(httpx.post, running.url + "/nap", content=nap, headers=json_type, timeout=10) for _ in range(2)]
            wait_until_held(app, 2 * SIZE)
            started = time.monotonic()
            assert_busy(post(running.url, BODY))
            assert 0.9 < time.monotonic() - started < 2.5
            assert [f.result().json() for f in naps] == [{"slept": 3.0}] * 2
        assert post(running.url, BODY).json() == {"sum": 3}


def test_a_body_alone_is_never_refused_for_the_budget():
    env = ArithmeticEnv(ServerSettings(max_body_bytes=1_000_000, max_held_body_bytes=100_000))
    with start_in_thread(env.build_app()) as running:
        for content in (BODY, chunks()):
            answer = httpx.post(running.url + "/add", content=content, headers={"content-type": "application/json"}, timeout=10)
            assert answer.status_code == 200 and answer.json() == {"sum": 3}


def test_bodies_declared_but_not_sent_hold_no_room():
    """Connections that declare bodies filling the budget and send none of them held it for ``body_timeout_s``
    (60 s by default): 16 heads declaring 16 MiB each kept every other body waiting, then answered 503, at
    the cost of a few header bytes, renewable. Only bytes that arrived are held now."""
    settings = ServerSettings(max_body_bytes=1_000_000, max_held_body_bytes=2_000_000, body_timeout_s=3.0)
    with start_in_thread(ArithmeticEnv(settings).build_app()) as running:
        host, port = running.url.removeprefix("http://").split(":")
        head = "POST /add HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
        silent = [socket.create_connection((host, int(port)), timeout=10) for _ in range(2)]  # 2 x 1 MB: the budget
        try:
            for sock in silent:
                sock.sendall(head.encode())
            time.sleep(0.3)  # the server has their heads: each is waiting for its body
            started = time.monotonic()
            small = httpx.post(running.url + "/add", json={"a": 1, "b": 2}, timeout=10)
            assert small.status_code == 200 and small.json() == {"sum": 3}, small.text
            assert post(running.url, BODY).json() == {"sum": 3}  # a whole 900 KB body too
            assert time.monotonic() - started < 2
        finally:
            for sock in silent:
                sock.close()
