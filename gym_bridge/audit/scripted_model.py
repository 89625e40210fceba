"""The model an attack speaks through: answers ``POST /responses`` with the attack's turns, in order.

It is served in-process (no socket) through the project's one HTTP layer (:class:`~gym_bridge.serving.json_http.
JsonApp`) and only ever talks to the agent loop, so the server under audit sees the same requests a
policy behind a real model would make it see.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gym_bridge.records.schema import Response
from gym_bridge.serving.json_http import JsonApp, Route

__all__ = ["scripted_model"]


def turn_for(turns: Sequence[list[dict[str, Any]]], request: dict[str, Any]) -> list[dict[str, Any]]:
    """Turn ``i`` once the request's input holds every tool call of turns ``< i``."""
    items = request.get("input")
    made = 0
    if isinstance(items, list):
        made = sum(1 for item in items if isinstance(item, dict) and item.get("type") == "function_call")
    seen = 0
    for turn in turns:
        if seen >= made:
            return turn
        seen += sum(1 for item in turn if item.get("type") == "function_call")
    return turns[-1]


def scripted_model(turns: Sequence[list[dict[str, Any]]]) -> JsonApp:
    """An app answering ``POST /responses`` with ``turns``, one per model call of the rollout."""
    script = list(turns)

    async def respond(body: dict[str, Any], _context: Any) -> dict[str, Any]:
        return Response(model="gym-bridge-audit", output=turn_for(script, body)).model_dump(mode="json")

    return JsonApp(
        [Route("POST", "/responses", respond, body=dict[str, Any])], title="gym-bridge audit model"
    )
