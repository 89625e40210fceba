"""Batched sampling with a Hugging Face causal LM on CPU: the hot path of the embedded trainer.

Why a hand-written loop instead of ``model.generate``: RL needs, per row, the exact log-probability
of every sampled token and a seed that reproduces the row whatever it is batched with. Here each
row pre-draws its uniforms from its own ``torch.Generator`` and samples by inverse CDF over the
(sorted, filtered) distribution, so a row's tokens depend only on its prompt, its parameters and its
seed. Prompts are left-padded into one batch and decoded with a KV cache whose buffers have room for the
whole completion (no per-token copy of the cache); a prompt repeated in the batch (GRPO's G samples per
prompt) is prefilled once; rows that finish are dropped from the batch.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers.cache_utils import DynamicLayer

from gym_bridge.generation.backend import (
    FinishReason,
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
)
from gym_bridge.generation.llama_decode import LlamaDecoder, decoder_for
from gym_bridge.generation.weights import PrecisionCopy, lora_merged, plain_state_dict
from gym_bridge.models.logprobs import gather_logprobs
from gym_bridge.models.shared_prefix import cache_kwargs, distinct_prompts, output_cache, prefill

__all__ = ["TransformersBackend", "checked_stop_token_ids"]


def checked_stop_token_ids(stop_token_ids: Sequence[int], vocab_size: int) -> frozenset[int]:
    """The backend-wide stop ids, or a ValueError naming the ones the model cannot emit."""
    bad = [t for t in stop_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"stop_token_ids {bad} are outside the model's vocabulary 0..{vocab_size - 1}")
    return frozenset(stop_token_ids)


@dataclass
class _Row:
    """Decoding state of one request."""

    request: GenerationRequest
    max_new_tokens: int
    stop_ids: frozenset[int]
    uniforms: Any  # torch.Tensor [max_new_tokens]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason | None = None
    text: str | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None


class TransformersBackend(GenerationBackend):
    """:class:`GenerationBackend` over an in-memory ``transformers`` causal LM (shared with a trainer).

    ``lock`` is held for every ``generate`` and ``update_weights``: a trainer that steps the shared model
    in place while a policy server may be generating holds it around ``optimizer.step()``.
    ``stop_token_ids`` end every completion, as the EOS ids do, besides each request's own
    (``policy.generation.stop_token_ids`` of a training run).

    ``threads``: torch threads while generating; None (the default) leaves torch's setting alone, so a
    seeded run computes the same on a quiet and on a loaded machine. ``"auto"`` drops to one thread for the
    call when the machine is oversubscribed (1-minute load average above 1.5x its cores) and leaves
    torch's setting alone otherwise: each op of a multi-threaded OpenMP team waits at a barrier for
    its slowest thread, and a descheduled thread stalls every op. On a 2-core machine at load 10-24,
    SmolLM2-135M generated 3-10x faster on one thread than on two (bench/generation_real.py).
    An int pins the count. (Torch's thread count is process-wide: ``"auto"`` and an int also affect
    work that other threads of the process run during the call.)

    ``logprobs_mode``: ``"raw"`` (the default, vLLM's ``raw_logprobs``) reports log-probs of the unscaled
    model distribution; ``"processed"`` (vLLM's ``processed_logprobs``, what a GRPO trainer compares
    with its own log-probs) of the temperature-scaled distribution each row sampled from. Top-k/top-p
    truncation is not applied to the reported value in either mode.

    ``precision``: the dtype to generate in (``"float32"``, ``"bfloat16"``, ``"float16"``); None (the
    default) is the model's own. Another dtype than the model's samples from a copy in that dtype
    (:class:`~gym_bridge.generation.weights.PrecisionCopy`, LoRA merged in), refreshed when the model's
    weights change; log-probs are then the copy's.
    """

    preallocate_cache = True
    """Decode into KV buffers sized for the whole completion (:func:`preallocate`); False keeps
    transformers' ``DynamicCache``, which copies every layer's keys and values at every token (for A/B
    benches)."""

    written_out_decode = True
    """Decode Llama-architecture models with :class:`~gym_bridge.generation.llama_decode.LlamaDecoder`
    (the step written out over the model's weights); False runs the model's forward per token (for A/B
    benches and tests). Other models always run their forward."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        model_name: str | None = None,
        seed: int = 0,
        max_context: int | None = None,
        stop_token_ids: Sequence[int] = (),
        threads: int | str | None = None,
        logprobs_mode: Literal["raw", "processed"] = "raw",
        precision: str | None = None,
    ) -> None:
        if precision not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"precision must be 'float32', 'bfloat16', 'float16' or None, not {precision!r}")
        if logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', not {logprobs_mode!r}")
        self.logprobs_mode = logprobs_mode
        if not (threads is None or threads == "auto" or (isinstance(threads, int) and threads >= 1)):
            raise ValueError(f"threads must be 'auto', None or a positive int, not {threads!r}")
        self.threads = threads
        dtype = None if precision is None else getattr(torch, precision)
        own = next(model.parameters()).dtype
        self._copy = PrecisionCopy(model, dtype) if dtype is not None and dtype != own else None
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name or getattr(model.config, "_name_or_path", None) or "local-model"
        self.eos_token_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else min(self.eos_token_ids, default=0)
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", None) or 2048
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.stop_token_ids = checked_stop_token_ids(stop_token_ids, self.vocab_size)
        self._seed_source = torch.Generator().manual_seed(seed)
        self._decoder: tuple[Any, LlamaDecoder | None] | None = None  # (the model it is for, the decoder)
        self.lock = threading.RLock()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def update_weights(self, weights: Any) -> None:
        """Load a ``state_dict`` (or copy a model's) into the served model. The served model itself: its
        tensors were written in place (by another process, in shared memory), nothing to load."""
        if weights is None or weights is self.model:
            if weights is not None and self._copy is not None:
                self._copy.mark_stale()
            if weights is not None and self._decoder is not None and self._decoder[1] is not None:
                self._decoder[1].mark_stale()
            return
        state = plain_state_dict(weights)  # a LoRA-trained model's adapters merged in
        with self.lock:
            self.model.load_state_dict(state)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        if not requests:
            return []
        with self.lock, _torch_threads(self.threads), self._generating() as model:
            with torch.inference_mode():
                rows = [self._new_row(r) for r in requests]
                self._decode(rows, model)
        return [
            GenerationResult(
                prompt_token_ids=list(row.request.prompt_token_ids),
                token_ids=row.token_ids,
                logprobs=row.logprobs,
                finish_reason=row.finish_reason or "length",
                text=row.text if row.text is not None else self._decode_text(row.token_ids),
                top_logprobs=row.top_logprobs,
            )
            for row in rows
        ]

    # ------------------------------------------------------------------ internals

    @contextmanager
    def _generating(self) -> Iterator[Any]:
        """The model to decode with, in eval mode: the copy in ``precision``, or the model itself (a LoRA
        model, such as the synchronous trainer's own, with its adapters merged for the call)."""
        if self._copy is not None:
            yield self._copy.current()
            return
        with lora_merged(self.model):
            was_training = self.model.training
            self.model.eval()
            try:
                yield self.model
            finally:
                if was_training:
                    self.model.train()

    def _new_row(self, request: GenerationRequest) -> _Row:
        params = request.params
        prompt_len = len(request.prompt_token_ids)
        if prompt_len == 0:
            raise ValueError("prompt_token_ids must not be empty")
        if not all(0 <= t < self.vocab_size for t in request.prompt_token_ids):
            raise ValueError(f"prompt_token_ids must be in 0..{self.vocab_size - 1}")
        if prompt_len >= self.max_context:
            raise ValueError(f"prompt of {prompt_len} tokens does not fit the context of {self.max_context}")
        max_new = min(params.max_new_tokens, self.max_context - prompt_len)
        seed = params.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
        generator = torch.Generator().manual_seed(seed)
        # Uniforms in (0, 1]: a zero could select a zero-probability token at the front of the CDF.
        uniforms = 1.0 - torch.rand(max(max_new, 1), generator=generator, dtype=torch.float64)
        return _Row(
            request=request,
            max_new_tokens=max_new,
            stop_ids=frozenset(self.eos_token_ids) | self.stop_token_ids | frozenset(params.stop_token_ids),
            uniforms=uniforms,
            token_ids=[],
            logprobs=[],
            finish_reason="length" if max_new == 0 else None,
            top_logprobs=[] if params.top_logprobs > 0 else None,
        )

    def _decode(self, rows: list[_Row], model: Any) -> None:
        active = [i for i, row in enumerate(rows) if row.finish_reason is None]
        if not active:
            return
        device = next(model.parameters()).device
        params = [rows[i].request.params for i in active]
        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
        top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
        top_k = torch.tensor([p.top_k if p.top_k > 0 else 0 for p in params], dtype=torch.long, device=device)
        steps = max(rows[i].max_new_tokens for i in active)
        uniforms = torch.ones((len(active), steps), dtype=torch.float64)  # [rows, steps], padded with 1s
        for j, i in enumerate(active):
            row_u = rows[i].uniforms[:steps]
            uniforms[j, : len(row_u)] = row_u
        uniforms = uniforms.to(device)

        # Each distinct prompt runs once (GRPO sends every prompt G times); its cache fans out per row.
        prompts, row_prompt = distinct_prompts([rows[i].request.prompt_token_ids for i in active])
        prompt = prefill(model, prompts, row_prompt, self.pad_token_id, device, logits_to_keep=1)
        cache, fan_out = prompt.cache, prompt.fan_out
        logits = prompt.output.logits[:, -1, :].float()[fan_out]
        attention_mask, position = prompt.attention_mask[fan_out], prompt.positions[fan_out][:, -1:]
        decoder = self._decoder_for(model)
        if decoder is not None:
            state = decoder.start(cache, attention_mask, steps)
            del cache, prompt
        elif self.preallocate_cache:
            preallocate(cache, steps)
        step = 0
        while True:
            tokens, logprobs = _sample(
                logits, temperature, top_p, top_k, uniforms[:, step], self.logprobs_mode == "processed"
            )
            token_list, logprob_list = tokens.tolist(), logprobs.tolist()
            top = _top_logprobs(logits, [rows[i].request.params.top_logprobs for i in active])
            keep: list[int] = []
            for j, i in enumerate(active):
                row = rows[i]
                row.token_ids.append(token_list[j])
                row.logprobs.append(logprob_list[j])
                if row.top_logprobs is not None and top is not None:
                    k = row.request.params.top_logprobs
                    row.top_logprobs.append(list(zip(top[1][j][:k], top[0][j][:k], strict=True)))
                if not self._finished(row):
                    keep.append(j)
            step += 1
            if not keep:
                return
            if len(keep) < len(active):  # drop finished rows so they cost nothing from here on
                index = torch.tensor(keep, dtype=torch.long, device=device)
                if decoder is not None:
                    state.select(index)
                else:
                    cache.batch_select_indices(index)
                tokens, attention_mask, position = tokens[index], attention_mask[index], position[index]
                temperature, top_p, top_k, uniforms = (
                    temperature[index],
                    top_p[index],
                    top_k[index],
                    uniforms[index],
                )
                active = [active[j] for j in keep]
            position = position + 1
            if decoder is not None:
                logits = decoder.step(state, tokens, position[:, 0]).float()
                continue
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(active), 1))], dim=-1)
            out = model(
                input_ids=tokens.unsqueeze(-1),
                attention_mask=attention_mask,
                position_ids=position,
                use_cache=True,
                **cache_kwargs(model, cache),
            )
            cache = output_cache(out)
            logits = out.logits[:, -1, :].float()

    def _decoder_for(self, model: Any) -> LlamaDecoder | None:
        """The written-out decode step for ``model`` (kept across calls: it holds prepared weights), or
        None where it does not apply or :attr:`written_out_decode` is off."""
        if not self.written_out_decode:
            return None
        if self._decoder is None or self._decoder[0] is not model:
            self._decoder = (model, decoder_for(model))
        return self._decoder[1]

    def _finished(self, row: _Row) -> bool:
        """Record why a row stops (stop token, stop string, length), or return False to continue."""
        if row.token_ids[-1] in row.stop_ids:
            row.finish_reason = "stop"
            return True
        stop_strings = row.request.params.stop_strings
        if stop_strings:
            text = self._decode_text(row.token_ids)
            cut = min((text.find(s) for s in stop_strings if s and s in text), default=-1)
            if cut >= 0:
                row.finish_reason = "stop"
                row.text = text[:cut]
                return True
        if len(row.token_ids) >= row.max_new_tokens:
            row.finish_reason = "length"
            return True
        return False

    def _decode_text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)


class _PreallocatedLayer(DynamicLayer):
    """A KV-cache layer whose keys and values live in buffers with room for the tokens still to come:
    a decoded token is written into place, where ``DynamicLayer`` concatenates (copying the whole
    cache of the layer at every token: with SmolLM2-135M, 64 rows and 150-token contexts about
    0.3 GB of copies per decoded token). ``keys``/``values`` are views of the filled part."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        super().__init__()
        self.is_initialized, self.device = True, keys.device
        self._fill(keys, values, capacity)

    def _fill(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        length = keys.shape[-2]
        self._keys = keys.new_empty((*keys.shape[:-2], capacity, keys.shape[-1]))
        self._values = values.new_empty((*values.shape[:-2], capacity, values.shape[-1]))
        self._keys[..., :length, :] = keys
        self._values[..., :length, :] = values
        self._length = length
        self.keys, self.values = self._keys[..., :length, :], self._values[..., :length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        end = self._length + key_states.shape[-2]
        if end > self._keys.shape[-2]:  # more than planned (not in the backend's loop): make room
            self._fill(self.keys, self.values, max(end, 2 * self._keys.shape[-2]))
        self._keys[..., self._length : end, :] = key_states
        self._values[..., self._length : end, :] = value_states
        self._length = end
        self.keys, self.values = self._keys[..., :end, :], self._values[..., :end, :]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._keys, self._values = self._keys[indices], self._values[indices]
        self.keys, self.values = self._keys[..., : self._length, :], self._values[..., : self._length, :]


def preallocate(cache: Any, tokens: int) -> None:
    """Move each layer of a prefilled ``DynamicCache`` into buffers with room for ``tokens`` more."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers):
        return  # another layout (an older transformers, sliding windows): decode as it is
    for i, layer in enumerate(layers):
        layers[i] = _PreallocatedLayer(layer.keys, layer.values, layer.keys.shape[-2] + tokens)


def _sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    uniforms: torch.Tensor,
    processed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its log-probability under the raw (unscaled) model distribution, or with
    ``processed`` under the temperature-scaled one it was drawn from (greedy rows: the raw one).

    Rows with temperature 0 take the argmax; the others sample by inverse CDF with their own uniform.
    The procedure a row goes through depends only on that row's parameters, which keeps a seeded row
    independent of what it is batched with.

    The log-probabilities reuse the sampler's pass over the vocabulary: ``exp(x - max)`` summed (in
    float64) is the normaliser, so ``log p = x - max - log(sum)`` needs no second ``logsumexp`` pass. Rows
    whose reported distribution is not the one sampled from (raw log-probs at a temperature other than 0
    or 1) take ``log_softmax`` of their raw logits.
    """
    greedy = temperature <= 0
    any_greedy = bool(greedy.any())
    chosen = logits.argmax(dim=-1) if any_greedy else None
    if bool(greedy.all()):
        return chosen, gather_logprobs(logits, chosen)
    unit = greedy | (temperature == 1)
    all_unit = bool(unit.all())
    # Dividing by 1 changes nothing: skip the pass when every row samples at temperature 0 or 1.
    scaled = (
        logits
        if all_unit
        else logits / torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)
    )
    vocab = scaled.shape[-1]
    filtered = (top_k > 0) & (top_k < vocab) | (top_p < 1)
    # Rows without top-k/top-p sample over the vocabulary in id order (no sort needed); rows with a
    # filter over the sorted vocabulary. Which path a row takes depends only on its own parameters.
    # Unnormalised weights exp(x - max) suffice: the inverse CDF scales by their total.
    top = scaled.amax(dim=-1, keepdim=True)
    sampled, total = _inverse_cdf((scaled - top).exp_(), uniforms)
    if bool(filtered.any()):
        sorted_logits, sorted_ids = torch.sort(scaled, dim=-1, descending=True, stable=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab)).unsqueeze(-1)
        mass_before = probs.cumsum(dim=-1) - probs
        keep = (ranks < k) & (mass_before < top_p.unsqueeze(-1))
        keep[:, 0] = True
        position, _ = _inverse_cdf(torch.where(keep, probs, torch.zeros_like(probs)), uniforms)
        sampled = torch.where(filtered, sorted_ids.gather(-1, position.unsqueeze(-1)).squeeze(-1), sampled)
    chosen = torch.where(greedy, chosen, sampled) if any_greedy else sampled
    # log-probs under `scaled` (greedy rows: scaled is their raw logits) from the sampler's normaliser
    picked = scaled.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
    logprobs = ((picked - top.squeeze(-1)).double() - total.log()).to(logits.dtype)
    if not processed and not all_unit:
        raw = gather_logprobs(logits, chosen)
        logprobs = torch.where(unit, logprobs, raw)
    return chosen, logprobs


def _top_logprobs(logits: torch.Tensor, ks: list[int]) -> tuple[list[list[float]], list[list[int]]] | None:
    """The ``max(ks)`` most likely tokens of each row under the raw distribution: (log-probs, ids); None
    when no row asked."""
    import torch

    k = min(max(ks, default=0), logits.shape[-1])
    if k <= 0:
        return None
    values, ids = torch.topk(torch.log_softmax(logits, dim=-1), k, dim=-1)
    return values.tolist(), ids.tolist()


_CDF_BLOCK = 256


def _inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index drawn per row from unnormalised non-negative ``weights`` [B, V] with uniforms in (0, 1], and
    each row's total weight (float64).

    Two levels, so that no float64 copy or cumulative sum of the whole vocabulary is made (on a 49k
    vocabulary that was most of the sampling time): a float64 CDF over sums of blocks of 256 weights
    picks a block, then a float64 CDF over that block's weights picks the token, at the same fraction
    of the block's mass. A token of zero weight is never picked: both searches find the first entry
    whose CDF reaches a target above the entry before it.
    """
    rows, vocab = weights.shape
    pad = (-vocab) % _CDF_BLOCK
    if pad:
        weights = torch.nn.functional.pad(weights, (0, pad))
    blocks = weights.view(rows, -1, _CDF_BLOCK)
    block_mass = blocks.sum(dim=-1).double()  # [B, V / 256]
    block_cdf = block_mass.cumsum(dim=-1)
    target = uniforms.double() * block_cdf[:, -1]
    block = torch.searchsorted(block_cdf, target.unsqueeze(-1)).squeeze(-1).clamp(max=blocks.shape[1] - 1)
    before = torch.where(
        block > 0, block_cdf.gather(-1, (block - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1), 0.0
    )
    mass = block_mass.gather(-1, block.unsqueeze(-1)).squeeze(-1)
    fraction = ((target - before) / mass).clamp(min=torch.finfo(torch.float64).tiny, max=1.0)
    inner_cdf = blocks[torch.arange(rows, device=weights.device), block].double().cumsum(dim=-1)
    inner = torch.searchsorted(inner_cdf, (fraction * inner_cdf[:, -1]).unsqueeze(-1)).squeeze(-1)
    return (block * _CDF_BLOCK + inner.clamp(max=_CDF_BLOCK - 1)).clamp(max=vocab - 1), block_cdf[:, -1]


def oversubscribed() -> bool:
    """Whether more threads want to run than the machine has cores (1-minute load average > 1.5x)."""
    try:
        return os.getloadavg()[0] > 1.5 * (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        return False


@contextmanager
def _torch_threads(threads: int | str | None) -> Iterator[None]:
    """Run the block with ``threads`` torch threads (see :class:`TransformersBackend`), then restore."""
    before = torch.get_num_threads()
    wanted = (1 if oversubscribed() else before) if threads == "auto" else (threads or before)
    if wanted == before:
        yield
        return
    torch.set_num_threads(int(wanted))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """EOS ids from the tokenizer and the model's generation config (chat models often list several)."""
    ids: set[int] = set()
    candidates = [tokenizer.eos_token_id]
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        candidates.append(generation_config.eos_token_id)
    for candidate in candidates:
        if isinstance(candidate, int):
            ids.add(candidate)
        elif isinstance(candidate, (list, tuple)):
            ids.update(int(c) for c in candidate)
    return ids
