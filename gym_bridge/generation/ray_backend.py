"""Generation replicas in Ray actors: the embedded trainer's scale-out backend.

Why: on CPU one ``generate`` call runs on one OpenMP team; N replicas (one process and model copy
each, ``threads_per_worker`` torch threads each) decode N shares of a batch at once. Each replica is a
:class:`~gym_bridge.generation.transformers_backend.TransformersBackend`, so outputs are the same
tokens a local backend samples:

- requests with the same ``prompt_token_ids`` go to the same replica (GRPO sends each prompt G
  times; a replica prefills a repeated prompt once), groups are spread by row count;
- unseeded requests get their seed here, drawn exactly as a local ``TransformersBackend(seed=...)``
  would, so results do not depend on how the batch was split;
- ``update_weights`` (the refit after each optimizer step) puts the ``state_dict`` in Ray's object
  store once, as numpy arrays, which replicas read in place (zero-copy) while loading them: pickled
  torch tensors were 5x slower (tiny model 47 -> 9 ms, 34M parameters 800 -> 180 ms).

The model reaches the actors as ``config`` + ``state_dict`` + tokenizer through the object store: no
files, no hub. Ray runs on loopback only (:mod:`~gym_bridge.distributed.ray_local`). Ray is optional:
building a :class:`RayBackend` without it raises :class:`RayUnavailableError` naming the ``[ray]`` extra.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any

from gym_bridge.distributed.ray_cluster import connect_ray, gather, in_bundle, remove_placement, reserve
from gym_bridge.distributed.ray_local import RayUnavailableError, import_ray, start_local_ray
from gym_bridge.generation.backend import GenerationBackend, GenerationRequest, GenerationResult
from gym_bridge.models.registry import load_model_and_tokenizer

__all__ = ["GenerationReplica", "RayBackend", "RayUnavailableError", "split_by_prompt"]


def split_by_prompt(requests: Sequence[GenerationRequest], num_replicas: int) -> list[list[int]]:
    """Request indices per replica: identical prompts together, groups balanced by row count.

    Largest group first onto the least-loaded replica (ties: the lower replica index), so the split
    is deterministic; each replica's indices are in request order.
    """
    if num_replicas < 1:
        raise ValueError("num_replicas must be >= 1")
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, request in enumerate(requests):
        groups.setdefault(tuple(request.prompt_token_ids), []).append(index)
    shares: list[list[int]] = [[] for _ in range(num_replicas)]
    for group in sorted(groups.values(), key=len, reverse=True):  # stable: first-seen order on ties
        min(shares, key=len).extend(group)
    return [sorted(share) for share in shares]


class GenerationReplica:
    """One replica (the body of a Ray actor): a model copy and a ``TransformersBackend`` over it."""

    def __init__(
        self,
        config: Any,
        weights: dict[str, Any],
        tokenizer: Any,
        generation_config: Any = None,
        dtype: str = "float32",
        threads: int = 1,
        backend_kwargs: dict[str, Any] | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        # Built in its dtype (not cast after): rotary tables stay float32, as in a local PrecisionCopy.
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        model.load_state_dict(_unpack(weights))
        if generation_config is not None:
            model.generation_config = generation_config
        # Parameters keep requires_grad as in the trainer's model: with it off, CPU matmuls under
        # inference_mode take another kernel and log-probs differ from in-process generation by ~1e-7.
        model.eval()
        from gym_bridge.generation.transformers_backend import TransformersBackend

        self.backend = TransformersBackend(model, tokenizer, **(backend_kwargs or {}))
        self.requests_by_prompt: Counter[tuple[int, ...]] = Counter()

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        self.requests_by_prompt.update(tuple(r.prompt_token_ids) for r in requests)
        return self.backend.generate(requests)

    def served(self) -> dict[tuple[int, ...], int]:
        """Requests served so far per prompt (how the batches were split, for tests and monitoring)."""
        return dict(self.requests_by_prompt)

    def update_weights(self, weights: dict[str, Any]) -> None:
        """Load weights packed by the driver (:func:`_pack`) into this replica's model."""
        self.backend.update_weights(_unpack(weights))

    def dtype(self) -> str:
        """The replica's weights' dtype (``"float32"``, ``"bfloat16"``...)."""
        return str(next(self.backend.model.parameters()).dtype).removeprefix("torch.")

    def threads(self) -> int:
        import torch

        return torch.get_num_threads()

    def pid(self) -> int:
        import os

        return os.getpid()

    def where(self) -> dict[str, Any]:
        """Ray's node id and address for this replica, and its process id."""
        from gym_bridge.distributed.ray_cluster import node_here

        return node_here()


class RayBackend(GenerationBackend):
    """:class:`GenerationBackend` over ``num_workers`` replicas of ``model`` in Ray actors.

    Starts a private loopback Ray (``num_workers x threads_per_worker`` logical CPUs,
    ``object_store_memory_mb``) unless the process already joined one; :meth:`close` kills the
    replicas and shuts down a Ray it started. ``seed`` and ``max_context`` mean what they mean for
    :class:`~gym_bridge.generation.transformers_backend.TransformersBackend`.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        model_name: str | None = None,
        seed: int = 0,
        max_context: int | None = None,
        num_workers: int = 2,
        threads_per_worker: int = 1,
        object_store_memory_mb: int = 200,
        start_timeout_s: float = 300.0,
        stop_token_ids: Sequence[int] = (),
        ray_address: str | None = None,
        placement_timeout_s: float = 60.0,
        logprobs_mode: str = "raw",
        precision: str | None = None,
    ) -> None:
        """``logprobs_mode``: :class:`~gym_bridge.generation.transformers_backend.TransformersBackend`'s,
        for every replica. ``precision``: the replicas' dtype (``"bfloat16"``...; None: the model's);
        weights are cast into it at every refit."""
        ray = import_ray()
        import torch

        from gym_bridge.generation.transformers_backend import _eos_ids, checked_stop_token_ids

        if num_workers < 1 or threads_per_worker < 1:
            raise ValueError("num_workers and threads_per_worker must be >= 1")
        self._ray = ray
        self.tokenizer = tokenizer
        self.model_name = model_name or getattr(model.config, "_name_or_path", None) or "local-model"
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", None) or 2048
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.stop_token_ids = checked_stop_token_ids(stop_token_ids, self.vocab_size)
        self.num_workers = num_workers
        self.threads_per_worker = threads_per_worker
        self._seed_source = torch.Generator().manual_seed(seed)  # as TransformersBackend draws them
        if ray_address is not None:  # an existing cluster (cluster.ray_address / RAY_ADDRESS)
            self._owns_ray = connect_ray(ray_address)
        else:
            self._owns_ray = start_local_ray(num_workers * threads_per_worker, object_store_memory_mb)
        self.replicas: list[Any] = []
        self.labels: list[str] = []
        self.placement: Any = None
        try:
            total = ray.cluster_resources().get("CPU", 0)
            if total < num_workers * threads_per_worker:  # the actors could never be scheduled
                raise ValueError(
                    f"{num_workers} replicas x {threads_per_worker} threads need "
                    f"{num_workers * threads_per_worker} Ray CPUs; the running Ray has {total:g}"
                )
            # One group, PACK: the replicas on as few nodes as fit, all placed or a clear error.
            self.placement = reserve(
                [{"CPU": threads_per_worker}] * num_workers,
                "PACK",
                placement_timeout_s,
                f"policy.generation.ray.num_workers={num_workers} x threads_per_worker={threads_per_worker} "
                "generation replicas do not fit the Ray cluster",
            )
            actor = ray.remote(num_cpus=threads_per_worker)(GenerationReplica)
            weights = ray.put(_pack(model))
            dtype = precision or str(next(model.parameters()).dtype).removeprefix("torch.")
            self.replicas = [
                actor.options(scheduling_strategy=in_bundle(self.placement, index)).remote(
                    model.config,
                    weights,
                    tokenizer,
                    getattr(model, "generation_config", None),
                    dtype,
                    threads_per_worker,
                    {
                        "model_name": self.model_name,
                        "max_context": self.max_context,
                        "stop_token_ids": sorted(self.stop_token_ids),
                        "logprobs_mode": logprobs_mode,
                    },
                )
                for index in range(num_workers)
            ]
            # Constructed, or raise now (a replica that fails to build raises its error here).
            where = ray.get([replica.where.remote() for replica in self.replicas], timeout=start_timeout_s)
            self.labels = [
                f"policy.generation.ray replica {i} of {num_workers} (node {w['node_id'][:12]}, pid {w['pid']})"
                for i, w in enumerate(where)
            ]
            del weights
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_pretrained(cls, name_or_path: str, **kwargs: Any) -> RayBackend:
        """Load a built-in model name or local directory here, then ship it to the replicas."""
        import_ray()  # fail on a missing extra before loading the model
        model, tokenizer = load_model_and_tokenizer(name_or_path)
        return cls(model, tokenizer, model_name=kwargs.pop("model_name", name_or_path), **kwargs)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        if not requests:
            return []
        requests = [self._with_seed(r) for r in requests]
        shares = [share for share in split_by_prompt(requests, len(self.replicas)) if share]
        pending = [
            replica.generate.remote([requests[i] for i in share])
            for replica, share in zip(self.replicas, shares, strict=False)
        ]
        results: list[GenerationResult | None] = [None] * len(requests)
        answers = gather(self._ray, pending, self.labels[: len(pending)], "generation")
        for share, share_results in zip(shares, answers, strict=True):
            for index, result in zip(share, share_results, strict=True):
                results[index] = result
        return results  # type: ignore[return-value]  # every index is in exactly one share

    def update_weights(self, weights: Any) -> None:
        """Refit every replica: one copy of the ``state_dict`` (or a model's) in the object store."""
        if weights is None:
            return
        ref = self._ray.put(_pack(weights))
        gather(self._ray, [r.update_weights.remote(ref) for r in self.replicas], self.labels, "a weight update")
        del ref

    def close(self) -> None:
        """Kill the replicas; shut down Ray if this backend started it."""
        for replica in self.replicas:
            self._ray.kill(replica)
        self.replicas = []
        if self.placement is not None:
            remove_placement(self.placement)
            self.placement = None
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()
        self._owns_ray = False

    def _with_seed(self, request: GenerationRequest) -> GenerationRequest:
        """The request with its seed fixed here, in request order, as a local backend would draw it."""
        if request.params.seed is not None:
            return request
        import torch

        seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
        return dataclasses.replace(request, params=dataclasses.replace(request.params, seed=seed))


def _pack(model: Any) -> dict[str, tuple[Any, str]]:
    """A model's (or a ``state_dict``'s) weights as ``name -> (numpy array, torch dtype name)``.

    Numpy arrays go into Ray's object store without pickling and come out as read-only views of it;
    bfloat16 (which numpy lacks) travels as its int16 bit pattern.
    """
    import torch

    from gym_bridge.generation.weights import plain_state_dict

    state = plain_state_dict(model)  # a LoRA-trained model's adapters merged in
    packed = {}
    for name, tensor in state.items():
        tensor = tensor.detach().cpu().contiguous()
        dtype = str(tensor.dtype).removeprefix("torch.")
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.view(torch.int16)
        packed[name] = (tensor.numpy(), dtype)
    return packed


def _unpack(packed: dict[str, tuple[Any, str]]) -> dict[str, Any]:
    """Tensors over :func:`_pack`'s arrays, without copying (``load_state_dict`` copies them once)."""
    import torch

    with warnings.catch_warnings():  # read-only object-store buffers; the tensors are only read
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return {
            name: torch.from_numpy(array).view(getattr(torch, dtype))
            for name, (array, dtype) in packed.items()
        }
