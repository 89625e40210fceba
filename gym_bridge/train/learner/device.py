"""Where the policy trains and in what precision: decided once, from the config, before anything loads.

:func:`resolve_device` is the one place that picks the device: ``policy.device`` when it names one,
else (``auto``) CUDA when ``cluster.gpus_per_node > 0`` and the CPU otherwise. :func:`device_problems`
refuses at start-up what this machine cannot honour (CUDA asked for and absent, bfloat16 on a GPU
without it), so a run never loads a model only to find it has nowhere to go.

:class:`Placement` carries the decision to the trainer: the policy, its KL reference, the optimizer
state (created lazily on the parameters' device) and every micro-batch go to ``device``.
``policy.precision``:

- ``float32``: weights and compute in float32.
- ``bfloat16``: weights and compute in bfloat16 (float32's exponent range, so no loss scaling; half
  the memory). LoRA adapters stay float32 on the bf16 base (peft casts around them).
- ``float16``: float32 master weights and optimizer, forward passes under ``torch.autocast`` in
  float16, and a ``torch.amp.GradScaler``: float16's range is too narrow for unscaled gradients and
  for AdamW's epsilon, and torch's scaler refuses float16 gradients, so the weights cannot be float16
  themselves. A step whose scaled gradients overflow is skipped and counted. The frozen KL reference
  (full fine-tuning) is stored in float16: it only runs forward. Works on the CPU too (torch 2.13 has
  CPU autocast and a CPU GradScaler), but CPUs without native float16 arithmetic run it several times
  slower than float32 (measured here: a 512x512 matmul 7x slower).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from gym_bridge.train.config import MasterConfig

__all__ = [
    "DTYPES",
    "Placement",
    "device_problems",
    "generation_precision_notice",
    "placement_for",
    "resolve_device",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(cfg: MasterConfig) -> torch.device:
    """The policy's device: ``policy.device``, or with ``auto`` CUDA when ``cluster.gpus_per_node > 0``."""
    choice = cfg.policy.device
    if choice == "auto":
        choice = "cuda" if cfg.cluster.gpus_per_node > 0 else "cpu"
    return torch.device(choice)


NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""CPU flags (``/proc/cpuinfo``) of native bfloat16 matrix arithmetic: without one, torch emulates it."""


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags from ``/proc/cpuinfo``, or None where that cannot be read (not Linux)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def generation_precision_notice(cfg: MasterConfig, flags: set[str] | None = None) -> str | None:
    """A start-up line when ``policy.generation.precision: bfloat16`` will sample on a CPU that has no
    native bfloat16 matrix units (the SmolLM2 recipes set it for CPUs that have them); None otherwise
    or when the flags cannot be read. ``flags``: the CPU's (default: :func:`cpu_flags`)."""
    generation = cfg.policy.generation
    if generation.precision != "bfloat16" or generation.backend == "vllm" or resolve_device(cfg).type != "cpu":
        return None
    flags = cpu_flags() if flags is None else flags
    if flags is None or any(flag in flags for flag in NATIVE_BF16_FLAGS):
        return None
    return (
        "note: policy.generation.precision=bfloat16 on a CPU without native bfloat16 matrix units "
        f"(none of {', '.join(NATIVE_BF16_FLAGS)} in /proc/cpuinfo): sampling may be slower than in float32; "
        "set policy.generation.precision=float32"
    )


def _why_cuda(cfg: MasterConfig) -> str:
    if cfg.policy.device == "cuda":
        return "policy.device is cuda"
    return f"cluster.gpus_per_node is {cfg.cluster.gpus_per_node} (policy.device auto then trains on CUDA)"


def device_problems(cfg: MasterConfig) -> list[str]:
    """One message per device or precision setting this machine cannot honour (empty: all fine).

    Cheap: asks torch about CUDA, loads nothing.
    """
    device, gpus = resolve_device(cfg), cfg.cluster.gpus_per_node
    if (device.type == "cuda" or gpus > 0) and not torch.cuda.is_available():
        build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        who = _why_cuda(cfg) if device.type == "cuda" else f"cluster.gpus_per_node is {gpus}"
        return [
            f"{who} but CUDA is not available here: torch.cuda.is_available() is false (torch "
            f"{torch.__version__}, {build}). To train on the CPU set cluster.gpus_per_node: 0 (and "
            "policy.device: auto or cpu); for a GPU run, use a machine with an NVIDIA GPU and a CUDA build of torch"
        ]
    problems = []
    visible = torch.cuda.device_count() if gpus > 0 else 0
    if gpus > visible:
        problems.append(f"cluster.gpus_per_node is {gpus} but torch sees {visible} CUDA device(s) here")
    if device.type == "cuda" and cfg.policy.precision == "bfloat16" and not torch.cuda.is_bf16_supported():
        problems.append(
            "policy.precision bfloat16 needs a GPU with bfloat16 arithmetic (compute capability 8.0 or "
            "newer); this one has none: use float16 (loss-scaled) or float32"
        )
    return problems


@dataclass(frozen=True)
class Placement:
    """The device and precision every training tensor follows (see the module docstring)."""

    device: torch.device
    precision: str = "float32"

    @classmethod
    def cpu(cls) -> Placement:
        return cls(torch.device("cpu"), "float32")

    @property
    def weights_dtype(self) -> torch.dtype:
        """Dtype of the trained weights (float32 master weights under float16 autocast)."""
        return torch.float32 if self.precision == "float16" else DTYPES[self.precision]

    @property
    def reference_dtype(self) -> torch.dtype:
        """Dtype of a frozen copy that only runs forward passes (the KL reference)."""
        return DTYPES[self.precision]

    @property
    def uses_loss_scaling(self) -> bool:
        return self.precision == "float16"

    def place(self, model: Any, dtype: torch.dtype | None = None) -> Any:
        """Move ``model`` to the device in ``dtype`` (default the trained weights' dtype), in place."""
        return model.to(device=self.device, dtype=dtype or self.weights_dtype)

    def tensor(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` on the device (same dtype); asynchronous from the host where CUDA allows it."""
        return value.to(self.device, non_blocking=True)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Forward passes in float16 under ``policy.precision: float16``; a no-op otherwise."""
        if not self.uses_loss_scaling:
            yield
            return
        with torch.autocast(self.device.type, dtype=torch.float16):
            yield

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """A loss scaler for float16 (None otherwise): it persists across steps, keep one per run."""
        return torch.amp.GradScaler(self.device.type) if self.uses_loss_scaling else None


def placement_for(cfg: MasterConfig) -> Placement:
    """The run's placement: :func:`resolve_device` and ``policy.precision``."""
    return Placement(resolve_device(cfg), cfg.policy.precision)
