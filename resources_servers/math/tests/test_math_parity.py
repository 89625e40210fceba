r"""The default rule is NeMo Gym 0.7.0's: every row of a table of varied answers scored by NeMo Gym's own
``math_with_judge`` code (``tests/data/nemo_gym/math_parity.jsonl``, made by
``scripts/nemo_gym_math_parity.py``) gets the same reward from this server over HTTP. NeMo Gym itself is
not needed here."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.math.app import MathConfig, MathServer
from resources_servers.math.tests.helpers import REFERENCE_DIR, verify_body, wait_for_pool

TABLE = REFERENCE_DIR / "math_parity.jsonl"
ROWS = [json.loads(line) for line in TABLE.read_text().splitlines()]


@pytest.fixture(scope="module")
def default_server() -> Iterator[str]:
    # The shipped defaults (config.yaml), two workers.
    config = MathConfig.from_yaml("resources_servers/math/config.yaml").model_copy(update={"pool_size": 2})
    with start_in_thread(MathServer(config=config).build_app()) as running:
        wait_for_pool(running.url)
        yield running.url


def test_the_table_is_nemo_gyms_and_varied() -> None:
    assert len(ROWS) >= 300
    assert {row["nemo_gym_version"] for row in ROWS} == {"0.7.0"}
    categories = Counter(row["category"] for row in ROWS)
    for category in (
        "integer",
        "fraction",
        "percent",
        "sqrt",
        "interval",
        "set",
        "unicode",
        "fbox",
        "relation",
        "huge",
    ):
        assert categories[category] >= 4, categories
    rewards = Counter(row["nemo_gym_reward"] for row in ROWS)
    assert rewards[0.0] >= 100 and rewards[1.0] >= 100, rewards


async def _rewards(url: str) -> list[dict[str, Any]]:
    semaphore = asyncio.Semaphore(8)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def one(row: dict[str, Any]) -> dict[str, Any]:
            async with semaphore:
                body = verify_body(row["response_text"], row["expected_answer"])
                response = await client.post("/verify", json=body)
            assert response.status_code == 200, response.text
            return response.json()

        return await asyncio.gather(*(one(row) for row in ROWS))


def test_the_default_rule_equals_nemo_gyms_on_every_row(default_server: str) -> None:
    answers = asyncio.run(_rewards(default_server))
    disagreements = [
        (
            row["id"],
            row["expected_answer"],
            row["response_text"],
            row["nemo_gym_reward"],
            out["reward"],
            out["failure_kind"],
        )
        for row, out in zip(ROWS, answers, strict=True)
        if out["reward"] != row["nemo_gym_reward"]
    ]
    assert disagreements == [], f"{len(disagreements)} of {len(ROWS)} rows differ: {disagreements[:20]}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{50\\%}", "50"),  # issue 34, finding 4
        ("\\fbox{7}", "7"),
        ("\\boxed{1 2}", "12"),  # issue 33, finding 9
        ("\\boxed{4+10^{-31}}", "4"),
        ("\\boxed{4-10^{-100}}", "4"),
        ("\\boxed{\\frac{4\\cdot10^{40}+1}{10^{40}}}", "4"),
        ("\\boxed{４}", "4"),
        # Red-team round 3, hedges that held (NeMo Gym 0.7.0 scores each 0 too): several values, a set,
        # an interval or inequality holding the answer, plus-minus, undefined values, hidden digits.
        ("\\boxed{3} or \\boxed{4}", "4"),
        ("\\boxed{3 \\text{ or } 4}", "4"),
        ("\\boxed{3, 4}", "4"),
        ("\\boxed{\\{3,4\\}}", "4"),
        ("\\boxed{x \\in \\{3,4\\}}", "4"),
        ("\\boxed{x = 3 \\text{ or } x = 4}", "4"),
        ("\\boxed{2 < x < 5}", "4"),
        ("\\boxed{[3,5]}", "4"),
        ("\\boxed{[0,\\infty)}", "4"),
        ("\\boxed{\\pm 4}", "4"),
        ("\\boxed{4 \\pm 1}", "4"),
        ("\\boxed{\\frac{0}{0}}", "4"),
        ("\\boxed{\\infty - \\infty}", "4"),
        ("\\boxed{0^0}", "4"),
        ("\\boxed{x}", "4"),
        ("\\boxed{\\mathbb{R}}", "4"),
        ("\\boxed{\\phantom{3}4}", "4"),  # read as 3 4, that is 7
        ("\\boxed{\\color{white}{3}4}", "4"),
        ("\\boxed{\\def\\x{4}\\x}", "4"),
        ("<think>\\boxed{4}</think> \\boxed{5}", "4"),  # a box in the reasoning counts too
        ("\\boxed{3.99999}", "4"),
        ("\\boxed{40\\%}", "4"),
        ("\\boxed{\\text{four}}", "4"),
    ],
)
def test_answers_nemo_gym_scores_zero_score_zero(default_server: str, text: str, expected: str) -> None:
    out = httpx.post(f"{default_server}/verify", json=verify_body(text, expected), timeout=60).json()
    assert out["reward"] == 0.0, out
