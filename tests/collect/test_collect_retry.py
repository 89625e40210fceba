"""Retry policy: Retry-After parsing, jittered backoff bounds, the total-time cap and 4xx pass-through.

Requests go through both clients ``post_json`` takes (aiohttp, what collect and training use, and httpx).
"""

from __future__ import annotations

import asyncio
import email.utils
import random

import pytest
from fake_model import FakeModel, Fault

from gym_bridge.rollout.agent import make_client, make_session
from gym_bridge.serving.retry import RequestFailed, RetryPolicy, parse_retry_after, post_json

BODY = {"input": "What is 1 + 1?"}
CLIENTS = {"aiohttp": make_session, "httpx": make_client}


@pytest.fixture(params=sorted(CLIENTS))
def post(request: pytest.FixtureRequest):
    """``post(url, policy, **kw)``: one ``post_json`` call through a fresh client of the given kind."""
    make = CLIENTS[request.param]

    def send(url: str, policy: RetryPolicy, **kw):
        async def go():
            async with make() as client:
                return await post_json(client, url, BODY, target="model", policy=policy, **kw)

        return asyncio.run(go())

    return send


def test_parse_retry_after():
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert parse_retry_after(date, now=1_000_000) == pytest.approx(30.0)


def test_backoff_is_full_jitter_within_a_doubling_cap():
    policy = RetryPolicy(backoff_base=0.5, backoff_max=3.0)
    rng = random.Random(0)
    for retry, cap in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 3.0), (10, 3.0)]:
        waits = [policy.backoff(retry, rng) for _ in range(200)]
        assert all(0.0 <= w <= cap for w in waits)
        assert max(waits) > cap * 0.8 and min(waits) < cap * 0.2  # spread over the whole range


def test_policy_rejects_nonsense():
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(request_timeout=0)


def test_total_budget_caps_attempts(post) -> None:
    policy = RetryPolicy(max_attempts=50, request_timeout=0.3, total_timeout=0.8, backoff_base=0.01)
    with FakeModel(lambda r, n: Fault.slow(10)) as model:
        with pytest.raises(RequestFailed) as info:
            post(model.url + "/responses", policy)
        calls = model.calls.total()
    assert info.value.failure_class == "model_timeout"
    assert 2 <= info.value.attempts <= 3 and calls == info.value.attempts


def test_retry_after_beyond_the_budget_gives_up_at_once(post) -> None:
    policy = RetryPolicy(max_attempts=5, request_timeout=1, total_timeout=2)
    with FakeModel(lambda r, n: Fault.http(429, retry_after=60)) as model:
        with pytest.raises(RequestFailed) as info:
            post(model.url + "/responses", policy)
        assert model.calls.total() == 1
    assert info.value.status == 429 and "would pass the" in info.value.message


def test_client_errors_can_be_returned_instead_of_raised(post) -> None:
    policy = RetryPolicy(max_attempts=3)
    with FakeModel(lambda r, n: Fault.http(404, body='{"detail": "nope"}')) as model:
        result = post(model.url + "/responses", policy, return_client_errors=True)
        assert model.calls.total() == 1
    assert result.status == 404 and result.text == '{"detail": "nope"}' and result.attempts == 1


def test_non_retryable_server_error_fails_at_once(post) -> None:
    with FakeModel(lambda r, n: Fault.http(501)) as model:
        with pytest.raises(RequestFailed) as info:
            post(model.url + "/responses", RetryPolicy(max_attempts=4))
        assert model.calls.total() == 1
    assert info.value.failure_class == "model_http_error" and info.value.status == 501


@pytest.mark.parametrize(
    ("fault", "failure_class"),
    [
        (Fault.drop(), "model_connection_error"),
        (Fault.malformed(), "model_bad_response"),
        (Fault.slow(10), "model_timeout"),
        (Fault.drip(10), "model_timeout"),
        (Fault.http(503), "model_http_error"),
    ],
    ids=["drop", "malformed", "slow", "drip", "503"],
)
def test_each_fault_is_retried_then_named(post, fault: Fault, failure_class: str) -> None:
    policy = RetryPolicy(max_attempts=2, request_timeout=0.5, backoff_base=0.01)
    with FakeModel(lambda r, n: fault) as model:
        with pytest.raises(RequestFailed) as info:
            post(model.url + "/responses", policy)
        assert model.calls.total() == 2
    assert info.value.failure_class == failure_class and info.value.attempts == 2


def test_a_fault_that_heals_is_invisible_but_counted(post) -> None:
    policy = RetryPolicy(max_attempts=3, backoff_base=0.01)
    with FakeModel(lambda r, n: Fault.drop() if n == 1 else "The answer is \\boxed{2}.") as model:
        result = post(model.url + "/responses", policy)
    assert result.attempts == 2 and result.status == 200
    assert result.data["output"][0]["content"][0]["text"] == "The answer is \\boxed{2}."


def test_refused_connection_is_a_connection_error(post) -> None:
    import socket

    with socket.socket() as s:  # a port that nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RequestFailed) as info:
        post(f"http://127.0.0.1:{port}/v1/responses", RetryPolicy(max_attempts=2, backoff_base=0.01))
    assert info.value.failure_class == "model_connection_error" and info.value.attempts == 2


@pytest.mark.parametrize("fault", [Fault.slow(10), Fault.drip(10)], ids=["slow", "drip"])
def test_a_timeout_is_not_retried_when_the_policy_says_so(post, fault: Fault) -> None:
    policy = RetryPolicy(max_attempts=3, request_timeout=0.5, backoff_base=0.01, retry_timeouts=False)
    with FakeModel(lambda r, n: fault) as model:
        with pytest.raises(RequestFailed) as info:
            post(model.url + "/responses", policy)
        assert model.calls.total() == 1
    assert info.value.failure_class == "model_timeout" and info.value.attempts == 1
    assert "not sent again" in info.value.message
