"""A policy server one request cannot exhaust, over real HTTP, with the server under a memory cap.

The server runs in its own process under ``prlimit --as`` (address space), so a regression that makes
it swallow a huge prompt fails the test (the server dies or answers 5xx) instead of taking the machine.
Checked: a 200 MB prompt (declared, and streamed without a length) is refused (413) within a second;
a 15 MB prompt under the body limit is refused (400) before it is tokenized (in seconds, not minutes); a
prompt that must be tokenized to be found too long is tokenized off the event loop, so ``/health``
answers meanwhile; the process's resident memory stays bounded throughout.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
ADDRESS_SPACE = 8 * 1024**3
"""The server's cap: torch reserves a few GB of address space; a 200 MB body copied a few times would pass it."""

_SERVER = """
import sys
from gym_bridge.generation.transformers_backend import TransformersBackend
from gym_bridge.models.tiny import TinyRecipe, random_tiny_model
from gym_bridge.models.tokenizer import build_tokenizer
from gym_bridge.policy.server import build_policy_app
from gym_bridge.serving.uvicorn_thread import start_in_thread

tokenizer = build_tokenizer()
shape = TinyRecipe(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=2048)
backend = TransformersBackend(random_tiny_model(tokenizer, shape), tokenizer, model_name="capped")
running = start_in_thread(build_policy_app(backend, max_output_tokens=4, max_request_tokens=4096))
print(running.url, flush=True)
sys.stdin.read()
"""

pytestmark = pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux prlimit")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def capped_server() -> Iterator[tuple[str, subprocess.Popen]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = ["prlimit", f"--as={ADDRESS_SPACE}", sys.executable, "-c", _SERVER]
    proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()  # type: ignore[union-attr]
        assert url.startswith("http"), f"server did not start: {url!r}"
        yield url, proc
    finally:
        proc.kill()
        proc.wait()


class HealthProbe:
    """Polls ``/health`` from a thread; records the longest wait for an answer."""

    def __init__(self, url: str) -> None:
        self.url, self.longest, self.failures, self.answers = url, 0.0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    ok = client.get(self.url + "/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.longest = max(self.longest, time.monotonic() - start)
                self.answers += ok
                self.failures += not ok
                self._stop.wait(0.02)

    def wait_for(self, answers: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.answers < answers and time.monotonic() < deadline:
            time.sleep(0.01)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        self.wait_for(1)  # probing before the request under test goes out
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def raw_post(url: str, path: str, head_extra: str, body_chunks: Iterator[bytes]) -> tuple[int, bytes, float]:
    """POST over a raw socket, streaming the body until the server answers; (status, answer, seconds)."""
    host, port = url.removeprefix("http://").split(":")
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{head_extra}\r\n".encode())
        answer, pending = b"", b""
        chunks = iter(body_chunks)
        while b"\r\n\r\n" not in answer and time.monotonic() - start < 30:
            if not pending:
                pending = next(chunks, b"")
            readable, writable, _ = select.select([sock], [sock] if pending else [], [], 1.0)
            if readable:
                more = sock.recv(65536)
                if not more:
                    break
                answer += more
            elif writable:
                try:
                    pending = pending[sock.send(pending):]
                except (BrokenPipeError, ConnectionResetError):
                    pending = b""
        head, _, body = answer.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
        sock.setblocking(True)
        sock.settimeout(10)
        while len(body) < length:  # the body may come in a later packet than the headers
            more = sock.recv(65536)
            if not more:
                break
            body += more
        answer = head + b"\r\n\r\n" + body
    return int(answer.split(b" ", 2)[1]), answer, time.monotonic() - start


def huge_prompt_chunks(total: int, chunked: bool) -> Iterator[bytes]:
    head = b'{"messages": [{"role": "user", "content": "'
    piece = b"a" * (1 << 20)
    parts = [head] + [piece] * (total // len(piece))
    for part in parts:
        yield (f"{len(part):x}\r\n".encode() + part + b"\r\n") if chunked else part


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_200_mb_prompt_is_refused_within_a_second_while_health_answers(capped_server, chunked):
    url, proc = capped_server
    before = rss_mib(proc.pid)
    size = 200 * 1024 * 1024
    header = "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {size + 100}\r\n"
    with HealthProbe(url) as probe:
        status, answer, seconds = raw_post(url, "/v1/chat/completions", header, huge_prompt_chunks(size, chunked))
        probe.wait_for(probe.answers + 2)
    assert status == 413, answer[:300]
    assert b"larger than the limit" in answer
    assert seconds < 1.0
    assert probe.failures == 0 and probe.answers > 0
    assert proc.poll() is None
    assert rss_mib(proc.pid) - before < 100  # the 16 MB limit, not the 200 MB body


def test_a_15_mb_prompt_is_refused_before_it_is_tokenized(capped_server):
    url, proc = capped_server
    before = rss_mib(proc.pid)
    body = {"messages": [{"role": "user", "content": "word " * (3 * 1024 * 1024)}]}
    with HealthProbe(url) as probe:
        start = time.monotonic()
        answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
        seconds = time.monotonic() - start
    assert answer.status_code == 400, answer.text[:300]
    assert "cannot fit the model's context" in answer.json()["error"]["message"]
    assert answer.json()["error"]["param"] == "messages"
    assert seconds < 10.0  # tokenizing it took ~150 s before the check moved ahead of tokenizing
    assert probe.failures == 0
    assert rss_mib(proc.pid) - before < 300


def test_a_long_prompt_is_tokenized_off_the_event_loop(capped_server):
    """Text that might fit (under the bytes-per-token bound) is tokenized to know: on the tokenizer
    thread, so /health keeps answering while it runs."""
    url, _ = capped_server
    words = "ab " * 10_000  # 30,000 characters: under the bytes-per-token bound, ~20,000 tokens, over 2,048
    with HealthProbe(url) as probe:
        answers = []
        threads = [
            threading.Thread(target=lambda: answers.append(httpx.post(url + "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": words}]}, timeout=60)))
            for _ in range(4)
        ]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [a.status_code for a in answers] == [400] * 4
    assert all("over the model's context" in a.json()["error"]["message"] for a in answers)
    assert probe.failures == 0 and probe.answers >= 3
    assert probe.longest < 1.0, f"/health waited {probe.longest:.2f} s"


def test_n_and_request_tokens_are_capped_with_named_errors(capped_server):
    url, _ = capped_server
    message = [{"role": "user", "content": "hi"}]
    too_many = httpx.post(url + "/v1/chat/completions", json={"messages": message, "n": 20}, timeout=30)
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "n"
    assert json.loads(too_many.text)["error"]["message"].startswith("n: 20 is over this server's limit of 16")
    long = [{"role": "user", "content": "ab " * 500}]  # ~1,000 tokens: 8 completions hold ~8,000 > 4,096
    one = httpx.post(url + "/v1/chat/completions", json={"messages": long, "max_tokens": 10**9}, timeout=60)
    assert one.status_code == 200, one.text[:300]
    assert one.json()["usage"]["completion_tokens"] <= 4  # max_tokens is cut to the server's cap
    eight = httpx.post(url + "/v1/chat/completions", json={"messages": long, "n": 8}, timeout=60)
    assert eight.status_code == 400, eight.text[:300]
    error = eight.json()["error"]
    assert error["param"] == "messages"
    assert "tokens (n x (prompt + max output)), over this server's limit of 4096" in error["message"]
