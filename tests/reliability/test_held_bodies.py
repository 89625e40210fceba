"""Request bodies held at once are bounded per server, over real HTTP: past the budget, 503 + Retry-After.

The per-request limit (16 MiB) bounds one body, not many clients each sending one at the limit. Here
the budget is 2 MB (the default is 256 MiB): two uploads of 900 KB in progress hold 1.6 MB, so a third
declaring 900 KB, or streaming past the budget without a length, is answered 503 at once; once the two
are answered the third goes through. A body alone is never refused for the budget (only by the limit).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx

from gym_bridge.server import ServerSettings, start_in_thread

from .envs import ArithmeticEnv

SIZE = 900_000
BODY = b'{"a": 1, "b": 2}' + b" " * (SIZE - 16)


def start_upload(url: str) -> socket.socket:
    """A POST whose body is sent but for its last 100 KB (the server holds what came)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    head = f"POST /add HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {SIZE}\r\n\r\n"
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


def refused_while_held(client: httpx.Client, **request: object) -> httpx.Response:
    """The answer to ``request`` once the server has read the held uploads (they arrive asynchronously)."""
    deadline = time.monotonic() + 5
    while True:
        answer = client.post("/add", headers={"content-type": "application/json"}, **request)  # type: ignore[arg-type]
        if answer.status_code == 503 or time.monotonic() > deadline:
            return answer
        time.sleep(0.1)


def assert_busy(answer: httpx.Response) -> None:
    assert answer.status_code == 503, answer.text[:300]
    assert answer.headers["retry-after"] == "1"
    assert "the most request bodies it may at once (2000000 bytes)" in answer.json()["detail"]


def chunks() -> Iterator[bytes]:
    yield BODY[:300_000]
    yield BODY[300_000:600_000]
    yield BODY[600_000:]


def test_bodies_past_the_budget_wait_for_the_held_ones():
    env = ArithmeticEnv(ServerSettings(max_body_bytes=1_000_000, max_held_body_bytes=2_000_000))
    with start_in_thread(env.build_app()) as running:
        with httpx.Client(base_url=running.url, timeout=10) as client:
            alone = client.post("/add", content=BODY, headers={"content-type": "application/json"})
            assert alone.json() == {"sum": 3}
            first, second = start_upload(running.url), start_upload(running.url)
            assert_busy(refused_while_held(client, content=BODY))  # declared: refused before it is read
            assert_busy(refused_while_held(client, content=chunks()))  # chunked: refused once past the budget
            assert client.get("/health").status_code == 200
            assert b'{"sum":3}' in finish_upload(first)
            assert b'{"sum":3}' in finish_upload(second)
            again = client.post("/add", content=BODY, headers={"content-type": "application/json"})
            assert again.status_code == 200 and again.json() == {"sum": 3}
            streamed = client.post("/add", content=chunks(), headers={"content-type": "application/json"})
            assert streamed.json() == {"sum": 3}


def test_a_body_alone_is_never_refused_for_the_budget():
    env = ArithmeticEnv(ServerSettings(max_body_bytes=1_000_000, max_held_body_bytes=100_000))
    with start_in_thread(env.build_app()) as running:
        for content in (BODY, chunks()):
            answer = httpx.post(running.url + "/add", content=content, headers={"content-type": "application/json"}, timeout=10)
            assert answer.status_code == 200 and answer.json() == {"sum": 3}
