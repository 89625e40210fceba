"""Where a step's samples come from: the prompts, the samplers behind one protocol, their faults.

Owns the training and validation prompts from the ``data`` config (``data``), the ``Sampler`` protocol
with its online and offline samplers (``sampling``), the rollout process (``rollout_worker``:
``ProcessSampler``), async GRPO's producer (``async_rollouts``), failed and timed-out rollouts
(``rollout_failures``, ``rollout_timeouts``) and the environments' Ray replicas (``env_replicas``).

May import: :mod:`gym_bridge.train.config`, :mod:`gym_bridge.train.batches`,
:mod:`gym_bridge.train.algorithm` (a sample's reward components) and the floors below the trainer
(the agent, environments, the policy server, generation); never the learner or the run's bookkeeping.
"""
