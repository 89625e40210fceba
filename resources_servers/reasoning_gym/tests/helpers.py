"""What the reasoning-gym server's tests share: a task row answered with one assistant message."""

from __future__ import annotations

from typing import Any


def answered(row: dict[str, Any], text: str) -> dict[str, Any]:
    """``row`` as a /verify body whose response is one assistant message saying ``text``."""
    return {**row, "response": {"output": [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]},
    ]}}  # fmt: skip
