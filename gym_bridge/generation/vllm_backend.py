"""vLLM behind the :class:`GenerationBackend` interface, for CUDA machines.

Why: the same policy server and trainer scale to real models by swapping the backend. vLLM is
imported only when a :class:`VllmBackend` is built, so CPU installs never need it.

Log-probabilities: vLLM's default ``logprobs_mode`` is ``"raw_logprobs"`` (before temperature and
top-p/top-k), the same convention as :mod:`gym_bridge.generation.backend`; this backend asks for it
explicitly where the installed vLLM knows the option.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from gym_bridge.generation.backend import GenerationBackend, GenerationRequest, GenerationResult
from gym_bridge.generation.weights import plain_state_dict

__all__ = ["VllmBackend", "VllmUnavailableError"]


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

    def __init__(
        self,
        model: str,
        model_name: str | None = None,
        stop_token_ids: Sequence[int] = (),
        **engine_kwargs: Any,
    ) -> None:
        """``stop_token_ids`` end every completion, besides each request's own."""
        vllm = _import_vllm()
        self._vllm = vllm
        init_params = inspect.signature(vllm.LLM.__init__).parameters
        if "logprobs_mode" in init_params or any(p.kind is p.VAR_KEYWORD for p in init_params.values()):
            engine_kwargs.setdefault("logprobs_mode", "raw_logprobs")
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

        Tries vLLM's ``collective_rpc`` (V1 engine; workers may run in other processes, which needs
        ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` to ship the function), then the V0 in-process path.
        """
        state = plain_state_dict(weights)  # LoRA adapters merged in: vLLM gets plain weights
        items = [(name, tensor.detach()) for name, tensor in state.items()]

        def load(worker: Any) -> None:
            worker.model_runner.model.load_weights(weights=items)

        if hasattr(self.llm, "collective_rpc"):
            self.llm.collective_rpc(load)
            if hasattr(self.llm, "reset_prefix_cache"):  # cached KV blocks belong to the old weights
                self.llm.reset_prefix_cache()
            return
        model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        model.load_weights(weights=items)

    def close(self) -> None:
        del self.llm
