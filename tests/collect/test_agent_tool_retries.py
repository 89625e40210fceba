"""The agent loop never sends a tool call again once the server may have run it: a state-changing call
(tool_use's ``add_to_cart``, ``place_order``) applied twice leaves a store, and a reward, the model did not make.

Finding: a tool call whose answer was lost (the attempt timed out, the connection dropped after the request went
out, a 500/502/504) was retried like a model call, so tool_use applied ``add_to_cart`` twice: the model added 2
mugs, the store held 4, and the rollout was scored on the 4 (an honest rollout paid 0, or a wrong one paid as
right). Now a tool call is retried only when it surely did not reach the server (the connection was refused, the
pooled connection closed before it was written) or the server said it did not run it (408, 425, 429, 503);
otherwise the rollout fails unscored (``env_timeout`` / ``env_connection_error`` / ``env_http_error``), as a
rollout whose env broke. NeMo Gym 0.7.0's simple_agent sets no timeout, so it never resends a slow call.

Real tool_use server over HTTP, behind a proxy that holds back the answer of the first ``add_to_cart`` after
the server applied it; the project's agent loop (:func:`~gym_bridge.rollout.agent.run_rollout`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gym_bridge.audit.attacks import answer, calls
from gym_bridge.audit.scripted_model import scripted_model
from gym_bridge.rollout.agent import AgentConfig, Rollout, make_session, run_rollout
from gym_bridge.serving.in_process import InProcessClient
from gym_bridge.serving.json_body import read_body
from gym_bridge.serving.retry import RetryPolicy, RoutedClient
from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.tool_use.app import ToolUseServer
from resources_servers.tool_use.tests.test_tool_use_server import store_row

TIMEOUT_S = 1.0
"""The env's per-attempt timeout in these rollouts; the proxy holds the first answer past it."""


class AnswerLost:
    """A proxy to the env: forwards every request, and for the first call of ``route`` forwards it (the env runs
    it) and then loses the answer as ``how`` says: ``slow`` (answers past the agent's timeout), ``drop`` (the
    connection closes mid-answer), or an HTTP status (the env's answer replaced, as a gateway would)."""

    def __init__(self, backend: str, route: str, how: str | int, refuse: bool = False) -> None:
        self.backend, self.route, self.how, self.refuse = backend, route, how, refuse
        self.sent: dict[str, int] = {}
        """Requests the env got (ran), by path."""
        self.received: dict[str, int] = {}
        self.lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await read_body(receive) or b""
        path = scope["path"]
        with self.lock:
            self.received[path] = self.received.get(path, 0) + 1
            first = path == self.route and self.received[path] == 1
        if first and self.refuse:  # as a server that did not run it answers (busy, rate limited)
            await send({"type": "http.response.start", "status": int(self.how), "headers": [(b"retry-after", b"0")]})
            await send({"type": "http.response.body", "body": b'{"detail": "busy"}'})
            return
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k.lower() not in (b"host", b"content-length")]
        async with httpx.AsyncClient() as client:
            reply = await client.request(scope["method"], self.backend + path, content=body, headers=headers)
        with self.lock:
            self.sent[path] = self.sent.get(path, 0) + 1
        status = reply.status_code
        if first and self.how == "slow":
            await asyncio.sleep(TIMEOUT_S * 3)
        elif first and self.how == "drop":  # the head promises a body that never comes: the connection closes
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1000")]})
            await send({"type": "http.response.body", "body": b"{"})
            return
        elif first:
            status = int(self.how)
        out = [(k.encode(), v.encode()) for k, v in reply.headers.multi_items()
               if k.lower() not in ("content-length", "transfer-encoding", "connection")]  # fmt: skip
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": reply.content})


@pytest.fixture(scope="module")
def env_url() -> Iterator[str]:
    with start_in_thread(ToolUseServer().build_app()) as running:
        yield running.url


def rollout(url: str, turns: list[list[dict[str, Any]]]) -> Rollout:
    """The project's agent loop on ``store_row()`` (add 2 of P1, place the order) against the env at ``url``."""

    async def run() -> Rollout:
        in_process, http = InProcessClient(), make_session()
        try:
            model_url = await in_process.mount("tool-retries-model", scripted_model(turns))
            config = AgentConfig(model_url=model_url, max_steps=len(turns),
                                 env_retry=RetryPolicy(max_attempts=4, request_timeout=TIMEOUT_S, backoff_base=0.01))  # fmt: skip
            return await run_rollout(RoutedClient(http, {model_url: in_process}), store_row(), url, config)
        finally:
            await in_process.aclose()
            await http.close()

    return asyncio.run(run())


RIGHT = [calls(("add_to_cart", {"product_id": "P1", "quantity": 2})), calls(("place_order", {})), answer("Ordered.")]
"""What the task asks: 2 of P1 into the cart, then the order placed (reward 1)."""


@pytest.mark.parametrize(("how", "failure_class"), [("slow", "env_timeout"), ("drop", "env_connection_error"),
                                                    (502, "env_http_error"), (500, "env_http_error")])  # fmt: skip
def test_a_tool_call_that_may_have_run_is_not_sent_again(env_url: str, how: str | int, failure_class: str) -> None:
    proxy = AnswerLost(env_url, "/add_to_cart", how)
    with start_in_thread(proxy) as running:
        done = rollout(running.url, RIGHT)
    assert proxy.sent["/add_to_cart"] == 1, f"add_to_cart sent {proxy.sent['/add_to_cart']} times: applied twice"
    assert done.record is None and done.failure is not None, done.record
    assert done.failure.failure_class == failure_class, done.failure


@pytest.mark.parametrize("how", [503, 429, 408])
def test_a_tool_call_the_server_did_not_run_is_sent_again_and_scored(env_url: str, how: int) -> None:
    """What held, and stays: a 408/429/503 says the call did not run, so it is sent again and the rollout scored."""
    proxy = AnswerLost(env_url, "/add_to_cart", how, refuse=True)
    with start_in_thread(proxy) as running:
        done = rollout(running.url, RIGHT)
    assert done.record is not None, done.failure
    assert proxy.received["/add_to_cart"] == 2 and proxy.sent["/add_to_cart"] == 1
    assert done.record["reward"] == 1.0, done.record


def test_a_healthy_rollout_is_unchanged(env_url: str) -> None:
    done = rollout(env_url, RIGHT)
    assert done.record is not None and done.record["reward"] == 1.0, done.failure or done.record


def test_a_refused_connection_is_retried_it_never_reached_the_server() -> None:
    """A tool call whose connection is refused never reached the server: sent again (then it fails, unscored)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go() -> Any:
        from gym_bridge.rollout.agent import EnvSession, post_tool

        async with make_session() as client:
            env = EnvSession(f"http://127.0.0.1:{port}", RetryPolicy(max_attempts=3, backoff_base=0.01))
            return await post_tool(client, env, "add_to_cart", {"product_id": "P1", "quantity": 1})

    from gym_bridge.serving.retry import RequestFailed

    with pytest.raises(RequestFailed) as info:
        asyncio.run(go())
    assert info.value.failure_class == "env_connection_error" and info.value.attempts == 3
