"""Shared fixtures: where the NeMo Gym reference records live (vendored in tests/data/nemo_gym)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFERENCE_DIR = REPO / "tests" / "data" / "nemo_gym"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    if not REFERENCE_DIR.is_dir():
        pytest.fail(f"NeMo Gym reference records not found at {REFERENCE_DIR}")
    return REFERENCE_DIR
