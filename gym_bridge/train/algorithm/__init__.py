"""NeMo RL's GRPO algorithm, the maths of a step: advantages, rewards as the advantages see them, the loss.

Owns the advantage estimators and the dynamic-sampling filter (``advantages``), the reward components
of ``/verify`` as tensors (``reward_components``), DAPO's overlong reward shaping (``reward_shaping``),
the clipped policy-gradient loss with its reference KL (``loss``) and its surrogates by name
(``policy_losses``), and the entropy bonus's adaptive coefficient (``entropy_control``). The names a
config may use live one floor down, in :mod:`gym_bridge.train.registry`, so the config can check them
without importing torch.

May import: :mod:`gym_bridge.train.registry`, :mod:`gym_bridge.train.config`,
:mod:`gym_bridge.train.batches` and the floors below the trainer; never the samplers, the learner or the
run's bookkeeping.
"""
