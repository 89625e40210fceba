"""Hot JSON routes served without FastAPI's per-request machinery, answering exactly as FastAPI would.

Why: a rollout makes a few small requests to each server (``/seed_session``, ``/v1/responses``,
``/verify``, tools), and FastAPI's request path (a dozen middleware layers, a ``Request``, dependency
solving, telemetry hooks) costs more CPU than the work behind most of them. A server keeps its FastAPI app
(documentation, every other route, and the reference behaviour), and its front calls :func:`answer_route`
for the hot paths: parse the body as FastAPI does (``json.loads``, then the route's pydantic type with
``from_attributes``, errors located under ``body``), call the handler, render the result as FastAPI
renders it, and turn what goes wrong into the answer the app's exception handlers would give
(:class:`ErrorStyle`). ``tests/server/test_fast_routes.py`` and ``tests/policy/test_policy_fast_routes.py``
compare the two paths byte for byte.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError
from starlette.exceptions import HTTPException

__all__ = [
    "Answer",
    "BodyTooLarge",
    "ErrorStyle",
    "JsonRoute",
    "answer_route",
    "json_answer",
    "read_body",
    "send_answer",
]

logger = logging.getLogger(__name__)

Headers = tuple[tuple[bytes, bytes], ...]


class Answer(NamedTuple):
    """A JSON response: status, body, and headers beyond the content type and length."""

    status: int
    body: bytes
    headers: Headers = ()


def json_answer(status: int, content: Any, headers: Headers = ()) -> Answer:
    """``content`` rendered exactly as Starlette's ``JSONResponse`` renders it."""
    body = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    return Answer(status, body, headers)


_ANY = TypeAdapter(Any)
_NO_BODY = object()


@dataclass(frozen=True)
class JsonRoute:
    """A hot POST route: the type its body is validated against, and the handler.

    The handler is called as ``call(body, context)`` (``context``: whatever the front passes, e.g. the
    session); it returns JSON-ready content (``raw_json``: rendered with ``json.dumps``, as a handler that
    returns a ``JSONResponse``) or a value FastAPI would serialize for a route annotated ``-> Any``.
    """

    body: TypeAdapter[Any]
    call: Callable[[Any, Any], Awaitable[Any]]
    default: Callable[[], Any] | None = None
    """Body used when the request has none; None: a body is required."""
    raw_json: bool = False


class ErrorStyle:
    """How an app's exception handlers answer: subclasses say how invalid input is answered; HTTP errors
    get FastAPI's default answer and anything else a logged 500 naming it (``server._CrashGuard``'s)."""

    def invalid(self, errors: list[dict[str, Any]], body: Any = None) -> Answer:
        """A ``RequestValidationError`` (``body``: what was parsed, or the text that was not JSON)."""
        raise NotImplementedError

    def failed(self, path: str, exc: Exception) -> Answer:
        """Anything the handler raised."""
        if isinstance(exc, HTTPException):
            headers = tuple(
                (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (exc.headers or {}).items()
            )
            return json_answer(exc.status_code, {"detail": exc.detail}, headers)
        if isinstance(exc, RequestValidationError):
            return self.invalid(list(exc.errors()), exc.body)
        return self.crash(path, exc)

    def crash(self, path: str, exc: Exception) -> Answer:
        """A bug: logged, answered 500 naming it (what ``gym_bridge.server._CrashGuard`` answers)."""
        logger.exception("error while serving %s", path)
        detail = f"internal error on {path}: {type(exc).__name__}: {exc}"
        return json_answer(500, {"detail": detail[:2000]})


async def answer_route(route: JsonRoute, path: str, raw: bytes, context: Any, style: ErrorStyle) -> Answer:
    """Parse, validate and answer one request to a hot route as FastAPI would."""
    value: Any = _NO_BODY
    if raw:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as e:
            error = {"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                     "input": {}, "ctx": {"error": e.msg}}  # fmt: skip
            return style.invalid([error], e.doc)
        except ValueError:  # not UTF-8/16/32 text at all
            return json_answer(400, {"detail": "There was an error parsing the body"})
    if value is _NO_BODY:
        if route.default is None:
            return style.invalid([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
        args = route.default()
    else:
        try:
            args = route.body.validate_python(value, from_attributes=True)
        except ValidationError as exc:
            errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors(include_url=False)]
            return style.invalid(errors, value)
    try:
        result = await route.call(args, context)
        if route.raw_json:
            return json_answer(200, result)
        # As FastAPI serializes the value of a route annotated ``-> Any``: pydantic's JSON.
        return Answer(200, _ANY.dump_json(_ANY.validate_python(result, from_attributes=True), by_alias=True))
    except Exception as exc:
        return style.failed(path, exc)


class BodyTooLarge(Exception):
    """The request body passed the limit given to :func:`read_body`."""


async def read_body(receive: Any, limit: int | None = None) -> bytes | None:
    """The whole request body; None when the client went away (:class:`BodyTooLarge` past ``limit``)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if limit is not None and size > limit:
                raise BodyTooLarge
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_JSON_CONTENT_TYPE = (b"content-type", b"application/json")


async def send_answer(send: Any, answer: Answer, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """An answer with the headers Starlette's ``JSONResponse`` sets, its own, then ``extra``."""
    headers = [(b"content-length", str(len(answer.body)).encode()), _JSON_CONTENT_TYPE, *answer.headers]
    if extra:
        headers += extra
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})
