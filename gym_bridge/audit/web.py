"""What any resources server faces from outside the agent loop: a web page's requests (a CORS "simple
request" needs no preflight; DNS rebinding arrives with a foreign ``Host``) and malformed bodies."""

from __future__ import annotations

import json
from collections.abc import Callable

from gym_bridge.audit.attacks import Attack, RawAttack

__all__ = ["web_attacks"]


def _refused(why: str) -> Callable[[int, bytes], str | None]:
    def check(status: int, body: bytes) -> str | None:
        return None if 400 <= status < 500 else f"HTTP {status}: {why}"

    return check


def _survived(status: int, body: bytes) -> str | None:
    """Any answer but a 5xx (filed by the runner) will do: the body only has to not break the server."""
    return None


def web_attacks(control: Attack) -> list[RawAttack]:
    """Raw requests built on the env's control row (a body the server would otherwise accept)."""
    verify_body = json.dumps({**control.row, "response": {"output": control.turns[-1]}}).encode()
    seed_body = json.dumps(control.row).encode()
    served = "served, so any web page the user opens can send it"
    return [
        RawAttack("text_plain_verify", "escape/leak", "POST /verify as text/plain (a CORS simple request)",
                  "/verify", verify_body, {"content-type": "text/plain"}, _refused(served)),
        RawAttack("form_seed_session", "escape/leak", "POST /seed_session as a form (a CORS simple request)",
                  "/seed_session", seed_body, {"content-type": "application/x-www-form-urlencoded"},
                  _refused(served)),
        RawAttack("foreign_host", "escape/leak", "POST /verify with Host: attacker.example (DNS rebinding)",
                  "/verify", verify_body, {"content-type": "application/json", "host": "attacker.example"},
                  _refused("a foreign Host was served, so a rebound DNS name reaches the server")),
        RawAttack("not_json", "crash", "a body that is not JSON", "/verify", b'{"response": ',
                  {"content-type": "application/json"}, _survived),
        RawAttack("wrong_types", "crash", "'response' as a string", "/verify",
                  json.dumps({**control.row, "response": "text"}).encode(),
                  {"content-type": "application/json"}, _survived),
        RawAttack("nested_body", "crash", "100,000 nested arrays", "/verify", b"[" * 100_000 + b"]" * 100_000,
                  {"content-type": "application/json"}, _survived),
        RawAttack("non_finite", "crash", "NaN and Infinity in the body", "/verify",
                  verify_body.replace(b"{", b'{"x": NaN, "y": Infinity, ', 1),
                  {"content-type": "application/json"}, _survived),
        RawAttack("lone_surrogate", "crash", "a lone UTF-16 surrogate in a string", "/verify",
                  verify_body.replace(b"{", b'{"x": "\\ud800", ', 1),
                  {"content-type": "application/json"}, _survived),
        RawAttack("surrogate_bytes", "crash", "a surrogate written as UTF-8 bytes (CESU-8) in a string", "/verify",
                  verify_body.replace(b"{", b'{"x": "\xed\xa0\x80", ', 1),
                  {"content-type": "application/json"}, _survived),
        RawAttack("aggregate_huge_integer", "crash", "/aggregate_metrics with a reward no float can hold",
                  "/aggregate_metrics", b'{"verify_responses": [{"reward": 1' + b"0" * 400 + b"}]}",
                  {"content-type": "application/json"}, _survived),
    ]  # fmt: skip
