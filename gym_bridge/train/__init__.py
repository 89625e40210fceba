"""The embedded GRPO trainer: NeMo RL's algorithm, sized for one machine.

Its rooms, bottom first (a room imports from its own floor or a lower one, never a higher one, and no
two import each other; ``tests/test_import_graph.py``'s ``TRAIN_FLOORS`` checks it):

1. ``registry``: the advantage estimators and policy losses by name, which the config checks without
   importing torch.
2. ``config/``: the typed, validated run configuration (NeMo RL key names) and its YAML loader.
3. ``batches/``: a step's samples as tensors: ``rollouts`` (``Sample``), ``batching``, ``packing``, and
   ``sequences`` (micro-batches and their log-probs through :mod:`gym_bridge.models.logprobs` and
   :mod:`gym_bridge.models.shared_prefix`, which the sampler runs too).
4. ``algorithm/``: NeMo RL's maths of a step: ``advantages``, ``reward_components``, ``reward_shaping``,
   ``loss`` with its ``policy_losses``, ``entropy_control``.
5. ``samplers/``: where samples come from: ``data`` (the prompts), ``sampling`` (the ``Sampler``
   protocol, online and offline), ``rollout_worker`` (``ProcessSampler``), ``async_rollouts``,
   ``rollout_failures``, ``rollout_timeouts``, ``env_replicas``; beside it ``learner/``: the policy
   being trained: ``device``, ``lora`` and ``update`` (one step's ``StepBatch`` -> optimizer steps).
6. ``bookkeeping/``: ``preflight``, ``run_dirs``, ``metrics``, ``logging``, ``gpu_monitor``,
   ``sample_log``, ``checkpoint``.
7. The assembly at this package's top: ``setup`` (seeds, threads, the resume point, the ``Learner``, the
   data and the samplers with their services), ``data_parallel`` (the update on Ray workers) and
   ``loop`` (``train()``, the set-up calls then the step loop, readable top to bottom).

Runs floor: imports evaluation (ranked validation), the agent and environments, the policy server,
generation, models, Ray's set-up (:mod:`gym_bridge.distributed`) and the substrate below them; the
viewer and the commands import it.

This package's ``__init__`` imports nothing heavy, so ``gym_bridge.cli`` can import
``gym_bridge.train.config`` without pulling in torch.
"""
