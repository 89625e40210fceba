"""The request bodies the policy server accepts (OpenAI's and vLLM's shapes) and how it refuses one.

Bodies are pydantic models, so a wrong field is a 422 naming it; :class:`ApiError` is a refusal the
handlers raise (answered in OpenAI's error shape by :class:`PolicyErrors`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gym_bridge.records.schema import ResponsesCreateParams, TrainingFields, item_union
from gym_bridge.serving.answers import (
    Answer,
    ErrorStyle,
    Headers,
    InvalidBody,
    format_validation_errors,
    json_answer,
    jsonable_errors,
)

__all__ = [
    "ApiError",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "PolicyErrors",
    "ResponsesRequest",
    "TokenizeRequest",
    "check_input_items",
]


class ResponsesRequest(ResponsesCreateParams):
    """``POST /v1/responses`` body: the Responses create params with range checks and our extras."""

    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    max_output_tokens: int | None = Field(None, ge=1)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = None
    stream: bool | None = None
    """Answer as server-sent events (``response.created`` ... ``response.completed``)."""
    top_logprobs: int | None = Field(None, ge=0, le=20)
    """Return this many most likely tokens per output token (with ``logprobs`` on the output text)."""
    include: list[str] | None = None
    """``"message.output_text.logprobs"`` returns the output text's log-probabilities."""
    return_token_ids: bool | None = None
    """Extra field: attach ``prompt_token_ids``/``generation_token_ids``/``generation_log_probs``."""


class InputMessage(TrainingFields):
    """A message item of Responses ``input`` (checked so a malformed one is a 422, not a crash)."""

    type: Literal["message"] | None = None
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[str | dict[str, Any]] | None = None


def _input_item_type(item: Any) -> str | None:
    if not isinstance(item, dict):
        return "message"  # reported as "should be a valid dictionary"
    return item.get("type", "message" if "role" in item else None)


InputItem = item_union(InputMessage, _input_item_type)
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
        raise InvalidBody(errors)


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the token counts."""

    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = None


class ChatFunction(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    arguments: str | dict[str, Any] = "{}"


class ChatToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: Literal["function"] = "function"
    function: ChatFunction


class ChatMessage(TrainingFields):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[str | dict[str, Any]] | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions`` body, with vLLM's token-id extensions."""

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
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None


class CompletionRequest(BaseModel):
    """``POST /v1/completions`` body: a raw ``prompt`` (text, or token ids as vLLM accepts), no template."""

    model_config = ConfigDict(extra="allow")

    prompt: str | list[int] = Field(min_length=1)
    model: str | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    max_tokens: int | None = Field(16, ge=1)
    seed: int | None = None
    n: int = Field(1, ge=1, le=64)
    stop: str | list[str] | None = None
    logprobs: int | None = Field(None, ge=0, le=20)
    """OpenAI's legacy form: the number of top log-probabilities per token (0: the sampled token's only)."""
    echo: Literal[False] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
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


class PolicyErrors(ErrorStyle):
    """Errors in OpenAI's shape (``error: {message, type, param}``) with ``detail`` beside it."""

    def error(self, status: int, detail: str, param: str | None = None, headers: Headers = ()) -> Answer:
        return json_answer(status, _error_content(status, detail, param), headers)

    def invalid(self, errors: list[dict[str, Any]], body: Any = None) -> Answer:
        """A 422: the first bad field as ``param``, all of them in ``errors``."""
        first = errors[0].get("loc", ()) if errors else ()
        param = ".".join(str(x) for x in first if x != "body") or None
        content = _error_content(422, format_validation_errors(errors, body), param, errors=jsonable_errors(errors))
        return json_answer(422, content)

    def failed(self, path: str, exc: Exception) -> Answer:
        if isinstance(exc, ApiError):
            return self.error(exc.status, exc.message, exc.param)
        return super().failed(path, exc)


def _error_content(status: int, message: str, param: str | None = None, **extra: Any) -> dict[str, Any]:
    error = {"message": message, "type": "invalid_request_error" if status < 500 else "server_error", "param": param}
    return {"detail": message, "error": error, **extra}
