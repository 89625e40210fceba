r"""The ``strict`` setting over real HTTP (issue 33, finding 9): the default is NeMo Gym's verdict, which
scores answers that assert a relation, a negation, an approximation or trailing prose as right; with
``strict`` (server config or per request) they score 0, and plain right answers still score 1."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.math.app import MathServer
from resources_servers.math.tests.helpers import TEST_CONFIG, verify_body, wait_for_pool

HEDGES = [
    ("\\boxed{5 = 4}", "a relation"),
    ("\\boxed{4 \\approx 5}", "an approximation"),
    ("\\boxed{\\neg 4}", "a negation"),
    ("\\boxed{4 \\text{ is not the answer}}", "words"),
    ("\\boxed{4 \\neq 5}", "a relation"),
    ("\\boxed{4} and then \\boxed{5 = 4}", "a relation"),  # every box is read
]


def _verify(client: httpx.Client, text: str, expected: str, **extra: object) -> dict:
    response = client.post("/verify", json=verify_body(text, expected, **extra))
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize(("text", "kind"), HEDGES[:4])
def test_the_default_is_nemo_gyms_verdict_on_hedged_answers(
    client: httpx.Client, text: str, kind: str
) -> None:
    # NeMo Gym 0.7.0's math_with_judge scores these 1 (tests/data/nemo_gym/math_parity.jsonl, "relation").
    assert _verify(client, text, "4")["reward"] == 1.0


@pytest.mark.parametrize(("text", "kind"), HEDGES)
def test_strict_per_request_rejects_hedged_answers(client: httpx.Client, text: str, kind: str) -> None:
    out = _verify(client, text, "4", strict=True)
    assert out["reward"] == 0.0 and out["library_reward"] == 0.0
    assert out["failure_kind"] == "strict_rejected" and kind in out["failure_reason"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("So \\boxed{4}.", "4"),
        ("\\boxed{x = 4}", "4"),  # naming the variable is not a claim
        ("\\boxed{4 \\text{ cm}}", "4"),  # units are not prose
        ("\\boxed{y = 2x + 1}", "y = 2x + 1"),  # the expected answer is an equation itself
        ("\\boxed{\\frac{\\sqrt{8}}{2}}", "\\sqrt{2}"),
        ("\\boxed{\\text{(B)}}", "\\text{(B)}"),
        ("\\boxed{5!}", "120"),
    ],
)
def test_strict_keeps_plain_right_answers_right(client: httpx.Client, text: str, expected: str) -> None:
    out = _verify(client, text, expected, strict=True)
    assert out["reward"] == 1.0 and out["failure_kind"] is None, out


# Red-team round 3: each scored 1 under strict. math-verify cannot parse the box of the first group, and then
# scores the last number it finds anywhere in the response (here the 4 after the symbol it could not read);
# the second group parses, to a relation or to one side of it, through a symbol the patterns did not list.
UNREADABLE = [
    "\\boxed{3 \\lor 4}",
    "\\boxed{3 \\vee 4}",
    "\\boxed{3 \u2228 4}",  # logical or
    "\\boxed{3 | 4}",
    "\\boxed{3 \\cup 4}",
    "\\boxed{3 \\setminus 4}",
    "\\boxed{3 \\operatorname{or} 4}",
    "\\boxed{3 \\foo 4}",  # any command the parser does not know
    "\\boxed{\\iffalse 3 \\fi 4}",
    "\\boxed{5 \\coloneqq 4}",
    "\\boxed{5 \\Leftarrow 4}",
    "\\boxed{! 4}",
    "\\boxed{3 \\bmod 4}",  # 3 mod 4 is 3
    "\\boxed{\u202e3 4}",  # a right-to-left override
    "\\boxed{4} then \\boxed{3 \\lor 4}",
]
UNLISTED_SYMBOLS = [
    ("\\boxed{5 \u2261 4}", "a relation"),  # identical to: Eq(5, 4), scored by its right-hand side
    ("\\boxed{5 \uff1d 4}", "a relation"),  # fullwidth equals sign (NFKC: "=")
    ("\\boxed{5 \u225f 4}", "a relation"),  # questioned equal to
    ("\\boxed{4 \u2243 5}", "a relation"),  # asymptotically equal: math-verify reads the left side
    ("\\boxed{4 \u224a 5}", "a relation"),  # almost equal or equal to
    ("\\boxed{5 \u2254 4}", "a relation"),  # colon equals
    ("\\boxed{4 \\text{?}}", "a question mark"),
]


@pytest.mark.parametrize("text", UNREADABLE)
def test_strict_refuses_a_box_math_verify_cannot_read(client: httpx.Client, text: str) -> None:
    assert _verify(client, text, "4")["reward"] == 1.0  # NeMo Gym's verdict: the default keeps it
    out = _verify(client, text, "4", strict=True)
    assert out["reward"] == 0.0 and out["failure_kind"] == "strict_rejected", out
    assert "cannot read" in out["failure_reason"], out


@pytest.mark.parametrize(("text", "kind"), UNLISTED_SYMBOLS)
def test_strict_refuses_relations_written_as_unicode_symbols(
    client: httpx.Client, text: str, kind: str
) -> None:
    assert _verify(client, text, "4")["reward"] == 1.0
    out = _verify(client, text, "4", strict=True)
    assert (
        out["reward"] == 0.0 and out["failure_kind"] == "strict_rejected" and kind in out["failure_reason"]
    ), out


def test_strict_reads_a_phrase_answer_as_the_box_is_read(client: httpx.Client) -> None:
    # Without a box, the phrase's answer is the candidate: the same rule applies to it.
    body = {"extraction": "boxed_or_final"}
    # Without strict a phrase is refused too (test_math_phrase.py): the phrase rule is this project's own.
    assert _verify(client, "The answer is 3 \\lor 4.", "4", **body)["failure_kind"] == "phrase_rejected"
    out = _verify(client, "The answer is 3 \\lor 4.", "4", strict=True, **body)
    assert (
        out["reward"] == 0.0
        and out["failure_kind"] == "strict_rejected"
        and "cannot read" in out["failure_reason"]
    )
    assert _verify(client, "The answer is 4.", "4", strict=True, **body)["reward"] == 1.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{|-4|}", "4"),
        ("\\boxed{\\left|-4\\right|}", "4"),
        ("\\boxed{2^2}", "4"),
        ("\\boxed{\\dfrac{8}{2}}", "4"),
        ("\\boxed{4.0}", "4"),
        ("\\boxed{45^\\circ}", "45"),
        ("\\boxed{\\$4}", "4"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{[0, 1)}", "[0, 1)"),
        ("\\boxed{4\\%}", "4\\%"),
        ("\\boxed{x \\le 3}", "x \\leq 3"),
        ("\\boxed{\\text{(B)}}", "B"),
        ("First \\boxed{2}, so \\boxed{4}.", "\\{2, 4\\}"),
    ],
)
def test_strict_reads_ordinary_answers(client: httpx.Client, text: str, expected: str) -> None:
    out = _verify(client, text, expected, strict=True)
    assert out["reward"] == 1.0 and out["failure_kind"] is None, out


@pytest.fixture(scope="module")
def strict_server() -> Iterator[str]:
    config = TEST_CONFIG.model_copy(update={"strict": True, "pool_size": 1})
    with start_in_thread(MathServer(config=config).build_app()) as running:
        wait_for_pool(running.url)
        yield running.url


def test_strict_server_config_and_a_request_that_opts_out(strict_server: str) -> None:
    with httpx.Client(base_url=strict_server, timeout=60) as client:
        rejected = _verify(client, "\\boxed{4 \\approx 5}", "4")
        opted_out = _verify(client, "\\boxed{4 \\approx 5}", "4", strict=False)
        right = _verify(client, "\\boxed{4}", "4")
    assert rejected["reward"] == 0.0 and rejected["failure_kind"] == "strict_rejected"
    assert opted_out["reward"] == 1.0  # the request's own setting wins
    assert right["reward"] == 1.0


def test_the_audit_finds_nothing_on_a_strict_server(strict_server: str, tmp_path: Path) -> None:
    # gym-bridge audit --strict: the catalogue's strict attacks (the relations and hedges above among them).
    from gym_bridge.audit.attacks import AuditOptions
    from gym_bridge.audit.envs.math import attacks

    strict_only = {a.name for a in attacks(AuditOptions(strict=True))} - {
        a.name for a in attacks(AuditOptions())
    }
    assert {"disjunction", "unknown_command", "unicode_relation", "question_mark"} <= strict_only
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "gym_bridge.cli", "audit", strict_server, "--env", "math", "--strict"]
    command += ["--json", str(report), *(f"--only={name}" for name in sorted(strict_only))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    result = json.loads(report.read_text())
    assert done.returncode == 0 and result["findings"] == [], (done.stdout[-2000:], result["findings"])
    assert {o["attack"] for o in result["outcomes"]} >= strict_only


def test_a_mistyped_strict_field_is_named(client: httpx.Client) -> None:
    response = client.post("/verify", json=verify_body("\\boxed{4}", "4", strict="sometimes"))
    assert response.status_code == 422 and "strict" in response.text
