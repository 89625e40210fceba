"""Group rollouts by task for the per-task transforms (DPO pairs, ranked groups).

NeMo Gym writes the rollouts of a task next to each other, tasks in increasing ``_ng_task_index``
(``a a b b c c``). :func:`iter_contiguous_groups` streams such a file holding one group at a time and
raises :class:`NotContiguous` at the first record that breaks the order; the caller then starts over
with :func:`iter_groups_on_disk`, which spills the records to a temporary SQLite file and reads them
back group by group, so memory stays bounded either way (only the on-disk pass costs disk and time).

A task is its ``_ng_task_index`` and its request (``instructions`` + ``input``, as a 16-byte digest): two
prompts under one index (the files of two runs concatenated, each counting its tasks from 0) are two
groups, where they had been one group of mixed prompts (a DPO pair whose "chosen" answered another
question). Order rule for streaming: integer task indices must increase from group to group (checked
with O(1) memory); rollouts without a task index are grouped by identical request, and each new group's
digest is checked against a set of digests (O(groups) memory).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["GroupKey", "NotContiguous", "group_key", "iter_contiguous_groups", "iter_groups_on_disk"]

GroupKey = tuple[int | None, bytes]
Numbered = tuple[int, dict[str, Any]]


class NotContiguous(Exception):
    """The input is not in task order (a task's rollouts are split, or task indices go down)."""

    def __init__(self, lineno: int) -> None:
        self.lineno = lineno
        super().__init__(f"line {lineno}: rollouts are not grouped by task in increasing task order")


def group_key(record: dict[str, Any]) -> GroupKey:
    """``(_ng_task_index or None, digest of the request's instructions and input)``."""
    index = record.get("_ng_task_index")
    if not isinstance(index, int) or isinstance(index, bool):
        index = None
    params = record["responses_create_params"]
    blob = json.dumps(
        [params.get("instructions"), params.get("input")],
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return index, hashlib.blake2b(blob.encode("utf-8"), digest_size=16).digest()


def _stored(key: GroupKey) -> str:
    """A group key as one SQLite value."""
    return f"{key[0]}:{key[1].hex()}"


class _OrderCheck:
    """Says whether a new group's key could not have been seen before."""

    def __init__(self) -> None:
        self._last_index: int | None = None
        self._seen_digests: set[bytes] = set()

    def is_new(self, key: GroupKey) -> bool:
        index, digest = key
        if index is not None:
            if self._last_index is not None and index <= self._last_index:
                return False
            self._last_index = index
            return True
        if digest in self._seen_digests:
            return False
        self._seen_digests.add(digest)
        return True


def _same_task(record: dict[str, Any], first: dict[str, Any]) -> bool:
    """Whether ``record`` is of ``first``'s task: the same task index and an equal request (compared as
    values: the group's other members cost no digest)."""
    index, params = record.get("_ng_task_index"), record["responses_create_params"]
    first_params = first["responses_create_params"]
    return (
        index == first.get("_ng_task_index")
        and type(index) is type(first.get("_ng_task_index"))
        and params.get("input") == first_params.get("input")
        and params.get("instructions") == first_params.get("instructions")
    )


def iter_contiguous_groups(records: Iterable[Numbered]) -> Iterator[list[Numbered]]:
    """Yield each task's ``(line, record)`` list from a task-ordered stream; NotContiguous when it is not."""
    check = _OrderCheck()
    current: GroupKey | None = None
    group: list[Numbered] = []
    for lineno, record in records:
        if group and _same_task(record, group[0][1]):
            group.append((lineno, record))
            continue
        key = group_key(record)
        if group and key == current:
            group.append((lineno, record))
            continue
        if not check.is_new(key):
            raise NotContiguous(lineno)
        if group:
            yield group
        current, group = key, [(lineno, record)]
    if group:
        yield group


def iter_groups_on_disk(
    records: Iterable[Numbered], spill_dir: str | Path | None = None
) -> Iterator[list[Numbered]]:
    """Group any stream through a temporary SQLite file; groups come out in order of first appearance."""
    with tempfile.TemporaryDirectory(prefix="gym-bridge-groups-", dir=spill_dir) as tmp:
        db = sqlite3.connect(Path(tmp) / "groups.sqlite")
        try:
            db.execute("PRAGMA journal_mode=OFF")
            db.execute("PRAGMA synchronous=OFF")
            db.execute("PRAGMA temp_store=FILE")
            db.execute("CREATE TABLE grp (gkey PRIMARY KEY, first_seq INTEGER)")
            db.execute("CREATE TABLE rec (seq INTEGER PRIMARY KEY, gkey, lineno INTEGER, body TEXT)")
            batch: list[tuple[int, str, int, str]] = []

            def flush() -> None:
                db.executemany("INSERT OR IGNORE INTO grp VALUES (?, ?)", [(k, s) for s, k, _, _ in batch])
                db.executemany("INSERT INTO rec VALUES (?, ?, ?, ?)", batch)
                batch.clear()

            for seq, (lineno, record) in enumerate(records):
                batch.append((seq, _stored(group_key(record)), lineno, json.dumps(record, ensure_ascii=False)))
                if len(batch) >= 5000:
                    flush()
            flush()
            db.execute("CREATE INDEX rec_by_group ON rec (gkey, seq)")
            db.commit()
            groups = db.execute("SELECT gkey FROM grp ORDER BY first_seq")
            for (key,) in groups:
                rows = db.execute("SELECT lineno, body FROM rec WHERE gkey = ? ORDER BY seq", (key,))
                yield [(lineno, json.loads(body)) for lineno, body in rows]
        finally:
            db.close()
