"""Bridges from other trainers to gym-bridge's (and NeMo Gym's) resources servers over HTTP.

:mod:`gym_bridge.integrations.trl` lets TRL's ``GRPOTrainer`` score with a resources server (a reward
function for single-turn tasks, an ``environment_factory`` for tool use). Nothing here imports TRL:
the bridge only follows its calling conventions, so it is usable (and tested) without it.

Runs floor: imports the agent and the record formats; nothing imports it.
"""
