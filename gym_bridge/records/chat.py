"""Chat messages: conversion from Responses API items, and rendering through a chat template.

The policy server renders Responses input through a tokenizer's chat template, and the SFT/GRPO
transforms write chat ``messages``; both go through these functions so the mapping lives once, and the
trainer counts prompt tokens with the same :func:`render_prompt` the policy server generates from.
"""

from __future__ import annotations

import json
from typing import Any

from gym_bridge.records.schema import content_text, item_dict

_ROLE_MAP = {"developer": "system"}


def _parse_arguments(arguments: Any) -> Any:
    """Tool-call arguments as an object when they are valid JSON (chat templates expect a dict)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def items_to_messages(items: list[Any], instructions: str | None = None) -> list[dict[str, Any]]:
    """Responses input/output items to chat messages; consecutive tool calls join one assistant turn.

    ``reasoning`` items are dropped (chat templates do not take them); unknown item types too, and
    entries that are not item objects at all.
    """
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for raw in items:
        item = item_dict(raw)
        if item is None:
            continue
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = _ROLE_MAP.get(item.get("role", "user"), item.get("role", "user"))
            messages.append({"role": role, "content": content_text(item.get("content"))})
        elif kind == "function_call":
            call = {
                "type": "function",
                "id": item.get("call_id"),
                "function": {"name": item.get("name"), "arguments": _parse_arguments(item.get("arguments"))},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": output if isinstance(output, str) else content_text(output),
                }
            )
    return messages


def tools_to_chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (flat) to the nested ``{"type","function":{...}}`` chat-template form."""
    if not tools:
        return None
    out = []
    for tool in tools:
        if tool.get("type", "function") != "function":
            continue
        if "function" in tool:
            out.append(tool)
            continue
        out.append(
            {
                "type": "function",
                "function": {
                    "name": tool["name"],
                    "description": tool.get("description") or "",
                    "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
                },
            }
        )
    return out or None


class TemplateError(ValueError):
    """The tokenizer's chat template could not render these messages (a jinja error, a missing template,
    or the template's own ``raise_exception``)."""


def render_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template: what the policy server generates
    from and what the trainer's prompt-length filter counts (one function, so the two always agree)."""
    try:
        ids = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
        )
    except Exception as exc:
        raise TemplateError(f"could not render the chat template: {exc}") from exc
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # a BatchEncoding from older transformers
        ids = ids["input_ids"]
    if ids and isinstance(ids[0], list):  # a batch of one
        ids = ids[0]
    return [int(i) for i in ids]
