"""Rollout, the environments-and-agent floor: one task row in, one verified rollout out.

Owns the agent loop (``agent``), where environments come from (``envs``: built-in servers by name or any
URL), sessions spread over an environment's replicas (``env_router``), the simulated user of
multi-turn rows (``user_sim``), the LLM judge (``judge``) and the entrypoint NeMo Gym's ``gym env
start`` runs for our servers (``nemo_gym_entry``).

May import: :mod:`gym_bridge.records`, :mod:`gym_bridge.serving` and the floors between (models,
generation, policy); never evaluation, the runs (collect, train, ...), the viewer or the commands.
"""
