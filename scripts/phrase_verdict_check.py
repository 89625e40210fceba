"""Re-verify logged rollouts through the math server, on two checkouts, and report verdicts that differ.

Why: a change to how the math server reads answers changes rewards, and the committed recipe figures
came from runs scored by the old rule. This sends every logged rollout's response to a real math server
(``/verify`` over loopback HTTP, ``extraction: boxed_or_final``, the shipped recipes' rule) built from
each checkout, and compares reward, ``failure_kind`` and ``extraction_method`` per rollout.

    .venv/bin/python scripts/phrase_verdict_check.py --before /tmp/old-checkout --after . \\
        '/tmp/recres/keep-*/*/logs/rollouts/step_*.jsonl'

Prints how many verdicts (reward, failure_kind, method) differ, with examples; exits 1 when any reward
differs. Not used by the tests.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

WORKER_FLAG = "--verdicts-of"


def _rollouts(patterns: list[str]) -> list[dict[str, Any]]:
    rows = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            with open(path) as handle:
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        record = json.loads(line)
                        rows.append({"where": f"{path}:{number}", **record})
    return rows


def _body(record: dict[str, Any], extraction: str) -> dict[str, Any]:
    """The /verify request of a logged rollout: its response's messages and its task fields."""
    output = []
    for item in record["response"]["output"]:
        if item.get("type") == "message":
            output.append({k: item[k] for k in ("type", "role", "id", "content") if k in item})
    body = {
        "responses_create_params": record["responses_create_params"],
        "response": {"id": record["response"].get("id", "resp"), "output": output},
        "expected_answer": record["expected_answer"],
        "extraction": extraction,
    }
    if record.get("question") is not None:
        body["question"] = record["question"]
    return body


def _verdicts_here(rollouts_json: str, extraction: str, out_path: str) -> None:
    """Runs inside one checkout (its root on sys.path): a real math server, every rollout to /verify."""
    import httpx

    from gym_bridge.serving.uvicorn_thread import start_in_thread
    from resources_servers.math.app import MathConfig, MathServer

    records = json.loads(Path(rollouts_json).read_text())
    server = MathServer(config=MathConfig(pool_size=2, cache_size=0))
    with (
        start_in_thread(server.build_app()) as running,
        httpx.Client(base_url=running.url, timeout=120) as client,
    ):

        def verify(record: dict[str, Any]) -> dict[str, Any]:
            out = client.post("/verify", json=_body(record, extraction))
            out.raise_for_status()
            got = out.json()
            return {
                key: got.get(key)
                for key in ("reward", "failure_kind", "extraction_method", "extracted_answer")
            }

        with ThreadPoolExecutor(8) as pool:
            verdicts = list(pool.map(verify, records))
    Path(out_path).write_text(json.dumps(verdicts))


def _text(record: dict[str, Any]) -> str:
    parts = [
        part.get("text", "")
        for item in record["response"]["output"]
        if item.get("type") == "message"
        for part in item.get("content", [])
    ]
    return "".join(parts)


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == WORKER_FLAG:
        _verdicts_here(sys.argv[2], sys.argv[3], sys.argv[4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="root of the checkout before the change")
    parser.add_argument("--after", default=".", help="root of the checkout after the change (default: .)")
    parser.add_argument("--extraction", default="boxed_or_final")
    parser.add_argument("--examples", type=int, default=10)
    parser.add_argument("rollouts", nargs="+", help="rollout JSONL files or glob patterns")
    args = parser.parse_args()
    records = _rollouts(args.rollouts)
    if not records:
        print("no rollouts found", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        rollouts_json = Path(tmp, "rollouts.json")
        rollouts_json.write_text(json.dumps(records))
        verdicts = {}
        for name, root in (("before", args.before), ("after", args.after)):
            root = str(Path(root).resolve())
            out = Path(tmp, f"{name}.json")
            env = {**os.environ, "PYTHONPATH": root}
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                WORKER_FLAG,
                str(rollouts_json),
                args.extraction,
                str(out),
            ]
            subprocess.run(command, cwd=root, env=env, check=True)
            verdicts[name] = json.loads(out.read_text())
    before, after = verdicts["before"], verdicts["after"]
    logged = sum(1 for r, b in zip(records, before, strict=True) if r.get("reward") != b["reward"])
    methods = Counter(b["extraction_method"] for b in before)
    differ = [
        (record, old, new)
        for record, old, new in zip(records, before, after, strict=True)
        if (old["reward"], old["failure_kind"], old["extraction_method"])
        != (new["reward"], new["failure_kind"], new["extraction_method"])
    ]
    rewards_differ = sum(1 for _, old, new in differ if old["reward"] != new["reward"])
    print(f"rollouts: {len(records)}; extraction methods before: {dict(methods)}")
    print(f"logged reward != re-verified before: {logged}")
    print(
        f"verdicts that differ (reward, failure_kind or method): {len(differ)}; rewards that differ: {rewards_differ}"
    )
    for record, old, new in differ[: args.examples]:
        print(f"- {record['where']} expected {record['expected_answer']!r}: {_text(record)[-160:]!r}")
        print(f"    before {old}\n    after  {new}")
    return 1 if rewards_differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
