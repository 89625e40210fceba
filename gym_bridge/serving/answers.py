"""What a route's request gets back: an :class:`Answer`, and the :class:`ErrorStyle` that shapes refusals.

Why its own module: every refusal of the project (a 4xx naming the field, never a 500 for bad input)
is shaped here, once, from pydantic's errors or an exception; the policy server's subclass gives
OpenAI's error shape (:mod:`gym_bridge.policy.api`). :mod:`gym_bridge.serving.json_http` serves the answers.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from pydantic import ValidationError
from starlette.exceptions import HTTPException

from gym_bridge.records.jsonl import compact_json
from gym_bridge.serving.json_body import MAX_JSON_DEPTH

__all__ = ["Answer", "ErrorStyle", "Headers", "InvalidBody", "format_validation_errors", "json_answer", "jsonable_errors"]

logger = logging.getLogger(__name__)

Headers = tuple[tuple[bytes, bytes], ...]


class Answer(NamedTuple):
    """A JSON response: status, body, and headers beyond the content type and length."""

    status: int
    body: bytes
    headers: Headers = ()
    value: Any = None
    """The JSON value ``body`` encodes, when it can be handed over as parsed (see :attr:`Route.fresh_json`)."""


def json_answer(status: int, content: Any, headers: Headers = ()) -> Answer:
    """``content`` as compact UTF-8 JSON (what Starlette's ``JSONResponse`` writes)."""
    body = compact_json(content, finite=True).encode()
    return Answer(status, body, headers)


class InvalidBody(Exception):
    """Raised by a handler: the body is invalid in a way its type could not say (answered 422)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(format_validation_errors(errors))
        self.errors = errors


class ErrorStyle:
    """How an app answers what goes wrong; subclasses change the shape (the policy server's is OpenAI's)."""

    def error(self, status: int, detail: str, param: str | None = None, headers: Headers = ()) -> Answer:
        """A refusal (4xx) or failure (5xx) with a message; ``param``: the request field at fault."""
        return json_answer(status, {"detail": detail}, headers)

    def invalid(self, errors: list[dict[str, Any]], body: Any = None) -> Answer:
        """Input that failed validation: 422 naming the fields (``body``: what was parsed, or the text)."""
        content = {"detail": format_validation_errors(errors, body), "errors": jsonable_errors(errors)}
        return json_answer(422, content)

    def failed(self, path: str, exc: Exception) -> Answer:
        """Anything a handler raised: HTTP errors as they say, validation errors as 422, else a 500."""
        if isinstance(exc, HTTPException):
            headers = tuple(
                (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (exc.headers or {}).items()
            )
            return self.error(exc.status_code, str(exc.detail), headers=headers)
        if isinstance(exc, ValidationError):
            return self.invalid(list(exc.errors(include_url=False)))
        if isinstance(exc, InvalidBody):
            return self.invalid(exc.errors)
        if isinstance(exc, RecursionError):
            return self.error(400, f"request nested too deeply to process (limit {MAX_JSON_DEPTH} levels)")
        logger.exception("error while serving %s", path)
        return self.error(500, f"internal error on {path}: {type(exc).__name__}: {exc}"[:2000])


def format_validation_errors(errors: list[dict[str, Any]], body: Any = None) -> str:
    """Pydantic errors as one line: ``field.path: message; ...`` (at most ten)."""
    parts = []
    for err in errors[:10]:
        if err.get("type") == "json_invalid":
            parts.append(_json_error_message(err, body))
            continue
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        if loc == "body" and err.get("type") == "missing":
            parts.append("request body is empty: expected a JSON object")
            continue
        if loc == "body" and err.get("type") in ("model_attributes_type", "model_type", "dict_type"):
            parts.append(f"request body must be a JSON object, not {type(err.get('input')).__name__}")
            continue
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    more = f" (+{len(errors) - 10} more)" if len(errors) > 10 else ""
    return "; ".join(parts) + more


def jsonable_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic errors reduced to what JSON holds: location, message, type."""
    return [{"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg")), "type": e.get("type")} for e in errors]


def _json_error_message(err: dict[str, Any], body: Any) -> str:
    """``invalid JSON at line L column C (char N): <reason>``."""
    loc = err.get("loc", ())
    pos = loc[-1] if loc and isinstance(loc[-1], int) else None
    reason = (err.get("ctx") or {}).get("error") or err.get("msg", "JSON decode error")
    if pos is None:
        return f"invalid JSON: {reason}"
    where = f"char {pos}"
    if isinstance(body, str | bytes):
        text = body if isinstance(body, str) else body.decode("utf-8", "replace")
        line = text.count("\n", 0, pos) + 1
        column = pos - (text.rfind("\n", 0, pos) + 1) + 1
        where = f"line {line} column {column} (char {pos})"
    return f"invalid JSON at {where}: {reason}"
