"""The in-process client's lifespans, and the router that sends each URL to the client serving it."""

from __future__ import annotations

import asyncio
from typing import Any

from gym_bridge.records.jsonl import compact_json, parse_json
from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.in_process import InProcessClient
from gym_bridge.serving.json_http import JsonApp, Route
from gym_bridge.serving.retry import RetryPolicy, RoutedClient, post_json
from gym_bridge.serving.server import ResourcesServer, Session


def _app(events: list[str]) -> Any:
    """An ASGI app that notes its lifespan events and answers every request with its own name."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                events.append(message["type"])
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        await receive()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"from": "app"}'})

    return app


def test_a_cancelled_lifespan_still_shuts_the_app_down() -> None:
    """Ctrl-C cancels every task of the loop: the app is told to shut down, as a server told to stop does."""
    events: list[str] = []

    async def go() -> None:
        client = InProcessClient()
        await client.mount("app", _app(events))
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()  # what run_interruptible does on Ctrl-C
        await asyncio.sleep(0)
        await client.aclose()

    asyncio.run(go())
    assert events == ["lifespan.startup", "lifespan.shutdown"]


def test_the_routed_client_sends_mounted_urls_in_process_and_the_rest_to_the_default() -> None:
    class Default:
        """An httpx-shaped client that answers for every URL it is sent."""

        def __init__(self) -> None:
            self.urls: list[str] = []

        async def post(self, url: Any, *, content: bytes, headers: dict[str, str]) -> Any:
            self.urls.append(str(url))
            return type(
                "Answer", (), {"status_code": 200, "headers": {}, "content": b'{"from": "default"}'}
            )()

    async def go() -> list[Any]:
        client, default = InProcessClient(), Default()
        base = await client.mount("env", _app([]))
        routed = RoutedClient(default, dict.fromkeys(client.urls, client))
        policy = RetryPolicy(max_attempts=1, request_timeout=5)
        answers = [
            (await post_json(routed, url, {}, target="env", policy=policy)).data
            for url in (f"{base}/verify", "http://127.0.0.1:9/v1/responses", f"{base}x/verify")
        ]
        await client.aclose()
        return [answers, default.urls]

    answers, sent_elsewhere = asyncio.run(go())
    assert answers == [{"from": "app"}, {"from": "default"}, {"from": "default"}]
    assert sent_elsewhere == ["http://127.0.0.1:9/v1/responses", "http://env.in-processx/verify"]


class _EchoingEnv(ResourcesServer):
    """Scores 1 and adds values that JSON changes on the way (a tuple, int keys, tiny floats, odd text);
    a row with ``"nan": true`` gets a NaN reward, which has no JSON form."""

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        reward = float("nan") if getattr(body, "nan", False) else 1.0
        extras = {
            "tiny": 1e-07,
            "big": 2**70,
            "pair": (1, 2.5),
            "by_id": {1: "one"},
            "text": 'é\u2028\x1f"\\',
        }
        return VerifyResponse(**dump(body), reward=reward, **extras)


def test_a_verify_answer_is_handed_over_in_process_exactly_as_its_body_parses() -> None:
    """``/verify`` (``Route.fresh_json``) hands its answer over as parsed: the very value the body parses
    to, types included; a route without the flag, and an answer that cannot be encoded, hand nothing over."""
    row = {"responses_create_params": {"input": "2+2?"}, "tag": ["kept", {"n": 0.1}]}
    response = {
        "id": "r",
        "output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}
        ],
    }

    async def go() -> list[Any]:
        client = InProcessClient()
        base = await client.mount("env", _EchoingEnv().build_app())
        headers = {"content-type": "application/json"}
        seeded = await client.post(
            f"{base}/seed_session", content=compact_json(row).encode(), headers=headers
        )
        cookie = {"cookie": seeded.headers["set-cookie"].split(";")[0]}
        body = compact_json({**row, "response": response}).encode()
        verified = await client.post(f"{base}/verify", content=body, headers={**headers, **cookie})
        again = await client.post(f"{base}/verify", content=body, headers={**headers, **cookie})
        nan_body = compact_json({**row, "nan": True, "response": response}).encode()
        refused = await client.post(f"{base}/verify", content=nan_body, headers={**headers, **cookie})
        policy = RetryPolicy(max_attempts=1, request_timeout=5)
        result = await post_json(
            client, f"{base}/verify", {**row, "response": response}, target="env", policy=policy
        )
        await client.aclose()
        return [seeded, verified, again, refused, result]

    seeded, verified, again, refused, result = asyncio.run(go())
    assert seeded.status_code == 200 and seeded.parsed is None  # /seed_session's answer is not handed over
    assert verified.status_code == 200 and verified.parsed is not None
    assert verified.parsed == parse_json(verified.content)
    assert compact_json(verified.parsed) == verified.content.decode()  # the same types: the same text
    assert verified.parsed["pair"] == [1, 2.5] and verified.parsed["by_id"] == {"1": "one"}
    assert verified.parsed["tiny"] == 1e-07 and verified.parsed["tag"] == row["tag"]
    assert again.parsed == verified.parsed and again.parsed is not verified.parsed  # a value for each answer
    verified.parsed["tag"].append("changed")  # the caller owns it: the next answer is not touched
    assert result.data == parse_json(again.content) and result.data["tag"] == ["kept", {"n": 0.1}]
    assert refused.status_code == 500 and refused.parsed is None  # a NaN reward is refused, not handed over


def test_an_in_process_body_is_held_to_the_limits_and_still_reaches_apps_that_receive_it() -> None:
    """A JsonApp takes an in-process body from the scope (no receive(), no body deadline) under the same
    limits as over HTTP; an app that reads receive() gets the body, then the client's leaving only once it
    has answered."""

    async def echo(body: Any, _: Any) -> Any:
        return body

    json_app = JsonApp(
        [Route("POST", "/echo", echo, body=dict[str, Any], raw_json=True)], title="t", max_body_bytes=64
    )
    seen: list[str] = []

    async def receiving_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _app([])(scope, receive, send)
            return
        seen.append((await receive())["body"].decode())
        later = asyncio.ensure_future(receive())
        await asyncio.sleep(0)
        assert not later.done()  # the client is still there: no answer yet
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})
        seen.append((await later)["type"])

    async def go() -> list[Any]:
        client = InProcessClient()
        base = await client.mount("json", json_app)
        other = await client.mount("raw", receiving_app)
        headers = {"content-type": "application/json"}
        small = await client.post(f"{base}/echo", content=b'{"a": 1}', headers=headers)
        large = await client.post(
            f"{base}/echo", content=compact_json({"a": "x" * 100}).encode(), headers=headers
        )
        raw = await client.post(f"{other}/anything", content=b'{"b": 2}', headers=headers)
        await client.aclose()
        return [small, large, raw]

    small, large, raw = asyncio.run(go())
    assert (small.status_code, parse_json(small.content)) == (200, {"a": 1})
    assert large.status_code == 413 and b"64 bytes" in large.content
    assert raw.status_code == 200 and seen == ['{"b": 2}', "http.disconnect"]
