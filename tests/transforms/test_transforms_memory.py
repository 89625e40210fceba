"""Transforms run in constant memory: 100x more input lines must not raise the peak RSS noticeably."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from transform_rollouts import rollout

REPO = Path(__file__).resolve().parents[2]

# Runs each transform on the small file (warm-up: imports, caches), takes the peak RSS, then runs them
# all on the big file and reports the peak again. ru_maxrss is in KiB on Linux.
_MEASURE = """
import json, resource, sys
from transforms.dpo import dpo_pairs
from transforms.grpo import to_grpo
from transforms.pipeline import run_grouped, run_records
from transforms.ranked import to_ranked
from transforms.sft import to_sft

small, big, out = sys.argv[1:]
def run_all(src):
    counts = [
        run_records(src, out, to_grpo).written,
        run_records(src, out, to_sft).written,
        run_grouped(src, out, dpo_pairs).written,
        run_grouped(src, out, to_ranked).written,
    ]
    return counts
small_counts = run_all(small)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
big_counts = run_all(big)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"small": small_counts, "big": big_counts, "base_kib": base, "peak_kib": peak}))
"""


def _write_rollouts(path: Path, n: int) -> None:
    """``n`` rollouts in NeMo Gym order: tasks of 4 rollouts (one prompt each), one of each 4 rewarded."""
    with open(path, "w") as f:
        for i in range(n):
            record = rollout(
                f"What is {i // 4} + 1? Think step by step.",
                f"The sum is {i + 1}.",
                float(i % 4 == 0),
                task=i // 4,
                repeat=i % 4,
            )
            f.write(json.dumps(record) + "\n")


def test_peak_memory_does_not_grow_with_input_size(tmp_path):
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    _write_rollouts(small, 2_000)
    _write_rollouts(big, 200_000)
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(small), str(big), str(tmp_path / "out.jsonl")],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    # grpo and sft (no filter here) write every rollout; dpo one pair per task; ranked one group per task.
    assert result["small"] == [2_000, 2_000, 500, 500]
    assert result["big"] == [200_000, 200_000, 50_000, 50_000]
    growth_mib = (result["peak_kib"] - result["base_kib"]) / 1024
    # Holding the 200k outputs would take well over 50 MiB; streaming stays within noise.
    print(f"peak RSS growth {growth_mib:.1f} MiB")
    assert growth_mib < 12, f"peak RSS grew by {growth_mib:.1f} MiB on 100x more lines"
