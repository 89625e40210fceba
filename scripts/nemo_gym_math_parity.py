r"""Regenerate tests/data/nemo_gym/math_parity.jsonl: NeMo Gym 0.7.0's own math verdicts on varied answers.

Run it with the Python of a NeMo Gym install (not the project's venv), from anywhere:

    /tmp/nemogym-dev/venv/bin/python scripts/nemo_gym_math_parity.py [--out PATH] [--check-only]

Each row is an (expected answer, response text) pair -- integers, fractions, decimals, percents, roots,
pi, intervals, sets, tuples, units, text, lookalike Unicode, ``\fbox``, ``\boxed`` variants, several or
empty boxes, relations, negations, huge numbers, near misses, prose around the box (the table:
``scripts/nemo_gym_math_parity_cases.py``) -- scored by NeMo Gym's ``math_with_judge`` server code with
its judge off (``LibraryJudgeMathResourcesServer._verify_answer``: its last-box gate, then math-verify in
a forked process, as its ``/verify`` runs it). The table records NeMo Gym's reward, extracted answer and
version; ``resources_servers/math/tests/test_math_parity.py`` checks the math server's default rule against
every row over HTTP, without NeMo Gym installed.

A 0 that took NeMo Gym more than ``--max-seconds`` is scored again alone, and left out if it is still
that slow (it may be one of its timeouts, which depend on the machine's speed: no fixed reference); the
script prints those. (A 1 is never a timeout.) ``--check-only`` writes nothing and
prints how many rows the stored table's verdicts differ from a fresh run (0 expected).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nemo_gym_math_parity_cases import cases  # the table of answers, beside this script

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "data" / "nemo_gym" / "math_parity.jsonl"


def _server() -> Any:
    """NeMo Gym's math_with_judge server object, judge off, without starting a web server."""
    from resources_servers.math_with_judge.app import LibraryJudgeMathResourcesServer

    config = SimpleNamespace(
        should_use_judge=False, library_verifier_timeout_seconds=10.0, library_verifier_max_concurrency=2
    )
    return LibraryJudgeMathResourcesServer.model_construct(config=config)


async def _score(
    rows: list[tuple[str, str, str]], max_seconds: float
) -> tuple[list[dict[str, Any]], list[Any]]:
    server = _server()
    versions = {
        "nemo_gym_version": importlib.metadata.version("nemo-gym"),
        "math_verify_version": importlib.metadata.version("math-verify"),
    }
    semaphore = asyncio.Semaphore(2)

    async def one(index: int, category: str, expected: str, text: str) -> tuple[dict[str, Any], float]:
        async with semaphore:
            start = time.perf_counter()
            reward, extracted, library_reward, _ = await server._verify_answer("Solve it.", expected, text)
            seconds = time.perf_counter() - start
        row = {
            "id": f"{category}-{index:03d}",
            "category": category,
            "expected_answer": expected,
            "response_text": text,
            "nemo_gym_reward": reward,
            "nemo_gym_extracted_answer": extracted,
            **versions,
        }
        return row, seconds

    results = await asyncio.gather(*(one(i, *row) for i, row in enumerate(rows)))
    kept, slow = [], []
    for index, (row, seconds) in enumerate(results):
        if seconds > max_seconds and row["nemo_gym_reward"] == 0.0:
            # A 0 that took long may be a timeout on a busy machine: score it again, alone.
            row, seconds = await one(index, *rows[index])
        if seconds > max_seconds and row["nemo_gym_reward"] == 0.0:
            slow.append((row["id"], row["expected_answer"], row["response_text"], seconds))
        else:
            kept.append(row)
    return kept, slow


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--max-seconds", type=float, default=3.0, help="leave out zeros NeMo Gym took longer on"
    )
    parser.add_argument(
        "--check-only", action="store_true", help="compare with the stored table, write nothing"
    )
    args = parser.parse_args()
    try:
        import resources_servers.math_with_judge.app  # noqa: F401
    except ImportError as e:
        print(
            f"NeMo Gym's math_with_judge is not importable here ({e}): run this with NeMo Gym's Python",
            file=sys.stderr,
        )
        return 2
    rows, slow = asyncio.run(_score(cases(), args.max_seconds))
    for entry in slow:
        print(f"left out (NeMo Gym took {entry[3]:.1f} s): {entry[:3]}")
    if args.check_only:
        stored = {row["id"]: row for row in map(json.loads, args.out.read_text().splitlines())}
        differ = [
            row["id"]
            for row in rows
            if row["id"] in stored and stored[row["id"]]["nemo_gym_reward"] != row["nemo_gym_reward"]
        ]
        print(f"{len(rows)} rows scored, {len(differ)} differ from {args.out}: {differ}")
        return 1 if differ else 0
    args.out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    ones = sum(row["nemo_gym_reward"] for row in rows)
    print(f"wrote {len(rows)} rows ({ones:.0f} scored 1) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
