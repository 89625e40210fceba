"""Completion text -> Responses output items: ``<tool_call>`` blocks, ``<think>`` reasoning, the rest.

Chat models of the Qwen/Hermes family (and our local tokenizer's template) write tool calls as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Each well-formed block becomes a
``function_call`` item (arguments as a JSON string, a fresh ``call_id``); a block whose JSON does not
parse, or lacks a name, stays in the text, so the verifier sees what the model really wrote. An
unterminated block at the very end (generation stopped before ``</tool_call>``) is accepted when its
JSON is complete. ``<think>...</think>`` spans become a ``reasoning`` item, as NeMo Gym's vLLM model
server does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gym_bridge.records.schema import FunctionCall, OutputMessage, OutputText, Reasoning, new_id

__all__ = ["ParsedCompletion", "ParsedToolCall", "completion_to_output_items", "parse_completion"]

# A block's body never spans another opening tag, so one malformed block cannot swallow the next.
_TOOL_CALL = re.compile(r"<tool_call>((?:(?!<tool_call>).)*?)(?:</tool_call>|\Z)", re.DOTALL)
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


@dataclass
class ParsedToolCall:
    name: str
    arguments: str
    """JSON text of the arguments object, as the OpenAI wire format carries it."""


@dataclass
class ParsedCompletion:
    text: str
    """What is left once tool calls and reasoning are taken out (stripped)."""
    tool_calls: list[ParsedToolCall]
    reasoning: list[str]


def _parse_call(body: str) -> ParsedToolCall | None:
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments: Any = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
        except json.JSONDecodeError:
            return None
        return ParsedToolCall(obj["name"], arguments)
    if not isinstance(arguments, dict):
        return None
    return ParsedToolCall(obj["name"], json.dumps(arguments, ensure_ascii=False))


def parse_completion(text: str, extract_reasoning: bool = True) -> ParsedCompletion:
    """Split a completion into its text, its well-formed tool calls and (optionally) its reasoning.

    With ``extract_reasoning=False`` the ``<think>`` spans stay in the text (the chat-completions form,
    where NeMo Gym parses reasoning itself).
    """
    reasoning: list[str] = []
    if extract_reasoning:
        reasoning = [m.strip() for m in _THINK.findall(text)]
        text = _THINK.sub("", text)
    calls: list[ParsedToolCall] = []
    kept: list[str] = []
    last = 0
    for match in _TOOL_CALL.finditer(text):
        call = _parse_call(match.group(1))
        if call is None:
            continue
        calls.append(call)
        kept.append(text[last : match.start()])
        last = match.end()
    kept.append(text[last:])
    return ParsedCompletion(text="".join(kept).strip(), tool_calls=calls, reasoning=reasoning)


def completion_to_output_items(
    text: str, incomplete: bool = False
) -> list[OutputMessage | FunctionCall | Reasoning]:
    """Responses ``output`` items for a completion: reasoning, then the message, then function calls.

    There is always at least one item (an empty message when the model said nothing), because
    consumers attach the training token ids to the last item.
    """
    parsed = parse_completion(text)
    items: list[OutputMessage | FunctionCall | Reasoning] = []
    if parsed.reasoning:
        items.append(
            Reasoning(
                id=new_id("rs"), summary=[{"type": "summary_text", "text": r} for r in parsed.reasoning]
            )
        )
    if parsed.text or not parsed.tool_calls:
        items.append(
            OutputMessage(
                id=new_id("msg"),
                status="incomplete" if incomplete else "completed",
                content=[OutputText(text=parsed.text)],
            )
        )
    for call in parsed.tool_calls:
        call_id = new_id("call")
        items.append(FunctionCall(call_id=call_id, name=call.name, arguments=call.arguments, id=new_id("fc")))
    return items
