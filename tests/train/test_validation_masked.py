"""Validation samples the environment masks (``mask_sample: true``, e.g. a judge down) are left out of its means.

Before, ``val:accuracy`` counted a masked sample as reward 0: a judge failing on a quarter of the validation
calls lowered the accuracy by a quarter, and ``checkpointing.keep_top_k`` (ranked by ``val:accuracy``) kept
the checkpoints whose validation the judge happened to fail less. Now the means are over the scored samples,
``num_masked`` says how many were left out, and a validation with no masked sample reports what it did.
(NeMo RL's GRPO validation averages every reward, masked or not.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gym_bridge.serving.answers import Answer
from gym_bridge.serving.server import ResourcesServer, Session
from gym_bridge.train import loop
from gym_bridge.train.bookkeeping.checkpoint import CheckpointManager
from gym_bridge.train.bookkeeping.logging import read_metrics
from gym_bridge.train.config import load_config
from tests.train.helpers import PARITY_SERVER, SMALL_ONLINE_RUN, save_random_tiny, write_say_prompts


class RowVerdictServer(ResourcesServer):
    """The task row's ``truth`` as the reward, whatever the completion; a row with ``judge_down`` answers as
    a judge that failed: reward 0, ``failure_kind: judge_error``, ``mask_sample: true``."""

    name = "row_verdict"

    async def _verify_content(self, body: dict[str, Any], session: Session) -> Any:
        if body.get("judge_down"):
            answer = {**body, "reward": 0.0, "failure_kind": "judge_error", "failure_reason": "judge unreachable",
                      "mask_sample": True}  # fmt: skip
        else:
            answer = {**body, "reward": float(body["truth"])}
        return Answer(200, json.dumps(answer).encode(), (), answer)


TRUTH = [1, 1, 0, 1, 1, 0, 1, 1]
"""The validation rows' verdicts; rows 0 and 3 (both right) are the ones a failing judge masks."""


def _validation(path: Path, masked: set[int]) -> Path:
    rows = [{"responses_create_params": {"input": [{"role": "user", "content": f"Say {i}."}]}, "truth": t,
             "judge_down": i in masked} for i, t in enumerate(TRUTH)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _val_metrics(tmp_path: Path, masked: set[int]) -> tuple[dict[str, Any], Path]:
    model_dir = save_random_tiny(tmp_path / "tiny", seed=3)
    cfg = load_config(None, [
        *SMALL_ONLINE_RUN, "grpo.max_num_steps=1", "grpo.val_period=0", "grpo.val_at_start=true",
        "grpo.val_at_end=false", f"policy.model_name={model_dir}",
        f"data.train.data_path={write_say_prompts(tmp_path / 'say.jsonl', 8)}", "data.train.env_name=parity",
        f"env.parity.server={PARITY_SERVER}", f"data.validation.data_path={_validation(tmp_path / 'val.jsonl', masked)}",
        "data.validation.env_name=judge", f"env.judge.server={__name__}:RowVerdictServer",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}", "checkpointing.metric_name=val:accuracy",
        f"logger.log_dir={tmp_path / 'logs'}", "logger.tensorboard_enabled=false",
    ])  # fmt: skip
    loop.train(cfg, show_progress=False)
    (val,) = [r for r in read_metrics(tmp_path / "logs") if r["split"] == "val"]
    return val, tmp_path / "ckpt"


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("masked", "accuracy"),
    [({0, 3}, 4 / 6), (set(), 6 / 8)],  # 4 right of the 6 scored (before: 4/8); none masked: 6/8, as before
    ids=["two_masked", "none_masked"],
)
def test_validation_accuracy_is_over_the_samples_the_env_scored(
    tmp_path: Path, masked: set[int], accuracy: float
) -> None:
    val, ckpt = _val_metrics(tmp_path, masked)
    assert val["accuracy"] == pytest.approx(accuracy)
    assert val["num_samples"] == 8 and val["num_masked"] == len(masked)
    (saved,) = CheckpointManager(ckpt).checkpoints()  # what keep_top_k ranks the checkpoint by
    assert saved.info["metrics"]["val:accuracy"] == pytest.approx(accuracy)
