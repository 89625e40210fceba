"""The hostile suite as a command: what a reward-hacking policy or a hostile web page tries, run against
any NeMo Gym-protocol resources server (``gym-bridge audit URL --env ...``).

Owns the attack catalogue (:mod:`.envs`, one module per environment kind, and :mod:`.web` for what any
server faces), the runner that plays each attack through the one agent loop with a scripted model
(:mod:`.run`), and the report (:mod:`.report`). Runs floor: it imports the agent, the schema and the
HTTP substrate (the in-process client, ``json_http``, ``retry``); nothing imports it but the command.
"""

from gym_bridge.audit.attacks import ATTACK_CLASSES, Attack, Finding, Outcome
from gym_bridge.audit.run import AuditReport, run_audit

__all__ = ["ATTACK_CLASSES", "Attack", "AuditReport", "Finding", "Outcome", "run_audit"]
