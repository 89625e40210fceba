"""A step's samples as tensors: the floor the algorithm, the samplers and the update share.

Owns the training sample and how a rollout becomes one (``rollouts``: ``Sample``, token ids with their
loss mask), micro-batches with little padding (``batching``), packed rows (``packing``) and the
micro-batches of a step with their log-probs under a model (``sequences``).

May import: :mod:`gym_bridge.train.config`, :mod:`gym_bridge.models` and the records below; never the
other subpackages of :mod:`gym_bridge.train`.
"""
