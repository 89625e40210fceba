"""The resources-server base over real HTTP: sessions, bearer auth, tools, and how bad input is answered."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.cookie_sessions import SESSION_COOKIE
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session, tool
from gym_bridge.serving.uvicorn_thread import start_in_thread

TOKEN = "s3cret-token"
MAX_BODY = 64 * 1024


class CounterArgs(BaseModel):
    step: int


class CountingVerifyRequest(VerifyRequest):
    target: int


class CountingServer(ResourcesServer):
    """A toy environment: ``/seed_session`` sets a counter, the ``add`` tool moves it, verify compares it."""

    name = "counting"
    verify_request_model = CountingVerifyRequest

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        session.state["count"] = int(body.get("start", 0))
        return {"count": session.state["count"]}

    @tool
    async def add(self, args: CounterArgs, session: Session) -> dict[str, Any]:
        """Add ``step`` to the session's counter."""
        session.state["count"] = session.state.get("count", 0) + args.step
        return {"count": session.state["count"]}

    @tool(name="explode")
    async def explode_tool(self, args: CounterArgs, session: Session) -> dict[str, Any]:
        """A tool with a bug."""
        raise ZeroDivisionError("the tool divided by zero")

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        assert isinstance(body, CountingVerifyRequest)
        reward = float(session.state.get("count") == body.target)
        return VerifyResponse.model_validate({**dump(body), "reward": reward})


def verify_body(**extra: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": "count"}, "response": {"output": []}, "target": 3, **extra}


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    settings = ServerSettings(auth_token=TOKEN, max_body_bytes=MAX_BODY)
    with start_in_thread(CountingServer(settings).build_app()) as running:
        yield running.url


@pytest.fixture
def client(server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        yield c


# --------------------------------------------------------------------------- sessions and tools


def test_session_cookie_is_set_once_and_keeps_state_across_tool_calls(client: httpx.Client) -> None:
    seeded = client.post("/seed_session", json={"start": 1})
    assert seeded.status_code == 200 and seeded.json() == {"count": 1}
    assert SESSION_COOKIE in seeded.cookies
    added = client.post("/add", json={"step": 2})
    assert added.json() == {"count": 3}
    assert "set-cookie" not in added.headers  # the echoed cookie found its session: no new one
    assert client.post("/verify", json=verify_body()).json()["reward"] == 1.0


def test_sessions_are_separate_per_cookie(server_url: str, client: httpx.Client) -> None:
    client.post("/seed_session", json={"start": 10})
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {TOKEN}"}) as other:
        other.post("/seed_session", json={"start": 0})
        assert other.post("/add", json={"step": 3}).json() == {"count": 3}
        assert other.cookies[SESSION_COOKIE] != client.cookies[SESSION_COOKIE]
    assert client.post("/add", json={"step": 1}).json() == {"count": 11}


def test_a_client_chosen_session_id_is_never_adopted(server_url: str) -> None:
    """Session fixation: two clients sending the same made-up cookie each get their own new session."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Cookie": f"{SESSION_COOKIE}=chosen-by-client"}
    with httpx.Client(base_url=server_url, headers=headers) as a, httpx.Client(base_url=server_url, headers=headers) as b:
        seeded_a = a.post("/seed_session", json={"start": 100})
        seeded_b = b.post("/add", json={"step": 1})
        issued_a, issued_b = seeded_a.cookies[SESSION_COOKIE], seeded_b.cookies[SESSION_COOKIE]
        assert "chosen-by-client" not in (issued_a, issued_b) and issued_a != issued_b
        assert seeded_b.json() == {"count": 1}  # b did not land in a's session (count 100)
        assert len(issued_a) >= 22  # 128 random bits
    # the id the server issued works when sent back (what NeMo Gym's agent and ours do)
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {TOKEN}"}) as again:
        again.cookies.set(SESSION_COOKIE, issued_a)
        answer = again.post("/add", json={"step": 1})
        assert answer.json() == {"count": 101} and "set-cookie" not in answer.headers


def test_an_unknown_or_stale_session_id_starts_a_new_session_with_a_fresh_cookie() -> None:
    settings = ServerSettings(session_ttl_s=0.2)
    with start_in_thread(CountingServer(settings).build_app()) as running, httpx.Client(base_url=running.url) as client:
        first = client.post("/seed_session", json={"start": 5}).cookies[SESSION_COOKIE]
        time.sleep(0.4)
        answer = client.post("/add", json={"step": 1})
        assert answer.json() == {"count": 1}  # the expired session's state is gone
        assert answer.cookies[SESSION_COOKIE] != first


def test_session_ids_are_128_random_bits_in_url_safe_base64_as_secrets_makes_them() -> None:
    import base64
    import re
    import secrets

    from gym_bridge.serving.cookie_sessions import new_session_id

    ids = [new_session_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for session_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", session_id)
        assert len(base64.urlsafe_b64decode(session_id + "==")) == 16
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", secrets.token_urlsafe(16))  # the same shape
    bits = "".join(f"{byte:08b}" for i in ids[:500] for byte in base64.urlsafe_b64decode(i + "=="))
    assert 0.45 < bits.count("1") / len(bits) < 0.55  # not a constant or a counter


def test_overlong_session_cookie_gets_a_fresh_session(client: httpx.Client) -> None:
    client.cookies.set(SESSION_COOKIE, "x" * 500)
    response = client.post("/seed_session", json={})
    assert response.status_code == 200
    assert len(response.cookies[SESSION_COOKIE]) < 128


def test_verify_echoes_the_request_with_reward(client: httpx.Client) -> None:
    body = verify_body(question="q?", verifier_metadata={"k": [1, 2]})
    out = client.post("/verify", json=body).json()
    assert out["reward"] == 0.0
    assert {k: out[k] for k in body} == body


# --------------------------------------------------------------------------- auth


def test_bearer_token_is_required_except_for_health(server_url: str) -> None:
    with httpx.Client(base_url=server_url) as anonymous:
        missing = anonymous.post("/verify", json=verify_body())
        assert missing.status_code == 401 and "bearer token" in missing.json()["detail"]
        wrong = anonymous.post("/add", json={"step": 1}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        health = anonymous.get("/health")
        assert health.status_code == 200 and health.json()["server"] == "counting"
        assert "set-cookie" not in health.headers  # health checks do not create sessions


# --------------------------------------------------------------------------- bad input


def test_invalid_json_says_where(client: httpx.Client) -> None:
    r = client.post("/verify", content=b'{"target": 3,,}', headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["detail"].startswith("invalid JSON at line 1 column 14 (char 13)")


def test_invalid_json_on_a_later_line(client: httpx.Client) -> None:
    r = client.post(
        "/seed_session", content=b'{\n  "start": 1\n  "x": 2}', headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422
    assert "invalid JSON at line 3 column 3" in r.json()["detail"]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_json_body_without_json_content_type_is_refused(client: httpx.Client, content_type: str | None) -> None:
    """What a web page can send without a CORS preflight is refused with 415 naming the header (issue 33)."""
    headers = {"Content-Type": content_type} if content_type else {}
    request = client.build_request("POST", "/verify", content=json.dumps(verify_body()).encode(), headers=headers)
    if content_type is None:
        request.headers.pop("Content-Type", None)
        assert "content-type" not in request.headers
    refused = client.send(request)
    assert refused.status_code == 415, refused.text
    assert "Content-Type: application/json" in refused.json()["detail"]
    assert (content_type or "no Content-Type header") in refused.json()["detail"]


def test_empty_and_non_object_bodies(client: httpx.Client) -> None:
    empty = client.post("/verify", content=b"", headers={"Content-Type": "application/json"})
    assert empty.status_code == 422 and "request body is empty" in empty.json()["detail"]
    array = client.post("/verify", json=[1, 2])
    assert array.status_code == 422 and "must be a JSON object" in array.json()["detail"]


def test_missing_and_mistyped_fields_are_named(client: httpx.Client) -> None:
    body = verify_body()
    del body["target"]
    missing = client.post("/verify", json=body)
    assert missing.status_code == 422 and "target: Field required" in missing.json()["detail"]
    mistyped = client.post("/verify", json=verify_body(target="three"))
    assert mistyped.status_code == 422 and missing.json()["errors"][0]["loc"][-1] == "target"
    assert "target:" in mistyped.json()["detail"]
    no_response = client.post("/verify", json={"responses_create_params": {"input": "x"}, "target": 1})
    assert "response: Field required" in no_response.json()["detail"]
    bad_tool_args = client.post("/add", json={"step": [1]})
    assert bad_tool_args.status_code == 422 and "step:" in bad_tool_args.json()["detail"]


def test_oversized_bodies_are_refused(client: httpx.Client) -> None:
    big = json.dumps(verify_body(padding="x" * (MAX_BODY + 10))).encode()
    declared = client.post("/verify", content=big, headers={"Content-Type": "application/json"})
    assert declared.status_code == 413 and f"{MAX_BODY} bytes" in declared.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    streamed = client.post("/verify", content=chunks(), headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413
    assert client.get("/health").status_code == 200


def test_aggregate_metrics_takes_a_whole_run_beyond_the_per_request_limit(client: httpx.Client) -> None:
    """A run's rollouts come in one /aggregate_metrics request (NeMo Gym's collector sends them so): at
    20,000 rollouts that passed the 16 MiB per-request limit and collect lost its aggregate metrics."""
    records = [{**verify_body(), "reward": float(i % 2), "_ng_task_index": i} for i in range(2000)]
    body = json.dumps({"verify_responses": records}).encode()
    assert len(body) > MAX_BODY  # over what /verify may take ...
    answer = client.post("/aggregate_metrics", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text  # ... taken here, up to max_held_body_bytes
    assert answer.json()["agent_metrics"]["num_rollouts"] == 2000
    as_verify = client.post("/verify", content=body, headers={"Content-Type": "application/json"})
    assert as_verify.status_code == 413


def test_unknown_tool_lists_the_known_ones(client: httpx.Client) -> None:
    r = client.post("/get_weather", json={"city": "Paris"})
    assert r.status_code == 404
    assert r.json()["detail"] == "unknown tool 'get_weather' (this server's tools: add, explode)"


def test_a_crashing_tool_answers_json_500_and_the_server_keeps_going(client: httpx.Client) -> None:
    r = client.post("/explode", json={"step": 1})
    assert r.status_code == 500
    assert r.json()["detail"] == "internal error on /explode: ZeroDivisionError: the tool divided by zero"
    assert client.post("/add", json={"step": 1}).status_code == 200


def test_aggregate_metrics_validates_records(client: httpx.Client) -> None:
    records = [{**verify_body(), "reward": r, "_ng_task_index": 0} for r in (1.0, 0.0)]
    ok = client.post("/aggregate_metrics", json={"verify_responses": records})
    assert ok.status_code == 200
    assert ok.json()["agent_metrics"]["mean/reward"] == 0.5 and ok.json()["agent_metrics"]["num_tasks"] == 1
    assert client.post("/aggregate_metrics", json=records).json()["agent_metrics"]["num_rollouts"] == 2
    not_list = client.post("/aggregate_metrics", json={"verify_responses": 3})
    assert not_list.status_code == 422 and "list of verify responses" in not_list.json()["detail"]
    stripped = client.post("/aggregate_metrics", json=[records[0], {"reward": 1.0}])  # NeMo Gym strips the request
    assert stripped.status_code == 200 and stripped.json()["agent_metrics"]["num_rollouts"] == 2
    bad = client.post("/aggregate_metrics", json=[records[0], {"_ng_task_index": 1}])
    assert bad.status_code == 422 and "verify_responses.1.reward" in bad.json()["detail"]


class KeepingServer(ResourcesServer):
    """Keeps whatever ``/seed_session`` gets, to fill sessions with state of a known size."""

    name = "keeping"

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        session.state["kept"] = body.get("blob", "")
        return {"kept": len(session.state["kept"])}

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        return VerifyResponse.model_validate({**dump(body), "reward": float(bool(session.state.get("kept")))})


def test_session_state_is_bounded_in_bytes_oldest_first() -> None:
    server = KeepingServer(ServerSettings(max_session_bytes=10_000))
    with start_in_thread(server.build_app()) as running:
        cookies = []
        for _ in range(6):
            with httpx.Client(base_url=running.url) as client:
                assert client.post("/seed_session", json={"blob": "x" * 3000}).status_code == 200
                cookies.append(client.cookies[SESSION_COOKIE])
        health = httpx.get(running.url + "/health").json()
        assert health["session_bytes"] <= 10_000 and health["sessions"] == 3  # 3 x ~3 KB fit
        too_big = httpx.post(running.url + "/seed_session", json={"blob": "x" * 20_000})
        assert too_big.status_code == 413 and "max_session_bytes" in too_big.json()["detail"]
        for cookie, kept in zip(cookies, [0, 0, 0, 1, 1, 1], strict=True):
            answer = httpx.post(running.url + "/verify", json=verify_body(), cookies={SESSION_COOKIE: cookie})
            assert answer.json()["reward"] == kept


def test_aggregate_metrics_reports_each_reward_component(client: httpx.Client) -> None:
    records = [
        {**verify_body(), "reward": 2.0, "reward_components": {"correct": 1.0, "format": 1.0}, "_ng_task_index": 0},
        {**verify_body(), "reward": 1.0, "reward_components": {"correct": 0.0, "format": 1.0}, "_ng_task_index": 0},
        {**verify_body(), "reward": 0.0, "reward_components": {"correct": 0.0, "format": 0.0}, "_ng_task_index": 1},
    ]
    answer = client.post("/aggregate_metrics", json={"verify_responses": records}).json()
    agent = answer["agent_metrics"]
    assert agent["mean/reward_components.correct"] == pytest.approx(1 / 3)
    assert agent["mean/reward_components.format"] == pytest.approx(2 / 3)
    assert agent["max/reward_components.correct"] == 1.0 and agent["min/reward_components.format"] == 0.0
    assert answer["key_metrics"]["mean/reward_components.format"] == pytest.approx(2 / 3)
    first_task = answer["group_level_metrics"][0]
    assert first_task["mean/reward_components.correct"] == 0.5 and first_task["mean/reward_components.format"] == 1.0


@pytest.mark.parametrize(
    "components, detail",
    [
        ({"correct": "yes"}, "verify_responses.1.reward_components: correct: expected a finite number, got 'yes'"),
        ({"": 1.0}, "verify_responses.1.reward_components: '': a component name must be 1 to 128 characters"),
        ([1.0], "verify_responses.1.reward_components: expected an object"),
    ],
)
def test_aggregate_metrics_refuses_bad_reward_components_naming_them(
    client: httpx.Client, components: Any, detail: str
) -> None:
    good = {**verify_body(), "reward": 1.0, "reward_components": {"correct": 1.0}}
    r = client.post("/aggregate_metrics", json=[good, {**good, "reward_components": components}])
    assert r.status_code == 422 and r.json()["detail"].startswith(detail)
