"""Helpers shared by the math server tests."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from resources_servers.math.app import MathConfig

REPO = Path(__file__).resolve().parents[3]
REFERENCE_DIR = REPO / "tests" / "data" / "nemo_gym"  # NeMo Gym records, vendored
TOKEN = "math-test-token"
# A short budget keeps the timeout tests quick; real answers take milliseconds.
TEST_CONFIG = MathConfig(timeout_s=1.0, kill_grace_s=0.5, pool_size=2)


def verify_body(text: str | None, expected: Any, **extra: Any) -> dict[str, Any]:
    """A ``/verify`` body whose response has one assistant message with ``text`` (no output if None)."""
    output = []
    if text is not None:
        content = [{"type": "output_text", "text": text, "annotations": []}]
        output.append({"type": "message", "role": "assistant", "id": "msg_1", "content": content})
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Solve it."}]},
        "response": {"id": "resp_1", "output": output},
        "expected_answer": expected,
        **extra,
    }


def wait_for_pool(url: str, headers: dict[str, str] | None = None, timeout: float = 120.0) -> dict[str, Any]:
    """Start the server's verifier workers (with a check that needs one; they start on demand) and
    return its ``verifier_pool`` health once they are all up."""
    body = verify_body("\\boxed{\\sqrt{4}}", "2")
    answer = httpx.post(f"{url}/verify", json=body, headers=headers, timeout=timeout)
    assert answer.status_code == 200 and answer.json()["reward"] == 1.0, answer.text
    deadline = time.monotonic() + timeout
    while True:
        pool = httpx.get(f"{url}/health", headers=headers, timeout=30).json()["verifier_pool"]
        if pool["started"] and not pool["starting"] and pool["live_workers"] == pool["size"]:
            return pool
        if time.monotonic() > deadline:
            raise AssertionError(f"the verifier pool did not start: {pool}")
        time.sleep(0.05)
