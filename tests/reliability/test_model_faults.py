"""Fault storms and combinations at the model endpoint: collect ends in bounded time, nothing is lost.

tests/collect covers each fault on its own; here many rollouts meet many faults at once, in seeded random
mixes, and the model server dies mid-run. For every rollout the outcome is predicted from its fault
script and checked exactly: written or failed (never both, never neither), with the right failure class,
and never more than ``max_retries + 1`` model calls.
"""

from __future__ import annotations

import json
import random
import sys
import threading
from collections.abc import Iterator

import pytest
from fake_model import FakeModel, Fault, arithmetic_row, solve_arithmetic

from gym_bridge.collect import CollectConfig, collect, failures_path_for, metrics_path_for

from .procs import serving

MAX_RETRIES = 2
TIMEOUT = 3.0
"""Per-attempt deadline where slow answers are part of the test: long enough that a good answer never
misses it on a loaded 2-core box (120 requests start at once), short enough to keep the test brief.
Slow faults outlast it 20 times over, and end as soon as the client gives up."""

FAULTS = {
    "500": (Fault.http(500), "model_http_error"),
    "503": (Fault.http(503, body="overloaded"), "model_http_error"),
    "429": (Fault.http(429, retry_after=0.01), "model_http_error"),
    "drop": (Fault.drop(), "model_connection_error"),
    "malformed": (Fault.malformed(), "model_bad_response"),
    "slow": (Fault.slow(TIMEOUT * 20), "model_timeout"),
    "drip": (Fault.drip(TIMEOUT * 20), "model_timeout"),
}


@pytest.fixture(scope="module")
def env_url() -> Iterator[str]:
    """The env in its own process, so the collector's load cannot starve it into timeouts."""
    with serving([sys.executable, "tests/reliability/serve_env.py"]) as url:
        yield url


def read_jsonl(path):
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def run(tmp_path, model_url, env_url, rows, **kw):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = dict(request_timeout=30.0, max_retries=MAX_RETRIES, progress=False, concurrency=len(rows))
    config = CollectConfig(
        tasks, tmp_path / "rollouts.jsonl", [env_url], model_url=model_url, **{**settings, **kw}
    )
    return collect(config, report=lambda _: None)


def prompt_of(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


@pytest.mark.timeout(120)
def test_rate_limit_storm_heals_with_every_rollout_written(tmp_path, env_url):
    """Every request of 300 simultaneous rollouts is rate-limited twice before it is answered."""

    def limited(request, n):
        return Fault.http(429, retry_after=0.01) if n <= 2 else solve_arithmetic(request, n)

    rows = [arithmetic_row(i, 1) for i in range(300)]
    with FakeModel(limited, record_requests=False) as model:
        result = run(tmp_path, model.url, env_url, rows)
        calls = dict(model.calls)
    records = read_jsonl(result.output_path)
    assert sorted(r["_ng_task_index"] for r in records) == list(range(300))
    assert all(r["reward"] == 1.0 for r in records)
    assert not failures_path_for(result.output_path).exists()
    assert set(calls.values()) == {3}  # two 429s and the answer, per rollout: no extra calls
    assert json.loads(metrics_path_for(result.output_path).read_text())["run"]["retries"] == 600


@pytest.mark.timeout(120)
def test_endless_storm_is_capped_and_far_retry_after_gives_up_at_once(tmp_path, env_url):
    """A model that only ever fails: each rollout costs exactly max_retries + 1 calls, then is recorded."""

    def script(request, n):
        if "What is 0 +" in json.dumps(request):
            return Fault.http(429, retry_after=3600)  # past the request's time budget: no point waiting
        return Fault.http(503) if n % 2 else Fault.drop()

    rows = [arithmetic_row(i % 5, i) for i in range(200)]
    with FakeModel(script, record_requests=False) as model:
        result = run(tmp_path, model.url, env_url, rows)
        calls = dict(model.calls)
    assert read_jsonl(result.output_path) == []
    failures = {f["_ng_task_index"]: f for f in read_jsonl(failures_path_for(result.output_path))}
    assert sorted(failures) == list(range(200))
    for i, failure in failures.items():
        if i % 5 == 0:
            assert failure["attempts"] == 1 and "budget" in failure["error"], failure
            assert failure["_ng_failure_class"] == "model_http_error"
        else:
            assert failure["attempts"] == MAX_RETRIES + 1
            # attempt 3 is odd: the last fault seen is the 503
            assert failure["_ng_failure_class"] == "model_http_error" and "503" in failure["error"]
    assert sum(calls.values()) == 40 * 1 + 160 * (MAX_RETRIES + 1)
    assert result.written == 0 and result.failed == 200


def test_seeded_mixed_fault_storm_outcomes_are_exact(tmp_path, env_url):
    """Each rollout gets its own random sequence of faults and answers; every outcome is predicted."""
    rng = random.Random(20261121)
    kinds = [*FAULTS, "ok", "ok"]
    plans: dict[str, list[str]] = {}
    rows = []
    for i in range(120):
        rows.append(arithmetic_row(i, 7))
        plans[prompt_of(i, 7)] = [rng.choice(kinds) for _ in range(MAX_RETRIES + 1)]

    def script(request, n):
        plan = next(p for prompt, p in plans.items() if prompt in json.dumps(request))
        step = plan[n - 1] if n <= len(plan) else "ok"
        return solve_arithmetic(request, n) if step == "ok" else FAULTS[step][0]

    with FakeModel(script, record_requests=False) as model:
        result = run(tmp_path, model.url, env_url, rows, request_timeout=TIMEOUT, retry_timeouts=True)
        calls = {prompt: n for p, n in model.calls.items() for prompt in plans if prompt in p}
    written = {r["_ng_task_index"]: r for r in read_jsonl(result.output_path)}
    failed = {f["_ng_task_index"]: f for f in read_jsonl(failures_path_for(result.output_path))}
    assert not set(written) & set(failed)
    assert sorted([*written, *failed]) == list(range(120))
    for i in range(120):
        plan = plans[prompt_of(i, 7)]
        if "ok" in plan:
            assert i in written and written[i]["reward"] == 1.0, (i, plan, failed.get(i))
            assert calls[prompt_of(i, 7)] == plan.index("ok") + 1
        else:
            assert i in failed, (i, plan)
            assert failed[i]["_ng_failure_class"] == FAULTS[plan[-1]][1], (i, plan, failed[i])
            assert failed[i]["attempts"] == MAX_RETRIES + 1
            assert calls[prompt_of(i, 7)] == MAX_RETRIES + 1
    metrics = json.loads(metrics_path_for(result.output_path).read_text())
    assert metrics["run"]["rollouts_written"] == len(written)
    assert sum(metrics["run"]["failures_by_class"].values()) == len(failed)


@pytest.mark.timeout(120)
def test_model_dies_mid_run_then_resume_completes_without_duplicates(tmp_path, env_url):
    """The model server goes away after 60 answers; the run still ends, and --resume finishes the job."""
    rows = [arithmetic_row(i, 2) for i in range(150)]
    answered = 0
    lock = threading.Lock()
    died = threading.Event()

    def dying(request, n):
        # Past the 60th answer the server is dying: it drops every connection until the killer has
        # stopped it. (Answering them was a race: on a quick machine all 150 were answered before
        # the graceful stop took effect, and the run had nothing to resume.)
        nonlocal answered
        with lock:
            answered += 1
            if answered > 60:
                died.set()
                return Fault.drop()
        return solve_arithmetic(request, n)

    model = FakeModel(dying, latency=0.01, record_requests=False).start()
    killer = threading.Thread(target=lambda: (died.wait(60), model.stop()), daemon=True)
    killer.start()
    try:
        first = run(tmp_path, model.url, env_url, rows, concurrency=32)
    finally:
        killer.join(30)
        model.stop()
    assert 50 <= first.written <= 60 and first.failed > 0
    assert first.written + first.failed == 150
    failures = read_jsonl(failures_path_for(first.output_path))
    assert {f["_ng_failure_class"] for f in failures} <= {"model_connection_error", "model_timeout"}
    assert all(f["attempts"] <= MAX_RETRIES + 1 for f in failures)

    with FakeModel(record_requests=False) as healthy:
        second = run(tmp_path, healthy.url, env_url, rows, concurrency=32, resume=True)
        assert healthy.calls.total() == first.failed  # only what was missing is asked again
    keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in read_jsonl(second.output_path)]
    assert len(keys) == len(set(keys)) == 150
    assert second.already_done == first.written and second.written == first.failed
