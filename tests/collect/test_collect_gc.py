"""collect runs its loop with the cycle collector's run thresholds (gym_bridge.serving.gc_policy), and restores them."""

from __future__ import annotations

import gc

from collect_helpers import read_jsonl, write_rows
from fake_model import FakeModel, arithmetic_row

from gym_bridge.collect import CollectConfig, collect
from gym_bridge.serving.gc_policy import RUN_THRESHOLDS


def test_collect_runs_with_rare_collections_and_restores_the_thresholds(tmp_path, boxed_env):
    before = gc.get_threshold()
    assert before != RUN_THRESHOLDS
    seen: list[tuple[int, ...]] = []
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, b) for b in range(1, 5)])
    config = CollectConfig(tasks, tmp_path / "rollouts.jsonl", envs=[boxed_env[0]], progress=False)
    with FakeModel() as model:
        config.model_url = model.url
        result = collect(config, on_progress=lambda stats, n: seen.append(gc.get_threshold()))
    assert seen and set(seen) == {RUN_THRESHOLDS}  # while the rollouts ran
    assert gc.get_threshold() == before
    assert [r["reward"] for r in read_jsonl(result.output_path)] == [1.0] * 4
