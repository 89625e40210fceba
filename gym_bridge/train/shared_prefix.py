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

from gym_bridge.train.gqa_attention import grouped_query_attention
from gym_bridge.train.logprobs import hidden_logprobs, projects_hidden_states_plainly

__all__ = [
    "MIN_COMMON_PREFIX",
    "Prefill",
    "PrefixPlan",
    "cache_kwargs",
    "common_prefix_length",
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


def prefill(
    forward: Any,
    prompts: Sequence[Sequence[int]],
    row_prompt: Sequence[int],
    pad_token_id: int,
    device: Any,
    **kwargs: Any,
) -> Prefill:
    """Run each of the distinct ``prompts`` once through ``forward`` (a model or its ``base_model``;
    ``kwargs`` go to it), then fan the KV cache out to rows: row i gets prompt ``row_prompt[i]``.

    Distinct prompts with a common start of :data:`MIN_COMMON_PREFIX` tokens or more (validation's 200
    problems behind one system prompt and worked examples) run that start once, batch 1, and only their
    own ends per prompt: keys are ``[common start][left padding][own end]``, positions count real tokens
    only, so attention and log-probs are the plain pass's up to float rounding.
    """
    common = common_prefix_length(prompts) if len(prompts) > 1 else 0
    cache = DynamicCache()
    if common >= MIN_COMMON_PREFIX:
        shared = torch.tensor([list(prompts[0][:common])], dtype=torch.long, device=device)
        start = forward(
            input_ids=shared,
            attention_mask=torch.ones_like(shared),
            position_ids=torch.arange(common, device=device).unsqueeze(0),
            use_cache=True,
            **cache_kwargs(forward, cache),
            **kwargs,
        )
        cache = output_cache(start)
        cache.batch_select_indices(torch.zeros(len(prompts), dtype=torch.long, device=device))
    else:
        common = 0
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
) -> torch.Tensor:
    """(b, T-1) log-probs of tokens 1..T-1 where ``token_mask`` is set (0 elsewhere), like a plain pass.

    ``token_mask`` is the micro-batch's right-padded next-token mask (position t-1 holds token t);
    it must be 0 inside each row's prompt, which :func:`prompt_length` guarantees for loss masks.
    ``chunk_size``: see :func:`gym_bridge.train.logprobs.hidden_logprobs`.
    """
    with grouped_query_attention(model):
        return _shared_prefix_logprobs(model, token_ids, token_mask, plan, pad_token_id, chunk_size)


def _shared_prefix_logprobs(
    model: Any,
    token_ids: Sequence[Sequence[int]],
    token_mask: torch.Tensor,
    plan: PrefixPlan,
    pad_token_id: int,
    chunk_size: int | None,
) -> torch.Tensor:
    device = token_mask.device
    rows = len(token_ids)
    # One left-padded pass over the distinct prompts, keeping their keys and values.
    prompt = prefill(model.base_model, plan.prompts, plan.row_prompt, pad_token_id, device)
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
    picked = hidden_logprobs(model, hidden[wanted], suffix_ids[wanted], chunk_size)
    out = torch.zeros(token_mask.shape, dtype=picked.dtype, device=device)
    row_index = torch.arange(rows, device=device).unsqueeze(-1).expand(rows, suffix_width)
    out[row_index[wanted], columns[wanted]] = picked
    return out
