"""Streaming JSONL I/O that never loses data and always says where a bad line is; JSON text in and out
at the least cost per value (:func:`compact_json`, :func:`parse_json`).

Readers stream (constant memory), report each bad line with its file and line number, and either skip
it or stop (``strict``). Writers append one complete line at a time and flush it, so a crash leaves at
most one torn line at the end, which :func:`repair_torn_tail` removes before a resumed run appends.
"""

from __future__ import annotations

import json
import json.scanner
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _encoder(
    *, ascii: bool, separators: tuple[str, str], default: Callable[[Any], Any], allow_nan: bool
) -> Callable[[Any, int], Iterable[str]]:
    """The C encoder ``json.dumps`` makes for these options (as a function ``(obj, 0) -> chunks``), made once."""
    make = json.encoder.c_make_encoder
    if make is None:  # pragma: no cover - an interpreter without the C accelerator
        encoder = json.JSONEncoder(
            ensure_ascii=ascii, separators=separators, default=default, allow_nan=allow_nan
        )
        return lambda obj, _: (encoder.encode(obj),)
    # No ``markers`` (the containers being encoded, kept to refuse a circular value): without them the
    # encoder keeps no state between calls, so one serves every call and thread; a circular value ends
    # in RecursionError instead of ValueError.
    strings = json.encoder.encode_basestring_ascii if ascii else json.encoder.encode_basestring
    item, key = separators
    return make(None, default, strings, None, key, item, False, False, allow_nan)


_refuse = json.JSONEncoder().default  # TypeError naming the type, as json.dumps says it
_COMPACT = _encoder(ascii=False, separators=(",", ":"), default=_refuse, allow_nan=True)
_COMPACT_FINITE = _encoder(ascii=False, separators=(",", ":"), default=_refuse, allow_nan=False)
_PLAIN = _encoder(ascii=True, separators=(", ", ": "), default=str, allow_nan=True)


def compact_json(obj: Any, *, finite: bool = False) -> str:
    """``json.dumps(obj, ensure_ascii=False, separators=(",", ":"))`` (``finite``: with ``allow_nan=False``).

    The same text from the same C encoder, made once: ``json.dumps`` with any argument builds a
    ``JSONEncoder`` and a C encoder on every call, a quarter of the cost of encoding a rollout record, and
    collect encodes several per rollout (each request body, each line it writes).
    """
    return "".join((_COMPACT_FINITE if finite else _COMPACT)(obj, 0))


def plain_json(obj: Any) -> str:
    """``json.dumps(obj, default=str)``, from an encoder made once (as :func:`compact_json`): the flat parts
    of a file written for people (an aggregate file's line per task)."""
    return "".join(_PLAIN(obj, 0))


_SCAN = json.scanner.c_make_scanner(json.JSONDecoder())
_OPENERS = frozenset(b"{[")


def parse_json(raw: bytes) -> Any:
    """``json.loads(raw)``: the same value, and the same error for what is not JSON.

    Why: for a small body, ``json.loads`` spends most of its time around the parse (guessing the
    encoding, two regular-expression matches for the whitespace around the value): 4 of 5 us for a
    rollout's request bodies. A body that starts with ``{`` or ``[`` and a byte that is not NUL is
    UTF-8 by ``json.loads``'s own rule, and one that ends with its value needs neither match; anything
    else, and every error, goes through ``json.loads`` itself.
    """
    if len(raw) > 1 and raw[0] in _OPENERS and raw[1]:
        try:
            text = raw.decode("utf-8", "surrogatepass")
            value, end = _SCAN(text, 0)
            if end == len(text):
                return value
        except (ValueError, StopIteration, RecursionError):
            pass
    return json.loads(raw)


class JsonlError(ValueError):
    """A bad line in a JSONL file; the message names the file and the 1-based line number."""

    def __init__(self, path: str | os.PathLike[str], lineno: int, reason: str) -> None:
        self.path = str(path)
        self.lineno = lineno
        self.reason = reason
        super().__init__(f"{self.path}:{lineno}: {reason}")


@dataclass
class ReadStats:
    """Counts kept while streaming a file, for the end-of-run report."""

    read: int = 0
    skipped: int = 0


def _decode_line(path: str | os.PathLike[str], lineno: int, raw: bytes) -> dict[str, Any] | None:
    """Parse one raw line; None for a blank line, JsonlError for anything that is not a JSON object."""
    if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 byte-order mark, as Windows tools write one: not part of the first row
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise JsonlError(path, lineno, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    text = text.strip()
    if not text:
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise JsonlError(path, lineno, f"invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(obj, dict):
        raise JsonlError(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
    return obj


def iter_jsonl(
    path: str | os.PathLike[str],
    *,
    strict: bool = True,
    on_error: Callable[[JsonlError], None] | None = None,
    stats: ReadStats | None = None,
    max_line_bytes: int = 256 * 1024 * 1024,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each JSON object line of ``path``.

    With ``strict`` a bad line raises :class:`JsonlError`; otherwise it is passed to ``on_error`` and
    skipped. Lines longer than ``max_line_bytes`` are bad lines too (they are never held in memory whole).
    """
    stats = stats if stats is not None else ReadStats()
    with open(path, "rb") as f:
        lineno = 0
        while True:
            raw = f.readline(max_line_bytes + 1)
            if not raw:
                return
            lineno += 1
            try:
                if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                    # Skip the rest of the oversized line without loading it.
                    while raw and not raw.endswith(b"\n"):
                        raw = f.readline(1024 * 1024)
                    raise JsonlError(path, lineno, f"line longer than {max_line_bytes} bytes")
                obj = _decode_line(path, lineno, raw)
            except JsonlError as err:
                if strict:
                    raise
                stats.skipped += 1
                if on_error is not None:
                    on_error(err)
                continue
            if obj is None:
                continue
            stats.read += 1
            yield lineno, obj


def repair_torn_tail(path: str | os.PathLike[str]) -> int:
    """Cut an unterminated (torn) last line left by a crash; return the number of bytes removed.

    Every complete line ends with a newline, so anything after the last newline is a partial write.
    """
    p = Path(path)
    if not p.exists():
        return 0
    size = p.stat().st_size
    if size == 0:
        return 0
    with open(p, "rb+") as f:
        chunk = 64 * 1024
        pos = size
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            buf = f.read(pos - start)
            idx = buf.rfind(b"\n")
            if idx >= 0:
                keep = start + idx + 1
                break
            pos = start
        else:
            keep = 0
        if keep < size:
            f.truncate(keep)
        return size - keep


class WriteFailed(OSError):
    """A write to a JSONL file failed (a full disk, a file-size limit, a lost mount); the message names the file."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


class JsonlWriter:
    """Append JSON objects one complete, flushed line at a time; safe to share between threads.

    Each line goes to the file in one unbuffered write (nothing waits in a buffer), so a failed write (a
    full disk, a file-size limit) raises :class:`WriteFailed` naming the file and leaves at most one torn
    line, which a resumed run cuts; closing after it has nothing left to flush that could fail again.
    """

    def __init__(self, path: str | os.PathLike[str], *, append: bool = True, fsync: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        self._lock = threading.Lock()
        self._f = open(self.path, "ab" if append else "wb", buffering=0)
        self.count = 0

    def write(self, obj: Any) -> None:
        self.write_line(compact_json(obj))

    def write_line(self, text: str) -> None:
        """Append ``text``, one JSON value already encoded (no newline in it), as a line."""
        data = memoryview((text + "\n").encode("utf-8"))
        with self._lock:
            try:
                while data:
                    data = data[self._f.write(data) :]
                if self._fsync:
                    os.fsync(self._f.fileno())
            except OSError as e:
                raise WriteFailed(e.errno, f"cannot write {self.path}: {e.strerror or e}", str(self.path)) from e
            except ValueError:  # the file was closed
                raise WriteFailed(f"cannot write {self.path}: the file is closed") from None
            self.count += 1

    def close(self) -> None:
        with self._lock:
            self._f.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
