"""The in-process client's lifespans, and the router that sends each URL to the client serving it."""

from __future__ import annotations

import asyncio
from typing import Any

from gym_bridge.in_process import InProcessClient
from gym_bridge.retry import RetryPolicy, RoutedClient, post_json


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
