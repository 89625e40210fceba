"""Token log-probs of a GRPO batch with one forward pass per distinct prompt.

GRPO trains on G completions of every prompt, and on short-answer tasks the prompt is most of each
sequence (the tiny recipe: 25 prompt tokens, about 8 generated). A plain forward pass runs the
prompt G times. Here each distinct prompt runs once, its keys and values are fanned out to its G
rows (an index into the KV cache, so gradients from every row flow back into the one prompt pass),
and only the completions run per row. The results are the plain pass's, up to float rounding:
attention over the cached prompt is the same attention.

The "prompt" of a sample is its tokens before the first trained token (``loss_mask``); multi-turn
samples share their first prompt and run the rest (later turns, tool outputs) per row.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from gym_bridge.models.gqa_attention import grouped_query_attention
from gym_bridge.models.logprobs import hidden_logprobs, projects_hidden_states_plainly

__all__ = [
    "MIN_COMMON_PREFIX",
    "CommonStart",
    "Prefill",
    "PrefixPlan",
    "cache_kwargs",
    "common_prefix_length",
    "common_start",
    "distinct_prompts",
    "output_cache",
    "plan_prefixes",
    "prefill",
    "prefix_micro_batches",
    "shared_prefix_logprobs",
    "shares_prefixes",
]


@functools.cache
def _cache_argument(forward_class: type) -> str:
    params = inspect.signature(forward_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for ``model``'s forward: transformers 5.24 renamed ``past_key_values`` to
    ``cache`` (the old name warns on every call); older releases know only ``past_key_values``."""
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_argument(type(target)): cache}


def output_cache(output: Any) -> Any:
    """The KV cache a forward pass returned, under either release's field name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def prompt_length(token_ids: Sequence[int], loss_mask: Sequence[int]) -> int:
    """Tokens before the first trained one, keeping at least one token on each side."""
    for i, m in enumerate(loss_mask):
        if m:
            return max(1, min(i, len(token_ids) - 1))
    return max(1, len(token_ids) - 1)


@dataclass
class PrefixPlan:
    """How the rows of a micro-batch split into shared prompts and per-row suffixes."""

    prompts: list[tuple[int, ...]]
    """Distinct prompts, in first-seen order."""
    row_prompt: list[int]
    """Index into ``prompts`` of each row."""
    prompt_lengths: list[int]
    """Each row's prompt length (where its suffix starts)."""

    @property
    def repeats(self) -> bool:
        """Whether any prompt serves two rows or more (otherwise sharing saves nothing)."""
        return len(self.prompts) < len(self.row_prompt)


def plan_prefixes(token_ids: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]]) -> PrefixPlan:
    """Group rows by identical prompt."""
    lengths = [prompt_length(tokens, mask) for tokens, mask in zip(token_ids, loss_masks, strict=True)]
    prompts, row_prompt = distinct_prompts([tokens[:n] for tokens, n in zip(token_ids, lengths, strict=True)])
    return PrefixPlan(prompts=prompts, row_prompt=row_prompt, prompt_lengths=lengths)


def prefix_micro_batches(
    token_ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    index: Sequence[int],
    max_rows: int,
) -> list[list[int]]:
    """Micro-batches of at most ``max_rows`` rows that keep rows of one prompt together.

    A prompt group larger than ``max_rows`` is split; otherwise groups are packed whole, longest
    prompts first, so a micro-batch holds few distinct prompts of similar length.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in index:
        n = prompt_length(token_ids[i], loss_masks[i])
        groups.setdefault(tuple(token_ids[i][:n]), []).append(i)
    batches: list[list[int]] = []
    current: list[int] = []
    for rows in sorted(groups.values(), key=lambda rows: -len(token_ids[rows[0]])):
        for start in range(0, len(rows), max_rows):
            chunk = rows[start : start + max_rows]
            if current and len(current) + len(chunk) > max_rows:
                batches.append(current)
                current = []
            current.extend(chunk)
    if current:
        batches.append(current)
    return batches


@dataclass
class Prefill:
    """One pass over the distinct prompts of a batch, its KV cache fanned out to the batch's rows."""

    output: Any
    """The model's output over the distinct prompts, left-padded to one width."""
    cache: Any
    """Their keys and values, one row per input prompt (an index, so gradients reach the one pass)."""
    fan_out: torch.Tensor
    """(rows,) which distinct prompt each row has."""
    attention_mask: torch.Tensor
    """(distinct, keys) over the cached keys: a common start, then each prompt's left-padded end."""
    positions: torch.Tensor
    """(distinct, keys) position ids (each prompt starts at 0; padding does not count)."""


def distinct_prompts(prompts: Sequence[Sequence[int]]) -> tuple[list[tuple[int, ...]], list[int]]:
    """The distinct prompts in first-seen order, and the index of each row's prompt among them."""
    index: dict[tuple[int, ...], int] = {}
    row_prompt = [index.setdefault(tuple(p), len(index)) for p in prompts]
    return list(index), row_prompt


MIN_COMMON_PREFIX = 16
"""Distinct prompts that all start with at least this many equal tokens (a system prompt and few-shot
examples before each problem) run that start once; a shorter common start is not worth a pass."""


def common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with, leaving each prompt at least one token of its own."""
    first, limit = prompts[0], min(len(p) for p in prompts) - 1
    for i in range(max(limit, 0)):
        token = first[i]
        if any(p[i] != token for p in prompts):
            return i
    return max(limit, 0)


def _layer_tensors(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values) in a ``DynamicCache`` (transformers 5's ``layers`` or 4's lists)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))


def _run_start(forward: Any, tokens: Sequence[int], device: Any, **kwargs: Any) -> Any:
    """The KV cache of ``tokens`` run as one batch-1 sequence."""
    ids = torch.tensor([list(tokens)], dtype=torch.long, device=device)
    output = forward(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        position_ids=torch.arange(len(tokens), device=device).unsqueeze(0),
        use_cache=True,
        **cache_kwargs(forward, DynamicCache()),
        **kwargs,
    )
    return output_cache(output)


class CommonStart:
    """The start every prompt of an optimizer step shares, run once with gradients for all its
    micro-batches.

    Why: micro-batches (kept small for memory) each ran the system prompt and worked examples again, a
    quarter of the SmolLM2 recipe's training pass. Here the start runs once; each micro-batch attends to
    detached copies of its keys and values (:meth:`cache`), whose gradients add up over the
    micro-batches, and :meth:`backward` sends the sum back through the one pass after the last of them.
    The same gradients as running the start in every micro-batch, up to float rounding; the start's
    activations are held over the micro-batches, as each micro-batch held its own before.
    """

    def __init__(self, forward: Any, tokens: Sequence[int], device: Any) -> None:
        self.tokens = tuple(tokens)
        self._outputs = [t for pair in _layer_tensors(_run_start(forward, self.tokens, device)) for t in pair]
        self._inputs = [t.detach().requires_grad_(t.requires_grad) for t in self._outputs]

    @classmethod
    def of(cls, forward: Any, prompts: Sequence[Sequence[int]], device: Any) -> CommonStart | None:
        """The common start of ``prompts`` run once, or None when it is shorter than
        :data:`MIN_COMMON_PREFIX` tokens (or there is one prompt)."""
        distinct = distinct_prompts(prompts)[0]
        common = common_prefix_length(distinct) if len(distinct) > 1 else 0
        return cls(forward, distinct[0][:common], device) if common >= MIN_COMMON_PREFIX else None

    def starts(self, prompts: Sequence[Sequence[int]]) -> bool:
        """Whether every prompt begins with this start and has a token of its own after it."""
        n = len(self.tokens)
        return all(len(p) > n and tuple(p[:n]) == self.tokens for p in prompts)

    def cache(self) -> DynamicCache:
        """A batch-1 KV cache of the start whose gradients collect for :meth:`backward`."""
        cache = DynamicCache()
        for layer in range(len(self._inputs) // 2):
            cache.update(self._inputs[2 * layer], self._inputs[2 * layer + 1], layer)
        return cache

    def backward(self) -> None:
        """Send the gradients the micro-batches left on the start's keys and values through its pass."""
        pairs = [(out, inp.grad) for out, inp in zip(self._outputs, self._inputs, strict=True) if inp.grad is not None]
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        self._outputs, self._inputs = [], []


def common_start(model: Any, plans: Sequence[PrefixPlan], device: Any) -> CommonStart | None:
    """The :class:`CommonStart` of an optimizer step's micro-batches (their prefix plans), run once;
    None for a single micro-batch (its own pass already runs its common start once) or no long start."""
    if len(plans) < 2:
        return None
    with grouped_query_attention(model):
        return CommonStart.of(model.base_model, [p for plan in plans for p in plan.prompts], device)


def prefill(
    forward: Any,
    prompts: Sequence[Sequence[int]],
    row_prompt: Sequence[int],
    pad_token_id: int,
    device: Any,
    start: CommonStart | None = None,
    **kwargs: Any,
) -> Prefill:
    """Run each of the distinct ``prompts`` once through ``forward`` (a model or its ``base_model``;
    ``kwargs`` go to it), then fan the KV cache out to rows: row i gets prompt ``row_prompt[i]``.

    Distinct prompts with a common start of :data:`MIN_COMMON_PREFIX` tokens or more (validation's 200
    problems behind one system prompt and worked examples) run that start once, batch 1, and only their
    own ends per prompt: keys are ``[common start][left padding][own end]``, positions count real tokens
    only, so attention and log-probs are the plain pass's up to float rounding. ``start``: a common
    start already run (:class:`CommonStart`, shared by a step's micro-batches), used when every prompt
    begins with it.
    """
    if start is not None and start.starts(prompts):
        common, cache = len(start.tokens), start.cache()
    else:
        common = common_prefix_length(prompts) if len(prompts) > 1 else 0
        if common >= MIN_COMMON_PREFIX:
            cache = _run_start(forward, prompts[0][:common], device, **kwargs)
        else:
            common, cache = 0, DynamicCache()
    if common:
        cache.batch_select_indices(torch.zeros(len(prompts), dtype=torch.long, device=device))
    ends = [p[common:] for p in prompts]
    width = max(len(e) for e in ends)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), common + width), dtype=torch.long)
    attention_mask[:, :common] = 1
    for j, end in enumerate(ends):
        input_ids[j, width - len(end) :] = torch.tensor(end, dtype=torch.long)
        attention_mask[j, common + width - len(end) :] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    output = forward(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions[:, common:],
        use_cache=True,
        **cache_kwargs(forward, cache),
        **kwargs,
    )
    fan_out = torch.tensor(list(row_prompt), dtype=torch.long, device=device)
    cache = output_cache(output)
    if list(row_prompt) != list(range(len(prompts))):  # (the identity would only copy the cache)
        cache.batch_select_indices(fan_out)
    return Prefill(output, cache, fan_out, attention_mask, positions)


def shares_prefixes(model: Any) -> bool:
    """Whether ``model`` supports the shared-prompt pass: a decoder whose logits are ``lm_head(hidden)``,
    whose attention reads a plain growing KV cache (no sliding windows or recurrent state) and whose
    layers are not activation-checkpointed."""
    config = model.config
    plain_head = projects_hidden_states_plainly(model)
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    full_attention = all(t == "full_attention" for t in layer_types) and not getattr(
        config, "sliding_window", None
    )
    # Checkpointed layers drop the KV cache in training passes (they would write it again on replay).
    checkpointed = any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
    return plain_head and full_attention and hasattr(model, "base_model") and not checkpointed


def shared_prefix_logprobs(
    model: Any,
    token_ids: Sequence[Sequence[int]],
    token_mask: torch.Tensor,
    plan: PrefixPlan,
    pad_token_id: int,
    chunk_size: int | None = None,
    start: CommonStart | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """(b, T-1) log-probs at ``temperature`` of tokens 1..T-1 where ``token_mask`` is set (0 elsewhere),
    like a plain pass.

    ``token_mask`` is the micro-batch's right-padded next-token mask (position t-1 holds token t);
    it must be 0 inside each row's prompt, which :func:`prompt_length` guarantees for loss masks.
    ``chunk_size``: see :func:`gym_bridge.models.logprobs.hidden_logprobs`. ``start``: the step's
    :class:`CommonStart` (then call its ``backward`` after the last micro-batch's).
    """
    with grouped_query_attention(model):
        return _shared_prefix_logprobs(
            model, token_ids, token_mask, plan, pad_token_id, chunk_size, start, temperature
        )


def _shared_prefix_logprobs(
    model: Any,
    token_ids: Sequence[Sequence[int]],
    token_mask: torch.Tensor,
    plan: PrefixPlan,
    pad_token_id: int,
    chunk_size: int | None,
    start: CommonStart | None,
    temperature: float,
) -> torch.Tensor:
    device = token_mask.device
    rows = len(token_ids)
    # One left-padded pass over the distinct prompts, keeping their keys and values.
    prompt = prefill(model.base_model, plan.prompts, plan.row_prompt, pad_token_id, device, start)
    fan_out, cache = prompt.fan_out, prompt.cache

    # One right-padded pass over each row's suffix, attending to its prompt through the cache.
    suffixes = [tokens[n:] for tokens, n in zip(token_ids, plan.prompt_lengths, strict=True)]
    suffix_width = max(len(s) for s in suffixes)
    suffix_ids = torch.full((rows, suffix_width), pad_token_id, dtype=torch.long)
    suffix_attention = torch.zeros((rows, suffix_width), dtype=torch.long)
    for i, suffix in enumerate(suffixes):
        suffix_ids[i, : len(suffix)] = torch.tensor(suffix, dtype=torch.long)
        suffix_attention[i, : len(suffix)] = 1
    suffix_ids, suffix_attention = suffix_ids.to(device), suffix_attention.to(device)
    starts = torch.tensor(plan.prompt_lengths, dtype=torch.long, device=device)
    suffix_out = model.base_model(
        input_ids=suffix_ids,
        attention_mask=torch.cat([prompt.attention_mask[fan_out], suffix_attention], dim=-1),
        position_ids=starts.unsqueeze(-1) + torch.arange(suffix_width, device=device),
        use_cache=True,
        **cache_kwargs(model.base_model, cache),
    )

    # Suffix token k is predicted by the prompt's last hidden state (k = 0) or by suffix position k-1.
    hidden = torch.cat(
        [prompt.output.last_hidden_state[:, -1][fan_out].unsqueeze(1), suffix_out.last_hidden_state[:, :-1]],
        dim=1,
    )
    # Next-token mask in suffix coordinates: column t-1 of token_mask is suffix column t - start.
    columns = starts.unsqueeze(-1) - 1 + torch.arange(suffix_width, device=device)
    in_range = columns < token_mask.shape[1]
    wanted = torch.zeros((rows, suffix_width), dtype=torch.bool, device=device)
    wanted[in_range] = token_mask.gather(1, columns.clamp(max=token_mask.shape[1] - 1))[in_range].bool()
    wanted &= suffix_attention.bool()
    picked = hidden_logprobs(model, hidden[wanted], suffix_ids[wanted], chunk_size, temperature)
    out = torch.zeros(token_mask.shape, dtype=picked.dtype, device=device)
    row_index = torch.arange(rows, device=device).unsqueeze(-1).expand(rows, suffix_width)
    out[row_index[wanted], columns[wanted]] = picked
    return out
