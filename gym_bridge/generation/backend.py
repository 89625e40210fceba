"""The generation-backend interface shared by the policy server and the GRPO trainer.

One batched call, token ids in and token ids out, with the per-token log-probabilities that RL needs.
Both the HTTP policy server (``gym_bridge.policy``) and the in-process trainer program against
:class:`GenerationBackend`, so swapping the local transformers loop for vLLM changes one constructor.

Log-probabilities convention: ``GenerationResult.logprobs[i]`` is ``log p(token_ids[i] | prefix)`` under
the **raw model distribution** (``log_softmax`` of the unscaled logits), *not* the temperature-scaled or
top-p/top-k-truncated distribution that was sampled from. That makes them directly comparable to the
trainer's own log-probabilities (what NeMo RL compares against ``generation_logprobs``) and matches
vLLM's default ``logprobs_mode="raw_logprobs"``. A GRPO trainer's backends are built with
``logprobs_mode="processed"`` instead: the temperature-scaled distribution the row was sampled from,
which is what the trainer's own log-probs are (:mod:`gym_bridge.models.logprobs`). Pure dataclasses
here: no torch import.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["FinishReason", "GenerationBackend", "GenerationRequest", "GenerationResult", "SamplingParams"]

FinishReason = Literal["stop", "length"]


@dataclass
class SamplingParams:
    """How to sample one completion.

    ``temperature == 0`` means greedy. ``top_k <= 0`` and ``top_p >= 1`` disable those filters.
    ``seed`` makes the completion reproducible for the same prompt, whatever it is batched with;
    ``None`` draws from the backend's own generator.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_strings: list[str] = field(default_factory=list)
    """Stop once the decoded completion contains one of these; the text is cut before it."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Stop after emitting one of these (the tokenizer's EOS ids are always included)."""
    top_logprobs: int = 0
    """Also return this many most likely tokens per step with their log-probabilities (same pass)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_logprobs < 0:
            raise ValueError("top_logprobs must be >= 0")


@dataclass
class GenerationRequest:
    """One prompt (already tokenized, e.g. through the chat template) and how to continue it."""

    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class GenerationResult:
    """One completion.

    ``token_ids`` include the stop token when generation stopped on EOS or a stop token (the model did
    emit it, and training must see it); ``text`` is the decoded completion without special tokens and
    cut before any matched stop string. ``logprobs`` has one entry per ``token_ids`` entry (see the
    module docstring for which distribution).
    """

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    text: str
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """With ``params.top_logprobs`` = k > 0: per generated token, the k most likely ``(token id,
    log-probability)`` pairs of that step's distribution (the same raw distribution as ``logprobs``)."""


class GenerationBackend(ABC):
    """A batched token-level generator: what the policy server serves and the trainer samples with."""

    model_name: str
    tokenizer: Any
    """A Hugging Face tokenizer (chat template, encode/decode, eos ids)."""
    max_context: int
    """Prompt plus completion length limit in tokens; longer requests are refused or cut."""
    vocab_size: int
    """Number of token ids the model accepts (its embedding rows; may exceed ``len(tokenizer)``)."""

    @abstractmethod
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Complete every request in one batched call; results are in request order."""

    def update_weights(self, weights: Any) -> None:  # noqa: B027  # optional hook, no-op by default
        """Load new policy weights (a ``state_dict`` or a model) after a training step.

        Backends that share the trainer's model object need nothing; a separate engine (vLLM) refits.
        """

    def close(self) -> None:  # noqa: B027  # optional hook, no-op by default
        """Release engine resources."""
