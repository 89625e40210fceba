"""The reasoning_gym environment: procedural tasks of the ``reasoning-gym`` package, scored by its own scorers."""
