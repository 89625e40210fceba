"""The embedded GRPO trainer: NeMo RL's algorithm, sized for one machine.

Modules (one idea each):

- ``loop``: ``train()``, the set-up calls then the step loop, readable top to bottom.
- ``setup``: seeds, threads, the resume point, the model with its optimizer (``Learner``), the data and
  the samplers with their services.
- ``sampling``: the ``Sampler`` protocol and its online and offline samplers; ``rollout_worker``: the
  rollout process (``ProcessSampler``); ``async_rollouts``: async GRPO's producer.
- ``update``: one step's ``StepBatch`` -> optimizer steps; ``sequences``: micro-batches and their
  log-probs (through :mod:`gym_bridge.models.logprobs` and :mod:`gym_bridge.models.shared_prefix`,
  which the sampler runs too); ``packing``: packed sequences.
- ``advantages`` and ``loss``: NeMo RL's advantage estimator and clipped policy-gradient loss.
- ``config``: the typed, validated run configuration (NeMo RL key names) and its YAML loader.
- ``data``, ``rollouts``, ``metrics``, ``logging``, ``checkpoint``, ``batching``, ``preflight``,
  ``gpu_monitor``, ``sample_log``: prompts, sequences, metrics, logs, checkpoints and checks.

Runs floor: imports evaluation (ranked validation), the agent and environments, the policy server,
generation, models, Ray's set-up (:mod:`gym_bridge.distributed`) and the substrate below them; the
viewer and the commands import it.

This package's ``__init__`` imports nothing heavy, so ``gym_bridge.cli`` can import
``gym_bridge.train.config`` without pulling in torch.
"""
