"""What an attack is, what it may score, and what counts as a finding.

An attack is a task row plus what a scripted model answers on each turn (an answer text, or tool
calls): it runs through the real agent loop against the server under audit, so the server sees exactly
what a policy would send. Its verdict is a finding when the server

* **wrong-reward**: pays more than ``max_reward`` for an answer that does not solve the task (or a reward
  that is not a finite number in [0, 1]),
* **crash**: answers 5xx, or drops the connection,
* **stall**: takes longer than the audit's stall bound,
* **escape/leak**: lets the answer act outside its verdict (a marker file appears on this machine, a
  later innocent answer's reward changes, a web page's request is served).

A *control* attack is the honest answer: it must score 1, or the probe row does not fit the server and
the audit stops rather than report a clean bill it never tested.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gym_bridge.records.schema import FunctionCall, OutputMessage, OutputText

__all__ = [
    "ATTACK_CLASSES",
    "Attack",
    "AuditOptions",
    "Finding",
    "Outcome",
    "RawAttack",
    "answer",
    "calls",
    "marker_path",
]

ATTACK_CLASSES = ("wrong-reward", "crash", "stall", "escape/leak")

Turn = list[dict[str, Any]]
"""The output items the scripted model answers with on one turn."""


def answer(text: str) -> Turn:
    """A turn that is one assistant message."""
    return [
        OutputMessage(id=f"msg_audit_{uuid.uuid4().hex[:8]}", content=[OutputText(text=text)]).model_dump()
    ]


def calls(*pairs: tuple[str, dict[str, Any] | str]) -> Turn:
    """A turn of tool calls: ``(name, arguments)``; arguments as a dict (dumped) or a raw string."""
    return [
        FunctionCall(
            call_id=f"call_audit_{uuid.uuid4().hex[:8]}",
            name=name,
            arguments=args if isinstance(args, str) else json.dumps(args),
        ).model_dump()
        for name, args in pairs
    ]


def marker_path(tag: str) -> str:
    """A file an escaping answer would create on the server's machine (checked only for a local server)."""
    return f"/tmp/gym-bridge-audit-{tag}-{uuid.uuid4().hex[:10]}"


@dataclass(frozen=True)
class AuditOptions:
    """What the catalogue needs to know of the server under audit."""

    strict: bool = False
    """Also count what a parity default pays by design (math: relations, negations, approximations, prose)."""
    code_cpu_limit_s: float = 4.0
    """The code server's CPU limit per test: the CPU attacks spend 1.7 times it (the code server's default)."""


@dataclass(frozen=True)
class Attack:
    """One hostile (or, with ``control``, honest) rollout."""

    name: str
    attack_class: str
    """Where a finding is filed: one of :data:`ATTACK_CLASSES`."""
    what: str
    """One line: what it tries."""
    row: dict[str, Any]
    turns: Sequence[Turn]
    """The scripted model's answers, turn by turn (every turn but the last should be tool calls)."""
    max_reward: float = 0.0
    """Reward above this is a wrong-reward finding (1.0 for the control and for answers that may pass)."""
    min_reward: float = 0.0
    """Reward below this is a finding (1.0 for an honest answer that an attack must not spoil)."""
    control: bool = False
    """A pre-flight check (an honest answer, ``min_reward`` 1): if it fails, the probe rows do not fit the server
    and nothing is audited."""
    markers: tuple[str, ...] = ()
    """Paths that must not exist after it ran (the server is on this machine)."""
    then: tuple[Attack, ...] = ()
    """Innocent follow-ups whose rewards the attack must not have changed (run after it, each checked as its own;
    what they find is filed as the attack's escape/leak)."""
    host_shmem_growth_mb: float | None = None
    """Shared memory (``Shmem`` of /proc/meminfo) the attack may leave on the server's machine (checked only
    for a local server): more is memory that outlived the task and escaped its limit."""
    concurrent: int = 1
    """Copies sent at once (a stall attack: the load a plain answer must not wait behind)."""
    plain_bound_s: float = 1.0
    """With ``concurrent``: the longest the plain follow-up (``then[0]``) may take while the copies are in flight."""


@dataclass(frozen=True)
class RawAttack:
    """A request no agent loop would send: a malformed body, a web page's request, a forged header.

    ``check(status, body)`` says what is wrong with the answer (None: nothing).
    """

    name: str
    attack_class: str
    what: str
    path: str
    content: bytes
    headers: dict[str, str]
    check: Callable[[int, bytes], str | None]
    needs_session: bool = False
    """Seed a session first (with the env's control row) and send its cookies."""


@dataclass(frozen=True)
class Finding:
    attack: str
    attack_class: str
    what: str
    observed: str


@dataclass
class Outcome:
    """What one attack did: its findings, or why it was not checked."""

    attack: str
    attack_class: str
    findings: list[Finding] = field(default_factory=list)
    reward: float | None = None
    seconds: float = 0.0
    skipped: str | None = None
    note: str | None = None
