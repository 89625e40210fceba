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


STALE_VERDICT = {"reward_components": {"audit_stale": 1.0}, "mask_sample": True, "failure_kind": "audit_stale",
                 "failure_reason": "an earlier verdict"}  # fmt: skip
"""An earlier verdict, as a rollout record fed back as a task carries it."""


def _no_stale_verdict(status: int, body: bytes) -> str | None:
    """A 4xx will do (a server that needs a session); a 200 must not echo the request's verdict beside its own."""
    if status != 200:
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return "the answer is not JSON"
    echoed = sorted(k for k, v in STALE_VERDICT.items() if isinstance(answer, dict) and answer.get(k) == v)
    return f"the answer echoes the request's earlier verdict ({', '.join(echoed)})" if echoed else None


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
        RawAttack("stale_verdict", "wrong-reward", "a task row that carries an earlier verdict (reward_components, "
                  "mask_sample, failure_kind)", "/verify", json.dumps({**control.row, **STALE_VERDICT,
                  "response": {"output": control.turns[-1]}}).encode(), {"content-type": "application/json"},
                  _no_stale_verdict, needs_session=True),
        RawAttack("aggregate_huge_integer", "crash", "/aggregate_metrics with a reward no float can hold",
                  "/aggregate_metrics", b'{"verify_responses": [{"reward": 1' + b"0" * 400 + b"}]}",
                  {"content-type": "application/json"}, _survived),
    ]  # fmt: skip
