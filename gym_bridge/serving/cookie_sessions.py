"""Cookie sessions: the per-rollout state a resources server keeps, found by the cookie it issued.

Why its own module: the store's bounds (idle expiry, a count cap, a byte cap, least recently used out)
and its id rule (the server makes every id, a client never picks one: session fixation) are one policy,
kept apart from the routes that use it (:mod:`gym_bridge.serving.server`). Sessions an Environment Server
names by its own id are bound to these through :mod:`gym_bridge.serving.resources_sessions`.
"""

from __future__ import annotations

import asyncio
import binascii
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import cookie_parser

from gym_bridge.serving.resources_sessions import Binding

SESSION_COOKIE = "gym_bridge_session"


@dataclass
class Session:
    """Per-session state of one rollout; environments keep what they need in ``state``."""

    id: str
    state: dict[str, Any] = field(default_factory=dict)
    last_seen: float = field(default_factory=time.monotonic)
    nbytes: int = 0
    """The state's size as counted against ``max_session_bytes`` (measured after seeding)."""
    binding: Binding | None = None
    """Set when an Environment Server seeded it: its ``resources_session_id``, episode and task."""
    lost: bool = False
    """Opened for a request whose cookie named a session this store no longer has (expired, evicted): a
    server whose verdict reads the session's state refuses to score it rather than read an empty one."""
    seeding: asyncio.Event | None = None
    """Set while an Environment Server's seed of it runs: a repeat of that seed (a retry whose first answer
    was lost) waits on it, rather than answer with the cookie of a session that has no state yet, or never will."""
    closing: asyncio.Event | None = None
    """Set while a ``/close_session`` releases it: another close of it waits on it rather than release twice."""
    released: bool = False
    """A ``/close_session`` released what it holds (``close_resources_session`` returned)."""
    gone: bool = False
    """Dropped from the store (closed, idle past the TTL, pushed out of the kept tier): never taken back."""


class SessionStore:
    """Sessions by server-issued id, with idle expiry and a size cap (least recently used goes first).

    Ids are 128-bit random tokens made here (:meth:`create`); :meth:`get` finds only those, so a client
    cannot choose an id, nor reach a session whose id it was not given.

    Two tiers, each at most ``max_sessions`` long: a session is *fresh* from its first request until it
    holds something (state, or an Environment Server's binding), then *kept*. Why: every request without
    a cookie opens a session (NeMo Gym's protocol sets the cookie on first contact), so a stream of them
    (a re-verify of a whole run, a client that drops cookies, a hostile one) used to push live rollouts'
    sessions out; now it can only push out sessions that hold nothing.
    """

    def __init__(
        self, ttl_s: float, max_sessions: int, max_bytes: int | None = None,
        on_drop: Callable[[Session], None] | None = None,
    ) -> None:  # fmt: skip
        self._ttl = ttl_s
        self._max = max_sessions
        self._max_bytes = max_bytes
        self._on_drop = on_drop
        """Called with each session an Environment Server seeded as it leaves the store (expired, evicted, closed)."""
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        """Kept sessions, least recently used first."""
        self._fresh: OrderedDict[str, Session] = OrderedDict()
        """Sessions that held nothing when last looked at, oldest first."""
        self.nbytes = 0
        """Total state size of the live sessions."""

    def __len__(self) -> int:
        return len(self._sessions) + len(self._fresh)

    def get(self, session_id: str) -> Session | None:
        """The live session with this id, or None (unknown, or idle past the TTL: then it is dropped)."""
        now = time.monotonic()
        tier = self._sessions
        session = tier.get(session_id)
        if session is None:
            tier = self._fresh
            session = tier.get(session_id)
            if session is None:
                return None
        if now - session.last_seen > self._ttl:
            self._drop(session_id)
            return None
        session.last_seen = now
        if tier is self._fresh and _holds_something(session):
            self.keep(session)  # a tool wrote state into it since
        else:
            tier.move_to_end(session_id)
        return session

    def create(self) -> Session:
        """A new (fresh) session under a fresh unguessable id."""
        session = Session(id=new_session_id())
        fresh = self._fresh
        fresh[session.id] = session
        while len(fresh) > self._max or self._expired(fresh, session.last_seen):
            oldest = next(iter(fresh.values()))
            if _holds_something(oldest) and session.last_seen - oldest.last_seen <= self._ttl:
                self.keep(oldest)
            else:
                self._drop(oldest.id, gone=False)  # holds nothing: its request, if still on the way, takes it back
        return session

    def keep(self, session: Session) -> None:
        """Move ``session`` to the kept tier (it holds state or a binding now); the least recently used
        kept sessions go past ``max_sessions``, and any idle past the TTL.

        A fresh session pushed out of its tier is taken back: its request is using it (a seed), and cookie-less
        requests pushed it out before its body was read; left out, its seed answered 200 for a session no
        later call could find, and its bytes stayed counted for good. A session dropped otherwise is not."""
        if self._fresh.pop(session.id, None) is None and (session.gone or session.id in self._sessions):
            return
        self._sessions[session.id] = session
        while len(self._sessions) > self._max or self._expired(self._sessions, session.last_seen):
            self._drop(next(iter(self._sessions)))

    def of_cookies(self, cookies: list[bytes]) -> tuple[Session, list[tuple[bytes, bytes]]]:
        """The session of a request's ``cookie`` headers; without one this store issued (none, unknown,
        expired), a new session and the header that sets its cookie. A client-chosen value is never adopted."""
        cookie_header = b"; ".join(cookies).decode("latin-1")
        session_id = cookie_parser(cookie_header).get(SESSION_COOKIE) if cookie_header else None
        session = self.get(session_id) if session_id else None
        if session is not None:
            return session, []
        session = self.create()
        session.lost = bool(session_id)
        return session, [set_cookie(session)]

    def charge(self, session: Session, nbytes: int) -> None:
        """Count ``nbytes`` as ``session``'s state size (keeping it); drop least recently used others past the bound."""
        if self._max_bytes is not None and nbytes > self._max_bytes:
            raise HTTPException(
                413, f"this session's state takes {nbytes} bytes, over the server's bound of {self._max_bytes} "
                "bytes for all sessions (max_session_bytes)",
            )  # fmt: skip
        self.keep(session)
        if session.gone:  # dropped while its request ran: nothing of it is kept, so nothing is counted
            return
        self.nbytes += nbytes - session.nbytes
        session.nbytes = nbytes
        while self._max_bytes is not None and self.nbytes > self._max_bytes:
            oldest = next(iter(self._sessions))
            if oldest == session.id:  # cannot happen while it is the most recently used, but never loop
                break
            self._drop(oldest)

    def discard(self, session_id: str) -> None:
        """Drop the session now (closed), if it is still here."""
        if session_id in self._sessions or session_id in self._fresh:
            self._drop(session_id)

    def _drop(self, session_id: str, gone: bool = True) -> None:
        session = self._sessions.pop(session_id, None) or self._fresh.pop(session_id)
        session.gone = gone
        self.nbytes -= session.nbytes
        if session.binding is not None and self._on_drop is not None:
            self._on_drop(session)

    def _expired(self, tier: OrderedDict[str, Session], now: float) -> bool:
        """Whether ``tier``'s oldest session has been idle past the TTL."""
        return bool(tier) and now - next(iter(tier.values())).last_seen > self._ttl


def _holds_something(session: Session) -> bool:
    return bool(session.state) or session.binding is not None


_URL_SAFE = bytes.maketrans(b"+/", b"-_")


def new_session_id() -> str:
    """``secrets.token_urlsafe(16)``: 128 bits from ``os.urandom`` in URL-safe base64, without its five
    Python calls (one for each rollout's ``/seed_session``)."""
    encoded = binascii.b2a_base64(os.urandom(16), newline=False)
    return encoded.rstrip(b"=").translate(_URL_SAFE).decode("ascii")


def set_cookie(session: Session) -> tuple[bytes, bytes]:
    """The ``set-cookie`` header that hands ``session``'s id to the client."""
    return b"set-cookie", f"{SESSION_COOKIE}={session.id}; HttpOnly; Path=/; SameSite=lax".encode("latin-1")
