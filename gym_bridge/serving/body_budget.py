"""A budget of request-body bytes that all requests of one server may hold at once.

Why: a server's per-request body limit bounds one body, not 200 clients each sending one at the limit
(16 MiB each, a few times that once parsed): together they take gigabytes. :class:`gym_bridge.serving.json_http.JsonApp`
claims each body's bytes as they arrive and releases them once the request is answered. A body with a
declared length waits until its whole size fits beside the bytes the others hold (uvicorn then stops
reading that socket after 64 KB, so a waiting request holds little); one that does not fit in time, or a
body that streams past the budget, gets 503 with ``Retry-After``. One event loop serves an app, so no lock
is needed.

Only bytes that arrived are held, never a declared length: heads declaring bodies that fill the budget,
whose bodies never come, held it whole until their body deadline (60 s), at the cost of a few header bytes.
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
    """One request's share of a :class:`BodyBudget`: the ``taken`` bytes of its body that arrived."""

    __slots__ = ("budget", "taken")

    def __init__(self, budget: BodyBudget | None) -> None:
        self.budget, self.taken = budget, 0

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes fit; a request alone always fits (so a body the server's own limit
        allows is never refused on an idle server, whatever the budget)."""
        if self.budget is None:
            return True
        return self.budget.held == self.taken or self.budget.held + size <= self.budget.limit

    def reserve_now(self, size: int) -> bool:
        """Whether a body of ``size`` bytes fits now (False: :meth:`reserve` waits); nothing is held until
        its bytes arrive (:meth:`take`)."""
        budget = self.budget
        return budget is None or budget.held == self.taken or budget.held + size <= budget.limit  # fits(), inline

    async def reserve(self, size: int, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds for ``size`` bytes to fit (else :class:`BodiesBusy`)."""
        if self.budget is None or self.fits(size):  # room now, the usual case, sets no timer
            return
        try:
            async with asyncio.timeout(timeout):
                while not self.fits(size):
                    await self.budget.freed().wait()
        except TimeoutError:
            raise BodiesBusy from None

    def take(self, size: int) -> None:
        """Hold ``size`` bytes that arrived; past the budget (and not alone) :class:`BodiesBusy`."""
        budget = self.budget
        if budget is None:
            return
        if not self.fits(size):
            raise BodiesBusy
        budget.held += size
        self.taken += size

    def release(self) -> None:
        if self.budget is not None and self.taken:
            self.budget.release(self.taken)
            self.taken = 0
