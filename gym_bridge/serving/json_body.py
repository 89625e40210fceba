"""A request body: read whole within its size, time and memory limits, then parsed as JSON within its own.

Why its own module: what a body may be (how large, how long in coming, how deeply nested, whether its
text is valid Unicode) is the first line of defence of every server, and each limit has its reason
written beside it; :class:`~gym_bridge.serving.json_http.JsonApp` calls :func:`read_body` and
:func:`parse_body`, and turns their refusals into answers.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from gym_bridge.records.jsonl import parse_json
from gym_bridge.serving.body_budget import BodyClaim
from gym_bridge.serving.deadlines import TaskDeadlines

if TYPE_CHECKING:
    from gym_bridge.serving.answers import Answer, ErrorStyle

MAX_JSON_DEPTH = 256
"""Deepest nesting of arrays and objects a request body may have (deeper: 400 naming this limit)."""
MAX_JSON_CONTAINERS = 100_000
"""Arrays and objects any request body may hold; a body may hold one more per :data:`BYTES_PER_CONTAINER`
bytes of its size. Why: parsing is the one step of a request that runs whole on the server's event loop, and
tiny containers are its worst case: 16 MB of ``[[],[],...]`` (5.6 million lists) held every other request
for 16 s (21 s and 930 MB for a ``/verify`` whose ``response.output`` was 5.6 million ``{}``). Real bodies
spend tens of bytes on each array or object (a rollout's output item, an aggregate record: 30 to 100+)."""
BYTES_PER_CONTAINER = 16
NO_BODY = object()
"""What :func:`parse_body` returns for an empty body."""


class BodyRefused(Exception):
    """The body is not acceptable JSON; ``answer`` says why, shaped by the app's error style."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE_BYTES = re.compile(rb"\xed[\xa0-\xbf]")
"""A surrogate written out as UTF-8 bytes (CESU-8, or ``\\ud800`` encoded with ``surrogatepass``): not
UTF-8, yet the parse (``surrogatepass``, as ``json.loads`` decodes bytes) reads it as a lone surrogate."""


def _has_lone_surrogate(value: Any, body: bytes) -> bool:
    """True when the parsed body holds text with a surrogate code point (it could never be echoed as UTF-8).

    Cheap scans of the raw bytes first (surrogate escapes, surrogates encoded as bytes, a NUL byte among
    the first four: a UTF-16 or -32 body); only bodies that have one are re-encoded.
    """
    suspect = (
        (b"\\u" in body and _SURROGATE_ESCAPE.search(body) is not None)
        or (b"\xed" in body and _SURROGATE_BYTES.search(body) is not None)
        or b"\x00" in body[:4]
    )
    if not suspect:
        return False
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


_COUNT_CHUNK = 16 * 1024
"""Bytes of a body whose brackets :func:`_too_deep` counts at a time (it stops once there are enough)."""


def _too_deep(value: Any, raw: bytes) -> bool:
    """True when ``value`` (parsed from ``raw``) nests arrays/objects deeper than :data:`MAX_JSON_DEPTH`.

    A body too short to open and close that many brackets is not looked at, nor one with no more
    ``{``/``[`` bytes than the limit (each array or object has its opening byte in ``raw``, in UTF-8, -16
    or -32 alike, so such a body cannot nest deeper). Counting them is C's job (~6 instructions a byte,
    ~12k for a rollout's ``/verify`` body, whose walk cost ~52k), in chunks, so a large body with many
    brackets is counted only until there are enough. Others are walked a level at a time, one
    comprehension per level (no recursion, no call per container: ``/aggregate_metrics`` bodies of a
    whole run have tens of thousands of containers).
    """
    if len(raw) <= 2 * MAX_JSON_DEPTH:
        return False
    openers = 0
    for start in range(0, len(raw), _COUNT_CHUNK):
        end = start + _COUNT_CHUNK
        openers += raw.count(b"{", start, end) + raw.count(b"[", start, end)
        if openers > MAX_JSON_DEPTH:
            break
    else:
        return False
    level = [value] if type(value) is dict or type(value) is list else []  # JSON makes no subclasses
    for _ in range(MAX_JSON_DEPTH):
        level = [
            child
            for node in level
            for child in (node.values() if type(node) is dict else node)
            if type(child) is dict or type(child) is list
        ]
        if not level:
            return False
    return True


def non_finite(value: Any) -> tuple[Any, ...] | None:
    """Where the first NaN or Infinity sits in a parsed body (Python's JSON reads those bare words)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        node, here = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return here
        if isinstance(node, dict):
            stack.extend((v, (*here, k)) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((v, (*here, i)) for i, v in reversed(list(enumerate(node))))
    return None


def _too_many_containers(raw: bytes) -> int | None:
    """The bound on arrays and objects ``raw`` passes (counted as its ``{``/``[`` bytes, which are at least as
    many), or None. A body too short to hold more than the base allowance is not counted."""
    limit = MAX_JSON_CONTAINERS + len(raw) // BYTES_PER_CONTAINER
    if len(raw) // 2 <= limit:  # each array or object takes two bytes at least
        return None
    return limit if raw.count(b"[") + raw.count(b"{") > limit else None


def parse_body(raw: bytes, style: ErrorStyle) -> Any:
    """The JSON value of a request body (``NO_BODY`` when empty); refusals raise :class:`BodyRefused`."""
    if not raw:
        return NO_BODY
    if (limit := _too_many_containers(raw)) is not None:
        detail = (f"body holds more JSON arrays and objects than the limit of {limit:,} for its size "
                  f"({MAX_JSON_CONTAINERS:,}, and one per {BYTES_PER_CONTAINER} bytes)")  # fmt: skip
        raise BodyRefused(style.error(400, detail, "body"))
    too_deep = f"JSON nested deeper than the limit of {MAX_JSON_DEPTH} levels"
    try:
        value = parse_json(raw)
    except json.JSONDecodeError as e:
        error = {"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                 "input": {}, "ctx": {"error": e.msg}}  # fmt: skip
        raise BodyRefused(style.invalid([error], e.doc)) from None
    except RecursionError:
        raise BodyRefused(style.error(400, too_deep, "body")) from None
    except ValueError:  # not UTF-8/16/32 text at all
        raise BodyRefused(style.error(400, "There was an error parsing the body")) from None
    if _too_deep(value, raw):
        raise BodyRefused(style.error(400, too_deep, "body"))
    if _has_lone_surrogate(value, raw):
        detail = (
            "body holds a lone UTF-16 surrogate escape (e.g. \\ud800) or a surrogate encoded as bytes, "
            "which is not valid Unicode text"
        )
        raise BodyRefused(style.error(400, detail, "body"))
    return value


class BodyTooLarge(Exception):
    """The request body passed the limit given to :func:`read_body`."""


def read_body(
    receive: Any,
    limit: int | None = None,
    claim: BodyClaim | None = None,
    deadlines: TaskDeadlines | None = None,
) -> Awaitable[bytes | None]:
    """The whole request body, to await; None when the client went away (:class:`BodyTooLarge` past
    ``limit`` bytes, ``TimeoutError`` when it is not all there ``deadlines.seconds`` after this call,
    :class:`BodiesBusy` when ``claim`` cannot take it from its budget). ``deadlines``: the loop's, whose
    one timer serves every request's body deadline; None, no deadline."""
    reading = _read_chunks(receive, limit, claim or BodyClaim(None))
    return reading if deadlines is None else deadlines.within(reading)


async def _read_chunks(receive: Any, limit: int | None, claim: BodyClaim) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if limit is not None and size > limit:
                raise BodyTooLarge
            claim.take(len(chunk))
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
