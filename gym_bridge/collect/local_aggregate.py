"""``/aggregate_metrics`` of an env the run serves in-process, computed from the run's spool file a record
at a time, and NeMo Gym's ``_aggregate_metrics.json`` written without holding every task's figures.

Why: over the protocol, a run's end posts every rollout in one body and gets every task's figures back in
one answer; for a million rollouts that was a 630 MB body (past the server's 256 MiB limit, so no
aggregate at all) and, at 262,144, about a gigabyte of parsed records and answer on top of the run. The
env's app is ours and runs on this process anyway, so its answer is computed here, by the same code its
route runs (:class:`~gym_bridge.records.aggregate.StreamingAggregate` is :func:`~gym_bridge.records.aggregate.nemo_gym_aggregate`
fed a record at a time; the env's own summary, ``ResourcesServer.aggregate_metrics``, is given the records
as a view that reads them back from the file). Envs reached over HTTP still get the one body NeMo Gym's
collector sends (streamed from the file, so it is not in this process's memory); their side holds it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from gym_bridge.collect.output import _indented
from gym_bridge.records.aggregate import (
    AggregateRequestError,
    SpilledGroups,
    StreamingAggregate,
    parse_aggregate_request,
)

__all__ = ["SpooledRecords", "local_aggregate", "server_of_app", "write_aggregate_file"]


def server_of_app(app: Any) -> Any:
    """The :class:`~gym_bridge.serving.server.ResourcesServer` behind an app built by its ``build_app`` (the
    app's ``owner``), else None."""
    from gym_bridge.serving.server import ResourcesServer

    owner = getattr(app, "owner", None)
    return owner if isinstance(owner, ResourcesServer) else None


class SpooledRecords:
    """The records of a spooled ``/aggregate_metrics`` body (one a line), read back on every iteration.

    ``group_size``: each task has at most this many records (``aggregate_rewards`` closes a task's group
    when it has them all, so a pass over a million records holds only the open ones)."""

    def __init__(self, body: IO[bytes], group_size: int | None = None) -> None:
        self.body, self.group_size, self.count = body, group_size, None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.body.seek(0)
        self.body.readline()  # {"verify_responses":[
        n = 0
        for line in self.body:
            line = line.rstrip(b"\n")
            if line == b"]}":
                break
            yield _decode(line[:-1] if line.endswith(b",") else line)
            n += 1
        self.count = n

    def __len__(self) -> int:
        if self.count is None:
            for _ in self:
                pass
        return self.count or 0


_DECODER = msgspec.json.Decoder()


def _decode(line: bytes) -> Any:
    """``json.loads(line)``: msgspec's decoder (about three times faster; an env's summary may read the
    records several times over), ``json.loads`` for what it refuses (``NaN``, which Python's JSON writes)."""
    try:
        return _DECODER.decode(line)
    except msgspec.DecodeError:
        return json.loads(line)


def local_aggregate(server: Any, body: IO[bytes], group_size: int | None, directory: Path) -> dict[str, Any]:
    """``server``'s ``/aggregate_metrics`` answer for the spooled ``body``: what its route would answer
    (422's message as a ``ValueError``), its ``group_level_metrics`` a :class:`SpilledGroups`."""
    records = SpooledRecords(body, group_size)
    aggregate = StreamingAggregate(group_size, directory=str(directory))
    for i, record in enumerate(records):
        try:
            parse_aggregate_request([record])
        except AggregateRequestError as e:
            raise ValueError(f"HTTP 422 (as the route answers it): record {i}: {e}") from None
        aggregate.add(record)
    return aggregate.result(server.aggregate_metrics(records))


SPILLED = "@@gym-bridge-spilled-groups-{}@@"


def write_aggregate_file(path: Path, entries: list[dict[str, Any]]) -> None:
    """Write NeMo Gym's ``_aggregate_metrics.json`` as ``write_json(path, entries, flat_below=3)`` does (a
    task's figures a line), streaming each :class:`SpilledGroups` from its file; via a temp file."""
    spilled: list[SpilledGroups] = []
    shown = []
    for entry in entries:
        groups = entry.get("group_level_metrics")
        if isinstance(groups, SpilledGroups):
            shown.append({**entry, "group_level_metrics": [SPILLED.format(len(spilled))] if len(groups) else []})
            if len(groups):
                spilled.append(groups)
        else:
            shown.append(entry)
    text = _indented(shown, 3, "")
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        for i, groups in enumerate(spilled):
            marker = f'"{SPILLED.format(i)}"'
            head, text = text.split(marker, 1)
            f.write(head)
            indent = head[head.rfind("\n") + 1 :]
            for n, line in enumerate(groups.lines()):
                f.write(("" if n == 0 else ",\n" + indent) + line.decode())
        f.write(text + "\n")
    os.replace(tmp, path)
