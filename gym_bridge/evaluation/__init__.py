"""Offline evaluation of a model on stored data (``gym-bridge eval``): no servers, no generation.

Owns the ranked-group metrics (:mod:`.ranked`) and a model as a ranking scorer (:mod:`.scoring`).
Evaluation floor: imports the models floor and the records (``transforms`` included), nothing of the
trainer (a trainer checkpoint is loaded by :func:`gym_bridge.train.bookkeeping.checkpoint.load_model_or_checkpoint`,
which the command calls), so the trainer's ranked validation and the viewer use it.
"""
