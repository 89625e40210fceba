"""NeMo Gym 0.7.0's Environment Server session protocol on every built-in server, over real HTTP.

The contract points of ``nemo_gym.testing.session_conformance.check_resources_session_contract`` (NeMo Gym
is not installed here; ``scripts/nemo_gym_session_conformance.py`` runs its own check live): a typed seed
echoes the caller's ``resources_session_id`` and sets the session cookie; a repeated seed finds the same
session (with its state, also without the cookie); ``/close_session`` is idempotent and succeeds for an
id never seeded; after a close, a seed of that id is refused. Then what the check cannot see: a typed
``ResourcesVerifyRequest`` scores the seeded session (math, tool_use), tool_use keeps a store per session
and keeps sessions apart, and the legacy cookie seed still works beside the typed one.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gym_bridge.rollout.envs import BUILTIN_SERVERS
from gym_bridge.serving.cookie_sessions import SESSION_COOKIE

REPO = Path(__file__).resolve().parents[2]
SERVERS = sorted(BUILTIN_SERVERS)


@pytest.fixture(scope="module")
def server_url(builtin_url: Callable[[str], str]) -> Callable[[str], str]:
    """``server_url(name)``: built-in server ``name`` on a loopback port (tests/conftest.py's, shared)."""
    return builtin_url


def example_row(name: str, verified_by: str | None = None) -> dict[str, Any]:
    """The first task of the server's example data (tool_use: the first verified by ``verified_by``)."""
    lines = (REPO / "resources_servers" / name / "data" / "example.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return next(r for r in rows if verified_by is None or verified_by in r["verifier_metadata"])


def typed_seed(row: dict[str, Any], **change: Any) -> dict[str, Any]:
    """A ``ResourcesSeedSessionRequest`` as NeMo Gym's Environment Server sends it for ``row``."""
    body = {
        "resources_session_id": f"resources-session-{uuid.uuid4().hex}",
        "episode_id": {"rollout_id": f"rollout_{uuid.uuid4().hex[:12]}", "attempt": 0},
        "task_id": {"taskset": "gym-bridge:test", "task_id": "0"},
        "task_data": {k: v for k, v in row.items() if k != "responses_create_params"},
    }
    return {**body, **change}


def close_body(seed: dict[str, Any]) -> dict[str, Any]:
    return {"resources_session_id": seed["resources_session_id"], "episode_id": seed["episode_id"]}


def answer(text: str, *calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    output: list[dict[str, Any]] = [
        {"id": f"fc_{i}", "call_id": f"call_{i}", "type": "function_call", "name": name,
         "arguments": json.dumps(args), "status": "completed"}
        for i, (name, args) in enumerate(calls)
    ]  # fmt: skip
    output.append({"id": "msg_0", "type": "message", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": text, "annotations": []}]})  # fmt: skip
    return {"id": "resp_0", "created_at": 0.0, "model": "m", "object": "response", "output": output}


def typed_verify(seed: dict[str, Any], row: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """A ``ResourcesVerifyRequest`` whose ``verification_input`` is the server's own verify body."""
    flat = {**seed["task_data"], "responses_create_params": row["responses_create_params"], "response": response}
    return {"episode_id": seed["episode_id"], "task_id": seed["task_id"], "verification_input": flat}


# --------------------------------------------------------------------------- the contract, on every server


@pytest.mark.parametrize("name", SERVERS)
def test_typed_seed_is_idempotent_echoes_its_id_and_close_keeps_it_out(server_url, name: str) -> None:
    url = server_url(name)
    seed = typed_seed(example_row(name))
    with httpx.Client(base_url=url, timeout=60) as client:
        first = client.post("/seed_session", json=seed)
        assert first.status_code == 200, first.text
        assert first.json() == {"resources_session_id": seed["resources_session_id"], "resources_tools": None,
                                "sandbox_access": None}  # fmt: skip
        cookie = first.cookies.get(SESSION_COOKIE)
        assert cookie, "the typed seed sets the session cookie (NeMo Gym's Environment Server reaches the session by it)"

        again = client.post("/seed_session", json=seed)  # with the cookie
        assert again.status_code == 200 and again.json()["resources_session_id"] == seed["resources_session_id"]
        assert again.cookies.get(SESSION_COOKIE) == cookie
        with httpx.Client(base_url=url, timeout=60) as retry:  # a retry whose first answer was lost: no cookie
            retried = retry.post("/seed_session", json=seed)
            assert retried.status_code == 200 and retried.cookies.get(SESSION_COOKIE) == cookie, retried.text

        other_episode = {**seed, "episode_id": {"rollout_id": "another-rollout", "attempt": 0}}
        refused = client.post("/seed_session", json=other_episode)
        assert refused.status_code == 409 and "episode_id" in refused.json()["detail"], refused.text

        wrong_close = client.post("/close_session", json=close_body(other_episode))
        assert wrong_close.status_code == 409, wrong_close.text  # not this episode's session to close
        for _ in ("close", "repeated close"):
            closed = client.post("/close_session", json=close_body(seed))
            assert closed.status_code == 200 and closed.json() == {"resources_session_id": seed["resources_session_id"]}
        late = client.post("/seed_session", json=seed)
        assert late.status_code == 409 and "closed" in late.json()["detail"], late.text

        never = typed_seed(example_row(name))
        closed = client.post("/close_session", json=close_body(never))  # closing an id never seeded
        assert closed.status_code == 200 and closed.json()["resources_session_id"] == never["resources_session_id"]
        racing = client.post("/seed_session", json=never)  # the seed that lost the race to its own close
        assert racing.status_code == 409, racing.text


@pytest.mark.parametrize("name", ["math", "tool_use"])
def test_bad_typed_requests_are_422s_naming_the_field(server_url, name: str) -> None:
    url = server_url(name)
    seed = typed_seed(example_row(name))
    cases = [
        ({k: v for k, v in seed.items() if k != "episode_id"}, "episode_id: Field required"),
        ({**seed, "episode_id": {"rollout_id": "r-a2"}}, "episode_id.rollout_id"),  # NeMo Gym's reserved suffix
        ({**seed, "task_id": {"taskset": "", "task_id": "0"}}, "task_id.taskset"),
        ({**seed, "resources_session_id": ""}, "resources_session_id"),
        ({**seed, "extra": 1}, "extra: Extra inputs are not permitted"),
        ({**seed, "task_data": []}, "task_data"),
    ]
    with httpx.Client(base_url=url, timeout=60) as client:
        for body, expected in cases:
            refused = client.post("/seed_session", json=body)
            assert refused.status_code == 422 and expected in refused.json()["detail"], (body, refused.text)
        no_close = client.post("/close_session", json={"resources_session_id": "x"})
        assert no_close.status_code == 422 and "episode_id: Field required" in no_close.json()["detail"]
        seeded = client.post("/seed_session", json=seed)
        assert seeded.status_code == 200, seeded.text
        bad_verify = typed_verify(seed, example_row(name), answer("x"))
        del bad_verify["verification_input"]["response"]
        refused = client.post("/verify", json=bad_verify)
        assert refused.status_code == 422 and "verification_input.response: Field required" in refused.json()["detail"]


def test_math_typed_verify_scores_and_checks_the_episode(server_url) -> None:
    row = example_row("math")
    seed = typed_seed(row)
    with httpx.Client(base_url=server_url("math"), timeout=60) as client:
        assert client.post("/seed_session", json=seed).status_code == 200
        right = client.post("/verify", json=typed_verify(seed, row, answer(f"\\boxed{{{row['expected_answer']}}}")))
        assert right.status_code == 200 and right.json()["reward"] == 1.0, right.text
        wrong = client.post("/verify", json=typed_verify(seed, row, answer("\\boxed{-12345}")))
        assert wrong.status_code == 200 and wrong.json()["reward"] == 0.0, wrong.text
        other = typed_verify(seed, row, answer(f"\\boxed{{{row['expected_answer']}}}"))
        other["task_id"] = {"taskset": "gym-bridge:test", "task_id": "another"}
        refused = client.post("/verify", json=other)
        assert refused.status_code == 409 and "task_id" in refused.json()["detail"], refused.text


# --------------------------------------------------------------------------- tool_use: state per session


def test_tool_use_keeps_a_store_per_typed_session_and_verifies_it(server_url) -> None:
    url = server_url("tool_use")
    row = example_row("tool_use", "reference_calls")
    reference = row["verifier_metadata"]["reference_calls"]
    seed_a, seed_b = typed_seed(row), typed_seed(row)
    with httpx.Client(base_url=url, timeout=60) as a, httpx.Client(base_url=url, timeout=60) as b:
        assert a.post("/seed_session", json=seed_a).status_code == 200
        assert b.post("/seed_session", json=seed_b).status_code == 200
        for call in reference:  # session a does what the task asks
            done = a.post(f"/{call['name']}", json=call["arguments"])
            assert done.status_code == 200 and "error" not in done.json(), done.text
        orders_a = a.post("/list_orders", json={}).json()["orders"]
        orders_b = b.post("/list_orders", json={}).json()["orders"]
        assert len(orders_a) == len(orders_b) + 1  # a placed an order; b's store is as it started

        again = a.post("/seed_session", json=seed_a)  # a repeated seed finds the session as it is now
        assert again.status_code == 200 and a.post("/list_orders", json={}).json()["orders"] == orders_a

        verdict_a = a.post("/verify", json=typed_verify(seed_a, row, answer("Done.")))
        verdict_b = b.post("/verify", json=typed_verify(seed_b, row, answer("Done.")))
        assert verdict_a.status_code == 200 and verdict_a.json()["reward"] == 1.0, verdict_a.text
        assert verdict_b.status_code == 200 and verdict_b.json()["reward"] == 0.0, verdict_b.text

        crossed = b.post("/verify", json=typed_verify(seed_a, row, answer("Done.")))  # b's cookie, a's episode
        assert crossed.status_code == 409, crossed.text
        with httpx.Client(base_url=url, timeout=60) as stranger:  # no cookie: no state to score
            lost = stranger.post("/verify", json=typed_verify(seed_a, row, answer("Done.")))
            assert lost.status_code == 409 and "cookie" in lost.json()["detail"], lost.text

        assert a.post("/close_session", json=close_body(seed_a)).status_code == 200
        gone = a.post("/view_cart", json={})  # the closed session's cookie finds no store any more
        assert gone.status_code == 409 and "seed_session" in gone.json()["detail"], gone.text
        assert b.post("/view_cart", json={}).status_code == 200  # b's session is still there


def test_tool_use_typed_seed_reads_the_store_from_task_data(server_url) -> None:
    """The finding: tool_use refused the typed seed (422 'no initial_state') looking at the top level."""
    row = example_row("tool_use")
    broken = copy.deepcopy(row)
    del broken["initial_state"]
    with httpx.Client(base_url=server_url("tool_use"), timeout=60) as client:
        assert client.post("/seed_session", json=typed_seed(row)).status_code == 200
        products = client.post("/list_products", json={}).json()["products"]
        assert {p["product_id"] for p in products} == set(row["initial_state"]["products"])
    refused = httpx.post(server_url("tool_use") + "/seed_session", json=typed_seed(broken), timeout=60)  # its own episode
    assert refused.status_code == 422 and "initial_state" in refused.json()["detail"], refused.text


def test_legacy_cookie_seed_still_works_beside_the_typed_one(server_url) -> None:
    url = server_url("tool_use")
    row = example_row("tool_use")
    with httpx.Client(base_url=url, timeout=60) as legacy:
        seeded = legacy.post("/seed_session", json=row)
        assert seeded.status_code == 200 and seeded.json()["seeded"] is True, seeded.text
        pid = sorted(row["initial_state"]["products"])[0]
        assert legacy.post("/add_to_cart", json={"product_id": pid, "quantity": 1}).status_code == 200
        # a typed seed sent with the legacy session's cookie is refused (an agent adopts the cookie a tool
        # call's answer sets, so a model's call named seed_session would move the rollout into its own session)
        seed = typed_seed(row)
        refused = legacy.post("/seed_session", json=seed)
        assert refused.status_code == 409 and "cookie of a session in use" in refused.json()["detail"], refused.text
        assert len(legacy.post("/view_cart", json={}).json()["cart"]["items"]) == 1  # the legacy session untouched
        flat = legacy.post("/verify", json={**row, "response": answer("Done.")})  # NeMo Gym's flat verify, by cookie
        assert flat.status_code == 200 and flat.json()["reward"] == 0.0, flat.text
    with httpx.Client(base_url=url, timeout=60) as typed:  # without the cookie, the typed seed is served beside it
        answered = typed.post("/seed_session", json=seed)
        assert answered.status_code == 200 and answered.json()["resources_session_id"] == seed["resources_session_id"]
        assert typed.post("/view_cart", json={}).json()["cart"]["items"] == []
