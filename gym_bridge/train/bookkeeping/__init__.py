"""A run's bookkeeping: what it checks before it starts, what it measures and writes, and how it resumes.

Owns the start-up checks that need the machine (``preflight``), the run directories a fresh run may
not mix with an earlier one's (``run_dirs``), a step's and a validation's metrics (``metrics``), where
the numbers go (``logging``: the terminal, ``metrics.jsonl``, TensorBoard, the final PNG), the GPUs'
readings (``gpu_monitor``), a few rollouts of each step kept for reading (``sample_log``) and the
crash-safe checkpoints a run resumes from (``checkpoint``).

May import: every other subpackage of :mod:`gym_bridge.train` but the assembly at its top (``setup``,
``data_parallel``, ``loop``), and evaluation (ranked validation) with the floors below the trainer.
"""
