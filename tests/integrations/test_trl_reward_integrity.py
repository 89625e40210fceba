"""A rollout the server could not score is left out of TRL's group, not learned as a wrong answer.

A real server on loopback whose ``/verify`` keeps failing (503, after the retries) for some sessions:
before, :class:`GymReward` scored those rollouts 0, which TRL's GRPOTrainer learned as wrong answers
(an honest completion pushed down, the rest of its group lifted by a lower baseline). Now they are
``None`` (``on_verify_failure="mask"``): TRL 1.16 leaves them out of the group mean and gives them
advantage 0, shown here inside TRL's own GRPOTrainer. ``"zero"`` keeps the old score, ``"raise"`` stops.
A ``reward_key`` the answer lacks is a failed rollout, not 0; the tool environment follows the same rule.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from gym_bridge.integrations.trl import TASK_ROW_COLUMN, GymReward, gym_environment_factory, task_dataset
from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.retry import RetryPolicy
from gym_bridge.serving.server import ResourcesServer, Session, tool
from gym_bridge.serving.uvicorn_thread import start_in_thread

FAST = RetryPolicy(max_attempts=2, backoff_base=0.01)
REPO = Path(__file__).resolve().parents[2]
MATH_ROWS = REPO / "resources_servers" / "math" / "data" / "example.jsonl"


class NoteArgs(BaseModel):
    text: str


class PartlyBrokenEnv(ResourcesServer):
    """Numbers sessions in seeding order; sessions 0 and 3 (of each 4) answer ``/verify`` with 503 every
    time, session 1 scores 1 and session 2 scores 0. A row with ``components`` answers with those
    ``reward_components``; a row with ``broken`` fails every session. A row with ``wants`` scores by
    outcome: 1 when the session kept that note; with ``tools_down`` too, ``note`` answers 503."""

    name = "partly_broken"

    def __init__(self) -> None:
        super().__init__()
        self.seeded = 0

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        session.state["n"] = self.seeded
        session.state["tools_down"] = bool(body.get("tools_down"))
        self.seeded += 1
        return {}

    @tool
    async def note(self, args: NoteArgs, session: Session) -> dict[str, Any]:
        """Keep a note."""
        if session.state.get("tools_down"):
            raise HTTPException(503, "overloaded")
        session.state["note"] = args.text
        return {"kept": args.text}

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        n = session.state.get("n", 0) % 4
        if n in (0, 3) or getattr(body, "broken", False):
            raise HTTPException(503, "overloaded")
        extra = {"reward_components": body.components} if getattr(body, "components", None) else {}  # type: ignore[attr-defined]
        if wants := getattr(body, "wants", None):  # by outcome, as tool_use's reference_calls
            return VerifyResponse(**dump(body), reward=float(session.state.get("note") == wants))
        return VerifyResponse(**{**dump(body), **extra}, reward=float(n == 1))


@pytest.fixture()
def broken() -> Iterator[tuple[PartlyBrokenEnv, str]]:
    env = PartlyBrokenEnv()
    with start_in_thread(env.build_app()) as running:
        yield env, running.url


def _columns(n: int, **extra: Any) -> dict[str, list[str]]:
    return {TASK_ROW_COLUMN: [json.dumps({"responses_create_params": {"input": "hi"}, **extra})] * n}


def _verdicts(reward: GymReward) -> list[str]:
    return ["failed" if a is None else str(a["reward"]) for a in reward.last_answers]


def test_a_failed_verify_is_none_by_default_with_a_warning(
    broken: tuple[PartlyBrokenEnv, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, url = broken
    reward = GymReward(url, retry=FAST, max_concurrency=1)  # one at a time: session n is rollout n
    with caplog.at_level(logging.WARNING, logger="gym_bridge.integrations.trl"):
        got = reward(["p"] * 4, ["a", "b", "c", "d"], **_columns(4))
    assert got == [None, 1.0, 0.0, None]  # before: [0.0, 1.0, 0.0, 0.0]
    assert _verdicts(reward) == ["failed", "1.0", "0.0", "failed"]
    warned = [r.getMessage() for r in caplog.records]
    assert any("rollout 0 left out (None)" in m and "503" in m for m in warned), warned


def test_zero_keeps_the_old_score_and_raise_stops(broken: tuple[PartlyBrokenEnv, str]) -> None:
    _, url = broken
    zero = GymReward(url, retry=FAST, max_concurrency=1, on_verify_failure="zero")
    assert zero(["p"] * 4, ["a", "b", "c", "d"], **_columns(4)) == [0.0, 1.0, 0.0, 0.0]
    stop = GymReward(url, retry=FAST, max_concurrency=1, on_verify_failure="raise")
    with pytest.raises(RuntimeError, match=r"rollout 0 has no reward \(on_verify_failure='raise'\).*verify.*503"):
        stop(["p"] * 4, ["a", "b", "c", "d"], **_columns(4))
    with pytest.raises(ValueError, match="on_verify_failure: 'skip' is not one of mask, zero, raise"):
        GymReward(url, on_verify_failure="skip")  # type: ignore[arg-type]


def test_every_rollout_failing_still_raises_under_mask(broken: tuple[PartlyBrokenEnv, str]) -> None:
    _, url = broken
    with pytest.raises(RuntimeError, match=r"every /verify of the batch failed \(2\)"):
        GymReward(url, retry=FAST)(["p"] * 2, ["a", "b"], **_columns(2, broken=True))


def test_a_reward_key_the_answer_lacks_is_a_failure_not_zero(broken: tuple[PartlyBrokenEnv, str]) -> None:
    """A misspelt ``reward_key`` (or a server that leaves the component out) had scored every rollout 0
    and trained on nothing; now the rollout fails, and a whole batch of them raises."""
    env, url = broken
    columns = _columns(2, components={"format": 0.5})
    env.seeded = 1  # sessions 1 and 2: both answer
    assert GymReward(url, reward_key="format", max_concurrency=1)(["p"] * 2, ["a", "b"], **columns) == [0.5, 0.5]
    env.seeded = 1
    with pytest.raises(RuntimeError, match=r"every /verify.*no reward_components\['formt'\] \(reward_key\)"):
        GymReward(url, reward_key="formt", max_concurrency=1)(["p"] * 2, ["a", "b"], **columns)


NOTE_TOOL = [{"type": "function", "name": "note", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}]  # fmt: skip


def test_tool_environment_failed_verify_is_none_and_before_reset_raises(broken: tuple[PartlyBrokenEnv, str]) -> None:
    _, url = broken
    row = {TASK_ROW_COLUMN: json.dumps({"responses_create_params": {"input": "hi"}})}
    Env = gym_environment_factory(url, NOTE_TOOL, retry=FAST)
    with pytest.raises(RuntimeError, match=r"get_reward\(\) before reset\(\)"):
        Env().get_reward()  # before: 0.0
    rollouts = [Env() for _ in range(3)]
    for rollout in rollouts:
        rollout.reset(**row)  # sessions 0, 1, 2
    assert [r.get_reward() for r in rollouts] == [None, 1.0, 0.0]  # before: [0.0, 1.0, 0.0]
    assert rollouts[0].last_answer is None
    Zero = gym_environment_factory(url, NOTE_TOOL, retry=FAST, on_verify_failure="zero")
    zero = Zero()
    zero.reset(**row)  # session 3: fails
    assert zero.get_reward() == 0.0


def test_grpo_trainer_leaves_a_failed_rollout_out_of_its_group(broken: tuple[PartlyBrokenEnv, str], tmp_path: Path) -> None:
    """One GRPO step of TRL's own trainer, 1 prompt x 4 generations, scored concurrently: two rollouts
    score 1 and 0, two fail. TRL logs the mean of the two scored (0.5; before 0.25) and gives the failed
    ones advantage 0 (before: about -0.5 each, learned as wrong answers)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from gym_bridge.models.tiny import ensure_tiny

    _, url = broken
    reward = GymReward(url, retry=FAST)
    scored: list[tuple[list[str], list[float]]] = []

    class Recording(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):  # type: ignore[no-untyped-def]
            out = super()._generate_and_score_completions(inputs)
            scored.append((_verdicts(reward), out["advantages"].tolist()))
            return out

    path = ensure_tiny()
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
        max_steps=1, learning_rate=1e-5, beta=0.0, bf16=False, fp16=False, gradient_checkpointing=False,
        use_cpu=True, logging_steps=1, save_strategy="no", report_to="none", seed=0,
    )  # fmt: skip
    trainer = Recording(
        model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        reward_funcs=reward,
        args=args,
        train_dataset=task_dataset(MATH_ROWS).select([0]),
        processing_class=AutoTokenizer.from_pretrained(path),
    )
    trainer.train()
    assert len(scored) == 1
    verdicts, advantages = scored[0]
    assert sorted(verdicts) == ["0.0", "1.0", "failed", "failed"]
    for verdict, advantage in zip(verdicts, advantages, strict=True):
        if verdict == "failed":
            assert advantage == 0.0
        else:
            assert (advantage > 0.5) == (verdict == "1.0") and abs(advantage) > 0.5, (verdict, advantage)
    logged = next(h for h in trainer.state.log_history if "rewards/gym_reward/mean" in h)
    assert logged["rewards/gym_reward/mean"] == pytest.approx(0.5)
    assert logged["reward"] == pytest.approx(0.5)


def test_a_tool_call_that_failed_leaves_the_rollout_unscored(broken: tuple[PartlyBrokenEnv, str]) -> None:
    """The model made the right call but the server failed it (503 after the retries): scored by outcome,
    the rollout had got 0 for the server's fault; now it is None (``collect`` fails such a rollout too)."""
    env, url = broken
    env.seeded = 1  # sessions whose /verify answers
    Env = gym_environment_factory(url, NOTE_TOOL, retry=FAST)
    row = {"responses_create_params": {"input": "note milk"}, "wants": "milk"}
    honest, unlucky = Env(), Env()
    honest.reset(**{TASK_ROW_COLUMN: json.dumps(row)})
    unlucky.reset(**{TASK_ROW_COLUMN: json.dumps({**row, "tools_down": True})})
    assert json.loads(honest.note(text="milk")) == {"kept": "milk"}
    assert "503" in json.loads(unlucky.note(text="milk"))["error"]  # the model sees the error and goes on
    assert honest.get_reward() == 1.0
    assert unlucky.get_reward() is None  # before: 0.0
    env.seeded = 1
    unlucky.reset(**{TASK_ROW_COLUMN: json.dumps(row)})  # a new rollout starts clean
    unlucky.note(text="milk")
    assert unlucky.get_reward() == 1.0


def test_a_row_field_named_like_the_row_column_never_replaces_the_row() -> None:
    """A task file re-exported from a dataset (``ds.to_json``) keeps a ``gym_task_row`` field; after its
    ``expected_answer`` was corrected, the stale copy had replaced the row the server scores against."""
    stale = json.dumps({"responses_create_params": {"input": "What is 2 + 2?"}, "expected_answer": "5"})
    row = {"responses_create_params": {"input": "What is 2 + 2?"}, "expected_answer": "4", TASK_ROW_COLUMN: stale}
    ds = task_dataset([row])
    assert json.loads(ds[0][TASK_ROW_COLUMN])["expected_answer"] == "4"  # before: "5"


TOOL_ROWS = REPO / "resources_servers" / "tool_use" / "data" / "example.jsonl"


def _call(function: Any) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": function}]}]


def test_a_malformed_tool_call_of_the_model_is_scored_by_the_server_not_left_out() -> None:
    """TRL hands on a tool call as the model wrote it (TRL's own loop only answers it with an error). A
    name that is a number had failed validation and, under ``"mask"``, left the model's own malformed call
    unpunished; a call without a name or a call that is a bare string had crashed the batch (KeyError,
    AttributeError). Now each goes to the real ``tool_use`` server, which scores it 0."""
    from gym_bridge.rollout.envs import running_env

    ds = task_dataset(TOOL_ROWS).select([0])  # expects add_to_cart(product_id="P450", quantity=1)
    right = _call({"name": "add_to_cart", "arguments": {"product_id": "P450", "quantity": 1}})
    odd = [
        _call({"name": 123, "arguments": {"product_id": "P450", "quantity": 1}}),
        _call({"arguments": {"product_id": "P450", "quantity": 1}}),
        [{"role": "assistant", "content": "", "tool_calls": ["add_to_cart"]}],
    ]
    completions = [right, *odd]
    with running_env("tool_use") as url:
        reward = GymReward(url)
        got = reward(list(ds["prompt"]) * 4, completions, **{TASK_ROW_COLUMN: list(ds[TASK_ROW_COLUMN]) * 4})
    assert got == [1.0, 0.0, 0.0, 0.0]
    names = [a["response"]["output"][0]["name"] for a in reward.last_answers]  # what the server was shown
    assert names == ["add_to_cart", "123", "", "add_to_cart"]


def test_a_verify_answer_without_a_usable_reward_is_never_a_reward() -> None:
    """Held (checked by the agent's ``verify_rollout``): a server answering a reward that is no finite
    number, or none, is a failed rollout (None), never 1.0 nor 0.0 made up from it."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def verify(request):  # type: ignore[no-untyped-def]
        return Response((await request.json())["raw"], media_type="application/json")

    raws = ['{"reward": 1.0}', '{"reward": NaN}', '{"reward": "1"}', '{"reward": true}', '{"reward": null}',
            '{"reward": 1e999}', '{"reward": {"v": 1}}', '{"score": 1}', '[1.0]', '{"reward": 1, "reward_components": {"a": NaN}}',
            '{"reward": 1' + "0" * 400 + "}"]  # fmt: skip
    app = Starlette(routes=[Route("/verify", verify, methods=["POST"])])
    with start_in_thread(app) as running:
        reward = GymReward(running.url, seed=False, retry=FAST, max_failed_fraction=1.0)
        rows = [json.dumps({"responses_create_params": {"input": "hi"}, "raw": raw}) for raw in raws]
        got = reward(["p"] * len(raws), ["x"] * len(raws), **{TASK_ROW_COLUMN: rows})
    assert got == [1.0] + [None] * (len(raws) - 1)


def test_a_batch_mostly_failed_raises_as_the_trainer_does(broken: tuple[PartlyBrokenEnv, str]) -> None:
    """3 of 4 rollouts failed: training on the one left had gone on with warnings only. Above
    ``max_failed_fraction`` (0.5, the trainer's ``grpo.max_failed_rollouts_fraction``) the batch raises."""
    env, url = broken
    ok = json.dumps({"responses_create_params": {"input": "hi"}})
    down = json.dumps({"responses_create_params": {"input": "hi"}, "broken": True})
    columns = {TASK_ROW_COLUMN: [down, down, down, ok]}
    env.seeded = -2  # one at a time: the last rollout is session 1, which scores 1
    with pytest.raises(RuntimeError, match=r"3 of 4 rollouts of the batch failed, more than max_failed_fraction 0\.5"):
        GymReward(url, retry=FAST, max_concurrency=1)(["p"] * 4, ["a"] * 4, **columns)
    env.seeded = -2
    lenient = GymReward(url, retry=FAST, max_concurrency=1, max_failed_fraction=0.75)
    assert lenient(["p"] * 4, ["a"] * 4, **columns) == [None, None, None, 1.0]
    with pytest.raises(ValueError, match="max_failed_fraction: must be within"):
        GymReward(url, max_failed_fraction=1.5)
