"""The resources-server base: NeMo Gym's HTTP protocol in a class a new environment subclasses.

An environment defines ``verify`` and, if it has tools, methods marked with :func:`tool`::

    class Weather(ResourcesServer):
        name = "weather"

        @tool
        async def get_weather(self, args: GetWeatherArgs, session: Session) -> dict:
            return {"city": args.city, "weather_description": "cold"}

        async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
            ...

The base serves ``POST /seed_session``, ``POST /verify``, ``POST /aggregate_metrics``, one
``POST /<tool>`` per tool, ``GET /health`` and FastAPI's OpenAPI docs. State is per session, keyed by a
session cookie that the server sets on first contact and NeMo Gym's agent (and ours) sends back.
Bad input never crashes the server: it is answered with a 4xx whose ``detail`` names the problem.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import json
import logging
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, get_type_hints

from fastapi import Body, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from starlette.requests import cookie_parser

from gym_bridge.aggregate import AggregateRequestError, nemo_gym_aggregate, parse_aggregate_request
from gym_bridge.fast_routes import (
    Answer,
    BodyTooLarge,
    ErrorStyle,
    JsonRoute,
    answer_route,
    json_answer,
    read_body,
    send_answer,
)
from gym_bridge.schema import VerifyRequest, VerifyResponse, dump

SESSION_COOKIE = "gym_bridge_session"

logger = logging.getLogger(__name__)


class ServerSettings(BaseModel):
    """Network and safety settings shared by every resources server."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = 0
    auth_token: str | None = None
    """When set, every request but ``/health`` needs ``Authorization: Bearer <token>``."""
    max_body_bytes: int = 16 * 1024 * 1024
    session_ttl_s: float = 3600.0
    """Sessions untouched for this long are dropped."""
    max_sessions: int = 200_000
    """Oldest sessions are dropped beyond this many, so memory stays bounded."""


@dataclass
class Session:
    """Per-session state of one rollout; environments keep what they need in ``state``."""

    id: str
    state: dict[str, Any] = field(default_factory=dict)
    last_seen: float = field(default_factory=time.monotonic)


class SessionStore:
    """Sessions by id with idle expiry and a size cap (least recently used goes first)."""

    def __init__(self, ttl_s: float, max_sessions: int) -> None:
        self._ttl = ttl_s
        self._max = max_sessions
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def get_or_create(self, session_id: str) -> Session:
        now = time.monotonic()
        session = self._sessions.get(session_id)
        if session is not None and now - session.last_seen > self._ttl:
            del self._sessions[session_id]
            session = None
        if session is None:
            session = Session(id=session_id)
            self._sessions[session_id] = session
            self._evict(now)
        session.last_seen = now
        self._sessions.move_to_end(session_id)
        return session

    def _evict(self, now: float) -> None:
        while len(self._sessions) > self._max:
            self._sessions.popitem(last=False)
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if now - oldest.last_seen <= self._ttl:
                break
            self._sessions.popitem(last=False)


ToolFn = Callable[[Any, BaseModel, Session], Awaitable[Any]]


def tool(fn: ToolFn | None = None, *, name: str | None = None) -> Any:
    """Mark an async method ``(self, args: SomeModel, session: Session)`` as the tool ``POST /<name>``."""

    def mark(f: ToolFn) -> ToolFn:
        f.__gym_tool__ = name or f.__name__  # type: ignore[attr-defined]
        return f

    return mark(fn) if fn is not None else mark


def _format_validation_errors(errors: list[dict[str, Any]], body: Any = None) -> str:
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


def _json_error_message(err: dict[str, Any], body: Any) -> str:
    """``invalid JSON at line L column C (char N): <reason>`` for FastAPI's ``json_invalid`` error."""
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


class _JsonBodies:
    """ASGI middleware: read every request body as JSON, whatever its ``Content-Type``.

    Every endpoint of a resources server takes JSON. Without this, a body sent with no or another
    content type (``curl -d`` sends ``application/x-www-form-urlencoded``) reaches the route as raw
    bytes and fails with a cryptic "valid dictionary" error instead of being parsed, or, when it is not
    JSON, reported as "invalid JSON at line L column C".
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            headers = scope.get("headers", [])
            content_type = next((v for k, v in headers if k == b"content-type"), b"")
            if b"json" not in content_type.lower():
                headers = [(k, v) for k, v in headers if k != b"content-type"]
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
            body, more = b"", True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    break
                body += message.get("body", b"")
                more = message.get("more_body", False)
            if _has_lone_surrogate(body):
                detail = "body holds a lone UTF-16 surrogate escape (e.g. \\ud800), which is not valid Unicode text"
                await JSONResponse({"detail": detail}, status_code=400)(scope, receive, send)
                return
            await self.app(scope, _replay(body, receive), send)
            return
        await self.app(scope, receive, send)


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _has_lone_surrogate(body: bytes) -> bool:
    """True when a JSON body decodes to text with an unpaired surrogate (it could never be echoed as UTF-8).

    A cheap scan for surrogate escapes first; only bodies that have one (rare) are parsed to be sure.
    """
    if not _SURROGATE_ESCAPE.search(body):
        return False
    try:
        json.dumps(json.loads(body), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    except (ValueError, RecursionError):
        return False  # not JSON at all: the route reports that
    return False


class _CrashGuard:
    """ASGI middleware: a bug in an environment answers a JSON 500 naming it, and the connection lives on.

    (Starlette's catch-all handler re-raises after responding, and uvicorn then drops the keep-alive
    connection, which clients see as "connection reset" on their next request.)
    """

    def __init__(self, app: Any, render: Callable[[str], Any] | None = None) -> None:
        self.app = app
        self.render = render or (lambda detail: JSONResponse({"detail": detail}, status_code=500))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise
            logger.exception("error while serving %s", scope.get("path"))
            detail = f"internal error on {scope.get('path')}: {type(exc).__name__}: {exc}"
            await self.render(detail[:2000])(scope, receive, send)


class _ResourceErrors(ErrorStyle):
    """Invalid input as this app's ``RequestValidationError`` and pydantic ``ValidationError`` handlers say it."""

    def invalid(self, errors: list[dict[str, Any]], body: Any = None) -> Answer:
        return _validation_failed(errors, body)

    def failed(self, path: str, exc: Exception) -> Answer:
        if isinstance(exc, ValidationError):
            return _validation_failed(list(exc.errors()))
        return super().failed(path, exc)


def _validation_failed(errors: list[dict[str, Any]], body: Any = None) -> Answer:
    """The 422 for invalid input: ``detail`` names the fields, ``errors`` lists them."""
    content = {"detail": _format_validation_errors(errors, body), "errors": _jsonable_errors(errors)}
    return json_answer(422, content)


_DICT_BODY = TypeAdapter(dict[str, Any])
_ERRORS = _ResourceErrors()


class _Front:
    """The one ASGI layer in front of a resources server's FastAPI app.

    Per request, in this order: a body over the size limit is refused (413, by ``Content-Length`` or
    while reading); the bearer token is checked (401; ``/health`` is open and session-less); the
    session of the request's cookie is found or started (a new one sets the cookie); the body is read as
    JSON whatever its ``Content-Type`` (``curl -d`` sends a form type; a lone UTF-16 surrogate escape
    is a 400). Then the hot routes (``POST /seed_session``, ``/verify`` and each tool) are served here,
    and everything else goes to FastAPI, which documents those routes too and answers them identically
    (``tests/server/test_fast_routes.py`` compares the two on good and bad input).

    Why: FastAPI's request path cost three quarters of a small request's CPU, and a rollout makes at
    least two requests here (see :mod:`gym_bridge.fast_routes`).
    """

    def __init__(
        self, app: Any, server: ResourcesServer, settings: ServerSettings, routes: dict[str, JsonRoute]
    ) -> None:
        self.app = app
        self.server = server
        self.routes = routes
        self.max_bytes = settings.max_body_bytes
        self.expected_auth = f"Bearer {settings.auth_token}".encode() if settings.auth_token else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        auth, cookies, declared = b"", [], None
        for key, value in scope["headers"]:
            if key == b"cookie":
                cookies.append(value)
            elif key == b"content-length":
                declared = value
            elif key == b"authorization":
                auth = value
        if declared is not None and _over(declared, self.max_bytes):
            await send_answer(send, self._too_big())
            return
        path = scope["path"]
        if path == "/health":
            await self.app(scope, receive, send)
            return
        if self.expected_auth is not None and not hmac.compare_digest(auth, self.expected_auth):
            await send_answer(send, json_answer(401, {"detail": "missing or wrong bearer token"}))
            return
        session, set_cookie = self._session(cookies)
        scope.setdefault("state", {})["session"] = session
        extra = [(b"set-cookie", set_cookie)] if set_cookie else []
        method = scope["method"]
        if method not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, _adding_headers(send, extra))
            return
        try:
            body = await read_body(receive, self.max_bytes)
        except BodyTooLarge:
            await send_answer(send, self._too_big())
            return
        if body is None:  # the client went away
            return
        if _has_lone_surrogate(body):
            detail = "body holds a lone UTF-16 surrogate escape (e.g. \\ud800), which is not valid Unicode text"
            await send_answer(send, json_answer(400, {"detail": detail}), extra)
            return
        route = self.routes.get(path) if method == "POST" else None
        if route is not None:
            await send_answer(send, await answer_route(route, path, body, session, _ERRORS), extra)
            return
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, _replay(body, receive), _adding_headers(send, extra))

    def _session(self, cookies: list[bytes]) -> tuple[Session, bytes | None]:
        cookie_header = b"; ".join(cookies).decode("latin-1")
        session_id = cookie_parser(cookie_header).get(SESSION_COOKIE) if cookie_header else None
        if session_id and len(session_id) <= 128:
            return self.server.sessions.get_or_create(session_id), None
        session_id = secrets.token_urlsafe(16)
        set_cookie = f"{SESSION_COOKIE}={session_id}; HttpOnly; Path=/; SameSite=lax".encode("latin-1")
        return self.server.sessions.get_or_create(session_id), set_cookie

    def _too_big(self) -> Answer:
        return json_answer(413, {"detail": f"request body larger than the limit of {self.max_bytes} bytes"})


def _over(declared: bytes, limit: int) -> bool:
    try:
        return int(declared) > limit
    except ValueError:
        return False


def _adding_headers(send: Any, extra: list[tuple[bytes, bytes]]) -> Any:
    """``send`` that appends ``extra`` headers to the response start (``send`` itself when none)."""
    if not extra:
        return send

    async def send_with_headers(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return send_with_headers


def _replay(body: bytes, receive: Any) -> Any:
    """``receive`` that hands over an already-read body first, then defers to the real one."""
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class ResourcesServer:
    """Base class of every environment; see the module docstring for how to write one."""

    name: ClassVar[str] = "resources_server"
    verify_request_model: ClassVar[type[VerifyRequest]] = VerifyRequest
    """Subclasses may narrow this to require task fields (e.g. ``expected_answer``)."""

    def __init__(self, settings: ServerSettings | None = None) -> None:
        self.settings = settings or ServerSettings()
        self.sessions = SessionStore(self.settings.session_ttl_s, self.settings.max_sessions)
        self.tools: dict[str, ToolFn] = {}
        for attr in dir(type(self)):
            fn = getattr(type(self), attr, None)
            tool_name = getattr(fn, "__gym_tool__", None)
            if tool_name:
                self.tools[tool_name] = getattr(self, attr)

    # ------------------------------------------------------------------ what environments override

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        """Set up the session's initial state from the task row; the default keeps nothing."""
        return {}

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        raise NotImplementedError

    reverify_mode: str = "unknown"
    """NeMo Gym's ``ReverifyMode`` for ``GET /reverify_mode``: ``stateless`` when ``/verify`` needs only the
    stored record (re-scoring a file is sound), ``unsupported`` when it needs the rollout's session state."""

    def aggregate_metrics(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """The environment's own summary (mean reward, pass@k, ...), put into ``agent_metrics`` of the answer."""
        from gym_bridge.metrics import aggregate_rewards

        return aggregate_rewards(records)

    def health(self) -> dict[str, Any]:
        """The ``GET /health`` answer; environments may add the state of their resources."""
        return {"status": "ok", "server": self.name, "sessions": len(self.sessions)}

    async def startup(self) -> None:
        """Acquire resources (worker pools, sandboxes) when the server starts."""

    async def shutdown(self) -> None:
        """Release what :meth:`startup` acquired."""

    # ------------------------------------------------------------------ the HTTP app

    def _session(self, request: Request) -> Session:
        return request.state.session

    def build_app(self, fast_routes: bool = True) -> Any:
        """The ASGI app: FastAPI's routes behind :class:`_Front` (limits, auth, sessions, JSON bodies).

        ``fast_routes=False`` sends the hot routes through FastAPI too (the reference behaviour the
        fast path is tested against).
        """
        from contextlib import asynccontextmanager

        @asynccontextmanager
        async def lifespan(_: FastAPI):  # type: ignore[no-untyped-def]
            await self.startup()
            try:
                yield
            finally:
                await self.shutdown()

        app = FastAPI(title=f"gym-bridge resources server: {self.name}", lifespan=lifespan)
        settings = self.settings

        @app.exception_handler(RequestValidationError)
        async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
            errors = list(exc.errors())
            return JSONResponse(
                {"detail": _format_validation_errors(errors, exc.body), "errors": _jsonable_errors(errors)},
                status_code=422,
            )

        @app.exception_handler(ValidationError)
        async def _invalid_model(_: Request, exc: ValidationError) -> JSONResponse:
            errors = list(exc.errors())
            return JSONResponse(
                {"detail": _format_validation_errors(errors), "errors": _jsonable_errors(errors)},
                status_code=422,
            )

        app.add_middleware(_CrashGuard)

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return self.health()

        @app.post("/seed_session")
        async def seed_session(request: Request, body: dict[str, Any] = Body(default_factory=dict)) -> Any:
            return await self.seed_session(body, self._session(request))

        verify_model = self.verify_request_model

        async def verify(request: Request, body: VerifyRequest) -> Any:
            return JSONResponse(await self._verify_content(body, self._session(request)))

        # Annotations are strings under `from __future__ import annotations`; give FastAPI the real class.
        verify.__annotations__ = {"request": Request, "body": verify_model, "return": Any}

        app.post("/verify", response_model=None)(verify)

        @app.post("/aggregate_metrics")
        async def aggregate_metrics(body: Any = Body(...)) -> Any:
            try:
                records = parse_aggregate_request(body)
            except AggregateRequestError as e:
                raise HTTPException(422, str(e)) from None
            return await asyncio.to_thread(nemo_gym_aggregate, records, self.aggregate_metrics)

        @app.get("/reverify_mode")
        async def reverify_mode() -> str:
            return self.reverify_mode

        routes = {
            "/seed_session": JsonRoute(_DICT_BODY, self.seed_session, default=dict),
            "/verify": JsonRoute(TypeAdapter(verify_model), self._verify_content, raw_json=True),
        }
        for tool_name, fn in self.tools.items():
            args_model = self._add_tool_route(app, tool_name, fn)
            routes[f"/{tool_name}"] = JsonRoute(TypeAdapter(args_model), fn)

        @app.post("/{tool_name}")
        async def unknown_tool(tool_name: str) -> Any:
            known = ", ".join(sorted(self.tools)) or "none"
            raise HTTPException(404, f"unknown tool '{tool_name}' (this server's tools: {known})")

        return _Front(app, self, settings, routes if fast_routes else {})

    async def _verify_content(self, body: VerifyRequest, session: Session) -> dict[str, Any]:
        return dump(await self.verify(body, session))

    def _add_tool_route(self, app: FastAPI, tool_name: str, fn: ToolFn) -> type[BaseModel]:
        hints = get_type_hints(fn)
        params = [p for p in inspect.signature(fn).parameters if p not in ("session",)]
        args_model = hints.get(params[0]) if params else None
        if not (isinstance(args_model, type) and issubclass(args_model, BaseModel)):
            raise TypeError(f"tool {tool_name}: first parameter must be annotated with a pydantic model")

        async def endpoint(request: Request, args: BaseModel) -> Any:
            return await fn(args, self._session(request))

        endpoint.__annotations__ = {"request": Request, "args": args_model, "return": Any}

        endpoint.__name__ = f"tool_{tool_name}"
        app.post(f"/{tool_name}", summary=(fn.__doc__ or tool_name).strip().splitlines()[0])(endpoint)
        return args_model


def _jsonable_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg")), "type": e.get("type")} for e in errors]


# --------------------------------------------------------------------------- running


@dataclass
class RunningServer:
    """A uvicorn server running in a background thread; ``stop()`` ends it."""

    url: str
    _server: Any
    _thread: threading.Thread

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0) -> RunningServer:
    """Serve an ASGI app from a daemon thread on a (by default free) loopback port; return its URL."""
    import uvicorn

    # backlog: a burst of thousands of new connections (collect at high concurrency) must not overflow
    # the accept queue (dropped SYNs are retried after 1 s, 3 s, ...); the kernel caps it at somaxconn.
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="on", access_log=False, ws="none", backlog=4096
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"server on {host}:{port} failed to start")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"server on {host}:{port} did not start within {timeout} s")
        time.sleep(0.002)  # start-up is ~5 ms: a coarse poll would dominate it
    bound_port = server.servers[0].sockets[0].getsockname()[1]
    return RunningServer(url=f"http://{host}:{bound_port}", _server=server, _thread=thread)


def serve_forever(server: ResourcesServer) -> None:
    """Run a resources server in the foreground (``gym-bridge serve NAME``)."""
    import uvicorn

    uvicorn.run(server.build_app(), host=server.settings.host, port=server.settings.port or 8000, log_level="info")
