"""The math_chat server over real HTTP: the reply to the user's last message is scored, the record keeps all turns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.math.app import MathConfig, MathServer
from resources_servers.math_chat.app import MathChatServer

CONFIG = MathConfig(pool_size=1)


def _assistant(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def _body(output: list[dict[str, Any]], expected: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "What is 3 + 9?"}]},
        "response": {"id": "resp_1", "output": output},
        "expected_answer": expected,
    }


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    with (
        start_in_thread(MathChatServer(config=CONFIG).build_app()) as chat,
        start_in_thread(MathServer(config=CONFIG).build_app()) as math,
    ):
        yield {"math_chat": chat.url, "math": math.url}


def _verify(url: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{url}/verify", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


CORRECTED = [_assistant("\\boxed{12}"), _user("Sorry, I meant 3 + 4."), _assistant("\\boxed{7}")]


def test_the_reply_to_the_last_user_message_is_scored(urls: dict[str, str]) -> None:
    out = _verify(urls["math_chat"], _body(CORRECTED, "7"))
    assert out["reward"] == 1.0 and out["extracted_answer"] == "7" and out["scored_after_user_turns"] == 1
    assert out["response"]["output"] == CORRECTED  # the record keeps every turn
    # The first answer is not the final one: a reply that repeats it scores 0.
    repeated = [*CORRECTED[:2], _assistant("\\boxed{12}")]
    assert _verify(urls["math_chat"], _body(repeated, "7"))["reward"] == 0.0
    assert _verify(urls["math_chat"], _body(repeated, "12"))["reward"] == 1.0


def test_the_math_server_reads_every_reply_joined(urls: dict[str, str]) -> None:
    """Why math_chat exists: NeMo Gym's rule hands math-verify both boxes, the set {12, 7}: never right."""
    out = _verify(urls["math"], _body(CORRECTED, "7"))
    assert out["reward"] == 0.0 and out["extraction_method"] == "all_boxes"


def test_a_last_reply_without_a_box_never_scores_an_earlier_answer(urls: dict[str, str]) -> None:
    output = [_assistant("\\boxed{7}"), _user("Sorry, I meant 3 + 4."), _assistant("seven")]
    out = _verify(urls["math_chat"], _body(output, "7"))
    assert out["reward"] == 0.0 and out["failure_kind"] == "no_answer"


def test_without_user_turns_the_whole_output_is_the_reply(urls: dict[str, str]) -> None:
    out = _verify(urls["math_chat"], _body([_assistant("\\boxed{12}")], "12"))
    assert out["reward"] == 1.0 and out["scored_after_user_turns"] == 0


def test_bad_input_is_a_4xx_naming_the_field(urls: dict[str, str]) -> None:
    body = _body(CORRECTED, "7")
    del body["expected_answer"]
    answer = httpx.post(f"{urls['math_chat']}/verify", json=body, timeout=60)
    assert 400 <= answer.status_code < 500 and "expected_answer" in answer.text


def test_near_scale_adds_the_shaped_component_beside_the_reward(urls: dict[str, str]) -> None:
    def scored(answer: str, expected: str) -> dict[str, Any]:
        body = _body([*CORRECTED[:2], _assistant(answer)], expected)
        return _verify(urls["math_chat"], {**body, "verifier_metadata": {"near_scale": 4}})

    assert scored("\\boxed{7}", "7")["reward_components"] == {"correct": 1.0, "near": 1.0}
    off_by_one = scored("\\boxed{8}", "7")
    assert off_by_one["reward"] == 0.0 and off_by_one["reward_components"] == {"correct": 0.0, "near": 0.75}
    assert scored("\\boxed{-5}", "-3")["reward_components"]["near"] == 0.5
    assert scored("\\boxed{20}", "7")["reward_components"]["near"] == 0.0
    assert scored("no box", "7")["reward_components"] == {"correct": 0.0, "near": 0.0}
    # Only the reply to the last user message counts for near too: the first answer (12) is far off.
    assert scored("\\boxed{6}", "7")["reward_components"]["near"] == 0.75
    # Without near_scale there are no components.
    assert _verify(urls["math_chat"], _body(CORRECTED, "7")).get("reward_components") is None


@pytest.mark.parametrize(
    ("answer", "expected", "near"),
    [
        # A huge answer made near's division overflow a float: a 500 the policy could trigger at will.
        ("\\boxed{" + "9" * 400 + "}", "7", 0.0),
        ("The answer is " + "9" * 400 + ".", "7", 0.0),
        # Past Python's 4,300-digit int() limit: a 500 (ValueError), on the answer or the expected side.
        ("\\boxed{" + "1" * 5000 + "}", "7", 0.0),
        ("\\boxed{1}", "1" * 5000, 0.0),
        ("\\boxed{" + "1" * 150 + "}", "1" * 149 + "2", 0.75),  # exact integers: one apart
        # Digits math-verify does not read (reward 0, unparsable): near read them as 7 and paid 1.
        ("\\boxed{\u0667}", "7", 0.0),  # Arabic-Indic seven
        ("The answer is \uff17.", "7", 0.0),  # fullwidth seven
        ("\\boxed{9}", "7", 0.5),
    ],
)
def test_near_reads_only_what_the_verifier_reads_and_never_fails(
    urls: dict[str, str], answer: str, expected: str, near: float
) -> None:
    body = {**_body([*CORRECTED[:2], _assistant(answer)], expected), "verifier_metadata": {"near_scale": 4}}
    out = _verify(urls["math_chat"], {**body, "extraction": "boxed_or_final"})
    assert out["reward_components"]["near"] == near, out["reward_components"]
    assert out["reward_components"]["correct"] == out["reward"]


def test_a_bad_near_scale_is_a_4xx_naming_it(urls: dict[str, str]) -> None:
    body = {**_body(CORRECTED, "7"), "verifier_metadata": {"near_scale": 0}}
    answer = httpx.post(f"{urls['math_chat']}/verify", json=body, timeout=60)
    assert answer.status_code == 422 and "verifier_metadata.near_scale" in answer.text
    body = {**_body(CORRECTED, "7"), "verifier_metadata": {"min_user_turns": "1"}}
    answer = httpx.post(f"{urls['math_chat']}/verify", json=body, timeout=60)
    assert answer.status_code == 422 and "verifier_metadata.min_user_turns" in answer.text


def test_min_user_turns_scores_0_before_the_users_message(urls: dict[str, str]) -> None:
    """A first reply cut off at max_output_tokens ends the conversation before the correction; its box
    must not be scored against the corrected question."""
    meta = {"verifier_metadata": {"min_user_turns": 1, "near_scale": 4}}
    cut = _verify(urls["math_chat"], {**_body([_assistant("\\boxed{7} and so on and")], "7"), **meta})
    assert cut["reward"] == 0.0 and cut["failure_kind"] == "too_few_user_turns"
    assert cut["reward_components"] == {"correct": 0.0, "near": 0.0}
    assert _verify(urls["math_chat"], {**_body(CORRECTED, "7"), **meta})["reward"] == 1.0


def _old_record(server: MathChatServer, body: Any, users: int, scale: int | None) -> Any:
    """The record as math_chat built it before: the verdict and the response dumped and validated again."""
    import asyncio

    from gym_bridge.records.schema import dump, item_dict
    from resources_servers.math_chat.app import MathChatVerifyResponse, near

    def is_user(item: Any) -> bool:
        d = item_dict(item)
        return d is not None and d.get("type", "message") == "message" and d.get("role") == "user"

    last = max((i for i, item in enumerate(body.response.output) if is_user(item)), default=-1)
    tail = body.model_copy(update={"response": body.response.model_copy(update={"output": body.response.output[last + 1 :]})})
    verdict = asyncio.run(MathServer.verify(server, tail, None))
    record = {**dump(verdict), "response": dump(body.response), "scored_after_user_turns": users}
    if scale is not None:
        record["reward_components"] = {"correct": verdict.reward, "near": near(verdict.extracted_answer, verdict.expected_answer, scale)}
    return MathChatVerifyResponse.model_validate(record)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"verifier_metadata": {"near_scale": 4}, "_ng_task_index": 3, "tags": ["a", {"b": 1.5}], "question": "3 + 4?"},
        {"agent_ref": {"name": "math_chat_simple_agent", "extra": 1}, "extraction": "boxed", "strict": False},
    ],
)
def test_the_record_is_the_one_a_full_revalidation_builds(extra: dict[str, Any]) -> None:
    import asyncio
    import json

    from gym_bridge.records.schema import dump
    from resources_servers.math.app import MathVerifyRequest

    server = MathChatServer(config=CONFIG)  # the fast path answers: no pool needed
    output = [*CORRECTED, {"type": "function_call", "call_id": "c1", "name": "calc", "arguments": "{}"}]
    body = MathVerifyRequest.model_validate({**_body(output, "7"), **extra})
    new = asyncio.run(server.verify(body, None))
    old = _old_record(server, body, 1, (extra.get("verifier_metadata") or {}).get("near_scale"))
    assert json.dumps(dump(new)) == json.dumps(dump(old))  # same fields, values, types and order
    assert new.reward == 1.0 and new.scored_after_user_turns == 1


def test_a_long_conversation_is_scored_without_dumping_it() -> None:
    """40,000 turns: math_chat's own share of /verify (finding the last user message, building the record)
    took 5.7 s of the event loop, dumping every item twice and validating them all again; the HTTP share
    (reading and writing the body) is the serving layer's, alike for every server."""
    import asyncio
    import time

    from resources_servers.math.app import MathVerifyRequest

    server = MathChatServer(config=CONFIG)
    turns = [_assistant("\\boxed{12}"), _user("Sorry, I meant 3 + 4.")] * 20_000 + [_assistant("\\boxed{7}")]
    body = MathVerifyRequest.model_validate(_body(turns, "7"))

    async def timed() -> tuple[Any, float]:  # the event loop's share (not the test's garbage collection after it)
        started = time.perf_counter()
        out = await server.verify(body, None)
        return out, time.perf_counter() - started

    out, elapsed = asyncio.run(timed())
    assert out.reward == 1.0 and out.scored_after_user_turns == 20_000 and len(out.response.output) == 40_001
    assert elapsed < 1.0, f"{elapsed:.2f} s"
