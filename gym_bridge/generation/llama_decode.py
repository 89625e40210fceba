"""One decoding step of a Llama-architecture model, written out: the CPU generation hot loop.

Why not ``model(...)`` per token: at 64 rows a SmolLM2-135M decode step is about 40 ms of matrix
multiplies, and transformers' forward added as much again on CPU: per-layer module and mask
machinery, a KV cache whose growing view is not contiguous (so bfloat16 matmuls copy it at every
layer), a flash-attention kernel built for long queries, not one token (0.9 ms a layer in bfloat16),
and bfloat16 weights reordered for oneDNN at every call. Here the step is the same operations in the
same precision as transformers' eager Llama (RMSNorm in float32, rotary tables cast to the model's
dtype, softmax in float32) over the model's weights (float32: read in place; bfloat16: reordered once,
see :class:`_Linear`), with grouped-query attention against contiguous per-row key/value buffers sized
for the whole completion (empty slots masked). Only decoding runs here: the prompt pass stays
transformers' (shared prompts, common starts: :func:`gym_bridge.models.shared_prefix.prefill`).

:func:`decoder_for` says which models qualify (plain ``LlamaForCausalLM`` on CPU: SmolLM2, Llama 2/3,
the tests' tiny Llama); everything else decodes through the model's forward as before. The logits are
the forward's up to float rounding (tests/generation/test_llama_decode.py), so a seeded run samples
what it sampled before in most rows, not in every one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gym_bridge.generation.weights import has_lora

__all__ = ["DecodeState", "LlamaDecoder", "decoder_for"]

_STATIC_ROPE = ("default", "linear", "llama3")
"""Rope types whose inverse frequencies do not depend on the sequence length."""


def _rope_type(config: Any) -> str:
    parameters = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return str(parameters.get("rope_type", parameters.get("type", "default")))


def decoder_for(model: Any) -> LlamaDecoder | None:
    """A :class:`LlamaDecoder` over ``model``'s weights, or None where the written-out step would not be
    the model's own computation (another architecture, biases, another activation, a length-dependent
    rope, LoRA layers not merged into plain weights, a model being trained) or has not been measured
    (a model off the CPU)."""
    if type(model).__name__ != "LlamaForCausalLM" or model.training:
        return None
    if next(model.parameters()).device.type != "cpu":  # measured and tested on CPU only
        return None
    config = model.config
    plain = (
        getattr(config, "hidden_act", None) == "silu"
        and not getattr(config, "attention_bias", False)
        and not getattr(config, "mlp_bias", False)
        and getattr(config, "pretraining_tp", 1) == 1
        and _rope_type(config) in _STATIC_ROPE
    )
    if not plain or has_lora(model):  # a LoRA layer's ``weight`` is its base weight, adapters not added
        return None
    return LlamaDecoder(model)


@dataclass
class DecodeState:
    """Per-row decoding state: key/value buffers with room for the whole completion and the mask."""

    keys: list[torch.Tensor]
    """Per layer, (rows, kv_heads, capacity, head_dim), contiguous."""
    values: list[torch.Tensor]
    bias: torch.Tensor
    """(rows, 1, 1, capacity) added to attention scores: 0 where a row may attend, -inf elsewhere."""
    length: int
    """Slots filled so far (the prompt's keys, then one per decoded token)."""

    def select(self, index: torch.Tensor) -> None:
        """Keep only the rows in ``index`` (finished rows leave the batch)."""
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        self.bias = self.bias.index_select(0, index)


class _Linear:
    """``x @ cat(weights).T`` for one or more of the model's weights side by side (q, k and v; gate and up).

    In bfloat16 on a CPU with oneDNN: one copy of the weights, concatenated and reordered once into
    oneDNN's blocked layout (the same results bit for bit; ``F.linear`` reorders the weight at every call,
    a quarter of a SmolLM2 step, half the 49k-row output layer's own time). Otherwise ``F.linear`` over
    the weights themselves, no copy.
    """

    def __init__(self, weights: list[torch.Tensor], rows: int) -> None:
        self.weights, self.packed = [w.detach() for w in weights], None
        first = self.weights[0]
        if first.dtype == torch.bfloat16 and first.device.type == "cpu" and _onednn_bf16():
            joined = torch.cat(self.weights) if len(self.weights) > 1 else first
            self.packed = torch.ops.mkldnn._reorder_linear_weight(joined, rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        if len(self.weights) == 1:
            return F.linear(x, self.weights[0])
        return torch.cat([F.linear(x, w) for w in self.weights], dim=-1)


def _onednn_bf16() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


class LlamaDecoder:
    """The decode step of a plain ``LlamaForCausalLM`` in eval mode, over its own parameters.

    Float32 weights are read in place; bfloat16 ones also held reordered for oneDNN (:class:`_Linear`,
    one more copy of the weights), redone when the model's weights change (their version counters) or
    after :meth:`mark_stale` (weights written from another process, which counters do not see).
    """

    def __init__(self, model: Any) -> None:
        config = model.config
        self.model = model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.layers = model.model.layers
        self.rotary = model.model.rotary_emb
        self.scaling = float(self.layers[0].self_attn.scaling)
        self._linears: list[dict[str, _Linear]] = []
        self._lm_head: _Linear | None = None
        self._versions: tuple[int, ...] | None = None

    def mark_stale(self) -> None:
        """The weights changed where version counters do not show it: prepare them again before use."""
        self._versions = None

    def _prepare(self, rows: int) -> None:
        versions = tuple(p._version for p in self.model.parameters())
        if versions == self._versions:
            return
        self._linears, self._lm_head = [], None  # release the old copies before making new ones
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self._linears.append(
                {
                    "qkv": _Linear([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], rows),
                    "o": _Linear([attn.o_proj.weight], rows),
                    "gate_up": _Linear([mlp.gate_proj.weight, mlp.up_proj.weight], rows),
                    "down": _Linear([mlp.down_proj.weight], rows),
                }
            )
        self._lm_head = _Linear([self.model.lm_head.weight], rows)
        self._versions = versions

    def start(self, cache: Any, attention_mask: torch.Tensor, steps: int) -> DecodeState:
        """Decoding state after a prompt pass: ``cache`` (a ``DynamicCache`` with one row per row) copied
        into buffers with room for ``steps`` more tokens; ``attention_mask`` (rows, keys) its padding."""
        layers = cache.layers
        rows, _, filled, _ = layers[0].keys.shape
        self._prepare(rows)
        capacity = filled + steps
        keys, values = [], []
        for layer in layers:
            k = layer.keys.new_zeros((rows, self.kv_heads, capacity, self.head_dim))
            v = layer.values.new_zeros((rows, self.kv_heads, capacity, self.head_dim))
            k[:, :, :filled] = layer.keys
            v[:, :, :filled] = layer.values
            keys.append(k)
            values.append(v)
        dtype = keys[0].dtype
        bias = torch.full((rows, 1, 1, capacity), float("-inf"), dtype=dtype, device=keys[0].device)
        bias[:, 0, 0, :filled].masked_fill_(attention_mask[:, :filled].bool(), 0.0)
        return DecodeState(keys, values, bias, filled)

    def step(self, state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits (rows, vocab) after feeding ``tokens`` (rows,) at ``positions`` (rows,); appends their
        keys and values to ``state``."""
        slot = state.length
        if slot >= state.keys[0].shape[2]:
            raise RuntimeError("decode state is full: start() was given fewer steps than decoded")
        state.bias[:, 0, 0, slot] = 0.0
        hidden = self.model.model.embed_tokens(tokens)  # (rows, hidden)
        dtype = hidden.dtype
        cos, sin = self._rotary(positions, dtype)
        rows = tokens.shape[0]
        groups = self.heads // self.kv_heads
        rotated = self.heads + self.kv_heads  # q and k heads, side by side in the qkv output
        half = self.head_dim // 2
        for i, (layer, linear) in enumerate(zip(self.layers, self._linears, strict=True)):
            x = _rms_norm(hidden, layer.input_layernorm.weight, self.eps)
            qkv = linear["qkv"](x).view(rows, rotated + self.kv_heads, self.head_dim)
            qk = qkv[:, :rotated]
            # rotate_half(x) * sin == roll(x, half) * (sign * sin): q and k in one pass
            qk = qk * cos + torch.roll(qk, half, dims=-1) * sin
            q, k, v = qk[:, : self.heads], qk[:, self.heads :], qkv[:, rotated:]
            state.keys[i][:, :, slot] = k
            state.values[i][:, :, slot] = v
            # (rows, kv_heads, groups, head_dim) x (rows, kv_heads, head_dim, capacity): each key/value
            # head serves its `groups` query heads without being repeated.
            q = q.view(rows, self.kv_heads, groups, self.head_dim)
            scores = torch.matmul(q, state.keys[i].transpose(2, 3)) * self.scaling + state.bias
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
            out = torch.matmul(weights, state.values[i]).view(rows, self.heads * self.head_dim)
            hidden = hidden + linear["o"](out)
            x = _rms_norm(hidden, layer.post_attention_layernorm.weight, self.eps)
            gate, up = linear["gate_up"](x).chunk(2, dim=-1)
            hidden = hidden + linear["down"](F.silu(gate) * up)
        state.length = slot + 1
        assert self._lm_head is not None
        return self._lm_head(_rms_norm(hidden, self.model.model.norm.weight, self.eps))

    def _rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, 1, head_dim) cos and sin tables as transformers makes them (float32, then ``dtype``), the
        sin table's first half negated (see the rotation in :meth:`step`)."""
        freqs = positions.float().unsqueeze(-1) * self.rotary.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = self.rotary.attention_scaling
        sin = (emb.sin() * scale).to(dtype)
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return (emb.cos() * scale).to(dtype).unsqueeze(1), sin.unsqueeze(1)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' ``LlamaRMSNorm``: normalised in float32, scaled in the input's dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)
