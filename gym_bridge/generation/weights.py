"""The weights a generation backend is refit with: a model's plain ``state_dict``, LoRA merged in.

A policy trained with LoRA (:mod:`gym_bridge.train.lora`) has peft's layers injected into it: its
``state_dict`` names ``q_proj.base_layer.weight``, ``q_proj.lora_A.default.weight`` and so on, which
no plain model (a rollout process's copy, a Ray replica, vLLM) can load. Generation gets what it can
load and what it would compute with the adapter on: ``W + (alpha / r) B A`` under the base name, as
NeMo RL sends vLLM. Models without LoRA pass through untouched, so this module needs peft only when
a model has adapters.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["has_lora", "plain_state_dict"]


def _lora_layers(model: Any) -> dict[str, Any]:
    """``module name -> peft LoraLayer`` of the adapted layers (empty without LoRA or without peft)."""
    if not hasattr(model, "named_modules"):
        return {}
    layers = {}
    for name, module in model.named_modules():
        if (
            hasattr(module, "lora_A")
            and hasattr(module, "get_delta_weight")
            and hasattr(module, "base_layer")
        ):
            layers[name] = module
    return layers


def has_lora(model: Any) -> bool:
    """Whether ``model`` has peft LoRA layers in it."""
    return bool(_lora_layers(model))


@torch.no_grad()
def plain_state_dict(weights: Any) -> dict[str, torch.Tensor]:
    """A ``state_dict`` (returned as is) or a model's, with active LoRA adapters merged into their base
    weights under the base model's names. Tensors are the model's own where nothing is merged (not
    copies: clone them to keep a snapshot)."""
    if not hasattr(weights, "state_dict"):
        return weights
    layers = _lora_layers(weights)
    state = weights.state_dict()
    if not layers:
        return state
    plain: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if ".lora_" in key:  # lora_A / lora_B / lora_embedding_* / lora_magnitude_vector
            continue
        plain[key.replace(".base_layer.", ".")] = tensor.detach()
    for name, layer in layers.items():
        key = f"{name}.weight"
        base = plain[key]
        delta = torch.zeros_like(base, dtype=torch.float32)
        if not getattr(layer, "disable_adapters", False):
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    delta += layer.get_delta_weight(adapter).float()
        plain[key] = (base.float() + delta).to(base.dtype)
    return plain
