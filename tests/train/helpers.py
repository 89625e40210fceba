"""Trainer test helpers: small random models saved like checkpoints."""

from __future__ import annotations

from pathlib import Path


def save_random_tiny(out: Path, seed: int = 0, num_layers: int = 2) -> Path:
    """A randomly initialised tiny Llama with the project's tokenizer, saved where a model name can point."""
    from gym_bridge.models.tiny import TinyRecipe, new_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    recipe = TinyRecipe(hidden_size=32, num_layers=num_layers, num_heads=2, intermediate_size=64)
    new_tiny_model(tokenizer, recipe, seed=seed).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
