"""The math server over real HTTP: verdicts, NeMo Gym reference records, bad input, sessions, auth, load."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from gym_bridge.serving.cookie_sessions import SESSION_COOKIE
from resources_servers.math.app import DEFAULT_CONFIG_PATH, MathConfig, MathServer, MathVerifyRequest
from resources_servers.math.tests.helpers import TOKEN, verify_body

EXAMPLE_DATA = Path(__file__).resolve().parents[1] / "data" / "example.jsonl"


def verify(client: httpx.Client, text: str | None, expected: Any, **extra: Any) -> dict[str, Any]:
    response = client.post("/verify", json=verify_body(text, expected, **extra))
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize(
    ("text", "expected", "reward", "extracted", "method"),
    [
        ("So the total is \\boxed{12}.", "12", 1.0, "12", "boxed"),
        ("So the total is \\boxed{13}.", "12", 0.0, "13", "boxed"),
        ("\\boxed{\\frac{6}{8}}", "\\(\\frac{3}{4}\\)", 1.0, "3/4", "boxed"),
        ("\\boxed{0.75}", "\\frac{3}{4}", 1.0, "0.750000000000000", "boxed"),  # SymPy's Float rendering
        ("\\boxed{\\dfrac{\\sqrt{8}}{2}}", "\\(\\sqrt{2}\\)", 1.0, "sqrt(8)/2", "boxed"),
        ("\\boxed{2\\pi}", "$2\\pi$", 1.0, "2*pi", "boxed"),
        ("\\boxed{x = 4}", "4", 1.0, "Eq(x, 4)", "boxed"),
        ("\\boxed{\\{1, 2\\}}", "\\{2, 1\\}", 1.0, "{1, 2}", "boxed"),
        ("\\boxed{\\pi}", "3", 0.0, "pi", "boxed"),
        ("First 3, then the answer is \\boxed{-6}", "-6", 1.0, "-6", "boxed"),
    ],
)
def test_verdicts(
    client: httpx.Client, text: str, expected: str, reward: float, extracted: str, method: str
) -> None:
    out = verify(client, text, expected)
    assert (out["reward"], out["library_reward"]) == (reward, reward)
    assert out["extracted_answer"] == extracted
    assert out["extraction_method"] == method
    assert out["failure_kind"] is None and out["failure_reason"] is None
    assert out["mask_sample"] is False and out["judge_evaluations"] is None


@pytest.mark.parametrize(
    ("text", "expected", "reward", "extracted"),
    [
        ("The answer is 4.5.", "4.5", 1.0, "4.50000000000000"),
        ("Answer: $\\frac{1}{4}$", "\\frac{1}{4}", 1.0, "1/4"),
        ("work\n#### 12", "12", 1.0, "12"),
    ],
)
def test_phrase_answers_when_the_request_opts_in(
    client: httpx.Client, text: str, expected: str, reward: float, extracted: str
) -> None:
    default = verify(client, text, expected)
    assert default["reward"] == 0.0 and default["failure_kind"] == "no_answer"
    out = verify(client, text, expected, extraction="boxed_or_final")
    assert (out["reward"], out["library_reward"]) == (reward, reward)
    assert out["extracted_answer"] == extracted
    assert out["extraction_method"] == "final_answer" and out["failure_kind"] is None


def test_response_echoes_the_request(client: httpx.Client) -> None:
    body = verify_body(
        "\\boxed{5}", "5", question="What is 2 + 3?", verifier_metadata={"id": 7}, _ng_task_index=3
    )
    out = client.post("/verify", json=body).json()
    assert {k: out[k] for k in body} == body


def test_problem_field_and_integer_expected_answer(client: httpx.Client) -> None:
    out = verify(client, "\\boxed{4}", 4, problem="Solve for x: 2x + 3 = 11.")
    assert out["reward"] == 1.0 and out["problem"] == "Solve for x: 2x + 3 = 11."
    assert out["expected_answer"] == "4"


def test_no_answer(client: httpx.Client) -> None:
    empty = verify(client, None, "3")
    assert empty["reward"] == 0.0 and empty["failure_kind"] == "no_answer"
    assert "no assistant message text" in empty["failure_reason"]
    blank = verify(client, "   ", "3")
    assert blank["failure_kind"] == "no_answer"
    unboxed = verify(client, "I think it is 3", "3")  # the last-number fallback is off by default
    assert unboxed["reward"] == 0.0 and unboxed["failure_kind"] == "no_answer"
    assert "no non-empty last \\boxed{} (extraction mode 'boxed')" in unboxed["failure_reason"]
    assert unboxed["extraction_method"] is None and unboxed["extracted_answer"] is None


def test_unparsable_answer_and_expected_answer(client: httpx.Client) -> None:
    garbled = verify(client, "\\boxed{a+*b}", "3")
    assert garbled["reward"] == 0.0 and garbled["failure_kind"] == "unparsable_answer"
    bad_gold = verify(client, "\\boxed{3}", "\\frac{")
    assert bad_gold["reward"] == 0.0 and bad_gold["failure_kind"] == "unparsable_expected_answer"


def test_reasoning_and_tool_items_are_not_answer_text(client: httpx.Client) -> None:
    body = verify_body("\\boxed{7}", "7")
    body["response"]["output"] = [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "\\boxed{8}"}]},
        {"type": "function_call_output", "call_id": "c1", "output": "\\boxed{9}"},
        *body["response"]["output"],
    ]
    assert client.post("/verify", json=body).json()["reward"] == 1.0


# --------------------------------------------------------------------------- NeMo Gym's records


def _reference_records(reference_dir: Path) -> list[dict[str, Any]]:
    rows = [
        json.loads(line) for line in (reference_dir / "math_rollouts.example.jsonl").read_text().splitlines()
    ]
    return [*rows, json.loads((reference_dir / "math_rollout.wire-captured.json").read_text())]


def test_reference_records_reverify_to_their_recorded_verdicts(
    client: httpx.Client, reference_dir: Path
) -> None:
    records = _reference_records(reference_dir)
    assert len(records) == 6
    for record in records:
        out = client.post("/verify", json=record).json()
        # Records whose library check failed went to NeMo Gym's LLM judge, which said "different"
        # every time here, so reward equals library_reward in all of them.
        assert out["reward"] == record["reward"] == record["library_reward"], record["expected_answer"]
        assert out["library_reward"] == record["library_reward"]
        assert out["extracted_answer"] == record["extracted_answer"]
        assert out["judge_evaluations"] is None


# --------------------------------------------------------------------------- task data and config


def test_example_rows_are_valid_tasks_and_verify(client: httpx.Client) -> None:
    rows = [json.loads(line) for line in EXAMPLE_DATA.read_text().splitlines()]
    assert 5 <= len(rows) <= 10
    assert any("question" in r for r in rows) and any("problem" in r for r in rows)
    for row in rows:
        answer = row["expected_answer"].strip("$").removeprefix("\\(").removesuffix("\\)")
        out = client.post("/verify", json={**verify_body(f"\\boxed{{{answer}}}", "x"), **row}).json()
        MathVerifyRequest.model_validate(row | {"response": {"output": []}})
        assert out["reward"] == 1.0, row


def test_config_file_is_loaded_and_strict(tmp_path: Path) -> None:
    assert MathServer().config == MathConfig.from_yaml(DEFAULT_CONFIG_PATH)
    bad = tmp_path / "config.yaml"
    bad.write_text("extraction: boxed\ntimeout_seconds: 3\n")
    with pytest.raises(ValueError, match="timeout_seconds"):
        MathConfig.from_yaml(bad)
    bad.write_text("extraction: last\n")
    with pytest.raises(ValueError, match="extraction"):
        MathConfig.from_yaml(bad)


# --------------------------------------------------------------------------- bad input


def test_missing_or_mistyped_fields_are_named(client: httpx.Client) -> None:
    body = verify_body("\\boxed{1}", "1")
    del body["expected_answer"]
    missing = client.post("/verify", json=body)
    assert missing.status_code == 422 and "expected_answer: Field required" in missing.json()["detail"]
    listed = client.post("/verify", json=verify_body("\\boxed{1}", ["1"]))
    assert listed.status_code == 422 and "expected_answer:" in listed.json()["detail"]
    no_output = client.post("/verify", json={**verify_body("x", "1"), "response": {"output": "text"}})
    assert no_output.status_code == 422 and "response.output" in no_output.json()["detail"]
    question = client.post("/verify", json=verify_body("\\boxed{1}", "1", question={"text": "q"}))
    assert question.status_code == 422 and "question:" in question.json()["detail"]
    mode = client.post("/verify", json=verify_body("\\boxed{1}", "1", extraction="last"))
    assert mode.status_code == 422 and "extraction:" in mode.json()["detail"]


def test_malformed_json_oversized_body_and_unknown_tool(client: httpx.Client) -> None:
    broken = client.post(
        "/verify", content=b'{"expected_answer": "1"', headers={"Content-Type": "application/json"}
    )
    assert broken.status_code == 422 and broken.json()["detail"].startswith(
        "invalid JSON at line 1 column 24"
    )
    huge = client.post("/verify", json=verify_body("\\boxed{1}" + " " * 2_000_000, "1"))
    assert huge.status_code == 413
    unknown = client.post("/calculator", json={"expr": "1+1"})
    assert unknown.status_code == 404 and "unknown tool 'calculator'" in unknown.json()["detail"]
    assert verify(client, "\\boxed{1}", "1")["reward"] == 1.0


# --------------------------------------------------------------------------- sessions and auth


def test_seed_session_sets_a_cookie_that_is_echoed(client: httpx.Client) -> None:
    seeded = client.post("/seed_session", json={"responses_create_params": {"input": "q"}})
    assert seeded.status_code == 200
    cookie = seeded.cookies[SESSION_COOKIE]
    again = client.post("/verify", json=verify_body("\\boxed{1}", "1"))
    assert again.status_code == 200 and "set-cookie" not in again.headers
    assert client.cookies[SESSION_COOKIE] == cookie


def test_bearer_auth(math_server: tuple[MathServer, str]) -> None:
    _, url = math_server
    body = verify_body("\\boxed{1}", "1")
    assert httpx.post(f"{url}/verify", json=body).status_code == 401
    assert (
        httpx.post(f"{url}/verify", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    )
    ok = httpx.post(f"{url}/verify", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json()["reward"] == 1.0
    health = httpx.get(f"{url}/health").json()
    assert health["verifier_pool"]["live_workers"] == 2 and health["extraction"] == "boxed"


# --------------------------------------------------------------------------- load and metrics


def test_fifty_concurrent_verifies(math_server: tuple[MathServer, str]) -> None:
    _, url = math_server
    cases = [
        (f"\\boxed{{{n}}}", str(n)) if n % 2 else (f"\\boxed{{\\sqrt{{{n * n}}}}}", f"\\({n}\\)")
        for n in range(50)
    ]

    async def run() -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as c:
            responses = await asyncio.gather(*(c.post("/verify", json=verify_body(t, e)) for t, e in cases))
        return [r.json() for r in responses]

    results = asyncio.run(run())
    assert [r["reward"] for r in results] == [1.0] * 50
    assert [r["expected_answer"] for r in results] == [e for _, e in cases]


def test_repeated_and_concurrent_identical_checks_run_once(math_server: tuple[MathServer, str]) -> None:
    server, url = math_server
    assert server.pool is not None
    stats = server.pool.stats
    checks, hits, coalesced = stats.checks, stats.cache_hits, stats.coalesced
    body = verify_body("\\boxed{\\frac{\\sqrt{12}}{2}}", "\\sqrt{3}")

    async def run() -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as c:
            responses = await asyncio.gather(*(c.post("/verify", json=body) for _ in range(8)))
            responses.append(await c.post("/verify", json=body))
        return [r.json() for r in responses]

    results = asyncio.run(run())
    assert {(r["reward"], r["extracted_answer"]) for r in results} == {(1.0, "sqrt(12)/2")}
    assert stats.checks == checks + 1  # one worker check for nine requests
    assert (stats.cache_hits - hits) + (stats.coalesced - coalesced) == 8
    assert stats.cache_hits > hits  # the last one came from the cache


def test_aggregate_metrics(client: httpx.Client) -> None:
    records = [
        verify(client, "\\boxed{4}", "4", _ng_task_index=0),
        verify(client, "The answer is 4", "4", _ng_task_index=0, extraction="boxed_or_final"),
        verify(client, "\\boxed{5}", "4", _ng_task_index=1),
        verify(client, "no idea", "4", _ng_task_index=1),
    ]
    metrics = client.post("/aggregate_metrics", json={"verify_responses": records}).json()["agent_metrics"]
    assert metrics["mean_reward"] == 0.5 and metrics["pass@2"] == 0.5
    assert metrics["extraction_methods"] == {"boxed": 2, "final_answer": 1, "none": 1}
    assert metrics["no_answer_rate"] == 0.25 and metrics["verifier_timeout_rate"] == 0.0
    assert metrics["mean_library_reward"] == 0.5
    assert metrics["failure_kinds"] == {"no_answer": 1}


# --------------------------------------------------------------------------- the CLI


def test_gym_bridge_serve_math() -> None:
    command = [sys.executable, "-m", "gym_bridge.cli", "serve", "math", "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None and process.stderr is not None
            line = process.stdout.readline()
            assert "listening on http://127.0.0.1:" in line, line + (
                process.stderr.read() if process.poll() else ""
            )
            url = line.split("listening on ")[1].split()[0]
            out = httpx.post(
                f"{url}/verify", json=verify_body("\\boxed{\\frac{1}{2}}", "0.5"), timeout=30
            ).json()
            assert out["reward"] == 1.0
        finally:
            process.terminate()
            process.wait(timeout=30)
