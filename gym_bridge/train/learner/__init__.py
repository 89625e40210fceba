"""The policy being trained: where it runs and in what precision, its LoRA adapters, and one step's update.

Owns the device and precision, decided once from the config before anything loads (``device``), LoRA
through peft (``lora``) and the policy update (``update``: ``Learner``, the model with its optimizer
and reference, and a step's ``StepBatch`` cut into optimizer steps of micro-batches).

May import: :mod:`gym_bridge.train.config`, :mod:`gym_bridge.train.batches`,
:mod:`gym_bridge.train.algorithm` and the floors below the trainer (models, generation's weights);
never the samplers or the run's bookkeeping.
"""
