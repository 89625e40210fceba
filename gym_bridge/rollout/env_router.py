"""Sessions of one environment spread over its replicas, each session kept on the replica it opened on.

Why: a resources server keeps a rollout's state in the session its cookie names (the tool_use store,
a code sandbox), in the memory of the process that seeded it. With several copies of the server,
every request carrying that cookie (tool calls, ``/verify``) must reach the copy that answered
``/seed_session``, or it finds no state. A load balancer in front would have to learn each
cookie from the answers and keep a table of them; the agent loop needs none of that, because it
holds one rollout's cookie jar itself: :func:`~gym_bridge.rollout.agent.run_rollout` asks this router for a
replica when it opens the session and sends everything of that session there (cookie-sticky by
construction, with no table to leak when a rollout dies half-way).

New sessions go to the live replica with the fewest sessions open (ties: fewest opened so far, then
the lowest index), so concurrent rollouts spread evenly. A replica that does not answer (refused
connections, timeouts at session set-up) is marked lost and gets no new sessions; a session that
could not be opened on it is opened on another. Sessions already open on a lost replica fail (their
state went with it). Pure Python: the replicas may be Ray actors, processes or machines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gym_bridge.serving.retry import RequestFailed

__all__ = ["Replica", "ReplicaEndpoints", "SessionRouter"]


@dataclass(frozen=True)
class ReplicaEndpoints:
    """Where one env's replicas listen (picklable: it goes to the async-GRPO rollout process too)."""

    urls: list[str]
    labels: list[str] = field(default_factory=list)
    """One per url, for messages: which replica, on which node."""
    token: str | None = None
    """Bearer token every replica of the run wants."""


@dataclass
class Replica:
    """One replica as the router sees it."""

    index: int
    url: str
    label: str
    open: int = 0
    """Sessions open on it now."""
    opened: int = 0
    """Sessions opened on it so far."""
    lost: str | None = None
    """Why it was given up on; None while it answers."""


class SessionRouter:
    """Chooses the replica for each new session of env ``name``; see the module docstring."""

    def __init__(self, name: str, endpoints: ReplicaEndpoints) -> None:
        if not endpoints.urls:
            raise ValueError(f"env {name!r}: no replica to route to")
        labels = endpoints.labels or [f"replica {i} at {url}" for i, url in enumerate(endpoints.urls)]
        self.name = name
        pairs = zip(endpoints.urls, labels, strict=True)
        self.replicas = [Replica(i, url.rstrip("/"), label) for i, (url, label) in enumerate(pairs)]
        self.newly_lost: list[Replica] = []
        """Replicas lost since the caller last emptied this list (to report them once)."""

    def open_session(self) -> Replica:
        """The replica for a new session; :class:`RequestFailed` when every replica is lost."""
        alive = [r for r in self.replicas if r.lost is None]
        if not alive:
            reasons = "; ".join(f"{r.label}: {r.lost}" for r in self.replicas)
            raise RequestFailed("env_connection_error", f"no replica of env {self.name!r} is left ({reasons})", 1)
        replica = min(alive, key=lambda r: (r.open, r.opened, r.index))
        replica.open += 1
        replica.opened += 1
        return replica

    def end_session(self, replica: Replica) -> None:
        """The session on ``replica`` is over (verified, or failed)."""
        replica.open -= 1

    def mark_lost(self, replica: Replica, reason: str) -> None:
        """Send no new session to ``replica`` again (the first reason is kept)."""
        if replica.lost is None:
            replica.lost = reason
            self.newly_lost.append(replica)

    @property
    def alive(self) -> int:
        return sum(r.lost is None for r in self.replicas)
