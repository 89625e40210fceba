"""Streamed answers in OpenAI's event shapes, built from a finished answer.

``stream=True`` gets what OpenAI's SDK parses: ``chat.completion.chunk`` objects (then ``[DONE]``) for
chat, ``text_completion`` chunks for completions, and the Responses API's typed events
(``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` ... ``response.completed``). The deltas
follow the generated tokens (one per token when the tokens' texts add up to the answer's text, else one
delta with the whole text). The backend generates a batch at once, so the events are sent when the
completion is finished: the shapes are streaming's, the first token does not come earlier.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["chat_chunks", "completion_chunks", "response_events", "token_pieces"]


def token_pieces(token_texts: list[str], text: str) -> list[str]:
    """The answer's text split at token boundaries; ``[text]`` when the tokens do not spell it exactly
    (a stop string cut it, a multi-byte character spans tokens, or tool calls were parsed out)."""
    pieces = [t for t in token_texts if t]
    return pieces if pieces and "".join(pieces) == text else ([text] if text else [])


def _split_logprobs(entries: list[dict[str, Any]] | None, pieces: list[str], per_token: bool) -> list[Any]:
    """Log-prob entries per piece: one each when pieces are tokens, else all with the first piece."""
    if entries is None:
        return [None] * len(pieces)
    if per_token and len(entries) == len(pieces):
        return [[e] for e in entries]
    return [entries] + [[] for _ in pieces[1:]]


async def chat_chunks(
    payload: dict[str, Any], pieces: list[list[str]], include_usage: bool = False
) -> AsyncIterator[dict[str, Any]]:
    """``chat.completion.chunk`` objects for a finished chat completion (``[DONE]`` is the app's)."""
    head = {"id": payload["id"], "object": "chat.completion.chunk", "created": payload["created"],
            "model": payload["model"]}  # fmt: skip

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {**head, "choices": [choice]}

    for choice, texts in zip(payload["choices"], pieces, strict=True):
        index, message = choice["index"], choice["message"]
        yield chunk(index, {"role": "assistant", "content": ""})
        content = message.get("content") or ""
        texts = texts if "".join(texts) == content else ([content] if content else [])
        entries = (choice.get("logprobs") or {}).get("content")
        for text, logprobs in zip(texts, _split_logprobs(entries, texts, True), strict=True):
            yield chunk(index, {"content": text}, logprobs=None if logprobs is None else {"content": logprobs})
        for k, call in enumerate(message.get("tool_calls") or []):
            yield chunk(index, {"tool_calls": [{"index": k, **call}]})
        yield chunk(index, {}, finish=choice["finish_reason"])
    if include_usage:
        yield {**head, "choices": [], "usage": payload["usage"]}


async def completion_chunks(
    payload: dict[str, Any], pieces: list[list[str]], include_usage: bool = False
) -> AsyncIterator[dict[str, Any]]:
    """``text_completion`` chunks for a finished completion (``[DONE]`` is the app's)."""
    head = {"id": payload["id"], "object": "text_completion", "created": payload["created"], "model": payload["model"]}
    for choice, texts in zip(payload["choices"], pieces, strict=True):
        texts = texts if "".join(texts) == choice["text"] else [choice["text"]]
        for text in texts:
            yield {**head, "choices": [{"index": choice["index"], "text": text, "logprobs": None, "finish_reason": None}]}
        last = {"index": choice["index"], "text": "", "logprobs": choice["logprobs"], "finish_reason": choice["finish_reason"]}
        yield {**head, "choices": [last]}
    if include_usage:
        yield {**head, "choices": [], "usage": payload["usage"]}


async def response_events(response: dict[str, Any], pieces: list[str]) -> AsyncIterator[dict[str, Any]]:
    """The Responses API's events for a finished response, numbered by ``sequence_number``."""
    sequence = 0

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        nonlocal sequence
        sequence += 1
        return {"type": kind, "sequence_number": sequence - 1, **fields}

    pending = {**copy.deepcopy(response), "status": "in_progress", "output": [], "usage": None,
               "incomplete_details": None}  # fmt: skip
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    for index, item in enumerate(response["output"]):
        kind = item.get("type")
        if kind == "message":
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})  # fmt: skip
            for part_index, part in enumerate(item.get("content") or []):
                text = part.get("text", "")
                logprobs = part.get("logprobs")
                yield event("response.content_part.added", item_id=item["id"], output_index=index,
                            content_index=part_index, part={**part, "text": "", "logprobs": []})  # fmt: skip
                texts = pieces if "".join(pieces) == text else ([text] if text else [])
                for piece, piece_logprobs in zip(texts, _split_logprobs(logprobs, texts, True), strict=True):
                    yield event("response.output_text.delta", item_id=item["id"], output_index=index,
                                content_index=part_index, delta=piece, logprobs=piece_logprobs or [])  # fmt: skip
                yield event("response.output_text.done", item_id=item["id"], output_index=index,
                            content_index=part_index, text=text, logprobs=logprobs or [])  # fmt: skip
                yield event("response.content_part.done", item_id=item["id"], output_index=index,
                            content_index=part_index, part=part)  # fmt: skip
        elif kind == "function_call":
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "arguments": ""})  # fmt: skip
            yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                        delta=item["arguments"])  # fmt: skip
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                        arguments=item["arguments"])  # fmt: skip
        else:
            yield event("response.output_item.added", output_index=index, item=item)
        yield event("response.output_item.done", output_index=index, item=item)
    final = "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
    yield event(final, response=response)
