"""The model an attack speaks through: answers ``POST /responses`` with the attack's turns, in order.

It is served in-process (no socket) and only ever talks to the agent loop, so the server under audit
sees the same requests a policy behind a real model would make it see.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gym_bridge.schema import Response

__all__ = ["ScriptedModel"]


class ScriptedModel:
    """An ASGI app: turn ``i`` is answered once the request's input holds every tool call of turns ``< i``."""

    def __init__(self, turns: Sequence[list[dict[str, Any]]]) -> None:
        self.turns = list(turns)

    def _turn_for(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        items = request.get("input")
        made = (
            sum(1 for item in items if isinstance(item, dict) and item.get("type") == "function_call")
            if (isinstance(items, list))
            else 0
        )
        seen = 0
        for turn in self.turns:
            if seen >= made:
                return turn
            seen += sum(1 for item in turn if item.get("type") == "function_call")
        return self.turns[-1]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body or b"{}")
        response = Response(model="gym-bridge-audit", output=self._turn_for(request)).model_dump(mode="json")
        payload = json.dumps(response).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": payload})
