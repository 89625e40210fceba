"""The GPU check's dry run (``--device cpu --tiny``): the script a lent GPU machine runs cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "cpu", "--tiny", "--steps", "2",
         "--out", str(tmp_path)],  # fmt: skip
        capture_output=True, text=True, timeout=900, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                                          "HOME": str(Path.home())},  # fmt: skip
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["ok"] is True
    assert report["environment"]["device"] == "cpu" and report["environment"]["torch"]
    assert report["matmul_flops"]["float32"] > 0 and report["matmul_flops"]["bfloat16"] > 0
    for precision in ("float32", "bfloat16"):
        row = report["tiny"][precision]
        assert row["steps"] == 2 and row["ok"] and row["reward_gap"] <= 0.15
    lora = report["lora"]
    assert lora["recipe"] == "grpo_math_tiny_lora.yaml" and lora["steps"] == 2
    assert 0 < lora["mfu"] < 1 and lora["step_s"] > 0
    assert report["refit"] == {"tokens_equal": True, "changed_by_refit": True, "ok": True}
    table = done.stdout.splitlines()
    assert table[-3:] == [f"check         {name}: ok" for name in
                          ("tiny float32 vs cpu", "tiny bfloat16 vs cpu", "refit greedy tokens")]  # fmt: skip
