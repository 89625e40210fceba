"""The weights a generation backend is refit with: a model's plain ``state_dict``, LoRA merged in.

A policy trained with LoRA (:mod:`gym_bridge.train.learner.lora`) has peft's layers injected into it: its
``state_dict`` names ``q_proj.base_layer.weight``, ``q_proj.lora_A.default.weight`` and so on, which
no plain model (a rollout process's copy, a Ray replica, vLLM) can load. Generation gets what it can
load and what it would compute with the adapter on: ``W + (alpha / r) B A`` under the base name, as
NeMo RL sends vLLM. Models without LoRA pass through untouched, so this module needs peft only when
a model has adapters.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from gym_bridge.models.host_memory import release_freed_memory

__all__ = [
    "MergedLoraWeights",
    "PrecisionCopy",
    "has_lora",
    "lora_merged",
    "plain_state_dict",
    "tensor_identity",
    "weights_snapshot",
]


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


class MergedLoraWeights(Mapping):
    """A LoRA model's plain weights as of when it was made, merged one tensor at a time when read.

    Why: async GRPO publishes a snapshot of the policy after every step and keeps up to
    ``max_trajectory_age_steps + 1`` of them; a full copy of a 135M model is 540 MB each. Under LoRA
    the base weights never change, so a snapshot holds references to them plus a copy of the adapter
    weights (a few MB), and reading ``W`` gives ``W + scale * B A`` with the copied adapters.
    """

    def __init__(self, model: Any) -> None:
        self._base: dict[str, torch.Tensor] = {}
        self._adapters: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}
        layers = _lora_layers(model)
        for key, tensor in model.state_dict().items():
            if ".lora_" not in key:
                self._base[key.replace(".base_layer.", ".")] = tensor.detach()
        for name, layer in layers.items():
            if getattr(layer, "disable_adapters", False):
                continue
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    a = layer.lora_A[adapter].weight.detach().clone()
                    b = layer.lora_B[adapter].weight.detach().clone()
                    if getattr(layer, "fan_in_fan_out", False):
                        raise ValueError(f"{name}: fan_in_fan_out LoRA layers are not supported here")
                    self._adapters[f"{name}.weight"] = (a, b, float(layer.scaling[adapter]))

    def __getitem__(self, key: str) -> torch.Tensor:
        base = self._base[key]
        if key not in self._adapters:
            return base
        a, b, scale = self._adapters[key]
        return (base.float() + scale * (b.float() @ a.float())).to(base.dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self._base)

    def is_merged(self, key: str) -> bool:
        """Whether reading ``key`` computes a new tensor (an adapted layer) rather than returning one."""
        return key in self._adapters

    def __len__(self) -> int:
        return len(self._base)


class PrecisionCopy:
    """A plain copy of a model in another dtype for generation to sample from, refreshed whenever the
    model's weights changed (LoRA adapters merged in, one tensor at a time).

    Why: on CPUs with native bfloat16 matrix units (AMX, AVX512-BF16) a bfloat16 copy of SmolLM2-135M
    generates faster than the float32 policy it follows, while the trainer keeps float32 weights,
    optimizer state and log-probs (as NeMo RL trains against a bfloat16 vLLM). A change is seen in the
    parameters' version counters, which every in-place write in this process bumps (an optimizer step,
    ``load_state_dict``, a LoRA merge); a write from another process (shared memory) is announced with
    :meth:`mark_stale`.
    """

    def __init__(self, model: Any, dtype: torch.dtype) -> None:
        self.source = model
        self.dtype = dtype
        self.model: Any = None
        self._versions: list[int] | None = None

    def mark_stale(self) -> None:
        """The source's tensors were written where version counters do not see it: refresh next time."""
        self._versions = None

    @torch.no_grad()
    def current(self) -> Any:
        """The copy, with the source's weights as of now."""
        versions = [p._version for p in self.source.parameters()]
        if self.model is None:
            self.model = _empty_plain_copy(self.source, self.dtype)
        if versions != self._versions:
            weights = MergedLoraWeights(self.source) if has_lora(self.source) else plain_state_dict(self.source)
            for name, target in self.model.state_dict().items():
                target.copy_(weights[name])
            self._versions = versions
        return self.model


def _empty_plain_copy(model: Any, dtype: torch.dtype) -> Any:
    """A model of ``model``'s architecture (without LoRA layers) in ``dtype``, in eval mode."""
    from transformers import AutoModelForCausalLM

    base = model.get_base_model() if has_lora(model) and hasattr(model, "get_base_model") else model
    copy = AutoModelForCausalLM.from_config(base.config, dtype=dtype)
    if getattr(base, "generation_config", None) is not None:
        copy.generation_config = base.generation_config
    return copy.to(next(base.parameters()).device).eval()


def tensor_identity(tensor: torch.Tensor) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """What makes two tensors the same memory: first element's address, shape and strides."""
    return tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride())


def weights_snapshot(model: Any) -> Mapping[str, torch.Tensor]:
    """The model's plain weights frozen as of now: a :class:`MergedLoraWeights` (adapters copied, base
    weights referenced: they do not train) for a LoRA model, else a copy of every tensor, each shared
    tensor (tied embeddings) copied once and still shared in the copy."""
    if has_lora(model):
        return MergedLoraWeights(model)
    copies: dict[int, torch.Tensor] = {}
    snapshot = {}
    for name, tensor in plain_state_dict(model).items():
        key = tensor_identity(tensor)
        if key not in copies:
            copies[key] = tensor.detach().clone()
        snapshot[name] = copies[key]
    return snapshot


MERGE_RELEASE_MIN_GAIN = 64 * 2**20
"""The merge trims the heap whenever the resident size grew this much since the last trim: the first
merge of a run kept SmolLM2-135M's per-layer temporaries resident (about 3 MB a layer, 0.6 GiB in
all, until the trim after the last layer), which set the LoRA recipe's peak."""

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
MAX_RESTORE_SHARE = 0.25
"""A layer whose in-place merge would need more than this share of its elements stored to be undone
exactly is merged into a new tensor instead (as before): the stored values would cost more than the
copy saves. LoRA deltas are small next to the weights, so few elements round differently: about 2%
when the delta is 1% of the weight's size, 10% at 10%."""


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(_INT_OF_SIZE[tensor.element_size()])


def _checksum(tensor: torch.Tensor) -> int:
    return int(_bits(tensor).sum(dtype=torch.int64))


def _with_deltas(weight: torch.Tensor, deltas: list[torch.Tensor], sign: int) -> torch.Tensor:
    """``weight + sum(deltas)`` in float32 (sign 1, adapters in order), or its undoing (sign -1)."""
    out = weight.float()
    for delta in deltas if sign > 0 else reversed(deltas):
        out = out + delta.float() if sign > 0 else out - delta.float()
    return out.to(weight.dtype)


@dataclass
class _InPlace:
    """What undoes one layer's in-place merge exactly: the elements ``merged - delta`` rounds wrong."""

    index: torch.Tensor
    values: torch.Tensor
    checksum: int


def _merge_in_place(weight: torch.Tensor, deltas: list[torch.Tensor]) -> _InPlace | None:
    """Write ``W + delta`` into ``weight`` and return how to undo it bit for bit, or None (nothing
    written) when too many elements would need storing (:data:`MAX_RESTORE_SHARE`)."""
    merged = _with_deltas(weight, deltas, 1)
    wrong = (_bits(_with_deltas(merged, deltas, -1)) != _bits(weight)).view(-1).nonzero().squeeze(1)
    if wrong.numel() > MAX_RESTORE_SHARE * weight.numel():
        return None
    index = wrong.to(torch.int32) if weight.numel() < 2**31 else wrong
    undo = _InPlace(index, weight.view(-1)[wrong].clone(), _checksum(weight))
    weight.copy_(merged)
    return undo


def _unmerge_in_place(name: str, weight: torch.Tensor, deltas: list[torch.Tensor], undo: _InPlace) -> None:
    weight.copy_(_with_deltas(weight, deltas, -1))
    weight.view(-1)[undo.index.long()] = undo.values
    if _checksum(weight) != undo.checksum:  # the deltas were not recomputed bit for bit
        raise RuntimeError(f"{name}: the base weight did not come back exactly after generation's LoRA merge")


def _deltas(layer: Any, adapters: list[str]) -> list[torch.Tensor]:
    return [layer.get_delta_weight(adapter) for adapter in adapters]


@contextmanager
def lora_merged(model: Any) -> Iterator[None]:
    """Run the block with each active LoRA layer's base weight holding ``W + scale * B A`` and its
    adapter path off; afterwards the base weights are bit for bit what they were.

    Why: unmerged, every adapted layer runs two skinny rank-r matmuls and peft's per-layer Python on
    top of the base matmul; SmolLM2-135M with r=16 on every linear layer generated about 1.5x slower
    that way than merged (bench/generation_real.py). The merge is written into the base weight in
    place, one layer at a time, so generation holds no second copy of the linear layers (425 MB for
    SmolLM2-135M). ``(W + d) - d`` is not always ``W`` in floating point, so the merge first computes
    the undoing and stores the few elements it gets wrong (their index and original value); the
    undoing rewrites them and a checksum of the bits proves the base came back (the deltas are
    recomputed from the untouched adapters, deterministically). A layer for which that would store
    too much is merged into a new tensor swapped in for the block, as a fallback. Not for use while
    another thread runs the model.
    """
    in_place: list[tuple[str, Any, torch.Tensor, list[str], _InPlace, bool]] = []
    swapped: list[tuple[Any, Any, torch.Tensor, bool]] = []
    try:
        with torch.no_grad():
            for name, layer in _lora_layers(model).items():
                if getattr(layer, "disable_adapters", False) or getattr(layer, "merged", False):
                    continue
                adapters = [a for a in layer.active_adapters if a in layer.lora_A]
                if not adapters:
                    continue
                base = layer.get_base_layer()
                original = base.weight.data
                deltas = _deltas(layer, adapters)
                undo = _merge_in_place(original, deltas)
                if undo is not None:
                    in_place.append((name, layer, original, adapters, undo, layer._disable_adapters))
                else:
                    swapped.append((layer, base, original, layer._disable_adapters))
                    base.weight.data = _with_deltas(original, deltas, 1)
                layer._disable_adapters = True
                del deltas
                release_freed_memory(MERGE_RELEASE_MIN_GAIN)
        release_freed_memory()  # the per-layer temporaries, before generation allocates its caches
        yield
    finally:
        with torch.no_grad():
            for layer, base, original, disabled in swapped:
                base.weight.data = original
                layer._disable_adapters = disabled
            failures = []
            for name, layer, weight, adapters, undo, disabled in in_place:
                try:
                    _unmerge_in_place(name, weight, _deltas(layer, adapters), undo)
                except RuntimeError as error:  # undo every other layer first
                    failures.append(error)
                layer._disable_adapters = disabled
            if failures:
                raise failures[0]
