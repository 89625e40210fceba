"""Real envs and task-file helpers for the collector tests (used by conftest.py and the tests)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from fake_model import function_call, message, tool_outputs
from fastapi import HTTPException
from pydantic import BaseModel

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, assistant_text, dump
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session, tool

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


class BoxedAnswerEnv(ResourcesServer):
    """Reward 1 when the last ``\\boxed{}`` of the answer equals the row's ``expected_answer``."""

    name = "boxed"

    def __init__(self, settings: ServerSettings | None = None) -> None:
        super().__init__(settings)
        self.verify_calls = 0

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        self.verify_calls += 1
        found = _BOXED.findall(assistant_text(body.response.output))
        extracted = found[-1].strip() if found else None
        expected = str(getattr(body, "expected_answer", ""))
        return VerifyResponse(**dump(body), reward=float(extracted == expected), extracted_answer=extracted)


class NoteArgs(BaseModel):
    text: str


class NotesEnv(ResourcesServer):
    """A tool env with per-session state: ``add_note`` appends to this rollout's notes (kept by cookie).

    ``verify`` gives reward 1 when the session was seeded and its notes equal the row's ``expected_notes``,
    so any mix-up of sessions between rollouts (a shared cookie jar) shows as a wrong reward.
    """

    name = "notes"

    def __init__(self, settings: ServerSettings | None = None) -> None:
        super().__init__(settings)
        self.tool_calls: Counter[str] = Counter()

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        session.state["seeded"] = True
        session.state["notes"] = []
        return {}

    @tool
    async def add_note(self, args: NoteArgs, session: Session) -> dict[str, Any]:
        """Append a note to this session's list."""
        self.tool_calls["add_note"] += 1
        session.state.setdefault("notes", []).append(args.text)
        return {"count": len(session.state["notes"])}

    @tool
    async def explode(self, args: NoteArgs, session: Session) -> dict[str, Any]:
        """A tool that always fails with a server error."""
        self.tool_calls["explode"] += 1
        raise HTTPException(500, "tool crashed")

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        notes = session.state.get("notes")
        ok = bool(session.state.get("seeded")) and notes == getattr(body, "expected_notes", None)
        return VerifyResponse(**dump(body), reward=float(ok), session_notes=notes)


class FaultyEnv(ResourcesServer):
    """Misbehaves as the row's ``fault`` says: ``seed_4xx`` (409 at session set-up), ``verify_raises`` (an
    exception in ``/verify``: a 500) or ``verify_4xx`` (400 from ``/verify``); else reward 1."""

    name = "faulty"

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        if body.get("fault") == "seed_4xx":
            raise HTTPException(409, "no session for this row")
        return {}

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        fault = getattr(body, "fault", None)
        if fault == "verify_raises":
            raise RuntimeError("the verifier crashed")
        if fault == "verify_4xx":
            raise HTTPException(400, "cannot verify this row")
        return VerifyResponse(**dump(body), reward=1.0)


class ShutdownMarkEnv(BoxedAnswerEnv):
    """:class:`BoxedAnswerEnv` that writes ``down`` to the file ``$SHUTDOWN_MARK`` names when it shuts down
    (its lifespan's shut-down ran)."""

    async def shutdown(self) -> None:
        Path(os.environ["SHUTDOWN_MARK"]).write_text("down")


class BrokenStartEnv(BoxedAnswerEnv):
    """An env whose start-up fails."""

    async def startup(self) -> None:
        raise RuntimeError("no sandbox here")


TOOLS = [
    {
        "type": "function",
        "name": "add_note",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    }
]


def notes_row(notes: list[str], **extra) -> dict:
    prompt = "take notes: " + ",".join(notes)
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt}], "tools": TOOLS},
        "expected_notes": notes,
        **extra,
    }


def note_taker(request, n):
    """Calls add_note once per note in the prompt, one call per turn, then says it is done."""
    text = next(i["content"] for i in request["input"] if i.get("role") == "user")
    notes = text.split(": ", 1)[1].split(",")
    done = len(tool_outputs(request))
    if done < len(notes):
        return [message(f"adding note {done}"), function_call("add_note", {"text": notes[done]})]
    return f"done: {done} notes"


def write_rows(path: Path, rows: list[Any]) -> Path:
    """Write rows as JSONL; a ``str`` row is written verbatim (for bad lines)."""
    with open(path, "w") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rollout_pairs(path: Any) -> list[tuple[int, int]]:
    """``(task index, repeat index)`` of every rollout in an output file, in file order."""
    return [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in read_jsonl(path)]


def assert_written_exactly_once(out: Path, tasks: int, repeats: int, done_before: list[tuple[int, int]]) -> None:
    """After a kill and ``--resume``: every (task, repeat) pair in ``out`` once, the lines written before the
    kill (``done_before``) kept first, as they were."""
    everything = rollout_pairs(out)
    assert Counter(everything).most_common(1)[0][1] == 1  # no duplicates
    assert sorted(everything) == [(t, r) for t in range(tasks) for r in range(repeats)]
    assert everything[: len(done_before)] == done_before  # finished lines were kept as they were


def sigkill_after_lines(command: list[str], out: Path, lines: int, cwd: str, timeout: float = 60) -> None:
    """Run ``gym-bridge collect`` as a child and SIGKILL it once ``out`` has ``lines`` lines (a crash mid-run)."""
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        while (
            not out.exists() or len(out.read_bytes().splitlines()) < lines
        ) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
