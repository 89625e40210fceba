"""Rollout builders for the transform tests: small NeMo Gym-shaped records with known text and reward."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from gym_bridge.cli import app

runner = CliRunner()


def run_transform(*args: Any) -> Result:
    """``gym-bridge transform ARGS`` in process (typer's runner), its exit code and output kept."""
    return runner.invoke(app, ["transform", *map(str, args)])


def summary_count(output: str, label: str) -> int:
    """The number printed after ``label`` in a transform's summary table."""
    match = re.search(rf"{re.escape(label)}\s+(\d+)", output)
    assert match, output
    return int(match.group(1))


def rollout(
    prompt: str,
    answer: str,
    reward: float | None,
    *,
    task: int | None = None,
    repeat: int | None = None,
    system: str | None = None,
    agent: str | None = "math_agent",
) -> dict[str, Any]:
    """A rollout as NeMo Gym writes it: request input items, response output items, reward, bookkeeping."""
    items: list[dict[str, Any]] = []
    if system is not None:
        items.append({"role": "developer", "content": system, "type": "message"})
    items.append({"role": "user", "content": [{"type": "input_text", "text": prompt}], "type": "message"})
    record: dict[str, Any] = {
        "responses_create_params": {"input": items, "tools": [], "temperature": 1.0},
        "response": {
            "id": "resp_1",
            "object": "response",
            "output": [
                {"id": "rs_1", "type": "reasoning", "summary": []},
                {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": answer, "annotations": []}],
                },
            ],
        },
        "expected_answer": answer.split()[-1],
    }
    if reward is not None:
        record["reward"] = reward
    if task is not None:
        record["_ng_task_index"] = task
        record["_ng_rollout_index"] = repeat or 0
    if agent is not None:
        record["agent_ref"] = {"name": agent}
    return record


def write_jsonl(path: Path, records: Iterable[dict[str, Any] | str | bytes]) -> Path:
    """Write records (dicts as JSON; str/bytes verbatim, to plant bad lines) one per line."""
    with open(path, "wb") as f:
        for record in records:
            if isinstance(record, dict):
                record = json.dumps(record)
            if isinstance(record, str):
                record = record.encode("utf-8")
            f.write(record + b"\n")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]
