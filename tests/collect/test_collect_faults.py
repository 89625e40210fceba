"""Faults end in bounded time: retries are capped, each failure is recorded by class, the run finishes."""

from __future__ import annotations

import json
import socket
import time

import pytest
from collect_helpers import read_jsonl, write_rows
from fake_model import FakeModel, Fault, arithmetic_row, flaky
from fastapi import HTTPException

from gym_bridge.collect import CollectConfig, collect, failures_path_for, metrics_path_for
from gym_bridge.records.schema import VerifyRequest, VerifyResponse
from gym_bridge.serving.server import ResourcesServer, Session
from gym_bridge.serving.uvicorn_thread import start_in_thread

MAX_RETRIES = 2
FAULTS = {
    "1 + 1": (Fault.http(500), "model_http_error"),
    "1 + 2": (Fault.http(429, retry_after=0.05), "model_http_error"),
    "1 + 3": (Fault.slow(30), "model_timeout"),
    "1 + 4": (Fault.drop(), "model_connection_error"),
    "1 + 5": (Fault.malformed(), "model_bad_response"),
    "1 + 6": (Fault.drip(30), "model_timeout"),
    "1 + 7": (Fault.http(502, body="bad gateway"), "model_http_error"),
}


def config_for(tmp_path, model_url, env_url, rows, **kw):
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    settings = dict(
        envs=[env_url], request_timeout=0.5, max_retries=MAX_RETRIES, progress=False, concurrency=16
    )
    return CollectConfig(tasks, tmp_path / "rollouts.jsonl", model_url=model_url, **{**settings, **kw})


def test_every_model_fault_is_retried_a_bounded_number_of_times(tmp_path, boxed_env):
    rows = [arithmetic_row(1, b) for b in range(1, 8)] + [arithmetic_row(2, 2)]
    script = {prompt: fault for prompt, (fault, _) in FAULTS.items()}
    with FakeModel(script) as model:
        result = collect(config_for(tmp_path, model.url, boxed_env[0], rows, retry_timeouts=True))  # timeouts too: asked for
        calls = dict(model.calls)
    records = read_jsonl(result.output_path)
    assert [r["_ng_task_index"] for r in records] == [7] and records[0]["reward"] == 1.0
    failures = {f["_ng_task_index"]: f for f in read_jsonl(failures_path_for(result.output_path))}
    assert sorted(failures) == list(range(7))
    for task_index, (prompt, (_, failure_class)) in enumerate(FAULTS.items()):
        failure = failures[task_index]
        assert failure["_ng_failure_class"] == failure_class, failure
        assert failure["attempts"] == MAX_RETRIES + 1
        assert failure["stage"] == "model" and failure["_ng_rollout_index"] == 0
        [asked] = [n for p, n in calls.items() if prompt in p]
        assert asked == MAX_RETRIES + 1, (prompt, asked)
    assert "HTTP 502" in failures[6]["error"] and "bad gateway" in failures[6]["error"]
    metrics = json.loads(metrics_path_for(result.output_path).read_text())
    assert metrics["run"]["failures_by_class"] == {
        "model_http_error": 3, "model_timeout": 2, "model_connection_error": 1, "model_bad_response": 1,
    }  # fmt: skip
    assert result.written == 1 and result.failed == 7


def test_client_errors_fail_at_once(tmp_path, boxed_env):
    with FakeModel({"1 + 1": Fault.http(400, body='{"error": "bad request"}')}) as model:
        result = collect(config_for(tmp_path, model.url, boxed_env[0], [arithmetic_row(1, 1)]))
        assert model.calls.total() == 1
    [failure] = read_jsonl(failures_path_for(result.output_path))
    assert failure["_ng_failure_class"] == "model_http_error" and failure["attempts"] == 1
    assert "HTTP 400" in failure["error"]


def test_transient_faults_heal_and_count_as_retries(tmp_path, boxed_env):
    arrivals: list[float] = []

    def rate_limited_twice(request, n):
        arrivals.append(time.monotonic())
        return Fault.http(429, retry_after=0.3) if n <= 2 else "\\boxed{2}"

    script = {"1 + 1": rate_limited_twice, "1 + 2": flaky(Fault.drop(), times=1)}
    with FakeModel(script) as model:
        result = collect(
            config_for(tmp_path, model.url, boxed_env[0], [arithmetic_row(1, 1), arithmetic_row(1, 2)])
        )
    records = read_jsonl(result.output_path)
    assert sorted((r["_ng_task_index"], r["reward"]) for r in records) == [(0, 1.0), (1, 1.0)]
    assert not failures_path_for(result.output_path).exists()
    assert len(arrivals) == 3
    assert all(b - a >= 0.3 for a, b in zip(arrivals, arrivals[1:], strict=False))  # Retry-After honoured
    assert json.loads(metrics_path_for(result.output_path).read_text())["run"]["retries"] == 3


class FlakyEnv(ResourcesServer):
    """verify answers 503 always; the ``explode`` tool answers 500."""

    name = "flaky"

    def __init__(self) -> None:
        super().__init__()
        self.verify_calls = 0

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        self.verify_calls += 1
        raise HTTPException(503, "verifier overloaded")


def test_env_faults_are_classified(tmp_path):
    env = FlakyEnv()
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with start_in_thread(env.build_app()) as running, FakeModel() as model:
        rows = [arithmetic_row(1, 1, env="flaky"), arithmetic_row(1, 2, env="dead")]
        envs = [f"flaky={running.url}", f"dead={dead_url}"]
        result = collect(config_for(tmp_path, model.url, None, rows, envs=envs))
    failures = {f["_ng_task_index"]: f for f in read_jsonl(failures_path_for(result.output_path))}
    assert failures[0]["_ng_failure_class"] == "env_http_error" and failures[0]["stage"] == "verify"
    assert "verifier overloaded" in failures[0]["error"]
    assert env.verify_calls == MAX_RETRIES + 1
    assert (
        failures[1]["_ng_failure_class"] == "env_connection_error" and failures[1]["stage"] == "seed_session"
    )
    assert failures[1]["attempts"] == MAX_RETRIES + 1
    assert result.written == 0


@pytest.mark.parametrize(
    "bad_body", ['{"output": "not a list"}', "[1, 2]", '{"error": {"message": "x"}, "output": []}']
)
def test_unusable_response_objects_are_bad_responses(tmp_path, boxed_env, bad_body):
    with FakeModel({"1 + 1": Fault("http", status=200, body=bad_body.encode())}) as model:
        result = collect(config_for(tmp_path, model.url, boxed_env[0], [arithmetic_row(1, 1)], max_retries=1))
        assert model.calls.total() == 2
    [failure] = read_jsonl(failures_path_for(result.output_path))
    assert failure["_ng_failure_class"] == "model_bad_response"
