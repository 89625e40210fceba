r"""The default answer rule over real HTTP: NeMo Gym's (a non-empty last ``\boxed{}``), scored as NeMo
Gym's math_with_judge scores boxed answers, and the phrase fallbacks only when a config opts in."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import httpx
import pytest
from math_verify.metric import math_metric
from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

from gym_bridge.rollout.envs import running_env
from resources_servers.math.tests.helpers import verify_body


def nemo_gym_reward(expected: str, text: str) -> float:
    """NeMo Gym's math_with_judge library reward (its ``_run_math_verify``): the whole response text to
    math-verify, the expected answer wrapped in ``\\boxed{}``, any exception scored 0."""
    metric = math_metric(
        gold_extraction_target=(LatexExtractionConfig(),),
        pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()),
    )
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            score, _ = metric(["\\boxed{" + expected + "}"], [text])
    except BaseException:  # noqa: BLE001  (NeMo Gym catches math-verify's TimeoutException too)
        return 0.0
    return float(score)


BOXED_CASES = [
    ("First \\boxed{3}, then \\boxed{7}", "7"),
    ("First \\boxed{7}, then \\boxed{3}", "7"),
    ("\\boxed{7}. Double-checking: \\boxed{7}", "7"),
    ("The roots are \\boxed{1} and \\boxed{2}", "\\{1, 2\\}"),
    ("\\boxed{\\frac{1}{2}} or rather \\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{\\boxed{4}}", "4"),
    ("So \\boxed{\\frac{\\sqrt{8}}{2}}.", "\\sqrt{2}"),
    ("Thus \\boxed{x = 4}", "4"),
    ("\\boxed{12} is the total", "12"),
    ("\\boxed{13}", "12"),
]


@pytest.fixture(scope="module")
def default_math() -> Any:
    with running_env("math", workers=1) as url:
        yield url


@pytest.mark.parametrize(("text", "expected"), BOXED_CASES)
def test_boxed_answers_score_as_nemo_gym_scores_them(default_math: str, text: str, expected: str) -> None:
    out = httpx.post(f"{default_math}/verify", json=verify_body(text, expected), timeout=60).json()
    assert out["reward"] == nemo_gym_reward(expected, text), out
    several = text.count("\\boxed{") > 1
    assert out["extraction_method"] == ("all_boxes" if several else "boxed")


def test_first_wrong_then_right_box_scores_zero(default_math: str) -> None:
    # The example: NeMo Gym reads both boxes (the set {3, 7}), so the answer is not 7.
    out = httpx.post(
        f"{default_math}/verify", json=verify_body("First \\boxed{3}, then \\boxed{7}", "7"), timeout=60
    ).json()
    assert out["reward"] == 0.0 and out["extraction_method"] == "all_boxes" and out["failure_kind"] is None


@pytest.mark.parametrize("text", ["The answer is 7", "Answer: 7", "#### 7", "\\boxed{}", "\\boxed{7} then \\boxed{"])
def test_no_non_empty_last_box_scores_zero_by_default(default_math: str, text: str) -> None:
    out = httpx.post(f"{default_math}/verify", json=verify_body(text, "7"), timeout=60).json()
    assert out["reward"] == 0.0 and out["failure_kind"] == "no_answer" and out["extraction_method"] is None


UNBOXED_CASES = [
    ("The answer is 7", "7"),
    ("Answer: 7", "7"),
    ("#### 7", "7"),
    ("7", "7"),
    ("So $\\frac{1}{2}$ it is", "0.5"),
    ("The final answer is $8$. Or \\boxed{7}", "7"),
    ("no idea", "7"),
    ("3 * 4 = 13", "12"),
]


@pytest.mark.parametrize(("text", "expected"), BOXED_CASES + UNBOXED_CASES)
def test_mode_nemo_gym_scores_every_response_as_nemo_gym(default_math: str, text: str, expected: str) -> None:
    body = verify_body(text, expected, extraction="whole_text")
    out = httpx.post(f"{default_math}/verify", json=body, timeout=60).json()
    assert out["reward"] == nemo_gym_reward(expected, text), out
    assert out["extraction_method"] == "whole_text"


def test_a_config_opts_in_to_the_phrase_fallbacks() -> None:
    # What a trainer's env.math.config does (recipes/grpo_math_tiny.yaml).
    with running_env("math", workers=1, extraction="boxed_or_final") as url:
        health = httpx.get(f"{url}/health", timeout=30).json()
        out = httpx.post(f"{url}/verify", json=verify_body("The answer is 7.", "7"), timeout=60).json()
        strict = httpx.post(
            f"{url}/verify", json=verify_body("The answer is 7.", "7", extraction="boxed"), timeout=60
        ).json()
    assert health["extraction"] == "boxed_or_final"
    assert out["reward"] == 1.0 and out["extraction_method"] == "final_answer"
    assert strict["reward"] == 0.0 and strict["failure_kind"] == "no_answer"  # the request's own rule


def test_an_unknown_server_setting_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="extractoin"), running_env("math", extractoin="boxed"):
        pass
    with pytest.raises(ValueError, match="extraction"), running_env("math", extraction="phrase"):
        pass


def test_the_tiny_recipe_opts_in_and_its_math_server_reads_phrases() -> None:
    from gym_bridge.train.config import load_config

    recipe = Path(__file__).resolve().parents[3] / "recipes" / "grpo_math_tiny.yaml"
    env = load_config(str(recipe), []).env["math"]
    assert env.config == {"extraction": "boxed_or_final"}
    with running_env(env.server or "math", workers=1, **env.config) as url:  # as the trainer starts it
        out = httpx.post(f"{url}/verify", json=verify_body("The answer is 7.", "7"), timeout=60).json()
    assert out["reward"] == 1.0 and out["extraction_method"] == "final_answer"
