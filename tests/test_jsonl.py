"""JSONL reading reports bad lines by number; writing is line-atomic; torn tails are repaired; compact JSON
is json.dumps' text."""

from __future__ import annotations

import json
import threading

import pytest

from gym_bridge.records.jsonl import (
    JsonlError,
    JsonlWriter,
    ReadStats,
    compact_json,
    iter_jsonl,
    parse_json,
    plain_json,
    repair_torn_tail,
)


def test_reads_objects_with_line_numbers(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert list(iter_jsonl(p)) == [(1, {"a": 1}), (3, {"a": 2})]


@pytest.mark.parametrize(
    "content, reason",
    [
        (b'{"a": 1}\n{"a": \n', "invalid JSON"),
        (b'{"a": 1}\n[1, 2]\n', "expected a JSON object"),
        (b'{"a": 1}\n{"a": "\xff"}\n', "not valid UTF-8"),
    ],
)
def test_bad_line_is_named(tmp_path, content, reason):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(content)
    with pytest.raises(JsonlError, match=rf"bad.jsonl:2: {reason}"):
        list(iter_jsonl(p))
    errors, stats = [], ReadStats()
    rows = list(iter_jsonl(p, strict=False, on_error=errors.append, stats=stats))
    assert rows == [(1, {"a": 1})]
    assert stats.read == 1 and stats.skipped == 1 and errors[0].lineno == 2


def test_huge_line_is_skipped_without_loading(tmp_path):
    p = tmp_path / "huge.jsonl"
    p.write_bytes(b'{"a": "' + b"x" * 5000 + b'"}\n{"b": 1}\n')
    errors = []
    rows = list(iter_jsonl(p, strict=False, on_error=errors.append, max_line_bytes=1000))
    assert rows == [(2, {"b": 1})]
    assert "longer than 1000 bytes" in str(errors[0])


def test_repair_torn_tail(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": 3, "b"')
    assert repair_torn_tail(p) == len(b'{"a": 3, "b"')
    assert p.read_bytes() == b'{"a": 1}\n{"a": 2}\n'
    assert repair_torn_tail(p) == 0
    q = tmp_path / "only.jsonl"
    q.write_bytes(b'{"torn')
    assert repair_torn_tail(q) == 6 and q.read_bytes() == b""
    assert repair_torn_tail(tmp_path / "missing.jsonl") == 0


def test_writer_appends_complete_lines(tmp_path):
    p = tmp_path / "w.jsonl"
    with JsonlWriter(p) as w:
        w.write({"x": "ü"})
        # flushed: readable before close
        assert p.read_text(encoding="utf-8") == '{"x":"ü"}\n'
    with JsonlWriter(p) as w:
        w.write({"y": 2})
    assert [o for _, o in iter_jsonl(p)] == [{"x": "ü"}, {"y": 2}]
    assert w.count == 1


VALUES = [
    {"a": 'é \u2028 \U0001f600 "q" \\ \n\t\x00', "b": [1, -2.5, 1e300, 5e-324, -0.0, True, False, None]},
    {
        "nested": [[{"x": [{}]}], []],
        "n": 2**70,
        1: "int key",
        2.5: "float key",
        None: "null key",
        False: "bool key",
    },
    "a string",
    12,
    [],
    float("inf"),
]


@pytest.mark.parametrize("value", VALUES)
def test_compact_json_is_json_dumps(value):
    assert compact_json(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def test_compact_json_refuses_what_json_dumps_refuses():
    with pytest.raises(ValueError, match="not JSON compliant"):
        compact_json({"x": [float("nan")]}, finite=True)
    assert compact_json({"x": float("nan")}) == '{"x":NaN}'
    with pytest.raises(TypeError, match="Object of type set is not JSON serializable"):
        compact_json({"x": {1}})
    circular: list = []
    circular.append(circular)
    with pytest.raises(RecursionError):
        compact_json(circular)
    assert compact_json([1, "after the errors"]) == '[1,"after the errors"]'  # no state left behind


def test_compact_json_from_threads_at_once():
    """One encoder serves every thread: each gets its own text."""
    out: dict[int, list[str]] = {}

    def encode(i: int) -> None:
        out[i] = [compact_json({"thread": i, "row": j, "text": "x" * (i * 7 % 50)}) for j in range(2000)]

    threads = [threading.Thread(target=encode, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, texts in out.items():
        assert [json.loads(t) for t in texts] == [
            {"thread": i, "row": j, "text": "x" * (i * 7 % 50)} for j in range(2000)
        ]


PARSE_CASES = [
    b'{"a":[1,2.5,"\\u00e9",null,true],"b":{}}',
    b"[1,2]",
    b'{"a":1}  \n',  # trailing whitespace
    b'  {"a":1}',  # leading whitespace
    b'{"a":1} x',  # extra data
    b'{"a":1}{"b":2}',
    b'{"a":',  # cut short
    b"{}",
    b"[]",
    b"{",
    b"[nul]",
    b'"text"',
    b"12",
    b"",
    b'{"a":NaN,"b":-Infinity}',
    b'{"a":"\\ud800"}',  # a lone surrogate escape: Python's JSON reads it
    b'{"a":"\xed\xa0\x80"}',  # a surrogate as raw bytes: json.loads takes it (surrogatepass)
    b'{"a":"\xff"}',  # not UTF-8
    b'\xef\xbb\xbf{"a":1}',  # UTF-8 byte-order mark
    '{"a":"é"}'.encode("utf-16-le"),
    '{"a":"é"}'.encode("utf-16"),
    '["x"]'.encode("utf-32-be"),
    b"[" * 100_000 + b"]" * 100_000,  # deeper than the interpreter recurses
]


def _outcome(parse, raw):
    try:
        return "value", parse(raw)
    except Exception as e:  # the same kind of error, with the same message and place
        return type(e), str(e), getattr(e, "pos", None)


@pytest.mark.parametrize("raw", PARSE_CASES, ids=range(len(PARSE_CASES)))
def test_parse_json_is_json_loads(raw):
    assert repr(_outcome(parse_json, raw)) == repr(_outcome(json.loads, raw))


@pytest.mark.parametrize("value", [*VALUES, {"not JSON": {1, 2}, "é": [float("nan"), None]}])
def test_plain_json_is_json_dumps_with_str_for_the_rest(value):
    assert plain_json(value) == json.dumps(value, default=str)
