"""NeMo Gym 0.7.0's Environment Server sessions: caller-assigned ids beside the server's own cookie sessions.

An Environment Server seeds with ``resources_session_id`` (its own id, e.g. ``resources-session-<uuid4>``)
and then reaches the session as an agent does, by the cookie the seed answer sets. This module keeps
which server session each such id names, and the ids that were closed: the rules
``nemo_gym.base_resources_server.ResourcesSeedSessionRequest`` states and NeMo Gym's
``check_resources_session_contract`` tests:

* a repeated seed of an id (same episode and task) finds the session it made, not a new one;
* a close is idempotent, succeeds for an id never seeded, and keeps every later seed of that id out,
  so a seed racing its own close (a retry of a lost seed answer) cannot bring the session back;
* an id whose session left the store holding something (idle past ``session_ttl_s``, pushed out) is kept
  out too: a repeat of its seed would otherwise get a fresh session under that id, the work done gone unsaid.

Closed (and lost) ids are remembered for the sessions' idle lifetime (``session_ttl_s``), at most ``max_sessions``
of them, each by a 16-byte digest (ids are the caller's, of any length: 200,000 closes of 1 MB ids held
200 GB); the cookie sessions' own bounds are :class:`~gym_bridge.serving.cookie_sessions.SessionStore`'s,
whose byte bound counts a binding's ids (:attr:`Binding.nbytes`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException

from gym_bridge.records.schema import EpisodeId, ResourcesSeedSessionRequest, TaskId

__all__ = ["Binding", "ResourcesSessions"]


@dataclass(frozen=True)
class Binding:
    """What a session was seeded for by an Environment Server: the caller's id, episode, task and row."""

    resources_session_id: str
    episode_id: EpisodeId
    task_id: TaskId
    task_digest: str

    @classmethod
    def of(cls, request: ResourcesSeedSessionRequest) -> Binding:
        row = json.dumps(request.task_data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return cls(request.resources_session_id, request.episode_id, request.task_id,
                   hashlib.sha256(row.encode()).hexdigest())  # fmt: skip

    @property
    def nbytes(self) -> int:
        """What this binding keeps, in bytes of its ids' text (counted against ``max_session_bytes``)."""
        ids = (self.resources_session_id, self.episode_id.rollout_id, self.task_id.taskset, self.task_id.task_id)
        return sum(map(len, ids)) + len(self.task_digest)

    def conflict(self, other: Binding) -> str | None:
        """Why a seed of the same id cannot be the repeat of this one; None when it is."""
        for field, mine, theirs in (("episode_id", self.episode_id, other.episode_id),
                                    ("task_id", self.task_id, other.task_id),
                                    ("task_data", self.task_digest, other.task_digest)):  # fmt: skip
            if mine != theirs:
                return (f"resources session '{self.resources_session_id}' is already seeded with another {field}; "
                        "a repeated seed must be the same request")  # fmt: skip
        return None


LOST = "is gone (idle past session_ttl_s, or pushed out past max_sessions / max_session_bytes): the state it held is lost"


class ResourcesSessions:
    """Caller-assigned ids -> server session ids, and the ids closed recently."""

    def __init__(self, ttl_s: float, max_closed: int) -> None:
        self._ttl = ttl_s
        self._max_closed = max_closed
        self._bound: dict[str, str] = {}
        self._closed: OrderedDict[bytes, tuple[float, str]] = OrderedDict()
        """Digests of the ids closed or lost (:func:`_digest`), oldest first, with when and why they are refused."""

    def __len__(self) -> int:
        return len(self._bound)

    def session_id(self, resources_session_id: str) -> str | None:
        """The server session the id names (it may since have expired from the store)."""
        return self._bound.get(resources_session_id)

    def bind(self, binding: Binding, session_id: str) -> None:
        self._bound[binding.resources_session_id] = session_id

    def unbind(self, resources_session_id: str, session_id: str) -> None:
        """Forget the id's session (dropped from the store, or closed), if it still names that one."""
        if self._bound.get(resources_session_id) == session_id:
            del self._bound[resources_session_id]

    def refuse_if_closed(self, resources_session_id: str) -> None:
        """409 when the id was closed or lost: such a session is never seeded again."""
        now = time.monotonic()
        closed = self._closed.get(_digest(resources_session_id))
        if closed is not None and now - closed[0] <= self._ttl:
            raise HTTPException(409, f"resources session '{resources_session_id}' {closed[1]}; seed a new resources_session_id")

    def mark_closed(self, resources_session_id: str) -> None:
        self._refuse(resources_session_id, "is closed")

    def mark_lost(self, resources_session_id: str) -> None:
        """The id's session left the store holding something (idle past the TTL, pushed out): a repeat of its
        seed is refused rather than answered with a fresh session under the same id (the work done, gone unsaid)."""
        self._refuse(resources_session_id, LOST)

    def _refuse(self, resources_session_id: str, why: str) -> None:
        now = time.monotonic()
        key = _digest(resources_session_id)
        self._closed[key] = (now, why)
        self._closed.move_to_end(key)
        while self._closed:
            oldest, (at, _) = next(iter(self._closed.items()))
            if len(self._closed) <= self._max_closed and now - at <= self._ttl:
                break
            del self._closed[oldest]

    def describe(self) -> dict[str, Any]:
        return {"resources_sessions": len(self._bound), "closed_resources_sessions": len(self._closed)}


def _digest(resources_session_id: str) -> bytes:
    """A closed id as it is remembered: 16 bytes, whatever the id's length."""
    return hashlib.blake2b(resources_session_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()
