"""The rollout deadline with ``env.<name>.replicas``: Ray actors on a simulated 2-node cluster on 127.0.0.1
serve :class:`~tests.train.straggler_env.StragglerEnv` over HTTP, each leaving every 7th tool call
unanswered after its first 24 (its share of three steps). The run keeps its pace within 2x, the hung
sessions end on their replica (none is taken for lost), and the run finishes."""

from __future__ import annotations

import json
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.ray_loopback import two_node_cluster_fixture
from tests.train.straggler_env import STRAGGLER_SERVER
from tests.train.test_rollout_timeouts import (
    CLEAN_STEPS,
    ROLLOUTS,
    STEPS,
    shop_run,
    train_steps,
    within_deadline,
)

ray = pytest.importorskip("ray")

two_nodes = two_node_cluster_fixture()


@pytest.mark.timeout(300)
def test_env_replicas_with_a_tool_that_never_answers_keep_the_runs_pace(
    tmp_path: Path, two_nodes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gym_bridge.train import setup
    from tests.train.helpers import save_random_tiny

    model_dir = save_random_tiny(tmp_path / "tiny", seed=4)
    per_replica = CLEAN_STEPS * ROLLOUTS // 2
    cfg = shop_run(
        tmp_path, model_dir, f"env.shop.server={STRAGGLER_SERVER}", "env.shop.replicas=2",
        f"env.shop.config={{hang_every: 7, hang_after: {per_replica}, hang_in: tool, delay_s: 0.3}}",
        f"cluster.ray_address={two_nodes.address}", "grpo.rollout_timeout_s=1.5",
    )  # fmt: skip
    started: list[Any] = []
    start_env_replicas = setup.start_env_replicas

    def recorded(cfg: Any, stack: ExitStack) -> Any:
        replicas = start_env_replicas(cfg, stack)
        started.append(replicas["shop"])
        two_nodes.started.update(w["pid"] for w in replicas["shop"].where)
        urls = [w["url"] for w in replicas["shop"].where]
        stack.callback(lambda: hung.extend(health(url)["hung"] for url in urls))  # before the replicas stop
        return replicas

    hung: list[int] = []
    monkeypatch.setattr(setup, "start_env_replicas", recorded)
    steps = train_steps(cfg, monkeypatch)  # (sync: Shopper samples in the trainer's process)
    assert not ray.is_initialized()

    # 8 sessions a step on each replica; calls 31, 38, 45 of each never answer: one per replica in steps 4-6.
    timed_out = [r["rollouts_timed_out"] for r in steps]
    assert timed_out == [0] * CLEAN_STEPS + [2] * (STEPS - CLEAN_STEPS) and sum(timed_out) == sum(hung) == 6, hung
    assert within_deadline(steps, 1.5), [r["time_step_s"] for r in steps]
    assert all(r["env_replicas_lost"] == 0 and r["request_retries"] == 0 for r in steps)  # a hang is not a loss
    for r in steps[CLEAN_STEPS:]:
        assert r["rollout_failures"] == 2 and r["num_samples"] == ROLLOUTS - 4 * r["groups_dropped_for_timeout"]
    assert len({w["node_id"] for w in started[0].where}) == 2


def health(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
        return json.loads(answer.read())
