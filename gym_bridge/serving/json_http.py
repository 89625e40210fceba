"""JSON over HTTP: a route table served by one small ASGI app, documented through FastAPI's OpenAPI.

Every server of the project (the resources servers and the policy server) is a table of :class:`Route`
values served by :class:`JsonApp`, the only request path: per request it checks the ``Host`` name (421)
and that a body comes as ``application/json`` (415; both :mod:`gym_bridge.serving.request_guard`: what a web page
could send), the body's size (413) and the bodies held at once (waits for room, else 503:
:mod:`gym_bridge.serving.body_budget`), the bearer token (401), finds the caller's context (a resources server's
session), reads the body as JSON, refuses a lone UTF-16 surrogate
escape and JSON nested deeper than :data:`MAX_JSON_DEPTH` (400), validates it against the route's type
(422 naming the fields), calls the handler and renders its answer (JSON, or server-sent events for a
:class:`EventStream`). What goes wrong in a handler is answered by the app's :class:`ErrorStyle`.

FastAPI is not in the request path: it generates ``/openapi.json`` (and ``/docs``) from the same table.
Why: FastAPI's request path (a dozen middleware layers, a ``Request``, dependency solving) cost about
three quarters of a small request's CPU; measured A/B in ``bench/README.md`` (collect and policy server).
"""

from __future__ import annotations

import hmac
import inspect
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pydantic import TypeAdapter, ValidationError
from starlette.exceptions import HTTPException

from gym_bridge.records.jsonl import compact_json, parse_json
from gym_bridge.serving.body_budget import BodiesBusy, BodyBudget, BodyClaim
from gym_bridge.serving.deadlines import TaskDeadlines, task_deadlines
from gym_bridge.serving.request_guard import RequestGuard

__all__ = [
    "BODY_IN_HAND",
    "MAX_JSON_DEPTH",
    "PARSED_BODY",
    "Answer",
    "ErrorStyle",
    "EventStream",
    "InvalidBody",
    "JsonApp",
    "Route",
    "format_validation_errors",
    "json_answer",
    "jsonable_errors",
]

logger = logging.getLogger(__name__)

MAX_JSON_DEPTH = 256
BODY_IN_HAND = "gym_bridge.body"
"""Key of a request scope's ``extensions`` that holds the whole body, from a caller on the same loop
(:class:`~gym_bridge.serving.in_process.InProcessClient`): read from there, with the same limits, instead of
awaiting ``receive()`` under the body deadline."""
PARSED_BODY = "gym_bridge.parsed_body"
"""Key of an ``http.response.body`` message that carries the value its ``body`` parses to (:attr:`Route.fresh_json`)."""
"""Deepest nesting of arrays and objects a request body may have (deeper: 400 naming this limit)."""

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


@dataclass
class EventStream:
    """A handler's streamed answer: server-sent events, each ``data: <json>`` (and ``event: <type>``).

    ``named``: each event also carries an ``event:`` line with its ``type`` (the Responses API's shape);
    ``done``: the stream ends with ``data: [DONE]`` (the chat and completions APIs' shape).
    """

    events: AsyncIterator[dict[str, Any]]
    named: bool = False
    done: bool = False


_ANY = TypeAdapter(Any)


@dataclass(frozen=True)
class Route:
    """One route: method, path, the type its JSON body is validated against, and the handler.

    The handler is called as ``call(body, context)`` (``body`` None for a route without one;
    ``context``: what the app's ``context`` hook found, e.g. the session). It returns JSON-ready content
    (``raw_json``), any value pydantic can serialize (models, lists of them), an :class:`Answer`, or an
    :class:`EventStream`.
    """

    method: str
    path: str
    call: Callable[[Any, Any], Awaitable[Any]]
    body: Any = None
    """The body's type (a pydantic model, ``dict[str, Any]``, ...); None: the route takes no body."""
    default: Callable[[], Any] | None = None
    """Body used when the request has none; None: a body is required."""
    raw_json: bool = False
    open: bool = False
    """Answered without the bearer token and without a context (``/health``)."""
    with_context: bool = True
    """False: the handler gets no context (``/close_session`` names its session in the body, so a call
    without a cookie starts no session)."""
    summary: str | None = None
    max_body_bytes: int | None = None
    """This route's body limit; None: the app's. ``/aggregate_metrics`` carries a whole run's rollouts."""
    fresh_json: bool = False
    """With ``raw_json``: the handler's content is made anew for each request and holds only JSON's own
    types (a pydantic JSON-mode dump: str keys, no NaN), so what its body parses to is that very value. A
    caller on the same event loop (:class:`~gym_bridge.serving.in_process.InProcessClient`) is handed the value
    beside the body and skips the parse: ``/verify``'s answer, a whole rollout, was parsed right after it
    was encoded (~160k instructions a rollout)."""
    adapter: TypeAdapter[Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.body is not None and self.adapter is None:
            object.__setattr__(self, "adapter", TypeAdapter(self.body))


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


# --------------------------------------------------------------------------- body parsing


class _Refused(Exception):
    def __init__(self, answer: Answer) -> None:
        self.answer = answer


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_NO_BODY = object()


def _has_lone_surrogate(value: Any, body: bytes) -> bool:
    """True when the parsed body holds text with an unpaired surrogate (it could never be echoed as UTF-8).

    Cheap scans of the raw bytes first (for ``\\u`` at all, then for surrogate escapes); only bodies that
    have one are re-encoded.
    """
    if b"\\u" not in body or not _SURROGATE_ESCAPE.search(body):
        return False
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


_COUNT_CHUNK = 16 * 1024
"""Bytes of a body whose brackets :func:`_too_deep` counts at a time (it stops once there are enough)."""


def _too_deep(value: Any, raw: bytes) -> bool:
    """True when ``value`` (parsed from ``raw``) nests arrays/objects deeper than :data:`MAX_JSON_DEPTH`.

    A body too short to open and close that many brackets is not looked at, nor one with no more
    ``{``/``[`` bytes than the limit (each array or object has its opening byte in ``raw``, in UTF-8, -16
    or -32 alike, so such a body cannot nest deeper). Counting them is C's job (~6 instructions a byte,
    ~12k for a rollout's ``/verify`` body, whose walk cost ~52k), in chunks, so a large body with many
    brackets is counted only until there are enough. Others are walked a level at a time, one
    comprehension per level (no recursion, no call per container: ``/aggregate_metrics`` bodies of a
    whole run have tens of thousands of containers).
    """
    if len(raw) <= 2 * MAX_JSON_DEPTH:
        return False
    openers = 0
    for start in range(0, len(raw), _COUNT_CHUNK):
        end = start + _COUNT_CHUNK
        openers += raw.count(b"{", start, end) + raw.count(b"[", start, end)
        if openers > MAX_JSON_DEPTH:
            break
    else:
        return False
    level = [value] if type(value) is dict or type(value) is list else []  # JSON makes no subclasses
    for _ in range(MAX_JSON_DEPTH):
        level = [
            child
            for node in level
            for child in (node.values() if type(node) is dict else node)
            if type(child) is dict or type(child) is list
        ]
        if not level:
            return False
    return True


def _non_finite(value: Any) -> tuple[Any, ...] | None:
    """Where the first NaN or Infinity sits in a parsed body (Python's JSON reads those bare words)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        node, here = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return here
        if isinstance(node, dict):
            stack.extend((v, (*here, k)) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((v, (*here, i)) for i, v in reversed(list(enumerate(node))))
    return None


def parse_body(raw: bytes, style: ErrorStyle) -> Any:
    """The JSON value of a request body (``_NO_BODY`` when empty); refusals raise :class:`_Refused`."""
    if not raw:
        return _NO_BODY
    too_deep = f"JSON nested deeper than the limit of {MAX_JSON_DEPTH} levels"
    try:
        value = parse_json(raw)
    except json.JSONDecodeError as e:
        error = {"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                 "input": {}, "ctx": {"error": e.msg}}  # fmt: skip
        raise _Refused(style.invalid([error], e.doc)) from None
    except RecursionError:
        raise _Refused(style.error(400, too_deep, "body")) from None
    except ValueError:  # not UTF-8/16/32 text at all
        raise _Refused(style.error(400, "There was an error parsing the body")) from None
    if _too_deep(value, raw):
        raise _Refused(style.error(400, too_deep, "body"))
    if _has_lone_surrogate(value, raw):
        detail = "body holds a lone UTF-16 surrogate escape (e.g. \\ud800), which is not valid Unicode text"
        raise _Refused(style.error(400, detail, "body"))
    return value


class BodyTooLarge(Exception):
    """The request body passed the limit given to :func:`read_body`."""


def read_body(
    receive: Any,
    limit: int | None = None,
    claim: BodyClaim | None = None,
    deadlines: TaskDeadlines | None = None,
) -> Awaitable[bytes | None]:
    """The whole request body, to await; None when the client went away (:class:`BodyTooLarge` past
    ``limit`` bytes, ``TimeoutError`` when it is not all there ``deadlines.seconds`` after this call,
    :class:`BodiesBusy` when ``claim`` cannot take it from its budget). ``deadlines``: the loop's, whose
    one timer serves every request's body deadline; None, no deadline."""
    reading = _read_chunks(receive, limit, claim or BodyClaim(None))
    return reading if deadlines is None else deadlines.within(reading)


async def _read_chunks(receive: Any, limit: int | None, claim: BodyClaim) -> bytes | None:
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
            claim.take(len(chunk))
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# --------------------------------------------------------------------------- the app

_JSON_CONTENT_TYPE = (b"content-type", b"application/json")
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]

ContextHook = Callable[[list[bytes]], tuple[Any, list[tuple[bytes, bytes]]]]
"""``cookies -> (context, extra response headers)``: e.g. find or start the caller's session."""


class JsonApp:
    """The ASGI app serving a route table; see the module docstring for what it does per request.

    ``not_found(method, path)`` answers a request no route matches (default: 404 ``Not Found``, or
    405 when the path exists under another method). ``startup``/``shutdown`` run on the ASGI lifespan.
    ``allowed_hosts``: the names the server answers to besides IP addresses and ``localhost``
    (:mod:`gym_bridge.serving.request_guard`).
    ``mounts``: ASGI apps that serve a path and everything under it themselves (a resources server's
    ``/mcp``), after the bearer-token check. A handler's answer that sets a cookie itself replaces the
    cookie the context hook set (a caller-assigned session found by its id, not by the cookie).
    """

    def __init__(
        self,
        routes: list[Route],
        *,
        title: str,
        errors: ErrorStyle | None = None,
        max_body_bytes: int = 16 * 1024 * 1024,
        max_held_body_bytes: int | None = 256 * 1024 * 1024,
        auth_token: str | None = None,
        body_timeout_s: float | None = 60.0,
        context: ContextHook | None = None,
        not_found: Callable[[str, str], Answer | None] | None = None,
        startup: Callable[[], Awaitable[None]] | None = None,
        shutdown: Callable[[], Awaitable[None]] | None = None,
        mounts: dict[str, Callable[[Any, Any, Any], Awaitable[None]]] | None = None,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self.routes = {(r.method, r.path): r for r in routes}
        self.guard = RequestGuard(allowed_hosts)
        self.mounts = dict(mounts or {})
        self.paths = {r.path for r in routes}
        self.title = title
        self.errors = errors or ErrorStyle()
        self.max_bytes = max_body_bytes
        self.bodies = BodyBudget(max_held_body_bytes) if max_held_body_bytes is not None else None
        self.expected_auth = f"Bearer {auth_token}".encode() if auth_token else None
        self.body_timeout_s = body_timeout_s
        self.context = context
        self.not_found = not_found
        self.startup, self.shutdown = startup, shutdown
        self._openapi: bytes | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        claim = BodyClaim(self.bodies)
        try:
            answer, extra = await self._answer(scope, receive, send, claim)
            if answer is not None:
                await _send_answer(send, answer, extra)
        finally:
            claim.release()

    async def _answer(
        self, scope: dict[str, Any], receive: Any, send: Any, claim: BodyClaim
    ) -> tuple[Answer | None, list[tuple[bytes, bytes]]]:
        refused = self.guard.refusal(scope)  # a foreign Host name (421), a body that is not JSON (415)
        if refused is not None:
            return self.errors.error(*refused), []
        auth, cookies, declared = b"", [], None
        for key, value in scope["headers"]:
            if key == b"cookie":
                cookies.append(value)
            elif key == b"content-length":
                declared = value
            elif key == b"authorization":
                auth = value
        method, path = scope["method"], scope["path"]
        if len(path) > 1 and path.endswith("/"):
            path = path.rstrip("/") or "/"
        route = self.routes.get((method, path)) or (
            self.routes.get(("GET", path)) if method == "HEAD" else None
        )
        limit = (route.max_body_bytes if route is not None else None) or self.max_bytes
        size = None
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                size = 0
        if size is not None and size > limit:
            return self._too_big(limit), []
        guarded = route is None or not route.open
        if guarded and self.expected_auth is not None and not hmac.compare_digest(auth, self.expected_auth):
            return self.errors.error(401, "missing or wrong bearer token"), []
        if route is None:
            if method == "GET" and path in ("/openapi.json", "/docs"):
                return self._docs(path), []
            mount = self._mount(path) if self.mounts else None
            if mount is not None:
                await mount(scope, receive, send)
                return None, []
            return self._unmatched(method, path), []
        context, extra = (None, [])
        if not route.open and route.with_context and self.context is not None:
            context, extra = self.context(cookies)
        value: Any = _NO_BODY
        if method in ("POST", "PUT", "PATCH"):
            try:
                if size is not None and not claim.reserve_now(size):
                    await claim.reserve(size, self.body_timeout_s)
                extensions = scope.get("extensions")
                raw = extensions.get(BODY_IN_HAND) if extensions else None
                if raw is not None:  # the whole body is here already (an in-process caller's)
                    if len(raw) > limit:
                        raise BodyTooLarge
                    if raw:
                        claim.take(len(raw))
                else:
                    deadlines = task_deadlines(self.body_timeout_s) if self.body_timeout_s is not None else None
                    raw = await read_body(receive, limit, claim, deadlines)
            except BodyTooLarge:
                return self._too_big(limit), []
            except BodiesBusy:
                return self._busy(), []
            except TimeoutError:  # the body deadline
                detail = f"request body not received within {self.body_timeout_s:g} s"
                return self.errors.error(408, detail, "body", ((b"connection", b"close"),)), []
            if raw is None:  # the client went away
                return None, []
            try:
                value = parse_body(raw, self.errors)
            except _Refused as refused:
                return refused.answer, extra
        answer = await self._call(route, path, value, context, send, extra)
        return answer, extra

    async def _call(
        self, route: Route, path: str, value: Any, context: Any, send: Any, extra: list[tuple[bytes, bytes]]
    ) -> Answer | None:
        if route.adapter is None:
            args = None
        elif value is _NO_BODY:
            if route.default is None:
                missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
                return self.errors.invalid([missing])
            args = route.default()
        else:
            try:
                args = route.adapter.validate_python(value, from_attributes=True)
            except ValidationError as exc:
                errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors(include_url=False)]
                return self.errors.invalid(errors, value)
            except RecursionError as exc:
                return self.errors.failed(path, exc)
        try:
            result = await route.call(args, context)
            if isinstance(result, EventStream):
                await self._stream(result, send, extra)
                return None
            if isinstance(result, Answer):
                if extra and any(k == b"set-cookie" for k, _ in result.headers):
                    extra[:] = [h for h in extra if h[0] != b"set-cookie"]
                return result
            if route.raw_json:
                answer = json_answer(200, result)
                return Answer(200, answer.body, (), result) if route.fresh_json else answer
            # As FastAPI serializes the value of a route annotated ``-> Any``: pydantic's JSON.
            return Answer(200, _ANY.dump_json(_ANY.validate_python(result, from_attributes=True), by_alias=True))
        except ValueError as exc:
            where = _non_finite(value) if "JSON compliant" in str(exc) else None
            if where is not None:  # the answer echoes a NaN/Infinity the request brought: the request's fault
                error = {"type": "finite_number", "loc": ("body", *where), "msg": "Input should be a finite number"}
                return self.errors.invalid([error], value)
            return self.errors.failed(path, exc)
        except Exception as exc:
            return self.errors.failed(path, exc)

    async def _stream(self, stream: EventStream, send: Any, extra: list[tuple[bytes, bytes]]) -> None:
        """Server-sent events; an error once streaming started ends the stream with an ``error`` event."""
        await send({"type": "http.response.start", "status": 200, "headers": [*_SSE_HEADERS, *extra]})
        try:
            async for event in stream.events:
                data = compact_json(event)
                head = f"event: {event.get('type')}\n" if stream.named else ""
                await send({"type": "http.response.body", "body": f"{head}data: {data}\n\n".encode(), "more_body": True})
        except Exception as exc:
            logger.exception("error while streaming")
            error = {"type": "error", "error": {"message": f"{type(exc).__name__}: {exc}"[:2000], "type": "server_error"}}
            head = "event: error\n" if stream.named else ""
            await send({"type": "http.response.body", "body": f"{head}data: {json.dumps(error)}\n\n".encode(), "more_body": True})
        tail = b"data: [DONE]\n\n" if stream.done else b""
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    def _mount(self, path: str) -> Callable[[Any, Any, Any], Awaitable[None]] | None:
        for prefix, app in self.mounts.items():
            if path == prefix or path.startswith(prefix + "/"):
                return app
        return None

    def _unmatched(self, method: str, path: str) -> Answer:
        if path in self.paths:
            allowed = ", ".join(sorted(m for m, p in self.routes if p == path))
            return self.errors.error(405, "Method Not Allowed", headers=((b"allow", allowed.encode()),))
        answer = self.not_found(method, path) if self.not_found is not None else None
        return answer if answer is not None else self.errors.error(404, "Not Found")

    def _busy(self) -> Answer:
        assert self.bodies is not None
        detail = (f"the server holds the most request bodies it may at once ({self.bodies.limit} bytes) "
                  "and this one did not fit in time; retry shortly")  # fmt: skip
        return self.errors.error(503, detail, "body", ((b"retry-after", b"1"), (b"connection", b"close")))

    def _too_big(self, limit: int) -> Answer:
        return self.errors.error(413, f"request body larger than the limit of {limit} bytes", "body")

    def _docs(self, path: str) -> Answer:
        if path == "/openapi.json":
            if self._openapi is None:
                self._openapi = json.dumps(openapi_schema(self.title, list(self.routes.values()))).encode()
            return Answer(200, self._openapi)
        from fastapi.openapi.docs import get_swagger_ui_html

        html = get_swagger_ui_html(openapi_url="/openapi.json", title=self.title).body
        return Answer(200, bytes(html), ((b"content-type", b"text/html; charset=utf-8"),))

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if self.startup is not None:
                        await self.startup()
                except Exception as exc:
                    logger.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": f"{type(exc).__name__}: {exc}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.shutdown is not None:
                    await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _send_answer(send: Any, answer: Answer, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """An answer with its content length and type (JSON unless its own headers say otherwise), then ``extra``."""
    headers = [(b"content-length", str(len(answer.body)).encode())]
    if not answer.headers or not any(k == b"content-type" for k, _ in answer.headers):
        headers.append(_JSON_CONTENT_TYPE)
    headers += answer.headers
    if extra:
        headers += extra
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    if answer.value is None:
        await send({"type": "http.response.body", "body": answer.body})
    else:  # a key servers ignore; an in-process client takes it as the parsed body (Route.fresh_json)
        await send({"type": "http.response.body", "body": answer.body, PARSED_BODY: answer.value})


def openapi_schema(title: str, routes: list[Route]) -> dict[str, Any]:
    """The OpenAPI document of a route table, written by FastAPI's generator (documentation only)."""
    from fastapi import Body
    from fastapi.openapi.utils import get_openapi
    from fastapi.routing import APIRoute

    api_routes = []
    for route in routes:
        if route.method == "HEAD":
            continue

        async def endpoint(**_: Any) -> Any:  # documentation only: JsonApp serves the route
            raise NotImplementedError

        params = []
        if route.body is not None:
            default = Body(default_factory=route.default) if route.default is not None else Body(...)
            params.append(inspect.Parameter("body", inspect.Parameter.KEYWORD_ONLY, default=default, annotation=route.body))
        endpoint.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        name = route.path.strip("/").replace("/", "_") or "root"
        api_routes.append(
            APIRoute(route.path, endpoint, methods=[route.method], name=name, summary=route.summary, response_model=None)
        )
    return get_openapi(title=title, version="0.1.0", routes=api_routes)
