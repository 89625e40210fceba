"""Successful rollout -> chat SFT record ``{"messages": [...], "tools": [...]}`` (strictly streaming).

The conversation is the request's input items followed by the response's output items, mapped by
:func:`gym_bridge.records.chat.items_to_messages`: ``instructions`` and developer messages become system
messages, function calls become the assistant's ``tool_calls`` and their outputs ``tool`` messages, so
a tool-using trajectory is kept whole. Reasoning items are dropped (chat templates do not take them).
"""

from __future__ import annotations

from typing import Any

from gym_bridge.records.chat import tools_to_chat_tools
from transforms.common import RecordError, prompt_messages, response_messages

__all__ = ["DEFAULT_MIN_REWARD", "to_sft"]

DEFAULT_MIN_REWARD = 1.0
"""Only fully verified rollouts are demonstrations by default."""


def to_sft(record: dict[str, Any], *, include_tools: bool = True) -> dict[str, Any]:
    """A rollout as ``{"messages": [...]}``, plus the request's ``tools`` in chat-template form when it has any."""
    out: dict[str, Any] = {"messages": prompt_messages(record) + response_messages(record)}
    if include_tools:
        raw = record["responses_create_params"].get("tools")
        try:
            tools = tools_to_chat_tools(raw)
        except (KeyError, TypeError, AttributeError):
            raise RecordError("'responses_create_params.tools' is not a list of function tools") from None
        if tools:
            out["tools"] = tools
    return out
