"""vLLM behind the :class:`GenerationBackend` interface, for CUDA machines.

Why: the same policy server and trainer scale to real models by swapping the backend. vLLM is
imported only when a :class:`VllmBackend` is built, so CPU installs never need it.

Log-probabilities: vLLM's default ``logprobs_mode`` is ``"raw_logprobs"`` (before temperature and
top-p/top-k), the same convention as :mod:`gym_bridge.generation.backend`; this backend asks for it
explicitly where the installed vLLM knows the option. A GRPO trainer asks for
``logprobs_mode="processed_logprobs"`` (the sampled distribution's, as its own log-probs are).

Colocated with a trainer on the same GPU (``colocated=True``), weights are refit from the trainer's
GPU tensors without passing through host memory: a one-GPU engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set otherwise), so its workers load the very tensors;
engine workers in other processes get CUDA IPC handles to them and copy device to device. Only CPU
tensors (a policy trained on the CPU) travel by value. :func:`colocation_problem` checks before the
engine starts that ``gpu_memory_utilization`` fits beside the policy.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from typing import Any

from gym_bridge.generation.backend import GenerationBackend, GenerationRequest, GenerationResult
from gym_bridge.generation.weights import plain_state_dict

__all__ = ["VllmBackend", "VllmUnavailableError", "colocation_problem", "weight_payload"]

GIB = 1024**3


class VllmUnavailableError(ImportError):
    """vLLM is not installed (or cannot be imported on this machine)."""


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise VllmUnavailableError(
            "the vLLM backend needs the 'vllm' package and a CUDA GPU: pip install 'gym-bridge[vllm]' "
            "on a GPU machine, or use the default transformers backend (--backend transformers)"
        ) from exc
    return vllm


class VllmBackend(GenerationBackend):
    """Generate with an in-process ``vllm.LLM`` engine; ``update_weights`` refits it after a train step."""

    in_process: bool = False
    """Whether the engine's worker runs in this process (refits then pass the tensors themselves)."""

    def __init__(
        self,
        model: str,
        model_name: str | None = None,
        stop_token_ids: Sequence[int] = (),
        colocated: bool = False,
        logprobs_mode: str = "raw",
        **engine_kwargs: Any,
    ) -> None:
        """``stop_token_ids`` end every completion, besides each request's own. ``colocated``: a
        trainer in this process refits the engine from its own GPU tensors (see the module docstring).
        ``logprobs_mode``: ``"raw"`` or ``"processed"`` (vLLM's ``raw_logprobs`` / ``processed_logprobs``)."""
        if logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', not {logprobs_mode!r}")
        vllm = _import_vllm()
        self._vllm = vllm
        if colocated and engine_kwargs.get("tensor_parallel_size", 1) == 1:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        init_params = inspect.signature(vllm.LLM.__init__).parameters
        if "logprobs_mode" in init_params or any(p.kind is p.VAR_KEYWORD for p in init_params.values()):
            engine_kwargs.setdefault("logprobs_mode", f"{logprobs_mode}_logprobs")
        elif logprobs_mode != "raw":
            raise VllmUnavailableError("this vLLM has no logprobs_mode: processed log-probs need a newer vLLM")
        self.llm = vllm.LLM(model=model, **engine_kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.model_name = model_name or model
        self.max_context = int(self.llm.llm_engine.model_config.max_model_len)
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        self.stop_token_ids = list(stop_token_ids)

    def _sampling_params(self, request: GenerationRequest) -> Any:
        p = request.params
        return self._vllm.SamplingParams(
            n=1,
            max_tokens=p.max_new_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k if p.top_k > 0 else -1,
            seed=p.seed,
            stop=list(p.stop_strings) or None,
            stop_token_ids=sorted({*self.stop_token_ids, *p.stop_token_ids}) or None,
            logprobs=p.top_logprobs,  # the sampled token's log-probability, and the top ones when asked
            skip_special_tokens=True,
        )

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        from vllm.inputs import TokensPrompt

        if not requests:
            return []
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)) for r in requests]
        outputs = self.llm.generate(prompts, [self._sampling_params(r) for r in requests], use_tqdm=False)
        results = []
        for request, output in zip(requests, outputs, strict=True):
            completion = output.outputs[0]
            token_ids = list(completion.token_ids)
            logprobs = [
                step[token].logprob for token, step in zip(token_ids, completion.logprobs or [], strict=False)
            ]
            top = None
            if request.params.top_logprobs > 0:
                k = request.params.top_logprobs
                top = [
                    sorted(((t, lp.logprob) for t, lp in step.items()), key=lambda pair: -pair[1])[:k]
                    for step in completion.logprobs or []
                ]
            results.append(
                GenerationResult(
                    prompt_token_ids=list(request.prompt_token_ids),
                    token_ids=token_ids,
                    logprobs=logprobs,
                    finish_reason="length" if completion.finish_reason == "length" else "stop",
                    text=completion.text,
                    top_logprobs=top,
                )
            )
        return results

    def update_weights(self, weights: Any) -> None:
        """Refit vLLM's model from a ``state_dict`` (or a model, LoRA merged) with its own ``load_weights``.

        Tries vLLM's ``collective_rpc`` (V1 engine; workers in other processes need
        ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` to ship the function, and get CUDA tensors as IPC
        handles, see :func:`weight_payload`), then the V0 in-process path.
        """
        state = plain_state_dict(weights)  # LoRA adapters merged in (on the weights' device)
        items = [(name, tensor.detach()) for name, tensor in state.items()]

        if hasattr(self.llm, "collective_rpc"):
            payload = weight_payload(items, shared=not self.in_process)

            def load(worker: Any) -> None:
                worker.model_runner.model.load_weights(weights=payload.tensors())

            self.llm.collective_rpc(load)
            del payload  # the IPC handles' tensors stay alive until every worker has copied them
            if hasattr(self.llm, "reset_prefix_cache"):  # cached KV blocks belong to the old weights
                self.llm.reset_prefix_cache()
            return
        model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        model.load_weights(weights=items)

    def close(self) -> None:
        del self.llm


class _Payload:
    """Weights for a ``load_weights`` call in a vLLM worker: the tensors themselves, or CUDA IPC
    handles to them that the worker opens (no copy through host memory)."""

    def __init__(self, items: list[tuple[str, Any]], handles: list[tuple[str, Any]] | None) -> None:
        self._items = items
        self._handles = handles

    def __getstate__(self) -> dict[str, Any]:  # shipped to another process: handles only when we have them
        if self._handles is None:
            return {"_items": self._items, "_handles": None}
        return {"_items": None, "_handles": self._handles}

    def tensors(self) -> list[tuple[str, Any]]:
        if self._handles is None:
            return self._items
        return [(name, rebuild(*args)) for name, (rebuild, args) in self._handles]


def weight_payload(items: list[tuple[str, Any]], *, shared: bool) -> _Payload:
    """``items`` as a :class:`_Payload`; with ``shared`` (workers in other processes) and CUDA tensors,
    as CUDA IPC handles (``torch.multiprocessing.reductions.reduce_tensor``, what torch's own
    multiprocessing sends): the worker maps the trainer's GPU memory and ``load_weights`` copies from
    it on the GPU. CPU tensors go by value."""
    if not shared or not items or any(not t.is_cuda for _, t in items):
        return _Payload(items, None)
    from torch.multiprocessing.reductions import reduce_tensor

    return _Payload(items, [(name, reduce_tensor(tensor.contiguous())) for name, tensor in items])


def colocation_problem(utilization: float, still_to_allocate: int, device: Any = None) -> str | None:
    """Why vLLM with ``gpu_memory_utilization=utilization`` cannot start beside the policy on this GPU,
    or None. vLLM takes ``utilization x total`` memory and refuses to start when less is free; the
    trainer still has ``still_to_allocate`` bytes to come (gradients and optimizer state are made at
    the first step), so both are checked here, with a message naming the key."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    wanted = utilization * total
    available = free - still_to_allocate
    if wanted <= available:
        return None
    fits = max(0.0, available / total)
    return (
        f"policy.generation.vllm_cfg.gpu_memory_utilization is {utilization}: vLLM would take "
        f"{wanted / GIB:.1f} GiB of this GPU's {total / GIB:.1f} GiB, but {free / GIB:.1f} GiB are free "
        f"beside the policy and {still_to_allocate / GIB:.1f} GiB more are needed by its gradients and "
        f"optimizer state: lower it to at most {fits:.2f} (or train with LoRA, or policy.precision bfloat16)"
    )
