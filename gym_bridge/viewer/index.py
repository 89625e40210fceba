"""An index over a rollout JSONL file: byte offsets and a few numbers per line, records read on demand.

Why: a rollout file of a million lines is gigabytes; the viewer must open it in seconds and stay
small. One pass keeps, per good line, its offset and length and the columns of
:class:`~gym_bridge.viewer.records.RecordSummary` in typed arrays (about 50 bytes a line), and per task
its rollouts and :func:`~gym_bridge.viewer.groups.task_summary`; a record is parsed again only when a
page shows it (``os.pread``). Bad lines (invalid JSON or UTF-8, not an object, over the size limit)
are counted and the first ones kept with their line numbers for the overview; they never stop the scan.

The pass can run in a thread (:meth:`RolloutIndex.build`) while the app answers with its progress.
"""

from __future__ import annotations

import json
import math
import os
import threading
from array import array
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym_bridge.viewer.groups import SUCCESS_THRESHOLD, pass_at_k, task_summary
from gym_bridge.viewer.records import DecodeError, answer_text, prompt_text, summarize

__all__ = ["BadLine", "RolloutIndex", "TaskRow"]

MAX_LINE_BYTES = 64 * 1024 * 1024
TAIL_BYTES = 4096
KEPT_BAD_LINES = 50
NO_ANSWER = 0  # answer-hash column value of "no extracted answer"
DETAILS_KEPT = 1024  # per-task summaries cached (memory stays bounded whatever is browsed)
MAJORITY_UNKNOWN = -1.0  # not computed yet (NaN: computed, no answers to vote on)


@dataclass
class BadLine:
    lineno: int
    reason: str


@dataclass
class TaskRow:
    """One task (a GRPO group) as the overview lists it."""

    tid: int
    task_index: int
    env: str
    num_rollouts: int
    mean_reward: float
    pass_1: float
    pass_k: float
    majority_k: float | None
    failures: dict[str, int] = field(default_factory=dict)
    mean_output_tokens: float = 0.0
    mean_input_tokens: float = 0.0


class RolloutIndex:
    """The index of one JSONL file (see the module docstring). Build it once, then query it."""

    def __init__(self, path: str | os.PathLike[str], *, name: str | None = None) -> None:
        self.path = Path(path)
        self.name = name or self.path.name
        stat = self.path.stat()
        self.size = stat.st_size
        self._identity = (stat.st_dev, stat.st_ino, stat.st_mtime_ns)
        self._tail = b""  # the last bytes indexed: still there means the file was only appended to
        self.bytes_done = 0
        self.lines_done = 0
        self.ready = False
        self.error: str | None = None
        self.bad_lines = 0
        self.bad_examples: list[BadLine] = []
        # per record (good line)
        self.offsets = array("q")
        self.lengths = array("i")
        self.linenos = array("i")
        self.task_of = array("i")
        self.rewards = array("d")
        self.failure_codes = array("h")  # index into self.failure_kinds, -1 for none
        self.answer_hashes = array("q")
        self.input_tokens = array("i")
        self.output_tokens = array("i")
        self.failure_kinds: list[str] = []
        self.envs: list[str] = []
        self._answers_seen: dict[int, str] = {}
        # per task
        self._task_ids: dict[int, int] = {}
        self.task_prompt_keys = array("q")
        self.task_index = array("i")
        self.task_env = array("h")
        self.task_start = array("i")
        self.task_order = array("i")  # record ids grouped by task: task_order[task_start[t]:task_start[t+1]]
        self.task_n = array("i")
        self._summary: dict[str, Any] = {}
        self._search_cache: OrderedDict[str, set[int]] = OrderedDict()
        self._fd: int | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ building

    @property
    def num_records(self) -> int:
        return len(self.offsets)

    def build(self) -> RolloutIndex:
        """Scan the file once and finish the per-task tables; errors are kept in ``self.error``."""
        try:
            self._scan()
            self._finish_tasks()
            self._fd = os.open(self.path, os.O_RDONLY)
            self._tail = os.pread(self._fd, min(self.size, TAIL_BYTES), max(self.size - TAIL_BYTES, 0))
            self.ready = True
        except OSError as err:
            self.error = f"{self.path}: {err.strerror or err}"
        except Exception as err:  # noqa: BLE001 - the page must say it, not show "indexing" forever
            self.error = f"{self.path}: indexing stopped at line {self.lines_done + 1}: {type(err).__name__}: {err}"
        return self

    def start(self) -> threading.Thread:
        """Build in a daemon thread; the app shows ``progress`` until ``ready``."""
        thread = threading.Thread(target=self.build, name=f"index-{self.name}", daemon=True)
        thread.start()
        return thread

    @property
    def progress(self) -> float:
        return 1.0 if self.ready or not self.size else min(1.0, self.bytes_done / self.size)

    def running_totals(self) -> dict[str, Any]:
        """What the scan has found so far (the progress page shows it while a large file indexes)."""
        rewards = self.rewards[: len(self.rewards)]  # a copy: the scan may be appending
        n = len(rewards)
        return {
            "records": n,
            "tasks": len(self.task_prompt_keys),
            "bad_lines": self.bad_lines,
            "mean_reward": sum(r for r in rewards if r == r) / n if n else None,
        }

    def _bad(self, lineno: int, reason: str) -> None:
        self.bad_lines += 1
        if len(self.bad_examples) < KEPT_BAD_LINES:
            self.bad_examples.append(BadLine(lineno, reason))

    def _code(self, table: list[str], value: str) -> int:
        try:
            return table.index(value)
        except ValueError:
            if len(table) >= 32000:
                return -1
            table.append(value)
            return len(table) - 1

    def _scan(self) -> None:
        """The one pass; hot for large files, so attribute look-ups are hoisted out of the loop."""
        fail_codes: dict[str, int] = {}
        env_codes: dict[str, int] = {}
        task_ids = self._task_ids
        add_offset, add_length, add_lineno = self.offsets.append, self.lengths.append, self.linenos.append
        add_task, add_reward, add_failure = self.task_of.append, self.rewards.append, self.failure_codes.append
        add_answer, add_in, add_out = self.answer_hashes.append, self.input_tokens.append, self.output_tokens.append
        cap = 2**31 - 1
        offset = lineno = 0
        with open(self.path, "rb", buffering=1 << 20) as f:
            readline = f.readline
            while offset < self.size:
                raw = readline(MAX_LINE_BYTES + 1)
                if not raw:
                    break
                lineno += 1
                start = offset
                offset += len(raw)
                if len(raw) > MAX_LINE_BYTES and raw[-1:] != b"\n":
                    while raw and raw[-1:] != b"\n":
                        raw = readline(1024 * 1024)
                        offset += len(raw)
                    self._bad(lineno, f"line longer than {MAX_LINE_BYTES} bytes")
                    continue
                if not lineno & 4095:
                    self.bytes_done, self.lines_done = offset, lineno
                try:
                    s = summarize(raw)
                except DecodeError as e:
                    if raw.strip():
                        self._bad(lineno, str(e))
                    continue
                except RecursionError:
                    self._bad(lineno, "JSON nested deeper than the decoder allows")
                    continue
                tid = task_ids.get(s.group_key)
                if tid is None:
                    tid = task_ids[s.group_key] = len(self.task_prompt_keys)
                    self.task_prompt_keys.append(s.prompt_key)
                    self.task_index.append(s.task_index)
                    code = env_codes.get(s.env)
                    if code is None:
                        code = env_codes[s.env] = self._code(self.envs, s.env)
                    self.task_env.append(code)
                add_offset(start)
                add_length(len(raw))
                add_lineno(lineno)
                add_task(tid)
                add_reward(s.reward)
                if s.failure_kind is None:
                    add_failure(-1)
                else:
                    code = fail_codes.get(s.failure_kind)
                    if code is None:
                        code = fail_codes[s.failure_kind] = self._code(self.failure_kinds, s.failure_kind)
                    add_failure(code)
                add_answer(NO_ANSWER if s.answer is None else hash(s.answer) or 1)
                add_in(min(s.input_tokens, cap))
                add_out(min(s.output_tokens, cap))
        self.bytes_done, self.lines_done = offset, lineno

    def _finish_tasks(self) -> None:
        n_tasks = len(self.task_prompt_keys)
        counts = array("i", bytes(4 * (n_tasks + 1)))
        for tid in self.task_of:
            counts[tid + 1] += 1
        for t in range(n_tasks):
            counts[t + 1] += counts[t]
        self.task_start = array("i", counts)
        fill = array("i", counts)
        order = array("i", bytes(4 * self.num_records))
        for rid, tid in enumerate(self.task_of):
            order[fill[tid]] = rid
            fill[tid] += 1
        self.task_order = order
        self.task_n = array("i", (counts[t + 1] - counts[t] for t in range(n_tasks)))
        reward_sum = array("d", bytes(8 * n_tasks))
        correct = array("i", bytes(4 * n_tasks))
        failed = array("i", bytes(4 * n_tasks))
        out_tokens = array("q", bytes(8 * n_tasks))
        in_tokens = array("q", bytes(8 * n_tasks))
        for rid, tid in enumerate(self.task_of):
            r = self.rewards[rid]
            if r == r:  # not NaN: a missing reward counts as 0, as in gym_bridge.records.metrics
                reward_sum[tid] += r
                if r >= SUCCESS_THRESHOLD:
                    correct[tid] += 1
            if self.failure_codes[rid] >= 0:
                failed[tid] += 1
            out_tokens[tid] += self.output_tokens[rid]
            in_tokens[tid] += self.input_tokens[rid]
        n = self.task_n
        self.task_mean_reward = array("d", (reward_sum[t] / n[t] for t in range(n_tasks)))
        self.task_correct = correct
        self.task_failed = failed
        self.task_pass_1 = array("d", (pass_at_k(n[t], correct[t], 1) for t in range(n_tasks)))
        self.task_pass_k = array("d", (pass_at_k(n[t], correct[t], n[t]) for t in range(n_tasks)))
        self.task_out_tokens = array("d", (out_tokens[t] / n[t] for t in range(n_tasks)))
        self.task_in_tokens = array("d", (in_tokens[t] / n[t] for t in range(n_tasks)))
        self._details: dict[int, dict[str, Any]] = {}
        self._majority = array("d", [MAJORITY_UNKNOWN]) * n_tasks
        self._summary = self._file_summary()

    def task_details(self, tid: int) -> dict[str, Any]:
        """:func:`~gym_bridge.viewer.groups.task_summary` of one task (the last few are kept)."""
        details = self._details.get(tid)
        if details is None:
            rids = self.task_records(tid)
            answers = [None if self.answer_hashes[r] == NO_ANSWER else str(self.answer_hashes[r]) for r in rids]
            details = task_summary([self.rewards[r] for r in rids], answers, [self._failure(r) for r in rids])
            self._details[tid] = details
            if len(self._details) > DETAILS_KEPT:
                self._details.pop(next(iter(self._details)))
        return details

    def majority(self, tid: int) -> float | None:
        """majority@k of a task (k = its rollouts; None when no rollout reports an extracted answer).

        Kept per task once computed (sorting by it computes every task's once)."""
        value = self._majority[tid]
        if value == MAJORITY_UNKNOWN:
            found = self.task_details(tid).get(f"majority@{self.task_n[tid]}")
            value = self._majority[tid] = math.nan if found is None else found
        return None if math.isnan(value) else value

    def task_row(self, tid: int) -> TaskRow:
        details = self.task_details(tid)
        n = self.task_n[tid]
        env_code = self.task_env[tid]
        return TaskRow(
            tid=tid,
            task_index=self.task_index[tid],
            env=self.envs[env_code] if env_code >= 0 else "",
            num_rollouts=n,
            mean_reward=self.task_mean_reward[tid],
            pass_1=self.task_pass_1[tid],
            pass_k=self.task_pass_k[tid],
            majority_k=self.majority(tid),
            failures=details["failure_kinds"],
            mean_output_tokens=self.task_out_tokens[tid],
            mean_input_tokens=self.task_in_tokens[tid],
        )

    @property
    def num_tasks(self) -> int:
        return len(self.task_n)

    def _failure(self, rid: int) -> str | None:
        code = self.failure_codes[rid]
        return self.failure_kinds[code] if code >= 0 else None

    # ------------------------------------------------------------------ queries

    def task_records(self, tid: int) -> list[int]:
        return list(self.task_order[self.task_start[tid] : self.task_start[tid + 1]])

    def raw(self, rid: int) -> bytes:
        if self._fd is None:
            raise RuntimeError(f"{self.path} is not indexed yet")
        return os.pread(self._fd, self.lengths[rid], self.offsets[rid])

    def read(self, rid: int) -> dict[str, Any]:
        """The record of ``rid``; a note in its place where it nests past what this thread can parse."""
        return _load(self.raw(rid), self.linenos[rid])

    def change(self) -> tuple[str, str] | None:
        """How the file on disk now differs from the one indexed: ``(kind, words)`` or None.

        ``rewritten`` (in place: ``collect -o`` run again: the offsets no longer point at its lines) and
        ``replaced`` (renamed over) mean the numbers are another file's: the viewer indexes it again.
        ``appended`` (a collect still writing) and ``gone`` leave what was indexed readable (the file
        stays open): pages say so."""
        try:
            stat = os.stat(self.path)
        except OSError as err:
            return "gone", f"{self.path} can no longer be opened ({err.strerror}): this is the file as indexed"
        if (stat.st_dev, stat.st_ino) != self._identity[:2]:
            return "replaced", f"{self.path} was replaced by another file since it was indexed: this is the old one"
        if stat.st_size == self.size and stat.st_mtime_ns == self._identity[2]:
            return None
        if stat.st_size >= self.size and self._fd is not None:
            if os.pread(self._fd, len(self._tail), self.size - len(self._tail)) == self._tail:
                grown = stat.st_size - self.size
                if not grown:
                    return None
                return "appended", f"{grown:,} bytes were appended to {self.path} since it was indexed (not shown)"
        return "rewritten", f"{self.path} was rewritten since it was indexed"

    def failure_kind(self, rid: int) -> str | None:
        return self._failure(rid)

    def summary(self) -> dict[str, Any]:
        """File-level numbers for the overview's header."""
        return self._summary

    def _file_summary(self) -> dict[str, Any]:
        n = self.num_records
        k = min(self.task_n) if self.num_tasks else 0
        failures = Counter(self.failure_kinds[c] for c in self.failure_codes if c >= 0)
        return {
            "num_rollouts": n,
            "num_tasks": self.num_tasks,
            "mean_reward": sum(r for r in self.rewards if r == r) / n if n else None,
            "k": k,
            "pass_k": sum(pass_at_k(self.task_n[t], self.task_correct[t], k) for t in range(self.num_tasks))
            / self.num_tasks
            if self.num_tasks
            else None,
            "failure_kinds": dict(failures.most_common()),
            "bad_lines": self.bad_lines,
            "output_tokens": sum(self.output_tokens),
        }

    def search(self, needle: str) -> set[int]:
        """Task ids whose prompt, answer text or extracted answer contains ``needle`` (case-insensitive).

        One sequential pass over the file: a raw-byte pre-filter (the text as written, or as JSON escapes
        it), then the candidate lines are parsed and their texts checked. Recent queries are cached.
        """
        needle = needle.strip().lower()
        if not needle:
            return set(range(self.num_tasks))
        with self._lock:
            if needle in self._search_cache:
                self._search_cache.move_to_end(needle)
                return self._search_cache[needle]
        probes = {needle.encode(), json.dumps(needle)[1:-1].encode().lower(),
                  json.dumps(needle, ensure_ascii=False)[1:-1].encode()}
        hits: set[int] = set()
        rid, n, pos = 0, self.num_records, 0
        with open(self.path, "rb") as f:
            for raw in f:
                if rid >= n:
                    break
                if pos == self.offsets[rid]:
                    if self.task_of[rid] not in hits:
                        low = raw.lower()
                        if any(p in low for p in probes):
                            rec = _load(raw, self.linenos[rid])
                            text = " ".join((prompt_text(rec), answer_text(rec), str(rec.get("extracted_answer") or "")))
                            if needle in text.lower():
                                hits.add(self.task_of[rid])
                    rid += 1
                pos += len(raw)
        with self._lock:
            self._search_cache[needle] = hits
            while len(self._search_cache) > 16:
                self._search_cache.popitem(last=False)
        return hits

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _load(raw: bytes, lineno: int) -> dict[str, Any]:
    try:
        return json.loads(raw)
    except RecursionError:
        return {"viewer_note": f"line {lineno} nests too deeply to draw: open the raw file line"}
