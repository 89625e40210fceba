"""gym-bridge: NeMo Gym-compatible resources servers, rollout collection, transforms and a GRPO trainer.

The floor plan, bottom first. A package imports from its own floor or a lower one, never from a
higher one, and no two packages import each other (function-local imports included):
``tests/test_import_graph.py`` checks it, and its ``LAYERS`` list places every package and the two
modules left in this directory (``cli``, the entry point, and ``console``).

1. **records** (``records/``: ``schema``, ``chat``, ``jsonl``, ``aggregate``, ``metrics``, ``seeding``,
   ``nemo_gym_record``; ``data/``; the sibling ``transforms``): the formats everything reads and writes.
2. **substrate**: the HTTP layer (``serving/``: ``json_http``, ``server``, ``in_process``, ``retry``,
   ``deadlines``, ...), the consoles (``console``), the sandbox (``sandbox/``) and Ray (``distributed/``).
3. **models** (``models/``: loading, log-probs, the forward passes), then **generation**
   (``generation/``: sampling backends), then the **policy** server (``policy/``).
4. **environments and the agent** (``rollout/``: ``agent``, ``envs``, ``env_router``, ``user_sim``,
   ``judge``, ``nemo_gym_entry``).
5. **evaluation** (``evaluation/``), then the **runs** (``collect/``, ``train/``, ``audit/``,
   ``integrations/``), then the **viewer** (``viewer/``).
6. **commands** on top (``commands/``, ``cli``).
"""

__version__ = "0.1.0"  # the package version (pyproject reads it from here)
