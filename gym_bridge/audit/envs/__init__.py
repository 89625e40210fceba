"""The attack catalogue, one module per kind of environment; :mod:`gym_bridge.audit.web` adds what any
server faces. Each module's ``attacks(options)`` returns its attacks, the controls among them."""

from __future__ import annotations

from gym_bridge.audit.attacks import Attack, AuditOptions, RawAttack
from gym_bridge.audit.envs import code, judge, math, reasoning_gym, tool_use
from gym_bridge.audit.web import web_attacks

__all__ = ["ENVS", "catalogue"]

ENVS = {"math": math, "code": code, "tool_use": tool_use, "reasoning_gym": reasoning_gym, "judge": judge}


def catalogue(env: str, options: AuditOptions | None = None) -> tuple[list[Attack], list[RawAttack]]:
    """``env``'s attacks (controls first) and the raw requests every server must refuse."""
    attacks = ENVS[env].attacks(options or AuditOptions())
    attacks.sort(key=lambda a: not a.control)
    control = next(a for a in attacks if a.control)
    return attacks, web_attacks(control)
