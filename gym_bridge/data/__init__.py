"""Task data generators (deterministic, seed-driven) for recipes and tests.

Records floor: imports only :mod:`gym_bridge.records.jsonl`; the tiny model (:mod:`gym_bridge.models.tiny`) uses it.
"""
