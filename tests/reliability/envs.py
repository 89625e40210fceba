"""Small real resources servers for the reliability tests, built on the shared base class.

They exercise everything the base serves (sessions, tools, verify, metrics) without depending on any
one environment, so the suite covers the base even before the built-in servers land.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, assistant_text, dump
from gym_bridge.serving.server import ResourcesServer, Session, tool

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


class AddArgs(BaseModel):
    a: int = Field(ge=-1_000_000, le=1_000_000)
    b: int = Field(ge=-1_000_000, le=1_000_000)


class NoteArgs(BaseModel):
    text: str = Field(max_length=10_000)


class ArithmeticEnv(ResourcesServer):
    """Reward 1 when the last ``\\boxed{}`` equals ``expected_answer``; tools ``add`` and ``note``."""

    name = "reliability_arithmetic"

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        session.state["notes"] = []
        return {}

    @tool
    async def add(self, args: AddArgs, session: Session) -> dict[str, Any]:
        """Add two integers."""
        return {"sum": args.a + args.b}

    @tool
    async def note(self, args: NoteArgs, session: Session) -> dict[str, Any]:
        """Append a note to this session's notes."""
        notes = session.state.setdefault("notes", [])
        notes.append(args.text)
        return {"count": len(notes)}

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        found = _BOXED.findall(assistant_text(body.response.output))
        extracted = found[-1].strip() if found else None
        expected = str(getattr(body, "expected_answer", ""))
        return VerifyResponse(**dump(body), reward=float(extracted == expected), extracted_answer=extracted)
