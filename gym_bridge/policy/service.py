"""The policy server's logic without HTTP: :class:`PolicyService` answers OpenAI-shaped requests.

Each method takes a validated request body and returns the answer's JSON content, or an
:class:`~gym_bridge.serving.json_http.EventStream` when the request asked for ``stream``; a refusal is an
:class:`~gym_bridge.policy.api.ApiError`. :mod:`gym_bridge.policy.server` binds these methods to routes.

Prompts are rendered with the tokenizer's chat template (:func:`gym_bridge.records.chat.render_prompt`); when the
conversation carries the previous turn's token ids they are reused exactly
(:mod:`gym_bridge.policy.continuation`). Concurrent requests are generated together
(:mod:`gym_bridge.policy.batching`). Limits: a prompt whose text cannot fit the context is refused before
it is tokenized (no token covers more than the vocabulary's longest token's bytes); large prompts are
tokenized on a worker thread, so ``/health`` and other requests are answered meanwhile; ``n``,
``max_tokens`` and the tokens one request may hold are capped (:class:`PolicySettings`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gym_bridge.generation.backend import (
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)
from gym_bridge.policy.api import (
    ApiError,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ResponsesRequest,
    TokenizeRequest,
    check_input_items,
)
from gym_bridge.policy.batching import GenerationBatcher
from gym_bridge.policy.continuation import on_policy_prompt
from gym_bridge.policy.prompt_cache import RenderCache
from gym_bridge.policy.streaming import chat_chunks, completion_chunks, response_events, token_pieces
from gym_bridge.policy.tool_calls import completion_to_output_items, parse_completion
from gym_bridge.records.chat import TemplateError, items_to_messages, render_prompt, tools_to_chat_tools
from gym_bridge.records.schema import Response, TrainingFields, Usage, content_text, input_items, new_id
from gym_bridge.serving.json_http import EventStream
from gym_bridge.serving.request_guard import check_host_names

__all__ = ["PolicyService", "PolicySettings"]

_TRAINING_FIELDS = tuple(TrainingFields.model_fields)
_LOGPROBS_INCLUDE = "message.output_text.logprobs"
_THREAD_RENDER_CHARS = 4096
"""Prompts with more text than this are rendered on the tokenizer thread (smaller ones cost less inline)."""


class PolicySettings(BaseModel):
    """Serving limits and defaults of one policy server."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int = Field(64, ge=1)
    batch_wait_ms: float = Field(5.0, ge=0)
    max_output_tokens: int = Field(1024, ge=1)
    """Server cap on ``max_output_tokens`` / ``max_tokens``; larger requests are cut to it (the answer's
    ``max_output_tokens`` says what was used)."""
    max_n: int = Field(16, ge=1)
    """Most completions one chat/completions request may ask for (``n``)."""
    max_request_tokens: int = Field(131_072, ge=1)
    """Most tokens one request may hold in the batch: ``n * (prompt + max output)``; more is refused (400)."""
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1)
    """Request bodies over this are refused (413) before they are read."""
    max_held_body_bytes: int = Field(256 * 1024 * 1024, ge=1)
    """Bytes of request bodies all requests may hold at once; past it, 503 with ``Retry-After``."""
    body_timeout_s: float = Field(60.0, gt=0)
    """A request body must arrive whole within this many seconds of its headers (else 408)."""
    return_token_ids: bool = False
    """Attach the training fields to every response, as NeMo Gym's ``return_token_id_information``."""
    default_temperature: float = 1.0
    auth_token: str | None = None
    """When set, every request but ``/health`` needs ``Authorization: Bearer <token>``."""
    allowed_hosts: list[str] = []
    """``Host`` names answered besides IP addresses, ``localhost`` and this machine's name; others get 421
    (DNS rebinding: :mod:`gym_bridge.serving.request_guard`); ``*`` answers any."""

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts_are_names(cls, value: list[str]) -> list[str]:
        return check_host_names(value)


class PolicyService:
    """OpenAI-compatible answers from a :class:`GenerationBackend`; ``start()`` before use, ``stop()`` after."""

    def __init__(
        self, backend: GenerationBackend, model_name: str | None = None, settings: PolicySettings | None = None
    ) -> None:
        self.settings = settings or PolicySettings()
        self.model_name = model_name or backend.model_name
        self.tokenizer = tokenizer = backend.tokenizer
        self.max_context = int(getattr(backend, "max_context", None) or 2048)
        self.vocab_size = int(getattr(backend, "vocab_size", None) or len(tokenizer))
        self.end_of_turn_ids = set(getattr(backend, "eos_token_ids", None) or []) or (
            {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        )
        self.max_token_bytes = _longest_token(tokenizer)
        self.batcher = GenerationBatcher(
            backend, self.settings.max_batch_size, self.settings.batch_wait_ms / 1000.0
        )
        self.render = RenderCache(self._render_uncached, getattr(tokenizer, "chat_template", None))
        self._tokenizer_thread = ThreadPoolExecutor(1, thread_name_prefix="tokenize")

    async def start(self) -> None:
        await self.batcher.start()

    async def stop(self) -> None:
        await self.batcher.stop()

    # ------------------------------------------------------------------ read-only routes

    def health(self) -> dict[str, Any]:
        stats = self.batcher.stats
        return {
            "status": "ok",
            "model": self.model_name,
            "batches": stats.batches,
            "requests": stats.requests,
            "generated_tokens": stats.generated_tokens,
            "mean_batch_size": stats.requests / stats.batches if stats.batches else 0.0,
        }

    def models(self) -> dict[str, Any]:
        card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "gym-bridge",
                "max_model_len": self.max_context}  # fmt: skip
        return {"object": "list", "data": [card]}

    # ------------------------------------------------------------------ the OpenAI routes

    async def tokenize(self, body: TokenizeRequest) -> dict[str, Any]:
        """vLLM's ``/tokenize``: chat ``messages`` through the template, or a raw ``prompt``."""
        if body.messages is not None:
            messages = [_chat_message_for_template(m) for m in body.messages]
            tools = _chat_tools(body.tools)
            size = _text_size(messages, tools)
            self._check_text_fits(size, "messages")
            tokens = await self._off_loop(size, lambda: self.render(messages, tools, body.add_generation_prompt))
        elif body.prompt is not None:
            prompt = body.prompt
            self._check_text_fits(len(prompt), "prompt")
            tokens = await self._off_loop(len(prompt), lambda: self._encode(prompt, body.add_special_tokens))
        else:
            raise ApiError(422, "messages or prompt: one of them is required", "messages")
        return {"count": len(tokens), "max_model_len": self.max_context, "tokens": tokens}

    async def responses(self, body: ResponsesRequest) -> dict[str, Any] | EventStream:
        """The Responses API: one completion of the conversation in ``input``."""
        items = input_items(body)
        check_input_items(items)
        tools = _chat_tools(body.tools)
        messages = items_to_messages(items, body.instructions)
        if not messages:
            raise ApiError(400, "input: no messages to respond to", "input")
        size = _text_size(messages, tools)
        self._check_text_fits(size, "input")

        def render_items(prefix: list[Any], add_generation_prompt: bool = True) -> list[int]:
            return self.render(items_to_messages(prefix, body.instructions), tools, add_generation_prompt, "input")

        prompt = await self._off_loop(
            size,
            lambda: on_policy_prompt(items, render_items, self.render(messages, tools, True, "input"), self.end_of_turn_ids),
        )
        self._check_token_ids(prompt, "input")
        top = body.top_logprobs or 0
        with_logprobs = top > 0 or _LOGPROBS_INCLUDE in (body.include or [])
        params = self._sampling_params(
            len(prompt), body.max_output_tokens, "max_output_tokens", body.temperature, body.top_p, body.top_k,
            body.seed, top_logprobs=top, param="input",
        )  # fmt: skip
        (result,) = await self._generate([GenerationRequest(prompt, params)], "input")
        incomplete = result.finish_reason == "length"
        output = completion_to_output_items(result.text, incomplete=incomplete)
        if with_logprobs:
            message = next((item for item in output if item.type == "message"), None)
            if message is not None:
                message.content[0].logprobs = self._token_logprobs(result)
        if _wants_token_ids(body.return_token_ids, body.metadata, self.settings):
            for key, value in _training_fields(result).items():
                setattr(output[-1], key, value)
        response = Response(
            model=self.model_name,
            output=output,
            status="incomplete" if incomplete else "completed",
            incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
            usage=Usage(
                input_tokens=len(prompt),
                output_tokens=len(result.token_ids),
                total_tokens=len(prompt) + len(result.token_ids),
                input_tokens_details={"cached_tokens": 0},
                output_tokens_details={"reasoning_tokens": 0},
            ),
            instructions=body.instructions,
            tools=body.tools or [],
            tool_choice=body.tool_choice if body.tool_choice is not None else "auto",
            parallel_tool_calls=body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
            temperature=params.temperature,
            top_p=params.top_p,
            top_logprobs=top,
            max_output_tokens=params.max_new_tokens,
            metadata=body.metadata,
        )
        payload = response.model_dump(mode="json", by_alias=True)
        _tidy_training_fields(payload["output"])
        if body.stream:
            return EventStream(response_events(payload, self._pieces(result)), named=True)
        return payload

    async def chat_completions(self, body: ChatCompletionRequest) -> dict[str, Any] | EventStream:
        """The chat completions API: ``n`` completions of ``messages``."""
        tools = _chat_tools(body.tools)
        template_messages = [_chat_message_for_template(m) for m in body.messages]
        size = _text_size(template_messages, tools)
        self._check_text_fits(size, "messages")

        def render_messages(prefix: list[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
            return self.render([_chat_message_for_template(m) for m in prefix], tools, add_generation_prompt)

        prompt = await self._off_loop(
            size,
            lambda: on_policy_prompt(
                body.messages, render_messages, self.render(template_messages, tools, True), self.end_of_turn_ids
            ),
        )
        self._check_token_ids(prompt, "messages")
        top = body.top_logprobs or 0
        if top and not body.logprobs:
            raise ApiError(400, "top_logprobs: needs logprobs=true", "top_logprobs")
        requested, field = (
            (body.max_completion_tokens, "max_completion_tokens")
            if body.max_completion_tokens is not None
            else (body.max_tokens, "max_tokens")
        )
        stop = [body.stop] if isinstance(body.stop, str) else body.stop
        results = await self._generate_n(
            prompt, body.n, requested, field, body.temperature, body.top_p, body.top_k, body.seed, stop, top, "messages"
        )
        wants_ids = _wants_token_ids(body.return_token_ids, None, self.settings)
        choices = [
            self._chat_choice(i, result, bool(body.logprobs), bool(body.return_tokens_as_token_ids), wants_ids)
            for i, result in enumerate(results)
        ]
        completion_tokens = sum(len(r.token_ids) for r in results)
        payload: dict[str, Any] = {
            "id": new_id("chatcmpl"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt) + completion_tokens,
            },
        }
        if wants_ids:
            payload["prompt_token_ids"] = prompt
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            pieces = [self._pieces(r) for r in results]
            return EventStream(chat_chunks(payload, pieces, include_usage=usage), done=True)
        return payload

    async def completions(self, body: CompletionRequest) -> dict[str, Any] | EventStream:
        """The (legacy) completions API: ``n`` continuations of a raw prompt, no chat template."""
        if isinstance(body.prompt, str):
            text = body.prompt
            self._check_text_fits(len(text), "prompt")
            prompt = await self._off_loop(len(text), lambda: self._encode(text, True))
        else:
            prompt = list(body.prompt)
        self._check_token_ids(prompt, "prompt")
        top = body.logprobs or 0
        stop = [body.stop] if isinstance(body.stop, str) else body.stop
        results = await self._generate_n(
            prompt, body.n, body.max_tokens, "max_tokens", body.temperature, body.top_p, body.top_k, body.seed,
            stop, top, "prompt",
        )  # fmt: skip
        choices = []
        for i, result in enumerate(results):
            logprobs = self._completion_logprobs(result) if body.logprobs is not None else None
            choice: dict[str, Any] = {"index": i, "text": result.text, "logprobs": logprobs,
                                      "finish_reason": result.finish_reason}  # fmt: skip
            if _wants_token_ids(body.return_token_ids, None, self.settings):
                choice.update(prompt_token_ids=prompt, token_ids=list(result.token_ids))
            choices.append(choice)
        completion_tokens = sum(len(r.token_ids) for r in results)
        payload = {
            "id": new_id("cmpl"),
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens,
                      "total_tokens": len(prompt) + completion_tokens},
        }  # fmt: skip
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            pieces = [self._pieces(r) for r in results]
            return EventStream(completion_chunks(payload, pieces, include_usage=usage), done=True)
        return payload

    # ------------------------------------------------------------------ prompts

    def _render_uncached(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool,
        param: str,
    ) -> list[int]:  # fmt: skip
        try:
            return render_prompt(self.tokenizer, messages, tools, add_generation_prompt)
        except TemplateError as exc:
            raise ApiError(400, f"{param}: {exc}", param) from exc

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return [int(t) for t in self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]]

    async def _off_loop(self, size: int, work: Callable[[], list[int]]) -> list[int]:
        """Run tokenizer work: inline when small, else on the tokenizer thread (the event loop stays free)."""
        if size <= _THREAD_RENDER_CHARS:
            return work()
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, work)

    def _check_text_fits(self, size: int, param: str) -> None:
        """Refuse text that cannot fit the context, before tokenizing it: a token covers at most
        ``max_token_bytes`` bytes, and a character is at least one byte."""
        if size > self.max_context * self.max_token_bytes:
            raise ApiError(
                400,
                f"{param}: {size} characters of text cannot fit the model's context of {self.max_context} tokens "
                f"(no token covers more than {self.max_token_bytes} bytes)",
                param,
            )

    def _check_token_ids(self, prompt: list[int], param: str) -> None:
        """Token ids sent back from earlier turns (or as a prompt) must exist in the model's vocabulary."""
        bad = next((t for t in prompt if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ApiError(
                400, f"{param}: token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})", param
            )

    # ------------------------------------------------------------------ generation

    def _sampling_params(
        self, prompt_len: int, requested_max: int | None, max_field: str, temperature: float | None,
        top_p: float | None, top_k: int | None, seed: int | None, stop: list[str] | None = None,
        top_logprobs: int = 0, param: str = "input",
    ) -> SamplingParams:  # fmt: skip
        room = self.max_context - prompt_len
        if room <= 0:
            raise ApiError(
                400, f"{param}: the prompt has {prompt_len} tokens, over the model's context of {self.max_context}",
                param,
            )  # fmt: skip
        cap = self.settings.max_output_tokens
        return SamplingParams(
            max_new_tokens=min(requested_max or cap, cap, room),
            temperature=self.settings.default_temperature if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            top_k=0 if top_k is None or top_k < 0 else top_k,
            seed=seed,
            stop_strings=list(stop or []),
            top_logprobs=top_logprobs,
        )

    async def _generate_n(
        self, prompt: list[int], n: int, requested_max: int | None, max_field: str, temperature: float | None,
        top_p: float | None, top_k: int | None, seed: int | None, stop: list[str] | None, top_logprobs: int,
        param: str,
    ) -> list[GenerationResult]:  # fmt: skip
        if n > self.settings.max_n:
            raise ApiError(400, f"n: {n} is over this server's limit of {self.settings.max_n}", "n")
        requests = []
        for i in range(n):
            params = self._sampling_params(
                len(prompt), requested_max, max_field, temperature, top_p, top_k,
                None if seed is None else seed + i, stop, top_logprobs, param,
            )  # fmt: skip
            requests.append(GenerationRequest(prompt, params))
        return await self._generate(requests, param)

    async def _generate(self, requests: list[GenerationRequest], param: str) -> list[GenerationResult]:
        held = sum(len(r.prompt_token_ids) + r.params.max_new_tokens for r in requests)
        if held > self.settings.max_request_tokens:
            raise ApiError(
                400,
                f"{param}: this request would hold {held} tokens (n x (prompt + max output)), over this server's "
                f"limit of {self.settings.max_request_tokens}",
                param,
            )
        try:
            if len(requests) == 1:
                return [await self.batcher.submit(requests[0])]
            return await self.batcher.submit_many(requests)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc

    # ------------------------------------------------------------------ answers

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def _pieces(self, result: GenerationResult) -> list[str]:
        return token_pieces([self._token_text(t) for t in result.token_ids], result.text)

    def _token_logprobs(self, result: GenerationResult, tokens_as_ids: bool = False) -> list[dict[str, Any]]:
        """Per generated token: ``token``, ``logprob``, ``bytes`` and ``top_logprobs`` (OpenAI's shape)."""

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            token = f"token_id:{token_id}" if tokens_as_ids else self._token_text(token_id)
            return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

        tops = result.top_logprobs or [[] for _ in result.token_ids]
        return [
            {**entry(token_id, logprob), "top_logprobs": [entry(t, lp) for t, lp in top]}
            for token_id, logprob, top in zip(result.token_ids, result.logprobs, tops, strict=True)
        ]

    def _completion_logprobs(self, result: GenerationResult) -> dict[str, Any]:
        """The completions API's (legacy) log-probabilities: parallel lists."""
        tokens = [self._token_text(t) for t in result.token_ids]
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        tops = result.top_logprobs
        return {
            "tokens": tokens,
            "token_logprobs": list(result.logprobs),
            "top_logprobs": [{self._token_text(t): lp for t, lp in top} for top in tops] if tops else None,
            "text_offset": offsets,
        }

    def _chat_choice(
        self, index: int, result: GenerationResult, logprobs: bool, tokens_as_ids: bool, training_fields: bool
    ) -> dict[str, Any]:
        """One chat ``choice``; ``<think>`` stays in the content, tool calls move to ``tool_calls``."""
        parsed = parse_completion(result.text, extract_reasoning=False)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.text or None}
        if parsed.tool_calls:
            message["tool_calls"] = [
                {"id": new_id("call"), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in parsed.tool_calls
            ]
        if training_fields:
            message.update(_training_fields(result))
        finish = "tool_calls" if parsed.tool_calls and result.finish_reason == "stop" else result.finish_reason
        choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish, "logprobs": None}
        if logprobs:
            choice["logprobs"] = {"content": self._token_logprobs(result, tokens_as_ids)}
        if training_fields:
            choice["token_ids"] = list(result.token_ids)
        return choice


# --------------------------------------------------------------------------- helpers


def _longest_token(tokenizer: Any) -> int:
    """Bytes of the vocabulary's longest token (byte-level vocabularies spell each byte as one character)."""
    try:
        longest = max((len(token.encode()) for token in tokenizer.get_vocab()), default=0)
    except (AttributeError, TypeError):
        longest = 0
    return max(longest, 16)


def _text_size(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """Characters of text a rendering of ``messages`` (and ``tools``) holds at least."""
    size = sum(len(m.get("content") or "") for m in messages)
    for message in messages:
        for call in message.get("tool_calls") or []:
            size += len(json.dumps(call.get("function", {}).get("arguments"), default=str))
    if tools:
        size += len(json.dumps(tools, default=str))
    return size


def _chat_message_for_template(message: ChatMessage) -> dict[str, Any]:
    """A chat message as templates expect it: text content, ``developer`` as system, dict arguments."""
    out: dict[str, Any] = {
        "role": "system" if message.role == "developer" else message.role,
        "content": content_text(message.content),
    }
    if message.tool_calls:
        calls = []
        for call in message.tool_calls:
            arguments: Any = call.function.arguments
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except (json.JSONDecodeError, RecursionError):
                    pass
            calls.append({"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}})
        out["tool_calls"] = calls
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """``tools`` in chat-template form; a function tool without a string ``name`` is a 400, not a crash."""
    for i, tool in enumerate(tools or []):
        flat_function = tool.get("type", "function") == "function" and "function" not in tool
        if flat_function and not isinstance(tool.get("name"), str):
            raise ApiError(400, f"tools.{i}: a function tool needs a string 'name'", f"tools.{i}")
    return tools_to_chat_tools(tools)


def _wants_token_ids(flag: bool | None, metadata: dict[str, Any] | None, settings: PolicySettings) -> bool:
    if flag is not None:
        return flag
    value = (metadata or {}).get("return_token_ids")
    if value is not None:
        return str(value).lower() in ("1", "true", "yes")
    return settings.return_token_ids


def _training_fields(result: GenerationResult) -> dict[str, Any]:
    return {
        "prompt_token_ids": list(result.prompt_token_ids),
        "generation_token_ids": list(result.token_ids),
        "generation_log_probs": list(result.logprobs),
    }


def _tidy_training_fields(output: list[dict[str, Any]]) -> None:
    """Drop unset training fields; move set ones after the item's own fields (readable dumps)."""
    for item in output:
        values = {key: item.pop(key) for key in _TRAINING_FIELDS if key in item}
        item.update({key: value for key, value in values.items() if value is not None})
