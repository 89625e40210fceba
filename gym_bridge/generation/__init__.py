"""Generation backends: batched token-level sampling with per-token log-probabilities.

:mod:`~gym_bridge.generation.backend` is the interface (no torch import);
:mod:`~gym_bridge.generation.transformers_backend` runs a local Hugging Face model;
:mod:`~gym_bridge.generation.vllm_backend` drives vLLM where it is installed (CUDA machines);
:mod:`~gym_bridge.generation.ray_backend` runs transformers replicas in Ray actors (``[ray]`` extra);
:mod:`~gym_bridge.generation.weights` hands a trainer's weights (plain or LoRA-merged) to a backend.

Generation floor: imports the models floor (the loader, the log-prob gather, the shared-prefix pass)
and Ray's set-up (:mod:`gym_bridge.distributed`); the trainer and the policy server import it.
"""

from __future__ import annotations

from typing import Any, Literal

from gym_bridge.generation.backend import (
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)
from gym_bridge.models.registry import load_model_and_tokenizer

__all__ = ["GenerationBackend", "GenerationRequest", "GenerationResult", "SamplingParams", "load_backend"]


def load_backend(
    name_or_path: str, kind: Literal["transformers", "vllm", "ray"] = "transformers", **kwargs: Any
) -> GenerationBackend:
    """A backend for a built-in model name (``tiny``, ``smollm2-135m``) or a local model directory.

    ``kwargs`` go to the backend's constructor (e.g. ``seed`` for transformers, engine arguments for vLLM,
    ``num_workers`` for ray).
    """
    if kind == "vllm":
        from gym_bridge.generation.vllm_backend import VllmBackend

        return VllmBackend(name_or_path, **kwargs)
    if kind == "ray":
        from gym_bridge.generation.ray_backend import RayBackend

        return RayBackend.from_pretrained(name_or_path, **kwargs)
    if kind != "transformers":
        raise ValueError(f"unknown backend {kind!r} (choose 'transformers', 'vllm' or 'ray')")
    from gym_bridge.generation.transformers_backend import TransformersBackend

    model, tokenizer = load_model_and_tokenizer(name_or_path)
    return TransformersBackend(model, tokenizer, model_name=name_or_path, **kwargs)
