"""The bearer-token header a client sends, built once: every caller of a server started with ``--token``
(an env, the policy server, a judge, a Ray head) sends the same ``authorization`` header."""

from __future__ import annotations

__all__ = ["bearer"]


def bearer(token: str | None) -> dict[str, str]:
    """The ``authorization`` header carrying ``token``; no header without one (None or empty)."""
    return {"authorization": f"Bearer {token}"} if token else {}
