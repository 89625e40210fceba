"""Grouped-query attention in the trainer's passes without copying keys and values per query head.

SmolLM2-135M has 9 query heads and 3 key/value heads. transformers' SDPA path passes SDPA a mask in
every padded batch, and with a mask on CPU it first repeats each key/value head to every query head
(``repeat_kv``): a (rows, 9, length, 64) copy of keys and of values per layer, kept for the backward
pass. In the SmolLM2 LoRA recipe (micro-batch of 8 rows sharing a 200-token prompt) that was about
260 MB of one training micro-batch's ~975 MB. torch's CPU flash-attention kernel reads grouped heads
itself (``enable_gqa=True``, masks allowed): the same forward values (bit for bit in
tests/train/test_gqa_attention.py) and gradients up to float rounding, with only the 3 heads kept.

:func:`grouped_query_attention` switches a model to that path for the duration of a block; models
without grouped heads, other attention implementations and non-CPU devices (whose fused kernels
refuse masked GQA and would fall back to the slow math kernel) are left as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["GQA_ATTENTION", "grouped_query_attention"]

GQA_ATTENTION = "gym_bridge_sdpa_gqa"
"""The attention implementation's registered name (transformers' AttentionInterface)."""


def _sdpa_gqa(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa_attention_forward`` with SDPA reading grouped key/value heads itself."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_length = query.shape[2]
    plain = (
        getattr(module, "num_key_value_groups", 1) == 1
        or q_length == 1  # decoding: transformers packs the heads itself (no copy)
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
        or kwargs.get("output_attentions", False)
    )
    if plain:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(attention_mask is None and causal)
    if causal and key.shape[2] > q_length:  # as upstream: a prefill into an empty static cache
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def _register() -> bool:
    """Register the implementation and its mask (SDPA's) with transformers; whether that worked."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False
    AttentionInterface.register(GQA_ATTENTION, _sdpa_gqa)
    AttentionMaskInterface.register(GQA_ATTENTION, sdpa_mask)
    return True


def _applies(model: Any) -> bool:
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    heads, kv_heads = (
        getattr(config, "num_attention_heads", None),
        getattr(config, "num_key_value_heads", None),
    )
    if not heads or not kv_heads or heads == kv_heads:
        return False
    parameter = next(iter(model.parameters()), None)
    if parameter is None or parameter.device.type != "cpu":
        return False
    return tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5) and _register()


@contextmanager
def grouped_query_attention(model: Any) -> Iterator[None]:
    """Run the block with ``model``'s SDPA attention reading grouped key/value heads in place (see the
    module docstring); a no-op where that does not apply. Not for use while another thread runs the
    model with a different implementation in mind."""
    if not _applies(model):
        yield
        return
    config = model.config
    config._attn_implementation = GQA_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
