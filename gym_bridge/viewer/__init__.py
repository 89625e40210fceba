"""``gym-bridge view``: a local web page over rollout files and training runs.

Owns reading rollout JSONL for people rather than for training: the on-disk index of a (possibly huge)
file (:mod:`.index`: byte offsets and a few numeric columns per line, records read on demand, bad lines
counted), the record shapes it understands and how they are drawn (:mod:`.records`: NeMo Gym rollouts,
``transform grpo`` rows, NeMo RL's token-only ``train_data_step`` lines), per-task aggregates and GRPO
advantages (:mod:`.groups`, reusing :mod:`gym_bridge.records.metrics` and :mod:`gym_bridge.train.algorithm.advantages`),
per-token log-prob colouring (:mod:`.tokens`), run comparison (:mod:`.compare`), training-run
directories (:mod:`.run_dir`) and the FastAPI app with its templates (:mod:`.app`).

Viewer floor: imports evaluation (ranked groups), the trainer's advantages and run-directory file
names, the tokenizer and the record formats; nothing imports it but ``gym-bridge view``.

Nothing here imports torch or transformers at start; the advantage of a group (torch) and a
``--tokenizer`` (transformers) are loaded the first time they are needed.
"""
