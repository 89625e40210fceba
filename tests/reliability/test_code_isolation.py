"""One code task cannot change another's result, and the tests of one task cannot see each other (issue 12
item 2), over real HTTP against ``gym-bridge serve code`` with its shipped limits (4 s CPU per test,
9 s wall clock, one sandbox per core).

* A program whose parent sleeps while 15 children, each in its own session (``setsid()``), spin is
  charged for all of their CPU: it scores 0 as a timeout once the tree has used 4 s, long before the
  wall clock, and a correct program that needs 2.5 s of CPU, verified at the same time, still scores 1.
* A file a test writes to ``/tmp`` (or its working directory) is gone when the next test starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .code_http import answer, descendants, serving_code, task
from .procs import cli

SPINNER = """
import os, time
for _ in range(15):  # as many as the sandbox's process limit (16, the harness included) allows
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.setsid()
        while True:
            pass
time.sleep(60)
print(3)
"""
CPU_HUNGRY = """
import time
while time.process_time() < 2.5:
    pass
a, b = map(int, input().split())
print(a + b)
"""
SUM = task(["1 2\n"], ["3\n"])


@pytest.fixture(scope="module")
def code_server() -> Iterator[tuple[str, int]]:
    with serving_code(cli("serve", "code", "--port", "0")) as (url, proc, _):
        yield url, proc.pid


def _wait_for_no_descendants(pid: int, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := descendants(pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_spinning_setsid_children_are_charged_and_cannot_fail_a_concurrent_correct_program(
    code_server: tuple[str, int],
) -> None:
    url, server_pid = code_server

    async def both() -> tuple[tuple[dict[str, Any], float], dict[str, Any]]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:

            async def post(code: str) -> tuple[dict[str, Any], float]:
                started = time.monotonic()
                response = await client.post("/verify", json={**SUM, "response": answer(code)})
                assert response.status_code == 200, response.text
                return response.json(), time.monotonic() - started

            spinner = asyncio.ensure_future(post(SPINNER))
            await asyncio.sleep(0.3)  # the spinners are running when the correct program starts
            correct, _ = await post(CPU_HUNGRY)
            return await spinner, correct

    (spun, spun_s), correct = asyncio.run(both())
    assert correct["reward"] == 1.0, (correct.get("failure_kind"), correct.get("failure_reason"))
    assert spun["reward"] == 0.0 and spun["failure_kind"] == "timeout", spun.get("failure_reason")
    test = spun["tests"][0]
    assert test["cpu_s"] >= 4.0  # the children's CPU, not the sleeping parent's
    assert test["wall_s"] < 9.0, test  # stopped by the CPU limit of the tree, before the wall clock
    assert spun_s < 9.0
    assert _wait_for_no_descendants(server_pid) == []


def test_each_test_of_a_task_starts_from_a_fresh_tmp(code_server: tuple[str, int]) -> None:
    url, server_pid = code_server
    program = """
import os
seen = sorted(n for d in ("/tmp", ".", "/dev/shm", "/var/tmp") if os.path.isdir(d)
              for n in os.listdir(d) if n.startswith("left-"))
for d in ("/tmp", ".", "/dev/shm", "/var/tmp"):
    try:
        os.makedirs(f"{d}/left-dir/sub", exist_ok=True)
        open(f"{d}/left-{os.getpid()}", "w").write("state")
        os.chmod(f"{d}/left-dir", 0)  # a mode that would stop a careless clean-up
    except OSError:
        pass
print("clean" if not seen else "SEEN " + " ".join(seen))
"""
    row = task(["", "", ""], ["clean\n"] * 3)
    response = httpx.post(f"{url}/verify", json={**row, "response": answer(program)}, timeout=120)
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["reward"] == 1.0 and out["num_passed"] == 3, out.get("failure_reason")
    assert _wait_for_no_descendants(server_pid) == []
