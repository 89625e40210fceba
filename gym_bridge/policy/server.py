"""The embedded policy server: an OpenAI-compatible HTTP front for a :class:`GenerationBackend`.

Endpoints: ``POST /v1/responses`` (what NeMo Gym agents call), ``POST /v1/chat/completions`` (what
NeMo Gym's ``vllm_model`` server calls, including vLLM's ``logprobs`` + ``return_tokens_as_token_ids``
and ``return_token_ids`` extensions), ``POST /tokenize`` (vLLM's, used by that same server),
``GET /v1/models`` and ``GET /health``.

Prompts are rendered with the tokenizer's chat template; when the conversation carries the previous
turn's token ids, they are reused exactly (:mod:`gym_bridge.policy.continuation`). Concurrent requests
are generated together (:mod:`gym_bridge.policy.batching`). For RL, the training fields NeMo Gym defines
(``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``) are attached to the last
output item when the server runs with ``return_token_ids=True`` or a request asks with
``"return_token_ids": true`` (or ``metadata: {"return_token_ids": "true"}``). Log-probabilities are
under the raw model distribution (see :mod:`gym_bridge.generation.backend`).
"""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, ValidationError

from gym_bridge.chat import items_to_messages, tools_to_chat_tools
from gym_bridge.fast_routes import (
    Answer,
    ErrorStyle,
    JsonRoute,
    answer_route,
    json_answer,
    read_body,
    send_answer,
)
from gym_bridge.generation.backend import (
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)
from gym_bridge.policy.batching import GenerationBatcher
from gym_bridge.policy.continuation import on_policy_prompt
from gym_bridge.policy.prompt_cache import RenderCache
from gym_bridge.policy.tool_calls import completion_to_output_items, parse_completion
from gym_bridge.schema import (
    FunctionCall,
    FunctionCallOutput,
    Reasoning,
    Response,
    ResponsesCreateParams,
    Usage,
    content_text,
    input_items,
    new_id,
)
from gym_bridge.server import (
    _CrashGuard,
    _format_validation_errors,
    _has_lone_surrogate,
    _jsonable_errors,
    _JsonBodies,
)

__all__ = ["ChatCompletionRequest", "PolicySettings", "ResponsesRequest", "build_policy_app"]

_TRAINING_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


class PolicySettings(BaseModel):
    """Serving limits and defaults of one policy server."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int = Field(64, ge=1)
    batch_wait_ms: float = Field(5.0, ge=0)
    max_output_tokens: int = Field(1024, ge=1)
    """Server cap on ``max_output_tokens`` / ``max_tokens``; larger requests are cut to it."""
    return_token_ids: bool = False
    """Attach the training fields to every response, as NeMo Gym's ``return_token_id_information``."""
    default_temperature: float = 1.0


# --------------------------------------------------------------------------- request bodies


class ResponsesRequest(ResponsesCreateParams):
    """``POST /v1/responses`` body: the Responses create params with range checks and our extras."""

    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    max_output_tokens: int | None = Field(None, ge=1)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = None
    stream: Literal[False] | None = None
    return_token_ids: bool | None = None
    """Extra field: attach ``prompt_token_ids``/``generation_token_ids``/``generation_log_probs``."""


class _TokenFields(BaseModel):
    """NeMo Gym's training fields, as an earlier turn sent back in the conversation may carry them."""

    model_config = ConfigDict(extra="allow")

    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float] | None = None


class InputMessage(_TokenFields):
    """A message item of Responses ``input`` (checked so a malformed one is a 422, not a crash)."""

    type: Literal["message"] | None = None
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[str | dict[str, Any]] | None = None


def _input_item_tag(item: Any) -> str:
    if not isinstance(item, dict):
        return "message"  # reported as "should be a valid dictionary"
    kind = item.get("type", "message" if "role" in item else None)
    return kind if kind in ("message", "function_call", "function_call_output", "reasoning") else "other"


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCall, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")]
    | Annotated[Reasoning, Tag("reasoning")]
    | Annotated[dict[str, Any], Tag("other")],
    Discriminator(_input_item_tag),
]
_INPUT_ITEM = TypeAdapter(InputItem)


def check_input_items(items: list[Any]) -> None:
    """Validate Responses input items in place of trusting them; errors are located as ``input.N...``."""
    errors: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        try:
            _INPUT_ITEM.validate_python(item)
        except ValidationError as exc:
            errors += [{**err, "loc": ("body", "input", i, *err["loc"][1:])} for err in exc.errors()]
    if errors:
        raise RequestValidationError(errors)


class ChatFunction(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    arguments: str | dict[str, Any] = "{}"


class ChatToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: Literal["function"] = "function"
    function: ChatFunction


class ChatMessage(_TokenFields):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[str | dict[str, Any]] | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions`` body (non-streaming), with vLLM's token-id extensions."""

    model_config = ConfigDict(extra="allow")

    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    n: int = Field(1, ge=1, le=64)
    stop: str | list[str] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=0)
    stream: Literal[False] | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None


class TokenizeRequest(BaseModel):
    """vLLM's ``POST /tokenize``: chat ``messages`` (rendered with the template) or a raw ``prompt``."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt: str | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = False


class ApiError(Exception):
    """A request the server refuses; answered as ``{"detail", "error": {"message", "param"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def _error_content(status: int, message: str, param: str | None = None, **extra: Any) -> dict[str, Any]:
    """An error in OpenAI's shape (``error``) with FastAPI's ``detail`` beside it."""
    error = {
        "message": message,
        "type": "invalid_request_error" if status < 500 else "server_error",
        "param": param,
    }
    return {"detail": message, "error": error, **extra}


def _error_response(status: int, message: str, param: str | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse(_error_content(status, message, param, **extra), status_code=status)


def _invalid_content(errors: list[dict[str, Any]], body: Any) -> dict[str, Any]:
    """A ``RequestValidationError`` as a 422: the first bad field as ``param``, all of them in ``errors``."""
    first = errors[0].get("loc", ()) if errors else ()
    param = ".".join(str(x) for x in first if x != "body") or None
    message = _format_validation_errors(errors, body)
    return _error_content(422, message, param, errors=_jsonable_errors(errors))


class _PolicyErrors(ErrorStyle):
    """What this app's exception handlers and crash guard answer, for the hot routes."""

    def invalid(self, errors: list[dict[str, Any]], body: Any = None) -> Answer:
        return json_answer(422, _invalid_content(errors, body))

    def failed(self, path: str, exc: Exception) -> Answer:
        if isinstance(exc, ApiError):
            return json_answer(exc.status, _error_content(exc.status, exc.message, exc.param))
        return super().failed(path, exc)

    def crash(self, path: str, exc: Exception) -> Answer:
        super().crash(path, exc)  # logs it
        detail = f"internal error on {path}: {type(exc).__name__}: {exc}"[:2000]
        return json_answer(500, _error_content(500, detail))


_ERRORS = _PolicyErrors()


class _PolicyFront:
    """Serves the generation routes itself (:mod:`gym_bridge.fast_routes`); the rest goes to FastAPI.

    Bodies are read as JSON whatever their content type, and a lone surrogate escape is a 400, as the
    FastAPI app's own middleware does. ``state`` is the FastAPI app's (``state.batcher``, ``state.settings``).
    """

    def __init__(self, app: FastAPI, routes: dict[str, JsonRoute]) -> None:
        self.app = app
        self.routes = routes
        self.state = app.state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        route = self.routes.get(scope.get("path", "")) if scope["type"] == "http" else None
        if route is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:  # the client went away
            return
        if _has_lone_surrogate(body):
            detail = "body holds a lone UTF-16 surrogate escape (e.g. \\ud800), which is not valid Unicode text"
            await send_answer(send, json_answer(400, {"detail": detail}))
            return
        await send_answer(send, await answer_route(route, scope["path"], body, None, _ERRORS))


# --------------------------------------------------------------------------- prompt rendering


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
                except json.JSONDecodeError:
                    pass
            function = {"name": call.function.name, "arguments": arguments}
            calls.append({"id": call.id, "type": "function", "function": function})
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


def render_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    param: str = "messages",
) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template (a bad template input is a 400)."""
    try:
        ids = tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            return_dict=False,
        )
    except Exception as exc:  # jinja errors, missing template, template's raise_exception(...)
        raise ApiError(400, f"{param}: could not render the chat template: {exc}", param) from exc
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(i) for i in ids]


# --------------------------------------------------------------------------- the app


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


def build_policy_app(
    backend: GenerationBackend,
    model_name: str | None = None,
    settings: PolicySettings | None = None,
    fast_routes: bool = True,
    **overrides: Any,
) -> Any:
    """The ASGI app serving ``backend``; ``overrides`` are :class:`PolicySettings` fields.

    ``app.state.batcher`` exposes the batcher (and its :class:`~gym_bridge.policy.batching.BatchStats`).
    ``POST /v1/responses`` and ``/v1/chat/completions`` are served by a front that answers exactly as the
    FastAPI app behind it would; ``fast_routes=False`` sends them through FastAPI too (the reference
    behaviour the front is tested against).
    """
    settings = PolicySettings.model_validate({**(settings or PolicySettings()).model_dump(), **overrides})
    served_name = model_name or backend.model_name
    tokenizer = backend.tokenizer
    max_context = int(getattr(backend, "max_context", None) or 2048)
    vocab_size = int(getattr(backend, "vocab_size", None) or len(tokenizer))
    end_of_turn_ids = set(getattr(backend, "eos_token_ids", None) or []) or (
        {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    )
    batcher = GenerationBatcher(backend, settings.max_batch_size, settings.batch_wait_ms / 1000.0)
    render = RenderCache(
        lambda messages, tools, add_generation_prompt, param: render_prompt(
            tokenizer, messages, tools, add_generation_prompt, param
        ),
        getattr(tokenizer, "chat_template", None),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI):  # type: ignore[no-untyped-def]
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(title=f"gym-bridge policy server: {served_name}", lifespan=lifespan)
    app.state.batcher = batcher
    app.state.settings = settings
    # As on the resources servers: bodies read as JSON (lone surrogates refused with a 400), and a crash
    # answers a JSON 500 without dropping the keep-alive connection.
    app.add_middleware(_CrashGuard, render=lambda detail: _error_response(500, detail))
    app.add_middleware(_JsonBodies)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(_invalid_content(list(exc.errors()), exc.body), status_code=422)

    @app.exception_handler(ApiError)
    async def _refused(_: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(Exception)
    async def _crashed(_: Request, exc: Exception) -> JSONResponse:
        return _error_response(500, f"internal error: {type(exc).__name__}: {exc}")

    def check_token_ids(prompt: list[int], param: str) -> None:
        """Token ids sent back from earlier turns must exist in the model's vocabulary."""
        bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ApiError(
                400,
                f"{param}: token id {bad} of an earlier turn is outside the vocabulary (0..{vocab_size - 1})",
                param,
            )

    def sampling_params(
        prompt_len: int,
        requested_max: int | None,
        temperature: float | None,
        top_p: float | None,
        top_k: int | None,
        seed: int | None,
        stop: list[str] | None = None,
        param: str = "input",
    ) -> SamplingParams:
        room = max_context - prompt_len
        if room <= 0:
            raise ApiError(
                400,
                f"{param}: the prompt has {prompt_len} tokens, over the model's context of {max_context}",
                param,
            )
        limit = min(requested_max or settings.max_output_tokens, settings.max_output_tokens, room)
        return SamplingParams(
            max_new_tokens=limit,
            temperature=settings.default_temperature if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            top_k=0 if top_k is None or top_k < 0 else top_k,
            seed=seed,
            stop_strings=list(stop or []),
        )

    async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
        try:
            if len(requests) == 1:
                return [await batcher.submit(requests[0])]
            return await batcher.submit_many(requests)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc

    @app.get("/health")
    async def health() -> dict[str, Any]:
        stats = batcher.stats
        return {
            "status": "ok",
            "model": served_name,
            "batches": stats.batches,
            "requests": stats.requests,
            "generated_tokens": stats.generated_tokens,
            "mean_batch_size": stats.requests / stats.batches if stats.batches else 0.0,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": served_name,
            "object": "model",
            "created": 0,
            "owned_by": "gym-bridge",
            "max_model_len": max_context,
        }
        return {"object": "list", "data": [card]}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        if body.messages is not None:
            messages = [_chat_message_for_template(m) for m in body.messages]
            tokens = render(messages, _chat_tools(body.tools), body.add_generation_prompt)
        elif body.prompt is not None:
            tokens = list(tokenizer(body.prompt, add_special_tokens=body.add_special_tokens)["input_ids"])
        else:
            raise ApiError(422, "messages or prompt: one of them is required", "messages")
        return {"count": len(tokens), "max_model_len": max_context, "tokens": tokens}

    async def responses(body: ResponsesRequest, _: Any = None) -> dict[str, Any]:
        items = input_items(body)
        check_input_items(items)
        tools = _chat_tools(body.tools)
        if not items_to_messages(items, body.instructions):
            raise ApiError(400, "input: no messages to respond to", "input")

        def render_items(prefix: list[Any], add_generation_prompt: bool = True) -> list[int]:
            messages = items_to_messages(prefix, body.instructions)
            return render(messages, tools, add_generation_prompt, param="input")

        prompt = on_policy_prompt(items, render_items, render_items(items), end_of_turn_ids)
        check_token_ids(prompt, "input")
        params = sampling_params(
            len(prompt),
            body.max_output_tokens,
            body.temperature,
            body.top_p,
            body.top_k,
            body.seed,
            param="input",
        )
        (result,) = await generate([GenerationRequest(prompt, params)])
        incomplete = result.finish_reason == "length"
        output = completion_to_output_items(result.text, incomplete=incomplete)
        if _wants_token_ids(body.return_token_ids, body.metadata, settings):
            for key, value in _training_fields(result).items():
                setattr(output[-1], key, value)
        response = Response(
            model=served_name,
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
            max_output_tokens=params.max_new_tokens,
            metadata=body.metadata,
        )
        payload = response.model_dump(mode="json", by_alias=True)
        _tidy_training_fields(payload["output"])
        return payload

    @app.post("/v1/responses")
    async def responses_route(body: ResponsesRequest) -> JSONResponse:
        return JSONResponse(await responses(body))

    async def chat_completions(body: ChatCompletionRequest, _: Any = None) -> dict[str, Any]:
        tools = _chat_tools(body.tools)

        def render_messages(prefix: list[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
            messages = [_chat_message_for_template(m) for m in prefix]
            return render(messages, tools, add_generation_prompt)

        prompt = on_policy_prompt(
            body.messages, render_messages, render_messages(body.messages), end_of_turn_ids
        )
        check_token_ids(prompt, "messages")
        stop = [body.stop] if isinstance(body.stop, str) else body.stop
        requested = body.max_completion_tokens or body.max_tokens
        requests = []
        for i in range(body.n):
            seed = None if body.seed is None else body.seed + i
            params = sampling_params(
                len(prompt), requested, body.temperature, body.top_p, body.top_k, seed, stop, param="messages"
            )
            requests.append(GenerationRequest(prompt, params))
        results = await generate(requests)
        wants_ids = _wants_token_ids(body.return_token_ids, None, settings)
        choices = [
            _chat_choice(
                i, result, tokenizer, bool(body.logprobs), bool(body.return_tokens_as_token_ids), wants_ids
            )
            for i, result in enumerate(results)
        ]
        completion_tokens = sum(len(r.token_ids) for r in results)
        payload: dict[str, Any] = {
            "id": new_id("chatcmpl"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": served_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt) + completion_tokens,
            },
        }
        if wants_ids:
            payload["prompt_token_ids"] = prompt
        return payload

    @app.post("/v1/chat/completions")
    async def chat_completions_route(body: ChatCompletionRequest) -> JSONResponse:
        return JSONResponse(await chat_completions(body))

    if not fast_routes:
        return app
    routes = {
        "/v1/responses": JsonRoute(TypeAdapter(ResponsesRequest), responses, raw_json=True),
        "/v1/chat/completions": JsonRoute(TypeAdapter(ChatCompletionRequest), chat_completions, raw_json=True),
    }
    return _PolicyFront(app, routes)


def _chat_choice(
    index: int,
    result: GenerationResult,
    tokenizer: Any,
    logprobs: bool,
    tokens_as_ids: bool,
    training_fields: bool,
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
        content = []
        for token_id, logprob in zip(result.token_ids, result.logprobs, strict=True):
            token = f"token_id:{token_id}" if tokens_as_ids else tokenizer.decode([token_id])
            content.append(
                {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}
            )
        choice["logprobs"] = {"content": content}
    if training_fields:
        choice["token_ids"] = list(result.token_ids)
    return choice
