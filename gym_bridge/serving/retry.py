"""Bounded, jittered retries for the HTTP calls of a rollout, and the names of what still fails.

Why: a collection run makes hundreds of thousands of requests; a rate-limited or restarting model server
must slow the run down, not kill it, and must never turn into a retry storm. So every request gets

* a deadline per attempt (connect to last body byte: a server that drips bytes still times out),
* a cap on attempts *and* on the total time spent on the request, waits included,
* exponential backoff with full jitter, never shorter than a server's ``Retry-After``,
* retries only for what can heal: 408/425/429/5xx, connection errors, unreadable bodies, and timeouts
  unless ``retry_timeouts`` is off (the server may still be working on the request).
  Other 4xx fail at once (or are handed back to the caller, for tool calls the model should see).
* a request that must not run twice (``idempotent=False``: a tool call, which may change the env's state) is
  sent again only when it surely did not run: the connection was refused or closed before it was written,
  or the server answered 408/425/429/503. A timeout, a connection lost after sending, a 500/502/504 may
  follow a call the server ran: it fails at once, never applied twice.

What still fails is raised as :class:`RequestFailed` with a failure class such as ``model_timeout``.

The client is an ``aiohttp.ClientSession`` (what ``collect`` and training use: about a fifth of
httpx's CPU per request on loopback) or an ``httpx.AsyncClient``; both get the same policy. So do
servers called in-process (:class:`~gym_bridge.serving.in_process.InProcessClient`, httpx's shape), and a
:class:`RoutedClient` that sends each URL to the one of those that serves it.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar

import aiohttp
from yarl import URL

from gym_bridge.records.jsonl import compact_json, parse_json
from gym_bridge.serving.deadlines import within

if TYPE_CHECKING:
    import httpx  # imported when an httpx client is used (collect and training use aiohttp)

Target = Literal["model", "env"]
T = TypeVar("T")
Client: TypeAlias = "aiohttp.ClientSession | httpx.AsyncClient | RoutedClient"
"""What :func:`post_json` sends with (anything with ``httpx.AsyncClient.post``'s shape counts as httpx)."""

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
"""Statuses worth another try; other 5xx (501 Not Implemented, 505, ...) will not heal either."""
NOT_RUN_STATUS = frozenset({408, 425, 429, 503})
"""Retryable statuses that say the request was not run (not received whole, too early, rate limited,
unavailable): the only ones a request that must not run twice is sent again after. A 500, 502 or 504 may come
after the server (or the server behind a gateway) ran it."""

FAILURE_CLASSES = tuple(
    f"{target}_{kind}"
    for target in ("model", "env")
    for kind in ("http_error", "timeout", "connection_error", "bad_response")
)
"""Every class :class:`RequestFailed` can carry: ``{model,env}_{http_error,timeout,connection_error,bad_response}``."""


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try one request."""

    max_attempts: int = 4
    """Attempts in all (1 = never retry)."""
    request_timeout: float = 300.0
    """Seconds for one attempt, from connecting to the last byte of the body."""
    total_timeout: float | None = None
    """Seconds for the request, attempts and waits included; default: 2 x request_timeout + 60."""
    backoff_base: float = 0.5
    """Upper bound of the first wait; it doubles with each retry (full jitter: uniform in [0, bound])."""
    backoff_max: float = 30.0
    """Largest jittered wait (a longer ``Retry-After`` is still honoured if the total budget allows)."""
    retry_timeouts: bool = True
    """Send a request again after an attempt timed out. Off where the server may still be working on the
    first copy (a slow local model): a second copy only adds to its load. Connection errors, 429 and the
    retryable 5xx are retried either way."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.request_timeout <= 0:
            raise ValueError("request_timeout must be positive")

    @property
    def budget(self) -> float:
        if self.total_timeout is not None:
            return self.total_timeout
        return 2 * self.request_timeout + 60.0

    def backoff(self, retry: int, rng: random.Random | None = None) -> float:
        """Full-jitter wait before retry number ``retry`` (1-based)."""
        bound = min(self.backoff_max, self.backoff_base * 2 ** (retry - 1))
        return (rng or random).uniform(0.0, bound)


class RequestFailed(Exception):
    """A request that did not succeed within its policy; ``failure_class`` says how it failed."""

    def __init__(
        self, failure_class: str, message: str, attempts: int, status: int | None = None, timeouts: int = 0
    ) -> None:
        self.failure_class = failure_class
        self.message = message
        self.attempts = attempts
        self.status = status
        self.timeouts = timeouts
        """Attempts that ran out of ``request_timeout`` (each one was sent again, if any attempt followed)."""
        super().__init__(f"{failure_class}: {message}")


@dataclass
class HttpResult:
    """A finished request: status, headers, raw body, parsed JSON (when asked for) and attempts used."""

    status: int
    headers: Any
    """The answer's headers: case-insensitive; ``aiohttp``'s multidict or ``httpx.Headers``."""
    content: bytes
    data: Any
    attempts: int
    timeouts: int = 0
    """Attempts before the answer that ran out of ``request_timeout`` and were sent again: a retry that
    is counted, never silent (a server that sometimes never answers shows here before it fails a run)."""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def header_values(self, name: str) -> list[str]:
        """Every value of a header that may repeat (``set-cookie``), whichever client got the answer."""
        getall = getattr(self.headers, "getall", None)
        return list(getall(name, ())) if getall is not None else self.headers.get_list(name)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date); None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _within(seconds: float, awaitable: Awaitable[T]) -> Awaitable[T]:
    """``awaitable`` with a deadline for the whole of it (httpx's own timeouts restart with every byte);
    requests of one length share the loop's one timer (:func:`~gym_bridge.serving.deadlines.within`)."""
    return within(seconds, awaitable)


def _snippet(content: bytes, limit: int = 300) -> str:
    text = content.decode("utf-8", errors="replace").strip()
    return text if len(text) <= limit else text[:limit] + "..."


@functools.lru_cache(maxsize=4096)
def _parsed(url: str) -> httpx.URL:
    """URLs repeat (a few endpoints, many requests): parse each once (~6% of a request's CPU)."""
    import httpx

    return httpx.URL(url)


@functools.lru_cache(maxsize=4096)
def _parsed_yarl(url: str) -> URL:
    return URL(url)


async def _send(
    client: Client, url: str, payload: bytes, headers: dict[str, str]
) -> tuple[int, Any, bytes, Any]:
    """One POST: ``(status, headers, body, parsed)``, ``parsed`` the body's JSON value when the client was
    handed it (:class:`~gym_bridge.serving.in_process.InProcessResponse`), else None; transport trouble raises
    ``TimeoutError`` or :class:`SendFailed`."""
    if isinstance(client, RoutedClient):
        client = client.client_for(url)
    if isinstance(client, aiohttp.ClientSession):
        try:
            async with client.post(_parsed_yarl(url), data=payload, headers=headers) as response:
                return response.status, response.headers, await response.read(), None
        except aiohttp.ServerTimeoutError as e:  # only when the session itself sets timeouts
            raise _TimedOut(type(e).__name__) from e
        except aiohttp.ClientConnectorError as e:  # no connection made: the server never saw the request
            raise NotConnected(e) from e
        except aiohttp.ClientOSError as e:
            if _NOT_SENT in str(e):
                raise NotSent(e) from e
            raise SendFailed(e) from e
        except aiohttp.ClientError as e:  # connection refused or reset, a body cut short, a bad URL
            raise SendFailed(e) from e
    import httpx

    # httpx parses a str URL on every request (cached here); an in-process client keys its apps by the str.
    target = _parsed(url) if isinstance(client, httpx.AsyncClient) else url
    try:
        response = await client.post(target, content=payload, headers=headers)
    except httpx.TimeoutException as e:
        raise _TimedOut(type(e).__name__) from e
    except httpx.ConnectError as e:
        raise NotConnected(e) from e
    except httpx.TransportError as e:
        raise SendFailed(e) from e
    return response.status_code, response.headers, response.content, getattr(response, "parsed", None)


class RoutedClient:
    """A client per base URL, and ``default`` for every other URL.

    Why: ``collect`` calls the envs it starts itself in-process
    (:class:`~gym_bridge.serving.in_process.InProcessClient`) and the model and the envs given by URL over HTTP,
    all from one rollout. Each client keeps its own shape, so its answers and errors, and the messages
    made of them, are what they are without the router.
    """

    def __init__(self, default: Client, routes: Mapping[str, Client]) -> None:
        self.default = default
        self.routes = [(base.rstrip("/") + "/", client) for base, client in routes.items()]
        """``(base URL + "/", client)``: a URL under the base goes to the client."""

    def client_for(self, url: str) -> Client:
        """The client that serves ``url``."""
        for prefix, client in self.routes:
            if url.startswith(prefix):
                return client
        return self.default


async def post_once(
    client: Client, url: str, payload: bytes, headers: dict[str, str], timeout: float
) -> tuple[int, Any, bytes]:
    """One POST of ``payload`` within ``timeout`` seconds, no retry: ``(status, headers, body)``.

    For a caller with a policy of its own (the end of run's ``/aggregate_metrics``). Raises
    ``TimeoutError``, or :class:`SendFailed` for transport trouble (its ``cause``: the client's own error).
    """
    return (await _within(timeout, _send(client, url, payload, headers)))[:3]


class _TimedOut(TimeoutError):
    """The client's own timeout fired (its name is the argument)."""


class SendFailed(Exception):
    """A request that failed in transport (not a timeout): the client's own exception is ``cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class NotConnected(SendFailed):
    """No connection could be made (refused, unreachable): the server never saw the request, so even a request
    that must not run twice may be sent again (it counts as an attempt)."""


class NotSent(SendFailed):
    """The pooled connection was closed before the request went out: the server never saw it.

    A busy client reuses a keep-alive connection that the server closed while it sat idle (the client's
    loop had not yet read the close). Sending it again on another connection is not a retry: it costs
    the server nothing and does not count as an attempt (up to :data:`MAX_NOT_SENT` a request).
    """


_NOT_SENT = "Can not write request body"
"""aiohttp's words (``ClientOSError``) when the connection closed before the request was written."""

MAX_NOT_SENT = 64
"""Most sends of one request that may fail unsent before they count as attempts: each one closes a
stale pooled connection, so a pool full of them drains rather than failing the request."""


async def post_json(
    client: Client,
    url: str,
    body: Any,
    *,
    target: Target,
    policy: RetryPolicy,
    headers: Mapping[str, str] | None = None,
    expect_json: bool = True,
    validate: Callable[[Any], str | None] | None = None,
    return_client_errors: bool = False,
    idempotent: bool = True,
    rng: random.Random | None = None,
) -> HttpResult:
    """POST ``body`` as JSON to ``url`` under ``policy``; return the result or raise :class:`RequestFailed`.

    ``expect_json`` parses the body (a body that is not JSON, or that ``validate`` rejects with a message,
    is retried as ``<target>_bad_response``). ``return_client_errors`` hands non-retryable 4xx answers
    back instead of failing, for callers that pass them on (a tool's error goes back to the model).
    ``idempotent=False``: the request must not run twice (a tool call may change the env's state); it is sent
    again only when it surely did not run (:class:`NotConnected`, :class:`NotSent`, :data:`NOT_RUN_STATUS`).
    """
    payload = compact_json(body).encode("utf-8")
    send_headers = {"content-type": "application/json"}
    if headers:
        send_headers.update(headers)
    deadline = time.monotonic() + policy.budget
    failure_class, message, status = f"{target}_timeout", "no attempt made", None
    attempt = timeouts = not_sent = 0
    while attempt < policy.max_attempts:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        attempt += 1
        retry_after: float | None = None
        try:
            status, response_headers, content, parsed = await _within(
                min(policy.request_timeout, remaining), _send(client, url, payload, send_headers)
            )
        except TimeoutError as e:
            timeouts += 1
            failure_class, status = f"{target}_timeout", None
            message = f"no complete answer from {url} within {min(policy.request_timeout, remaining):.3g} s"
            if isinstance(e, _TimedOut):
                message += f" ({e.args[0]})"
            if not idempotent:
                message += "; not sent again: the server may have run it, and it must not run twice"
                break
            if not policy.retry_timeouts:
                message += "; not sent again: the server may still be working on it"
                break
        except SendFailed as e:
            if isinstance(e, NotSent) and not_sent < MAX_NOT_SENT:
                not_sent += 1
                attempt -= 1  # the server never saw it: send it again now, on another connection
                continue
            failure_class, status = f"{target}_connection_error", None
            message = f"{type(e.cause).__name__} talking to {url}: {e.cause or 'connection failed'}"
            if not idempotent and not isinstance(e, NotConnected):
                message += "; not sent again: the server may have run it, and it must not run twice"
                break
        else:
            if status < 400:
                if not expect_json:
                    return HttpResult(status, response_headers, content, None, attempt, timeouts)
                try:
                    data = parse_json(content) if parsed is None else parsed
                except ValueError as e:
                    failure_class = f"{target}_bad_response"
                    message = (
                        f"{url} answered {status} with a body that is not JSON ({e}): {_snippet(content)!r}"
                    )
                else:
                    problem = validate(data) if validate is not None else None
                    if problem is None:
                        return HttpResult(status, response_headers, content, data, attempt, timeouts)
                    failure_class = f"{target}_bad_response"
                    message = f"{url} answered {status} with an unusable body: {problem}"
            else:
                failure_class = f"{target}_http_error"
                message = f"{url} answered HTTP {status}: {_snippet(content)!r}"
                if status not in RETRYABLE_STATUS:
                    if return_client_errors and status < 500:
                        return HttpResult(status, response_headers, content, None, attempt, timeouts)
                    raise RequestFailed(failure_class, message, attempt, status, timeouts)
                if not idempotent and status not in NOT_RUN_STATUS:
                    message += "; not sent again: the server may have run it, and it must not run twice"
                    raise RequestFailed(failure_class, message, attempt, status, timeouts)
                retry_after = parse_retry_after(response_headers.get("retry-after"))
        if attempt >= policy.max_attempts:
            break
        wait = policy.backoff(attempt, rng)
        if retry_after is not None:
            wait = max(wait, retry_after)
        if time.monotonic() + wait >= deadline:
            message += (
                f"; giving up: the next try (in {wait:.3g} s) would pass the {policy.budget:.3g} s budget"
            )
            break
        await asyncio.sleep(wait)
    raise RequestFailed(
        failure_class, f"{message} (after {attempt} attempt{'s' * (attempt != 1)})", attempt, status, timeouts
    )
