"""``collect --ray``: rollouts/s over 2 simulated Ray nodes against 1, on this machine.

Each arm is a fresh ``ray.cluster_utils.Cluster`` on 127.0.0.1 (1 logical CPU per node) joined by this
process as the driver (:func:`gym_bridge.collect.ray_shards.collect_on_ray`), the built-in math env
started by name on every node, and the fake model (tests/fake_model.py, arithmetic solver) in a child
process of its own. The same task file, concurrency and repeats in every arm; the figure is the run's own
``rollouts_per_s`` (from the first rollout loop to the last, shard start-up excluded). A third arm, plain
``collect`` in this process (no Ray), shows what the Ray hop costs on one node. The three arms run
interleaved, ``--rounds`` times (3), and each figure is the arm's median: this machine is shared and its
load moves between arms.

Why 2 cores bound the gain: a second node adds a second shard process (agent loop + math verifier),
but not a core. The driver (writing the file, Ray calls), the fake model, Ray's GCS and raylets and the
shards all share the same 2 cores, so the most a second node can add is the work one shard process could
not spread over both cores before (one Python process runs its agent loop on one core); on a real
cluster each node brings its own cores and its own env servers, and the gain is bounded by the model
endpoint and the driver instead.

    .venv/bin/python bench/bench_collect_ray.py            # 4,000 tasks x 2 repeats, c = 16
    .venv/bin/python bench/bench_collect_ray.py --quick    # 1,000 tasks x 2 repeats (about a minute)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import figure, print_rows, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024 * 1024}


def arithmetic_rows(n: int) -> list[dict[str, Any]]:
    """Task rows the fake model's default script solves ("What is a + b?")."""
    return [
        {
            "responses_create_params": {
                "input": [{"role": "user", "content": f"What is {i} + {i % 7}? Put the answer in \\boxed{{}}."}]
            },
            "question": f"What is {i} + {i % 7}?",
            "expected_answer": str(i + i % 7),
        }
        for i in range(n)
    ]


def run_arm(nodes: int, tasks: Path, out: Path, model_url: str, concurrency: int, repeats: int) -> dict[str, Any]:
    """One collection: over ``nodes`` simulated Ray nodes, or (``nodes == 0``) in this process without Ray."""
    from gym_bridge.collect import CollectConfig, collect

    config = CollectConfig(tasks, out, ["math"], model_url=model_url, concurrency=concurrency,
                           num_repeats=repeats, progress=False, overwrite=True)  # fmt: skip
    if nodes == 0:
        result = collect(config, report=lambda m: None)
        return {"nodes": 0, "rollouts_per_s": result.metrics["run"]["rollouts_per_s"], "written": result.written}
    from gym_bridge.collect.ray_shards import collect_on_ray
    from gym_bridge.distributed.ray_local import import_ray

    import_ray()  # loopback settings before the cluster's processes start
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        result = collect_on_ray(config, cluster.address, report=lambda m: None)
    finally:
        cluster.shutdown()
    run = result.metrics["run"]
    return {
        "nodes": nodes,
        "rollouts_per_s": run["rollouts_per_s"],
        "written": result.written,
        "per_shard": [s["rollouts"] for s in run["ray"]["shards"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 tasks x 2 repeats (about a minute)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three arms, interleaved; medians")
    args = parser.parse_args()
    n_tasks, repeats = (1000, 2) if args.quick else (4000, 2)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]  # the cluster's worker processes import gym_bridge too
    fake = subprocess.Popen([sys.executable, str(REPO / "tests" / "fake_model.py")], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    arms: list[dict[str, Any]] = []
    try:
        url = fake.stdout.readline().strip()  # type: ignore[union-attr]
        if not url.startswith("http"):
            raise RuntimeError(f"fake model did not start (printed {url!r})")
        with tempfile.TemporaryDirectory(prefix="bench-collect-ray-") as tmp:
            tasks = Path(tmp) / "tasks.jsonl"
            tasks.write_text("".join(json.dumps(row) + "\n" for row in arithmetic_rows(n_tasks)))
            for round_ in range(args.rounds):
                for nodes in (0, 1, 2):
                    arm = run_arm(nodes, tasks, Path(tmp) / f"out{nodes}.jsonl", url, args.concurrency, repeats)
                    if arm["written"] != n_tasks * repeats:
                        raise RuntimeError(f"{nodes} node(s): wrote {arm['written']} of {n_tasks * repeats} rollouts")
                    arm["round"] = round_
                    print(json.dumps(arm), flush=True)
                    arms.append(arm)
    finally:
        fake.terminate()
        fake.wait(30)
    local, one, two = (statistics.median(a["rollouts_per_s"] for a in arms if a["nodes"] == n) for n in (0, 1, 2))
    shape = f"math env, fake model, c={args.concurrency}, {n_tasks * repeats} rollouts, median of {args.rounds}"
    rows = [
        figure(f"collect --ray rollouts/s, 2 simulated nodes ({shape})", two, "rollouts/s", baseline=one,
               note="baseline: the same run over 1 simulated node; higher is better. Both nodes share this "
               "machine's 2 cores with the driver, the fake model and Ray's GCS/raylets, so a second node adds "
               "a shard process but no core: the gain is bounded well below 2x here (on a real cluster each "
               "node brings its own cores and env servers)"),
        figure(f"collect --ray rollouts/s, 1 simulated node ({shape})", one, "rollouts/s", baseline=local,
               note="baseline: plain collect in one process (no Ray), same run; the cost of the Ray hop "
               "(an actor call per rollout) and of Ray's own processes on 2 cores; higher is better"),
    ]  # fmt: skip
    path = write_results("collect_ray", rows, quick=args.quick, details={"arms": arms})
    print_rows(rows, path)


if __name__ == "__main__":
    main()
