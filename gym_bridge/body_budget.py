"""A budget of request-body bytes that all requests of one server may hold at once.

Why: a server's per-request body limit bounds one body, not 200 clients each sending one at the limit
(16 MiB each, a few times that once parsed): together they take gigabytes. :class:`gym_bridge.json_http.JsonApp`
claims each body's bytes as they arrive and releases them once the request is answered; past the budget
a request gets 503 with ``Retry-After``. One event loop serves an app, so no lock is needed.
"""

from __future__ import annotations

__all__ = ["BodiesBusy", "BodyBudget", "BodyClaim"]


class BodiesBusy(Exception):
    """Taking this body would put the bodies held at once past the app's :class:`BodyBudget`."""


class BodyBudget:
    """Bytes of request bodies all requests may hold at once (read, parsed, until answered)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0


class BodyClaim:
    """One request's share of a :class:`BodyBudget`; :meth:`release` returns it once the request is answered."""

    def __init__(self, budget: BodyBudget | None) -> None:
        self.budget, self.held = budget, 0

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes fit; a request alone always fits (so a body the server's own limit
        allows is never refused on an idle server, whatever the budget)."""
        if self.budget is None:
            return True
        return self.budget.held == self.held or self.budget.held + size <= self.budget.limit

    def take(self, size: int) -> None:
        if self.budget is None:
            return
        if not self.fits(size):
            raise BodiesBusy
        self.budget.held += size
        self.held += size

    def release(self) -> None:
        if self.budget is not None:
            self.budget.held -= self.held
            self.held = 0
