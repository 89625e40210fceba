"""gym-bridge: NeMo Gym-compatible resources servers, rollout collection, transforms and a GRPO trainer."""

__version__ = "0.1.0"  # the package version (pyproject reads it from here)
