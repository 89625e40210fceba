"""A ``/verify`` request that carries an earlier verdict never gets it echoed beside the new one, on every server.

A rollout record fed back as a task (reverify of a file edited by hand, a re-collected rollout, a dataset built
from rollouts) carries ``reward``, ``reward_components``, ``mask_sample``, ``failure_kind``... Servers answer with
the request echoed and their verdict on top, so whatever the new verdict did not set stood beside it: the math
server answered a wrong answer with reward 0 *and* ``reward_components`` 1.0 and ``mask_sample`` true (a trainer
weighing components learned the old 1.0; a masked sample was dropped). The base ``/verify`` route drops the keys
that are the server's to give (``ResourcesServer.verdict_keys``: ``VerifyResponse``'s own fields, the fields of
the server's answer model, its declared diagnostics) before the server sees the request. Over real HTTP.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gym_bridge.records.schema import VERDICT_FIELDS
from gym_bridge.serving.cookie_sessions import SESSION_COOKIE
from tests.server.test_resources_sessions import answer, example_row, typed_seed, typed_verify

STALE = {"reward": 1.0, "reward_components": {"correct": 1.0}, "mask_sample": True, "failure_kind": "an_old_kind",
         "failure_reason": "an old reason"}  # fmt: skip
"""An earlier verdict, as a rollout record carries it."""

WRONG = {
    "math": answer("\\boxed{-12345}"),
    "reasoning_gym": answer("<answer>nobody is an angel</answer>"),
    "code": answer("no code here"),  # no_code: decided before any sandbox runs
}
"""A wrong answer to each server's first example task (reward 0)."""

DIAGNOSTICS = {
    "math": {"extracted_answer": "12", "extraction_method": "last_number", "library_reward": 1.0,
             "judge_evaluations": [{"verdict": "equal"}]},
    "reasoning_gym": {"score": 1.0, "extracted_answer": "old", "task_name": "old_task"},
    "code": {"extracted_code": "print(1)", "num_tests": 3, "num_passed": 3, "tests": [{"outcome": "pass"}]},
}  # fmt: skip
"""Each server's own diagnostics, as an earlier answer carried them."""


def _no_stale_verdict(out: dict[str, Any], stale: dict[str, Any]) -> None:
    assert out["reward"] == 0.0, out
    for key, old in stale.items():
        if key != "reward":
            assert out.get(key) != old, f"{key} echoed from the request: {out.get(key)!r}"


def test_the_verdict_keys_are_verify_responses_own_fields() -> None:
    assert {"reward", "reward_components", "mask_sample", "failure_kind", "failure_reason"} == VERDICT_FIELDS


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_flat_verify_body_carrying_an_earlier_verdict_does_not_pass_it_on(builtin_url, name: str) -> None:
    """Finding (math, reasoning_gym, code): the answer to a wrong answer kept the request's
    ``reward_components: {correct: 1.0}`` and ``mask_sample: true`` beside its reward of 0."""
    stale = {**STALE, **DIAGNOSTICS[name]}
    row = example_row(name)
    body = {**row, **stale, "response": WRONG[name]}
    reply = httpx.post(f"{builtin_url(name)}/verify", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    out = reply.json()
    _no_stale_verdict(out, stale)
    assert out["responses_create_params"] == row["responses_create_params"]  # the task's own keys stay


def test_a_typed_verify_request_carrying_an_earlier_verdict_does_not_pass_it_on(builtin_url) -> None:
    """NeMo Gym 0.7.0's ``ResourcesVerifyRequest``: the verdict keys of ``verification_input`` are dropped too."""
    url, row = builtin_url("math"), example_row("math")
    seed = typed_seed(row)
    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.post("/seed_session", json=seed).status_code == 200
        body = typed_verify(seed, row, WRONG["math"])
        body["verification_input"].update(STALE, **DIAGNOSTICS["math"])
        reply = client.post("/verify", json=body)
    assert reply.status_code == 200, reply.text
    _no_stale_verdict(reply.json(), {**STALE, **DIAGNOSTICS["math"]})


def test_tool_use_drops_its_diagnostics_at_the_route_over_a_typed_session(builtin_url) -> None:
    """tool_use's diagnostics (``state_diff``, ``calls_matched``...) are its ``verdict_keys``: dropped at the route."""
    url, row = builtin_url("tool_use"), example_row("tool_use", "reference_calls")
    seed = typed_seed(row)
    stale = {**STALE, "state_diff": ["an old diff"], "calls_matched": 7, "extra_reads": ["old()"]}
    with httpx.Client(base_url=url, timeout=60) as client:
        seeded = client.post("/seed_session", json=seed)
        assert seeded.status_code == 200, seeded.text
        client.cookies.set(SESSION_COOKIE, seeded.cookies[SESSION_COOKIE])
        body = typed_verify(seed, row, answer("Done."))  # a claim, no call: wrong
        body["verification_input"].update(stale)
        reply = client.post("/verify", json=body)
    assert reply.status_code == 200, reply.text
    _no_stale_verdict(reply.json(), stale)


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_verdict_key_of_the_wrong_type_is_dropped_not_a_422(builtin_url, name: str) -> None:
    """What held: a stale ``reward`` that is not a number (``"1.0"``, null) is dropped with the rest, not refused."""
    body = {**example_row(name), "reward": "1.0", "reward_components": None, "mask_sample": "yes",
            "response": WRONG[name]}  # fmt: skip
    reply = httpx.post(f"{builtin_url(name)}/verify", json=body, timeout=60)
    assert reply.status_code == 200 and reply.json()["reward"] == 0.0, reply.text
