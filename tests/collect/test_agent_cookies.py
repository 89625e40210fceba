"""Env cookies in the agent loop: every cookie the env sets is sent back to it, as sent, through both clients."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fake_model import FakeModel, function_call

from gym_bridge.rollout.agent import AgentConfig, make_client, make_session, run_rollout
from gym_bridge.serving.uvicorn_thread import start_in_thread

SET_COOKIES = [
    b"session=abc123; HttpOnly; Path=/; SameSite=lax",
    b'quoted="x y"; Path=/',
    b" spaced = v1 ; Max-Age=60",
    b"bad name=1",  # not a token: ignored
    b"no-equals-sign",  # not a cookie: ignored
]


class CookieEnv:
    """A raw ASGI env: ``/seed_session`` sets cookies, the ``echo`` tool and ``/verify`` report the
    ``Cookie`` header they received."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        cookie = b"; ".join(v for k, v in scope["headers"] if k == b"cookie").decode()
        headers = [(b"content-type", b"application/json")]
        if scope["path"] == "/seed_session":
            answer: Any = {}
            headers += [(b"set-cookie", c) for c in SET_COOKIES]
        elif scope["path"] == "/echo":
            answer = {"cookie": cookie}
        else:
            answer = {**json.loads(body), "reward": 1.0, "cookie_at_verify": cookie}
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})


def script(request: dict[str, Any], n: int) -> Any:
    called = any(item.get("type") == "function_call_output" for item in request["input"])
    return "done" if called else [function_call("echo", {})]


@pytest.mark.parametrize("make", [make_session, make_client], ids=["aiohttp", "httpx"])
def test_every_cookie_the_env_sets_comes_back_as_sent(make: Any) -> None:
    row = {"responses_create_params": {"input": [{"role": "user", "content": "echo the cookies"}]}}
    expected = 'session=abc123; quoted="x y"; spaced=v1'

    async def go() -> Any:
        async with make() as client:
            return await run_rollout(client, row, env.url, AgentConfig(model_url=model.url))

    with start_in_thread(CookieEnv()) as env, FakeModel(script) as model:
        rollout = asyncio.run(go())
    assert rollout.ok, rollout.failure
    echoed = next(i for i in rollout.record["response"]["output"] if i["type"] == "function_call_output")
    assert json.loads(echoed["output"]) == {"cookie": expected}
    assert rollout.record["cookie_at_verify"] == expected
