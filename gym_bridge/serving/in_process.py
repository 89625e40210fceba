"""Servers a run starts itself, called without a socket: same apps, same bytes, no HTTP.

Training (:class:`~gym_bridge.train.samplers.sampling.OnlineSampler`: the policy server and the built-in
resources servers) and ``collect`` (the envs it starts itself, ``--env math`` or ``--env module:Class``)
run the agent loop against servers of their own. Over loopback HTTP each rollout's requests
(``/seed_session``, ``/responses``, tool calls, ``/verify``) cost more CPU in aiohttp, uvicorn and the
sockets than the apps' own work, and the event loops (client, servers) passed the interpreter lock
between them hundreds of times a step. Here the apps run on the agent loop's own event loop and each
request is one ASGI call: the request body, headers (cookies, bearer token, content length) and the
answer's status, headers and body are exactly what HTTP would carry, through the same
:class:`~gym_bridge.serving.json_http.JsonApp` code (validation, limits, sessions). Servers given by URL still
go over HTTP: :class:`~gym_bridge.serving.retry.RoutedClient` sends each URL to the client that serves it.

:class:`InProcessClient` has the shape :func:`gym_bridge.serving.retry.post_json` expects of an
``httpx.AsyncClient`` (``await post(url, content=, headers=)`` answering ``status_code``, ``headers``,
``content``), so the agent loop and its retry policy run unchanged.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
from multidict import CIMultiDict

from gym_bridge.serving.json_http import BODY_IN_HAND, PARSED_BODY

__all__ = ["InProcessClient", "InProcessResponse"]

_MAX_TARGETS = 4096
"""URLs whose parts :class:`InProcessClient` keeps (as the retry policy keeps its parsed URLs)."""


@dataclass
class InProcessResponse:
    """An app's answer, as an ``httpx.Response`` exposes it to :func:`~gym_bridge.serving.retry.post_json`."""

    status_code: int
    headers: CIMultiDict[str]
    """Case-insensitive, repeatable (``set-cookie``): what aiohttp answers with (cheaper than httpx's)."""
    content: bytes
    parsed: Any = None
    """What ``content`` parses to, when the app handed it over (:attr:`~gym_bridge.serving.json_http.Route.fresh_json`:
    a value made for this answer alone); None: parse ``content``."""


class _Lifespan:
    """An app's ASGI lifespan run on the current event loop: start-up now, shut-down on :meth:`stop`.

    A cancellation of the lifespan task while the app waits for its next message (Ctrl-C in
    :func:`~gym_bridge.serving.event_loop.run_interruptible` cancels every task of the loop) is handed to the
    app as ``lifespan.shutdown``, as a server told to stop does: its shut-down still runs (the math
    server's verifier processes are stopped). A second cancellation is not caught.
    """

    def __init__(self, app: Any) -> None:
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._shut = False  # the app was told to shut down
        self._task = asyncio.ensure_future(
            app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, self._receive, self._outbox.put)
        )

    async def _receive(self) -> dict[str, Any]:
        try:
            message = await self._inbox.get()
        except asyncio.CancelledError:
            if self._shut:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # taken as the shut-down it asks for; the task may still be cancelled again
            message = {"type": "lifespan.shutdown"}
        self._shut = self._shut or message["type"] == "lifespan.shutdown"
        return message

    async def _phase(self, name: str) -> None:
        await self._inbox.put({"type": f"lifespan.{name}"})
        get = asyncio.ensure_future(self._outbox.get())
        await asyncio.wait({get, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not get.done():
            get.cancel()
            self._task.result()  # the app's own error, if it raised
            raise RuntimeError(f"the app ended its lifespan during {name}")
        message = get.result()
        if message["type"] != f"lifespan.{name}.complete":
            raise RuntimeError(f"{name} failed: {message.get('message', '')}")

    async def start(self) -> None:
        await self._phase("startup")

    async def stop(self) -> None:
        if not self._task.done() and not self._shut:
            await self._phase("shutdown")
        await self._task


class _Exchange:
    """One request's ASGI ``receive`` and ``send``, and the answer they collect."""

    __slots__ = ("body", "content", "delivered", "done", "headers", "parsed", "started", "status", "waiter")

    def __init__(self, content: bytes) -> None:
        self.content, self.delivered, self.done = content, False, False
        self.status, self.headers, self.body, self.started, self.parsed = 500, [], bytearray(), False, None
        self.waiter: asyncio.Future[None] | None = None
        """Made only when the app asks for a message past the body (few do)."""

    async def receive(self) -> dict[str, Any]:
        if not self.delivered:
            self.delivered = True
            return {"type": "http.request", "body": self.content, "more_body": False}
        if not self.done:  # as a server does: the client is gone only once the answer is sent
            if self.waiter is None:
                self.waiter = asyncio.get_running_loop().create_future()
            await asyncio.shield(self.waiter)
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.status = message["status"]
            self.headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])]
        elif message["type"] == "http.response.body":
            chunk = message.get("body", b"")
            self.body.extend(chunk)
            if not message.get("more_body", False):
                if len(self.body) == len(chunk):  # the answer came whole, in this message
                    self.parsed = message.get(PARSED_BODY)
                self.finish()

    def finish(self) -> None:
        """The answer is complete (or the app returned): a receive() waiting for the client to go returns."""
        self.done = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class InProcessClient:
    """Serves ASGI apps under made-up origins on the current event loop and posts to them directly.

    :meth:`mount` runs an app's start-up on the calling loop; every later call must come from that loop.
    A URL of an origin that was not mounted is refused with ``httpx.ConnectError`` (a connection error
    to the retry policy), so a misrouted request fails as loudly as over HTTP.
    """

    def __init__(self) -> None:
        self._apps: dict[tuple[str, int], Any] = {}
        self.urls: list[str] = []
        """The base URLs of the mounted apps (what a :class:`~gym_bridge.serving.retry.RoutedClient` sends here)."""
        self._lifespans: list[_Lifespan] = []
        self._targets: dict[Any, tuple[Any, bytes, str, bytes, bytes, tuple[str, int]]] = {}
        """URL -> (app, host, path, raw path, query, server): a run posts to a few URLs many times."""

    async def mount(self, name: str, app: Any) -> str:
        """Start ``app`` and return its base URL (``http://<name>.in-process``)."""
        url = httpx.URL(f"http://{name}.in-process")
        lifespan = _Lifespan(app)
        await lifespan.start()
        self._lifespans.append(lifespan)
        self._apps[(url.host, 80)] = app
        base = str(url).rstrip("/")
        self.urls.append(base)
        return base

    async def post(self, url: httpx.URL | str, *, content: bytes, headers: dict[str, str]) -> InProcessResponse:
        """POST ``content`` to the mounted app that ``url`` names, as one ASGI request."""
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) >= _MAX_TARGETS:  # tool names a model made up: each is a URL of its own
                self._targets.clear()
            target = self._targets[url] = self._target(url)
        app, host, path, raw_path, query, server = target
        raw_headers = [(b"host", host), (b"content-length", str(len(content)).encode())]
        raw_headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": raw_headers,
            "client": ("127.0.0.1", 0),
            "server": server,
            # The whole body, which a JsonApp takes from here (no receive() and no body deadline to set up);
            # other apps read it from receive() as usual.
            "extensions": {BODY_IN_HAND: content},
        }
        exchange = _Exchange(content)
        try:
            await app(scope, exchange.receive, exchange.send)
        except Exception as exc:
            if exchange.started:  # the answer was under way: over HTTP, a connection cut mid-answer
                raise httpx.RemoteProtocolError(f"the app failed mid-answer: {exc!r}") from exc
            # What uvicorn answers for an app that raised before answering.
            return InProcessResponse(500, CIMultiDict({"content-type": "text/plain; charset=utf-8"}),
                                     b"Internal Server Error")  # fmt: skip
        finally:
            exchange.finish()
        if not exchange.started:
            raise httpx.RemoteProtocolError("the app ended without an answer")
        return InProcessResponse(exchange.status, CIMultiDict(exchange.headers), bytes(exchange.body), exchange.parsed)

    def _target(self, url: httpx.URL | str) -> tuple[Any, bytes, str, bytes, bytes, tuple[str, int]]:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
        port = parsed.port or 80
        app = self._apps.get((parsed.host, port))
        if app is None:
            raise httpx.ConnectError(f"no in-process app serves {parsed.scheme}://{parsed.host}:{port}")
        raw_path = parsed.raw_path.split(b"?", 1)[0]
        return app, parsed.host.encode("ascii"), parsed.path, raw_path, parsed.query, (parsed.host, port)

    async def aclose(self) -> None:
        """Shut the mounted apps down (their lifespans' shut-down), last mounted first; one whose shut-down
        fails does not keep the others running (the first error is raised once all were asked)."""
        self._apps.clear()
        self._targets.clear()
        self.urls.clear()
        failed: BaseException | None = None
        while self._lifespans:
            try:
                await self._lifespans.pop().stop()
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
