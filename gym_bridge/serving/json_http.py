"""JSON over HTTP: a route table served by one small ASGI app, documented through FastAPI's OpenAPI.

Every server of the project (the resources servers and the policy server) is a table of :class:`Route`
values served by :class:`JsonApp`, the only request path: per request it checks the ``Host`` name (421)
and that a body comes as ``application/json`` (415; both :mod:`gym_bridge.serving.request_guard`: what a web page
could send), the body's size (413) and the bodies held at once (waits for room, else 503:
:mod:`gym_bridge.serving.body_budget`), the bearer token (401), finds the caller's context (a resources server's
session), reads the body as JSON, refuses a lone UTF-16 surrogate, JSON nested deeper than
:data:`~gym_bridge.serving.json_body.MAX_JSON_DEPTH` and more arrays and objects than its size allows (400; all
:mod:`gym_bridge.serving.json_body`), validates
it against the route's type (422 naming the fields), calls the handler and renders its answer (JSON, or
server-sent events for a :class:`EventStream`). What goes wrong in a handler is answered by the app's
:class:`~gym_bridge.serving.answers.ErrorStyle`.

FastAPI is not in the request path: it generates ``/openapi.json`` (and ``/docs``) from the same table.
Why: FastAPI's request path (a dozen middleware layers, a ``Request``, dependency solving) cost about
three quarters of a small request's CPU; measured A/B in ``bench/README.md`` (collect and policy server).
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from gym_bridge.records.jsonl import compact_json
from gym_bridge.serving.answers import Answer, ErrorStyle, json_answer
from gym_bridge.serving.body_budget import BodiesBusy, BodyBudget, BodyClaim
from gym_bridge.serving.deadlines import task_deadlines
from gym_bridge.serving.json_body import NO_BODY, BodyRefused, BodyTooLarge, non_finite, parse_body, read_body
from gym_bridge.serving.request_guard import RequestGuard

__all__ = ["BODY_BYTES", "BODY_IN_HAND", "PARSED_BODY", "THREAD_BODY_BYTES", "ContextHook", "EventStream", "JsonApp", "Route", "off_loop", "openapi_schema", "replaying_receive"]

logger = logging.getLogger(__name__)

BODY_IN_HAND = "gym_bridge.body"
"""Key of a request scope's ``extensions`` that holds the whole body, from a caller on the same loop
(:class:`~gym_bridge.serving.in_process.InProcessClient`): read from there, with the same limits, instead of
awaiting ``receive()`` under the body deadline."""
PARSED_BODY = "gym_bridge.parsed_body"
"""Key of an ``http.response.body`` message that carries the value its ``body`` parses to (:attr:`Route.fresh_json`)."""
BODY_BYTES: ContextVar[int] = ContextVar("gym_bridge_body_bytes", default=0)
"""Size in bytes of the body of the request being handled: its validation and its answer's conversion run in a
worker thread when it is large (:func:`off_loop`), so the event loop answers other requests meanwhile."""
THREAD_BODY_BYTES = 256 * 1024
"""Bodies at least this large are validated, and their answers converted, in a worker thread (~20 ms of
validation and more; the hop costs ~50 us, so small bodies stay on the event loop)."""


async def off_loop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``: in a worker thread when the request's body is :data:`THREAD_BODY_BYTES` or more,
    else here. Why: validating or dumping a 16 MB body on the event loop held every other session's requests
    for seconds (every route: ``/verify``, ``/seed_session``, the tools, ``/aggregate_metrics``, ``/mcp``)."""
    if BODY_BYTES.get() >= THREAD_BODY_BYTES:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)


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
    ``/mcp``), after the bearer-token check, with a body read and checked as a route's is. A handler's answer
    that sets a cookie itself replaces the cookie the context hook set (a caller-assigned session found by
    its id, not by the cookie).
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
        owner: Any = None,
    ) -> None:
        self.routes = {(r.method, r.path): r for r in routes}
        self.owner = owner
        """The object serving these routes (a resources server), for a caller that mounts the app in its own
        process and may ask the object directly (collect's end-of-run aggregate over its own spool)."""
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
        mount = None
        if route is None:
            if method == "GET" and path in ("/openapi.json", "/docs"):
                return self._docs(path), []
            mount = self._mount(path) if self.mounts else None
            if mount is None:
                return self._unmatched(method, path), []
        context, extra = (None, [])
        if route is not None and not route.open and route.with_context and self.context is not None:
            context, extra = self.context(cookies)
        value: Any = NO_BODY
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
            BODY_BYTES.set(len(raw))
            try:
                value = await off_loop(parse_body, raw, self.errors)
            except BodyRefused as refused:
                return refused.answer, extra
            if mount is not None:  # its body read and checked as a route's (deadline, bounds, JSON rules)
                receive = replaying_receive(raw, receive)
        if mount is not None:
            await mount(scope, receive, send)
            return None, []
        assert route is not None
        answer = await self._call(route, path, value, context, send, extra)
        return answer, extra

    async def _call(
        self, route: Route, path: str, value: Any, context: Any, send: Any, extra: list[tuple[bytes, bytes]]
    ) -> Answer | None:
        if route.adapter is None:
            args = None
        elif value is NO_BODY:
            if route.default is None:
                missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
                return self.errors.invalid([missing])
            args = route.default()
        else:
            try:
                args = await off_loop(route.adapter.validate_python, value, from_attributes=True)
            except ValidationError as exc:  # its answer too: 500,000 stray keys are 500,000 errors
                return await off_loop(self._invalid, exc, value)
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
                answer = await off_loop(json_answer, 200, result)
                return Answer(200, answer.body, (), result) if route.fresh_json else answer
            # As FastAPI serializes the value of a route annotated ``-> Any``: pydantic's JSON.
            return Answer(200, await off_loop(_pydantic_json, result))
        except ValueError as exc:
            where = non_finite(value) if "JSON compliant" in str(exc) else None
            if where is not None:  # the answer echoes a NaN/Infinity the request brought: the request's fault
                error = {"type": "finite_number", "loc": ("body", *where), "msg": "Input should be a finite number"}
                return self.errors.invalid([error], value)
            return await off_loop(self.errors.failed, path, exc)  # a ValidationError: maybe many errors
        except Exception as exc:
            return await off_loop(self.errors.failed, path, exc)  # a 422 of a large body lists many errors

    def _invalid(self, exc: ValidationError, value: Any) -> Answer:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors(include_url=False)]
        return self.errors.invalid(errors, value)

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


def _pydantic_json(value: Any) -> bytes:
    return _ANY.dump_json(_ANY.validate_python(value, from_attributes=True), by_alias=True)


def replaying_receive(raw: bytes, receive: Any) -> Callable[[], Awaitable[dict[str, Any]]]:
    """A ``receive`` that gives a mount the body already read (``raw``), then what the client sends next
    (its disconnect)."""
    pending = [{"type": "http.request", "body": raw, "more_body": False}]

    async def replay() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    return replay


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
