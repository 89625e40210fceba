"""A budget of request-body bytes that all requests of one server may hold at once.

Why: a server's per-request body limit bounds one body, not 200 clients each sending one at the limit
(16 MiB each, a few times that once parsed): together they take gigabytes. :class:`gym_bridge.serving.json_http.JsonApp`
claims each body's bytes and releases them once the request is answered. A body with a declared length
waits for its whole size to be free before it is read (uvicorn then stops reading that socket after
64 KB, so a waiting request holds little); one that does not fit in time, or a chunked body that streams
past the budget, gets 503 with ``Retry-After``. One event loop serves an app, so no lock is needed.
"""

from __future__ import annotations

import asyncio

__all__ = ["BodiesBusy", "BodyBudget", "BodyClaim"]


class BodiesBusy(Exception):
    """This body does not fit the app's :class:`BodyBudget` (now, or within the wait allowed)."""


class BodyBudget:
    """Bytes of request bodies all requests may hold at once (read, parsed, until answered)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0
        self._freed: asyncio.Event | None = None

    def freed(self) -> asyncio.Event:
        """An event set the next time bytes are released."""
        if self._freed is None:
            self._freed = asyncio.Event()
        return self._freed

    def release(self, size: int) -> None:
        self.held -= size
        if self._freed is not None:
            self._freed.set()
            self._freed = None


class BodyClaim:
    """One request's share of a :class:`BodyBudget`: ``reserved`` bytes, of which ``taken`` were read."""

    __slots__ = ("budget", "reserved", "taken")

    def __init__(self, budget: BodyBudget | None) -> None:
        self.budget, self.reserved, self.taken = budget, 0, 0

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes fit; a request alone always fits (so a body the server's own limit
        allows is never refused on an idle server, whatever the budget)."""
        if self.budget is None:
            return True
        return self.budget.held == self.reserved or self.budget.held + size <= self.budget.limit

    def reserve_now(self, size: int) -> bool:
        """Hold ``size`` bytes if they fit now (True); else hold nothing (False: :meth:`reserve` waits)."""
        budget = self.budget
        if budget is None:
            return True
        if budget.held != self.reserved and budget.held + size > budget.limit:  # not fits(): inline, as
            return False  # every request with a body asks
        budget.held += size
        self.reserved += size
        return True

    async def reserve(self, size: int, timeout: float | None) -> None:
        """Hold ``size`` bytes, waiting up to ``timeout`` seconds for them to be free (else :class:`BodiesBusy`)."""
        if self.budget is None:
            return
        if not self.fits(size):  # no room now: wait for it (room now, the usual case, sets no timer)
            try:
                async with asyncio.timeout(timeout):
                    while not self.fits(size):
                        await self.budget.freed().wait()
            except TimeoutError:
                raise BodiesBusy from None
        self._grow(size)

    def take(self, size: int) -> None:
        """Count ``size`` bytes read; past what was reserved they must fit now (else :class:`BodiesBusy`)."""
        self.taken += size
        extra = self.taken - self.reserved
        if self.budget is None or extra <= 0:
            return
        if not self.fits(extra):
            raise BodiesBusy
        self._grow(extra)

    def _grow(self, size: int) -> None:
        assert self.budget is not None
        self.budget.held += size
        self.reserved += size

    def release(self) -> None:
        if self.budget is not None and self.reserved:
            self.budget.release(self.reserved)
            self.reserved = 0
