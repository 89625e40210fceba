"""``collect --ray`` on a real 2-node Ray cluster on this machine (``ray.cluster_utils.Cluster``, 127.0.0.1).

One cluster for the module (starting it takes ~10 s on 2 cores), two nodes of 1 CPU each. The envs are
the built-in math server by name, so each shard starts its own on its node; the model is
tests/fake_model.py on loopback. Ray comes with the ``[dev]`` extra (as ``[ray]``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from collect_helpers import assert_written_exactly_once, read_jsonl, sigkill_after_lines, write_rows
from collect_helpers import rollout_pairs as pairs
from fake_model import FakeModel, Fault, arithmetic_row

from gym_bridge.collect import CollectConfig, CollectError, failures_path_for, metrics_path_for
from tests.ray_loopback import listeners, off_loopback

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024 * 1024}


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Any]:
    from gym_bridge.distributed.ray_local import import_ray

    import_ray()  # the loopback settings, before any Ray process starts
    from ray.cluster_utils import Cluster

    # A lost node is declared dead after ~3 s of missed health checks (Ray's default waits ~10 s).
    health = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False, "_system_config": health})
    try:
        cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def node_ids(cluster: Any) -> set[str]:
    return {node.node_id for node in [cluster.head_node, *cluster.worker_nodes]}


def test_two_nodes_write_every_rollout_once_with_node_local_envs_on_loopback(tmp_path, two_nodes):
    import ray

    from gym_bridge.collect.ray_shards import collect_on_ray

    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(i, 2) for i in range(12)])
    out = tmp_path / "rollouts.jsonl"
    seen: list[list[tuple[str, str, int, int]]] = []

    def snapshot(stats: Any, n: int) -> None:  # while the shards and their envs are up
        if stats.done == 6 and not seen:
            seen.append(listeners())

    with FakeModel({"What is 3 + 2": Fault.http(500)}, latency=0.02, record_requests=False) as model:
        config = CollectConfig(tasks, out, ["math"], model_url=model.url, num_repeats=2, concurrency=4, progress=False,
                               max_retries=0)  # fmt: skip
        result = collect_on_ray(config, two_nodes.address, on_progress=snapshot)
    assert not ray.is_initialized()  # the driver left the cluster it joined ...
    assert all(node.remaining_processes_alive() for node in two_nodes.list_all_nodes())  # ... which stays up

    everything = pairs(out)
    assert sorted(everything) == [(t, r) for t in range(12) if t != 3 for r in range(2)]
    assert result.written == 22 and result.failed == 2  # task 3's model calls fail: failures merged here
    failed = [(f["_ng_task_index"], f["_ng_rollout_index"], f["_ng_failure_class"]) for f in read_jsonl(failures_path_for(out))]
    assert sorted(failed) == [(3, 0, "model_http_error"), (3, 1, "model_http_error")]
    assert all(r["reward"] == 1.0 and r["_ng_environment_server"] == "math_environment_server" for r in read_jsonl(out))
    metrics = json.loads(metrics_path_for(out).read_text())
    assert metrics["num_rollouts"] == 22 and metrics["mean_reward"] == 1.0
    assert metrics["run"]["rollouts_failed"] == 2 and metrics["run"]["failures_by_class"] == {"model_http_error": 2}
    shards = metrics["run"]["ray"]["shards"]
    assert {s["node_id"] for s in shards} == node_ids(two_nodes)  # one shard per node, both ran
    assert all(s["rollouts"] > 0 for s in shards), shards
    assert sum(s["rollouts"] for s in shards) == 22 and sum(s["failed"] for s in shards) == 2
    env_urls = [s["env_urls"]["math"] for s in shards]
    assert len(set(env_urls)) == 2 and all(u.startswith("http://127.0.0.1:") for u in env_urls)

    (found,) = seen
    names = Counter(name for name, _ in {(entry[0], entry[3]) for entry in found})  # processes, by name
    assert names["gcs_server"] == 1 and names["raylet"] == 2, found  # the check sees both nodes
    assert names["ray::CollectShard"] >= 2, found  # ... and both shards (with their env servers)
    assert off_loopback(found) == [], f"sockets bound off loopback: {off_loopback(found)}"


def test_sigkill_of_the_driver_then_resume_gives_every_rollout_exactly_once(tmp_path, two_nodes):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(i % 10, i // 10) for i in range(20)])
    out = tmp_path / "rollouts.jsonl"
    with FakeModel(latency=0.05, record_requests=False) as model:
        command = [
            sys.executable, "-m", "gym_bridge.cli", "collect", str(tasks), "-o", str(out), "--env", "math",
            "--model-url", model.url, "--num-repeats", "3", "--concurrency", "4", "--no-progress",
            "--ray", two_nodes.address,
        ]  # fmt: skip
        sigkill_after_lines(command, out, 8, cwd=REPO)
        done_before = pairs(out)
        assert 8 <= len(done_before) < 60

        resumed = subprocess.run(command + ["--resume"], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
    assert_written_exactly_once(out, 20, 3, done_before)
    metrics = json.loads(metrics_path_for(out).read_text())
    assert metrics["run"]["already_done"] == len(done_before)
    assert metrics["run"]["rollouts_written"] == 60 - len(done_before)
    assert {s["node_id"] for s in metrics["run"]["ray"]["shards"]} == node_ids(two_nodes)
    deadline = time.monotonic() + 30  # the killed driver's shards and the resumed run's are gone
    while any(entry[0] == "ray::CollectShard" for entry in listeners()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(entry[0] == "ray::CollectShard" for entry in listeners())


def test_without_ray_installed_the_error_names_the_extra(tmp_path, monkeypatch):
    from gym_bridge.collect.ray_shards import collect_on_ray

    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1)])
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    config = CollectConfig(tasks, tmp_path / "r.jsonl", ["math"], model_url="http://127.0.0.1:9/v1", progress=False)
    with pytest.raises(CollectError, match=r"--ray needs Ray: pip install 'gym-bridge\[ray\]'"):
        collect_on_ray(config)


def test_policy_with_ray_is_refused_naming_both_options(tmp_path):
    from gym_bridge.collect.ray_shards import collect_on_ray

    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1)])
    config = CollectConfig(tasks, tmp_path / "r.jsonl", ["math"], policy="tiny", progress=False)
    with pytest.raises(CollectError, match="--policy cannot be used with --ray.*--model-url"):
        collect_on_ray(config)


@pytest.mark.parametrize("flag", [["--ray"], ["--ray", "127.0.0.1:1"], ["--ray=127.0.0.1:1"]])
def test_cli_ray_with_policy_is_refused_before_any_ray_starts(tmp_path, flag):
    from typer.testing import CliRunner

    from gym_bridge.cli import app

    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1)])
    args = ["collect", str(tasks), "-o", str(tmp_path / "r.jsonl"), "--env", "math", "--policy", "tiny", *flag]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--policy cannot be used with --ray" in " ".join(result.output.split())


def test_a_node_lost_mid_run_stops_it_naming_the_node_and_resume_finishes_on_the_other(tmp_path, two_nodes):
    """Last of the cluster tests: it takes the second node away for good (the teardown ends the rest)."""
    import ray

    from gym_bridge.collect.ray_shards import collect_on_ray

    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(i, 3) for i in range(40)])
    out = tmp_path / "rollouts.jsonl"
    (worker,) = two_nodes.worker_nodes
    lost = worker.node_id

    def lose_a_node(stats: Any, n: int) -> None:
        if stats.done == 10:
            two_nodes.remove_node(worker, allow_graceful=False)

    with FakeModel(latency=0.05, record_requests=False) as model:
        config = CollectConfig(tasks, out, ["math"], model_url=model.url, num_repeats=2, concurrency=4, progress=False)
        with pytest.raises(CollectError, match=f"shard \\d on node {lost} .* was lost.*--resume") as caught:
            collect_on_ray(config, two_nodes.address, on_progress=lose_a_node)
        assert not ray.is_initialized()
        done_before = pairs(out)
        assert 10 <= len(done_before) < 80, caught.value
        resumed = collect_on_ray(
            CollectConfig(tasks, out, ["math"], model_url=model.url, num_repeats=2, concurrency=4, progress=False,
                          resume=True), two_nodes.address)  # fmt: skip
    everything = pairs(out)
    assert Counter(everything).most_common(1)[0][1] == 1
    assert sorted(everything) == [(t, r) for t in range(40) for r in range(2)]
    assert resumed.written == 80 - len(done_before)
    assert [s["node_id"] for s in resumed.metrics["run"]["ray"]["shards"]] == [two_nodes.head_node.node_id]


def test_bare_ray_flag_starts_a_private_ray_on_loopback_and_ends_it(tmp_path, monkeypatch):
    """After the cluster tests: this process cannot join another Ray after a private one (Ray's
    process-wide state), which a CLI run, one Ray per process, never asks of it."""
    import ray
    from typer.testing import CliRunner

    from gym_bridge.cli import app

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(i, 1) for i in range(4)])
    out = tmp_path / "r.jsonl"
    with FakeModel(record_requests=False) as model:
        result = CliRunner().invoke(app, ["collect", str(tasks), "-o", str(out), "--env", "math", "--model-url",
                                          model.url, "--no-progress", "--ray"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert sorted(pairs(out)) == [(t, 0) for t in range(4)]
    (shard,) = json.loads(metrics_path_for(out).read_text())["run"]["ray"]["shards"]
    assert shard["node_ip"] == "127.0.0.1" and shard["rollouts"] == 4
    assert f"ray shard 0: node {shard['node_id'][:12]} (127.0.0.1)" in result.output  # in the summary table
    assert not ray.is_initialized()  # the Ray it started is shut down again

