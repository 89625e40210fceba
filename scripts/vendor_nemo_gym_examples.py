"""Vendor the ``example_rollouts*.jsonl`` files that NeMo Gym's package ships, cut down, into the tests.

Usage: ``python scripts/vendor_nemo_gym_examples.py nemo_gym-0.7.0-py3-none-any.whl tests/data/nemo_gym_examples``
(the wheel from the package registry: ``pip download nemo-gym==0.7.0 --no-deps --python-version 3.13.14
--only-binary=:all:``). Why cut down: the 0.7.0 wheel holds ~200 such files, 28 MB. Kept per file: its
first line, plus the first line of every other record shape in it (keys present, kinds of output items),
so each odd shape NeMo Gym ships is kept; strings are cut to 200 characters and lists longer than 24 to
their first and last 12 items (the shapes the transforms read survive; texts do not). Lines that are not
JSON (NeMo Gym's ``<PLACEHOLDER ROW>`` files) are kept as they are. ``*_materialized_inputs.jsonl``
(task inputs, not rollouts) are left out, and byte-identical files are kept once.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

STRING_CAP = 200
LIST_CAP = 24


def shorten(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= STRING_CAP else value[:STRING_CAP] + "…"
    if isinstance(value, list):
        if len(value) > LIST_CAP:
            value = value[: LIST_CAP // 2] + value[-LIST_CAP // 2 :]
        return [shorten(v) for v in value]
    if isinstance(value, dict):
        return {k: shorten(v) for k, v in value.items()}
    return value


def shape(line: str) -> tuple[Any, ...]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return ("not json",)
    if not isinstance(record, dict):
        return (type(record).__name__,)
    response = record.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    kinds = (
        sorted({item.get("type", "?") if isinstance(item, dict) else type(item).__name__ for item in output})
        if isinstance(output, list)
        else [type(output).__name__]
    )
    return (tuple(sorted(k for k in record if not k.startswith("_"))), tuple(kinds))


def vendored_lines(text: str) -> list[str]:
    first_of_shape: dict[tuple[Any, ...], str] = {}
    for line in text.splitlines():
        if line.strip():
            first_of_shape.setdefault(shape(line), line)
    out = []
    for line in first_of_shape.values():
        try:
            out.append(json.dumps(shorten(json.loads(line)), ensure_ascii=False))
        except json.JSONDecodeError:
            out.append(line)
    return out


def main(wheel: str, out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    count = 0
    with zipfile.ZipFile(wheel) as zf:
        for name in sorted(zf.namelist()):
            base = name.rsplit("/", 1)[-1]
            if not (base.startswith("example_rollouts") and base.endswith(".jsonl")):
                continue
            if base.endswith("_materialized_inputs.jsonl"):
                continue
            data = zf.read(name)
            digest = hashlib.sha256(data).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            target = out / name.replace("/data/", "/").replace("/", "__")
            target.write_text("\n".join(vendored_lines(data.decode("utf-8"))) + "\n", encoding="utf-8")
            count += 1
    print(f"vendored {count} files into {out}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
