"""A large ``/verify`` body is validated off the event loop: other sessions' requests are answered meanwhile.

Finding: ``/verify`` validated its body on the event loop, so a 13-16 MB transcript held every other request of
the server (all sessions' tool calls and verifies) for as long as validation took (seconds; ~30 s measured on a
busy machine). Bodies of ``THREAD_BODY_BYTES`` and more are now validated, and their answers dumped, in a worker
thread. The test holds validation open until a ``/health`` answer has arrived: on the event loop the ``/health``
request could not be answered until validation ended, so validation saw no answer. Ordering, not timing.
Over real HTTP against a server in a thread (uvicorn), with the body limits and 4xx answers as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import field_validator

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.server import THREAD_BODY_BYTES, ResourcesServer, ServerSettings
from gym_bridge.serving.uvicorn_thread import start_in_thread

WAIT_S = 10.0
"""How long validation waits for the ``/health`` answer (the failure case waits this long, then goes on)."""


class Gate:
    """Validation signals that it started, then waits for the test to say a ``/health`` answer arrived."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.health_answered = threading.Event()
        self.seen_during_validation: bool | None = None

    def hold(self) -> None:
        self.started.set()
        self.seen_during_validation = self.health_answered.wait(WAIT_S)

    def health_while_held(self, url: str) -> httpx.Response:
        """``GET /health`` once validation has started, then let validation go on."""
        assert self.started.wait(30), "validation never started"
        health = httpx.get(f"{url}/health", timeout=60)
        self.health_answered.set()
        return health


GATE: Gate | None = None


class GatedRequest(VerifyRequest):
    expected_answer: str
    padding: str = ""

    @field_validator("expected_answer")
    @classmethod
    def _held(cls, value: str) -> str:
        if GATE is not None and value == "hold":
            GATE.hold()
        return value


class Echo(ResourcesServer):
    name = "echo"
    verify_request_model = GatedRequest

    async def verify(self, body: VerifyRequest, session: Any) -> VerifyResponse:
        return VerifyResponse.model_validate({**dump(body), "reward": 1.0})


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with start_in_thread(Echo(ServerSettings(max_body_bytes=4 * 1024 * 1024)).build_app()) as running:
        yield running.url


@pytest.fixture
def gate() -> Iterator[Gate]:
    global GATE
    GATE = Gate()
    try:
        yield GATE
    finally:
        GATE.health_answered.set()  # never leave a validation waiting
        GATE = None


def body(expected: str, size: int) -> dict[str, Any]:
    return {"responses_create_params": {"input": "q"}, "expected_answer": expected, "padding": "x" * size,
            "response": {"id": "r", "created_at": 0.0, "model": "m", "object": "response", "output": []}}  # fmt: skip


def test_health_is_answered_while_a_large_verify_body_is_validated(url: str, gate: Gate) -> None:
    big = body("hold", THREAD_BODY_BYTES * 2)
    answers: dict[str, Any] = {}

    def post() -> None:
        answers["verify"] = httpx.post(f"{url}/verify", json=big, timeout=60)

    poster = threading.Thread(target=post)
    poster.start()
    try:
        assert gate.health_while_held(url).status_code == 200
        assert "verify" not in answers  # the big /verify is still being validated
    finally:
        poster.join(60)
    assert gate.seen_during_validation is True, "/health waited for the large body's validation"
    verify = answers["verify"]
    assert verify.status_code == 200 and verify.json()["reward"] == 1.0
    assert len(verify.json()["padding"]) == THREAD_BODY_BYTES * 2  # the answer is the whole echo


@pytest.mark.parametrize("size", [0, THREAD_BODY_BYTES * 2])
def test_a_bad_field_is_still_a_422_naming_it_small_or_large(url: str, size: int) -> None:
    bad = {**body("fine", size), "expected_answer": 12}
    reply = httpx.post(f"{url}/verify", json=bad, timeout=60)
    assert reply.status_code == 422 and reply.json()["errors"][0]["loc"] == ["body", "expected_answer"], reply.text
    typed = {"episode_id": {"rollout_id": "r1", "attempt": 0}, "task_id": {"taskset": "t", "task_id": "0"},
             "verification_input": bad}  # fmt: skip
    reply = httpx.post(f"{url}/verify", json=typed, timeout=60)
    assert reply.status_code == 422, reply.text
    assert reply.json()["errors"][0]["loc"] == ["body", "verification_input", "expected_answer"], reply.text


def test_a_body_over_the_limit_is_still_a_413(url: str) -> None:
    reply = httpx.post(f"{url}/verify", json=body("fine", 5 * 1024 * 1024), timeout=60)
    assert reply.status_code == 413, reply.text


def test_a_small_body_is_answered_as_before(url: str) -> None:
    reply = httpx.post(f"{url}/verify", json=body("fine", 10), timeout=60)
    assert reply.status_code == 200 and reply.json()["reward"] == 1.0 and reply.json()["padding"] == "x" * 10
