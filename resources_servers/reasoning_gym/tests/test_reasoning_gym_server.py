"""The reasoning_gym server over real HTTP: reasoning-gym's own scorers, NeMo Gym parity, bad input, the generator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import reasoning_gym

from gym_bridge.rollout.envs import running_env
from resources_servers.reasoning_gym.generate import task_rows
from resources_servers.reasoning_gym.tests.helpers import answered

DATA = Path(__file__).resolve().parents[1] / "data"
REPO = Path(__file__).resolve().parents[3]
FAMILIES = ["basic_arithmetic", "chain_sum", "knights_knaves", "word_sorting", "gcd"]


@pytest.fixture(scope="module")
def client():
    with running_env("reasoning_gym") as url, httpx.Client(base_url=url, timeout=60) as c:
        yield c


def score(family, answer, row):
    """What the reasoning-gym package itself gives ``answer`` on ``row``."""
    entry = {"question": row["question"], "answer": row["answer"], "metadata": row["metadata"]}
    return float(reasoning_gym.get_score_answer_fn(family)(answer=answer, entry=entry))


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_is_scored_by_its_own_scorer(client, family):
    for row in task_rows([family], 3, seed=5):
        right = client.post("/verify", json=answered(row, f"Thinking...\n<answer>{row['answer']}</answer>"))
        assert right.status_code == 200, right.text
        out = right.json()
        assert (out["reward"], out["score"], out["task_name"]) == (1.0, 1.0, family)
        assert out["extracted_answer"] == row["answer"] and out["extraction_method"] == "answer_tag"
        assert out["failure_kind"] is None
        wrong = client.post("/verify", json=answered(row, "<answer>certainly not this</answer>")).json()
        assert wrong["reward"] == score(family, "certainly not this", row) < 1.0
        assert wrong["extracted_answer"] == "certainly not this"


def test_extraction_order_answer_tag_then_first_boxed_then_whole_text(client):
    (row,) = task_rows(["basic_arithmetic"], 1, seed=1)  # "Calculate 5 - 3 - 6." -> -4
    assert row["answer"] == "-4"
    cases = [
        ("\\boxed{-4} but <answer>-4</answer>", 1.0, "-4", "answer_tag"),
        ("\\boxed{-4} then \\boxed{7}", 1.0, "-4", "boxed"),  # NeMo Gym takes the first box
        ("  -4 ", 1.0, "-4", "full_text"),
        ("it is -4", score("basic_arithmetic", "it is -4", row), "it is -4", "full_text"),  # partial credit
    ]
    assert 0 < cases[-1][1] < 1
    for text, reward, extracted, method in cases:
        out = client.post("/verify", json=answered(row, text)).json()
        assert (out["reward"], out["extracted_answer"], out["extraction_method"]) == (reward, extracted, method), text


def test_same_rewards_as_nemo_gyms_own_server_on_its_shipped_rollouts(client):
    """NeMo Gym 0.7.0's reasoning_gym example rollouts, scored by its server; ours must agree on each."""
    tasks = {json.loads(line)["question"]: json.loads(line) for line in (DATA / "nemo_gym" / "example.jsonl").open()}
    rollouts = [json.loads(line) for line in (DATA / "nemo_gym" / "example_rollouts.jsonl").open()]
    assert len(rollouts) == 5 and sorted(r["reward"] for r in rollouts) == [0.0, 0.0, 0.0, 1.0, 1.0]
    for rollout in rollouts:
        task = tasks[rollout["responses_create_params"]["input"][0]["content"]]
        out = client.post("/verify", json={**task, "response": rollout["response"]}).json()
        assert out["reward"] == rollout["reward"] and out["score"] == rollout["score"]
        # the reasoning-gym NeMo Gym ran left the tag's surrounding newlines on; 0.1.25 strips them
        assert out["extracted_answer"] == rollout["extracted_answer"].strip()
        assert out["task_name"] == rollout["task_name"]


def test_a_scorer_that_raises_gives_zero_and_says_why(client):
    (row,) = task_rows(["basic_arithmetic"], 1, seed=1)
    out = client.post("/verify", json=answered({**row, "answer": None}, "<answer>-4</answer>"))
    assert out.status_code == 200
    body = out.json()
    assert body["reward"] == 0.0 and body["failure_kind"] == "scorer_error" and "TypeError" in body["failure_reason"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"metadata": {"source_dataset": "no_such_family"}}, "metadata"),
        ({"metadata": {}}, "metadata"),
        ({"metadata": None}, "metadata"),
        ({"question": None}, "question"),
    ],
)
def test_bad_rows_are_422_naming_the_field(client, change, field):
    (row,) = task_rows(["gcd"], 1, seed=0)
    answer = client.post("/verify", json=answered({**row, **change}, "<answer>1</answer>"))
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"].startswith(field)
    if change.get("metadata") == {"source_dataset": "no_such_family"}:
        assert "unknown reasoning-gym family 'no_such_family'" in answer.json()["detail"]


def test_reverify_mode_and_aggregate(client):
    assert client.get("/reverify_mode").json() == "stateless"
    rows = list(task_rows(["chain_sum"], 2, seed=3))
    records = [
        client.post("/verify", json={**answered(row, f"<answer>{text}</answer>"), "_ng_task_index": i}).json()
        for i, row in enumerate(rows)
        for text in (row["answer"], "0")
    ]
    body = client.post("/aggregate_metrics", json={"verify_responses": records}).json()
    assert body["agent_metrics"]["mean/reward"] == pytest.approx(sum(r["reward"] for r in records) / 4)
    assert body["agent_metrics"]["pass@2"] == 1.0


def test_generator_cli_writes_disjoint_deterministic_splits(tmp_path):
    def run(out, *extra):
        return subprocess.run(
            [sys.executable, "-m", "resources_servers.reasoning_gym.generate", "--family", "basic_arithmetic,gcd",
             "--train-size", "40", "--validation-size", "10", "--seed", "7", "--out-dir", str(out), *extra],
            capture_output=True, text=True, cwd=REPO, timeout=300,
        )  # fmt: skip

    done = run(tmp_path / "a", "--suffix", " Put the answer in <answer></answer>.")
    assert done.returncode == 0, done.stderr
    assert "wrote 40 train and 10 validation rows" in done.stdout
    train = [json.loads(line) for line in (tmp_path / "a" / "train.jsonl").open()]
    validation = [json.loads(line) for line in (tmp_path / "a" / "validation.jsonl").open()]
    assert len(train) == 40 and len(validation) == 10
    assert {r["metadata"]["source_dataset"] for r in train} == {"basic_arithmetic", "gcd"}
    assert not {r["question"] for r in train} & {r["question"] for r in validation}
    assert train[0]["responses_create_params"]["input"][0]["content"] == train[0]["question"] + (
        " Put the answer in <answer></answer>."
    )
    assert run(tmp_path / "b", "--suffix", " Put the answer in <answer></answer>.").returncode == 0
    assert (tmp_path / "a" / "train.jsonl").read_text() == (tmp_path / "b" / "train.jsonl").read_text()
    bad = run(tmp_path / "c", "--config", '{"bogus": 1}')
    assert bad.returncode == 2 and "bogus" in bad.stderr and not (tmp_path / "c").exists()


def test_shipped_example_rows_verify(client):
    for line in (DATA / "example.jsonl").open():
        row = json.loads(line)
        out = client.post("/verify", json=answered(row, f"<answer>{row['answer']}</answer>")).json()
        assert out["reward"] == 1.0, row["question"]
