"""Helpers for tests of the code server over real HTTP: task rows, answers, and the server's process tree.

The server runs in its own process (started by PID, in its own session), so "nothing is left behind"
is checked exactly: once a verification has answered, the server process has no descendants at all.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .procs import start, stop, wait_for_line


def answer(code: str) -> dict[str, Any]:
    """A Responses API output whose assistant text holds ``code`` as its fenced python block."""
    text = f"Here it is.\n```python\n{code}\n```\n"
    return {
        "output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
        ]
    }


def task(inputs: list[Any], outputs: list[Any], fn_name: str | None = None) -> dict[str, Any]:
    """A NeMo Gym code task row."""
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "solve"}]},
        "verifier_metadata": {"unit_tests": {"inputs": inputs, "outputs": outputs, "fn_name": fn_name}},
    }


def descendants(root: int) -> list[int]:
    """Every live process whose parent chain leads to ``root`` (found by walking /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            data = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2 :].split()
        if fields[0] != b"Z":
            parents[int(entry)] = int(fields[1])
    found: list[int] = []
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        found += children
        frontier += children
    return found


def processes_of_uids(uids: range) -> list[int]:
    """Live processes whose real uid is in ``uids`` (the sandbox's slot uids when the server is root)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        uid_line = next((line for line in status.splitlines() if line.startswith("Uid:")), "")
        if uid_line and int(uid_line.split()[1]) in uids:
            found.append(int(entry))
    return found


@contextmanager
def serving_code(args: list[str]) -> Iterator[tuple[str, subprocess.Popen[str], str]]:
    """Start a code server command that prints its URL; yield (url, process, the line it printed); stop it
    by PID afterwards."""
    proc = start(args, stderr=subprocess.DEVNULL)  # nothing reads it: a full pipe would block the server
    try:
        line = wait_for_line(proc, "http://")
        url = next(word for word in line.split() if word.startswith("http://"))
        yield url.rstrip("/"), proc, line
    finally:
        stop(proc)
