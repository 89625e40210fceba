"""A run's memory does not grow with its size, and --concurrency past what the OS allows is bounded (issue 37).

Before: every rollout left ~1 KB behind (a slimmed record for the end-of-run metrics, two latencies, the
done set on resume), and the end of the run read the whole /aggregate_metrics body into memory, parsed it
(in-process) and parsed the answer with every task's figures: ~5.8 KB a rollout at 262,144 rollouts.
"""

from __future__ import annotations

import gc
import json
import os
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from collect_helpers import BoxedAnswerEnv, write_rows
from fake_model import FakeModel, arithmetic_row

from gym_bridge.collect import CollectConfig, aggregate_metrics_path_for, collect, metrics_path_for
from gym_bridge.collect.client import concurrency_bound
from gym_bridge.collect.local_aggregate import write_aggregate_file
from gym_bridge.collect.output import write_json
from gym_bridge.records.aggregate import StreamingAggregate, nemo_gym_aggregate
from gym_bridge.records.metrics import LatencySketch, RewardTally, aggregate_rewards, latency_summary
from gym_bridge.serving.server import ServerSettings

REPO = Path(__file__).resolve().parents[2]


class FewSessionsEnv(BoxedAnswerEnv):
    """The boxed-answer env keeping at most 64 sessions (a server's session store is bounded by its own
    ``max_sessions``, 200,000 by default; here it is kept out of the collector's figure)."""

    def __init__(self, settings: ServerSettings | None = None) -> None:
        super().__init__(ServerSettings(max_sessions=64))


def _peak_bytes(tmp_path: Path, model_url: str, rows: int) -> int:
    """Peak Python memory (tracemalloc) of a whole in-process collect run of ``rows`` x 4 rollouts."""
    tasks = write_rows(tmp_path / f"tasks_{rows}.jsonl", [arithmetic_row(i % 10, i // 10 % 10) for i in range(rows)])
    config = CollectConfig(tasks, tmp_path / f"r_{rows}.jsonl", [f"{__name__}:FewSessionsEnv"], model_url=model_url,
                           num_repeats=4, concurrency=16, progress=False, request_timeout=60.0)  # fmt: skip
    gc.collect()
    tracemalloc.reset_peak()
    start = tracemalloc.get_traced_memory()[0]
    result = collect(config, report=lambda _: None)
    peak = tracemalloc.get_traced_memory()[1] - start
    assert result.written == rows * 4 and result.failed == 0
    aggregate = json.loads(aggregate_metrics_path_for(result.output_path).read_text())
    assert len(aggregate[0]["group_level_metrics"]) == rows  # the aggregate is all there, every task
    assert aggregate[0]["agent_metrics"]["num_rollouts"] == rows * 4
    return peak


def test_memory_does_not_grow_with_the_number_of_rollouts(tmp_path, monkeypatch):
    """Peak memory of a run of 800 rollouts against one of 160: at most 400 bytes more a rollout (the
    aggregate's exact columns are 8 bytes a number; the old code kept several kilobytes a rollout).
    The bounded buffers (latencies kept exactly up to 4,096, task figures described 512 tasks at a time)
    are shrunk so that a small run shows what a large one keeps per rollout."""
    monkeypatch.setattr(LatencySketch, "EXACT", 32)
    monkeypatch.setattr(StreamingAggregate, "BATCH", 8)
    with FakeModel(record_requests=False) as model:  # (it would keep every request)
        tracemalloc.start()
        try:
            _peak_bytes(tmp_path, model.url, 10)  # warm: imports, the app, the model's first answers
            small = _peak_bytes(tmp_path, model.url, 40)
            large = _peak_bytes(tmp_path, model.url, 200)
        finally:
            tracemalloc.stop()
    per_rollout = (large - small) / (800 - 160)
    assert per_rollout < 400, f"peak grew {per_rollout:.0f} bytes a rollout ({small:,} -> {large:,} bytes)"


def test_concurrency_above_the_open_file_limit_is_bounded_and_reported(tmp_path):
    """With an open-file limit of 1,024, --concurrency 2000 runs 256 rollouts at a time (half the files,
    less a reserve), says so on the console and in the metrics, and no rollout fails."""
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(i % 10, i // 10 % 10) for i in range(150)])
    out = tmp_path / "r.jsonl"

    def low_limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    with FakeModel() as model:
        cmd = [sys.executable, "-m", "gym_bridge.cli", "collect", str(tasks), "-o", str(out), "--env", "math",
               "--model-url", model.url, "--concurrency", "2000", "--num-repeats", "2", "--no-progress"]  # fmt: skip
        run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, preexec_fn=low_limit,
                             env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    said = " ".join((run.stdout + run.stderr).split())
    assert "--concurrency 2,000 is more than this machine can hold open at once" in said
    assert "running 256 rollouts at a time" in said and "open-file limit 1,024" in said
    block = json.loads(metrics_path_for(out).read_text())["run"]
    assert block["concurrency"] == 256 and block["concurrency_requested"] == 2000
    assert block["rollouts_written"] == 300 and block["rollouts_failed"] == 0


def test_the_bound_follows_the_ephemeral_ports(monkeypatch):
    monkeypatch.setattr("gym_bridge.collect.client.ephemeral_ports", lambda: 100)
    monkeypatch.setattr("gym_bridge.collect.client.connection_cap", lambda: 10_000)
    bound, why = concurrency_bound(1)
    assert bound == 90 and "100 ephemeral ports" in why  # a tenth kept for TIME_WAIT and other clients
    assert concurrency_bound(0) is None  # nothing over HTTP: nothing to bound


def _records(rng: random.Random, tasks: int, repeats: int) -> list[dict]:
    records = []
    for task in range(tasks):
        for repeat in range(repeats):
            if rng.random() < 0.1:
                continue  # a failed rollout: an uneven group
            record = {"reward": float(rng.random() < 0.5), "_ng_task_index": task, "_ng_rollout_index": repeat,
                      "extracted_answer": rng.choice(["1", "2", None]), "x": rng.random(),
                      "response": {"usage": {"input_tokens": rng.randint(1, 50), "output_tokens": rng.randint(1, 9)}}}  # fmt: skip
            if rng.random() < 0.2:
                record["y"] = rng.random()  # a field only some records have
            records.append(record)
    return records


def test_the_streaming_aggregate_is_the_whole_one_in_any_arrival_order(tmp_path):
    """StreamingAggregate over records arriving out of order (a task's repeats in their order) answers
    exactly what nemo_gym_aggregate answers over the list, and the aggregate file streamed from its
    spilled groups is byte for byte the one write_json writes."""
    rng = random.Random(3)
    records = _records(rng, 300, 4)
    arrival = sorted(records, key=lambda r: (r["_ng_task_index"] // 7 + rng.random() * 3, r["_ng_rollout_index"]))
    want = nemo_gym_aggregate(records, aggregate_rewards)
    streaming = StreamingAggregate(group_size=4, directory=str(tmp_path))
    streaming.BATCH = 16
    for record in arrival:
        streaming.add(record)
    got = streaming.result(aggregate_rewards(records))
    assert got == want and list(got["group_level_metrics"]) == want["group_level_metrics"]
    write_json(tmp_path / "whole.json", [want], flat_below=3)
    write_aggregate_file(tmp_path / "streamed.json", [got])
    assert (tmp_path / "streamed.json").read_bytes() == (tmp_path / "whole.json").read_bytes()


def test_the_tally_closing_groups_as_they_finish_is_aggregate_rewards():
    """RewardTally with each task closed when its repeats are back (a smaller group later: the votes are
    read back to vote at its k) gives aggregate_rewards' figures exactly."""
    rng = random.Random(5)
    records = _records(rng, 400, 4)
    tally = RewardTally()
    for task in range(400):
        for record in (r for r in records if r["_ng_task_index"] == task):
            tally.add(record)
        tally.close(task)
    assert tally.open == {}
    assert tally.result() == aggregate_rewards(records)
    assert "majority@4" not in tally.result() and any(k.startswith("majority@") for k in tally.result())  # uneven
    tally.discard()


def test_the_latency_sketch_is_exact_then_within_half_a_percent():
    rng = random.Random(9)
    values = [rng.lognormvariate(-3, 1) for _ in range(50_000)]
    sketch = LatencySketch()
    sketch.extend(values[:100])
    assert sketch.summary() == latency_summary(values[:100])
    sketch.extend(values[100:])
    got, want = sketch.summary(), latency_summary(values)
    assert got["count"] == want["count"] and got["max"] == want["max"]
    assert got["mean"] == pytest.approx(want["mean"], rel=1e-9)
    for q in ("p50", "p90", "p99"):
        assert got[q] == pytest.approx(want[q], rel=0.006), q
    assert len(sketch.buckets) < 2000 and sketch.values is None


def test_an_in_process_env_is_aggregated_from_the_spool_not_over_its_route():
    """collect finds the server behind an in-process app, so the end-of-run aggregate reads the spool: the
    route would hold the whole body (the memory test above caught this when the app's session hook
    stopped being the server's bound method)."""
    from gym_bridge.collect.local_aggregate import server_of_app
    from gym_bridge.serving.json_http import JsonApp

    server = FewSessionsEnv()
    assert server_of_app(server.build_app()) is server
    assert server_of_app(JsonApp([], title="not a resources server")) is None
