"""LoRA with peft, configured by NeMo RL's ``policy.dtensor_cfg.lora_cfg``.

:func:`apply_lora` injects peft's LoRA layers into the policy in place: the trainer keeps working on
the same transformers model (its forward passes, shared-prefix and packed passes are unchanged), and
the returned ``PeftModel`` is the handle for what only peft knows: switching the adapters off (the KL
reference is the base model, no second copy) and writing ``adapter_model.safetensors`` +
``adapter_config.json`` that ``PeftModel.from_pretrained`` loads as is. Base weights are frozen, so
only the adapters get gradients and optimizer state. Generation backends are refit with the merged
weights (:mod:`gym_bridge.generation.weights`).
"""

from __future__ import annotations

import copy
import math
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gym_bridge.train.config import LoRAConfig

__all__ = [
    "LORA_KEY",
    "apply_lora",
    "load_adapter",
    "merged_model",
    "parameter_counts",
    "resolve_target_modules",
    "trainable_parameters_line",
    "without_peft_deprecation_warnings",
]

LORA_KEY = "policy.dtensor_cfg.lora_cfg"


def _wildcard(pattern: str, name: str) -> bool:
    """NeMo Automodel's wildcard: ``*`` spans any characters, dots included, over the full name."""
    regex = "".join(".*" if part == "*" else re.escape(part) for part in re.split(r"(\*)", pattern))
    return re.fullmatch(regex, name) is not None


def _matches(pattern: str, name: str) -> bool:
    """A full dotted name, a module name (``q_proj`` matches ``...self_attn.q_proj``) or a wildcard."""
    if "*" in pattern:
        return _wildcard(pattern, name)
    return name == pattern or name.endswith("." + pattern)


def resolve_target_modules(model: Any, cfg: LoRAConfig) -> list[str]:
    """Full names of the linear layers ``cfg`` selects; raises ValueError naming the key when none is
    selected or when the output layer is selected while it shares its weight with the embeddings."""
    output = model.get_output_embeddings()
    linear = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    if cfg.match_all_linear:
        chosen = [name for name, m in linear.items() if m is not output]
        key = "match_all_linear"
    elif cfg.target_modules:
        chosen = [name for name in linear if any(_matches(p, name) for p in cfg.target_modules)]
        key = "target_modules"
    else:
        chosen = [name for name in linear if not any(_matches(p, name) for p in cfg.exclude_modules)]
        key = "exclude_modules"
    if not chosen:
        some = ", ".join(list(linear)[:4])
        raise ValueError(f"{LORA_KEY}.{key} selects no linear layer of this model (its layers: {some}, ...)")
    tied = getattr(model.config, "tie_word_embeddings", False) and output is not None
    if tied and any(linear[name] is output for name in chosen):
        raise ValueError(
            f"{LORA_KEY}.{key} selects the output layer, whose weight is tied to the input embeddings: "
            "a merged adapter would change both. Leave it out"
        )
    return chosen


def _init_lora_a(layer: Any, adapter: str, method: str) -> None:
    weight = layer.lora_A[adapter].weight
    if method == "xavier":
        nn.init.xavier_uniform_(weight)
    else:  # "uniform": nn.Linear's own initialisation (peft's default)
        nn.init.kaiming_uniform_(weight, a=math.sqrt(5))


def _post_dropout(p: float) -> Any:
    def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(output, p=p, training=module.training)

    return hook


@contextmanager
def without_peft_deprecation_warnings() -> Iterator[None]:
    """peft reads transformers' deprecated ``is_gradient_checkpointing`` whenever it wraps a model: a
    FutureWarning that is not the user's to fix, so it is not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def apply_lora(model: Any, cfg: LoRAConfig) -> Any:
    """Inject LoRA layers into ``model`` (in place) and freeze everything else; return the PeftModel.

    B starts at zero, so the adapted model computes exactly what the base model does. ``dropout``
    with ``dropout_position: post`` drops the adapter's output (a forward hook on ``lora_B``, which
    keeps peft's parameter names); ``pre`` is peft's dropout on the adapter's input.
    """
    from peft import LoraConfig, get_peft_model

    targets = resolve_target_modules(model, cfg)
    post = cfg.dropout_position == "post" and cfg.dropout > 0
    peft_config = LoraConfig(
        r=cfg.dim,
        lora_alpha=cfg.alpha,
        lora_dropout=0.0 if post else cfg.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with without_peft_deprecation_warnings():
        peft_model = get_peft_model(model, peft_config)
    for module in model.modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            _init_lora_a(module, "default", cfg.lora_A_init)
            nn.init.zeros_(module.lora_B["default"].weight)
            if post:
                module.lora_B["default"].register_forward_hook(_post_dropout(cfg.dropout))
    return peft_model


def parameter_counts(model: Any) -> tuple[int, int]:
    """(trainable, total) parameters, each shared tensor counted once."""
    seen: dict[int, tuple[int, bool]] = {}
    for parameter in model.parameters():
        seen[id(parameter)] = (parameter.numel(), parameter.requires_grad)
    return sum(n for n, t in seen.values() if t), sum(n for n, _ in seen.values())


def trainable_parameters_line(model: Any) -> str:
    """The start-up line that says how much of the model trains."""
    trainable, total = parameter_counts(model)
    share = 100.0 * trainable / total if total else 0.0
    return f"trainable parameters: {trainable:,} / {total:,} ({share:.2f}%)"


def load_adapter(peft_model: Any, adapter_dir: Path) -> None:
    """Load ``adapter_model.safetensors`` into the injected adapters, in place (the optimizer's
    parameters stay the same tensors); raises when the saved adapter does not fit."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(adapter_dir) / "adapter_model.safetensors"
    if not path.is_file():
        raise RuntimeError(f"{adapter_dir} has no adapter_model.safetensors")
    saved = load_file(path)
    result = set_peft_model_state_dict(peft_model, saved)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"the adapter in {adapter_dir} does not fit {LORA_KEY} (missing {missing[:4]}, "
            f"unexpected {list(result.unexpected_keys)[:4]})"
        )


def merged_model(peft_model: Any) -> Any:
    """A plain transformers model with the adapters merged in (a copy; the trained model is untouched)."""
    return copy.deepcopy(peft_model).merge_and_unload()
