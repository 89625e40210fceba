"""Records, the bottom floor: the formats everything reads and writes.

Owns NeMo Gym's protocol objects as pydantic models (``schema``), chat messages (``chat``), JSONL I/O
(``jsonl``), metrics over verified rollouts (``metrics``, ``aggregate``), per-rollout seeds
(``seeding``) and the rollout record as NeMo Gym writes it (``nemo_gym_record``, ``nemo_gym_shapes``).

May import: the standard library, pydantic, and its own modules; nothing else of gym_bridge (every
other package, ``data/`` and the sibling ``transforms`` included, imports it). Importing it stays cheap.
"""
