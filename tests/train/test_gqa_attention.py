"""Training passes read grouped key/value heads in place: same log-probs and gradients, no per-head copy."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gym_bridge.models import gqa_attention  # noqa: E402
from gym_bridge.models.logprobs import token_logprobs  # noqa: E402
from gym_bridge.models.shared_prefix import plan_prefixes, shared_prefix_logprobs  # noqa: E402
from tests.train.helpers import random_grpo_batch  # noqa: E402

PAD = 0
HEADS, KV_HEADS, HEAD_DIM, LAYERS = 6, 2, 8, 2


def tiny_llama(kv_heads: int = KV_HEADS) -> Any:
    config = transformers.LlamaConfig(
        vocab_size=300,
        hidden_size=HEADS * HEAD_DIM,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=kv_heads,
        max_position_embeddings=128,
        pad_token_id=PAD,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).float()


def grpo_batch() -> tuple[list[list[int]], list[list[int]], Any, Any, Any]:
    return random_grpo_batch(1, prompts=2, prompt_len=(20, 30), pad=PAD)


def run(model: Any, shared: bool) -> tuple[Any, list[Any], int]:
    """Log-probs, gradients and the bytes saved for the backward pass."""
    token_ids, loss_masks, ids, attention, mask = grpo_batch()
    model.zero_grad()
    saved: dict[int, int] = {}

    def pack(t: Any) -> Any:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if shared:
            plan = plan_prefixes(token_ids, loss_masks)
            out = shared_prefix_logprobs(model, token_ids, mask, plan, PAD)
        else:
            out = token_logprobs(model, ids, attention, mask)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    activation_bytes = sum(n for ptr, n in saved.items() if ptr not in weights)
    (out * mask).sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()], activation_bytes


@pytest.mark.parametrize("shared", [False, True], ids=["plain", "shared_prompt"])
def test_same_logprobs_and_gradients_without_repeated_keys(shared: bool, monkeypatch: Any) -> None:
    model = tiny_llama()
    values, grads, grouped_bytes = run(model, shared)
    assert model.config._attn_implementation == "sdpa"  # restored after the pass
    monkeypatch.setattr(gqa_attention, "_applies", lambda model: False)  # transformers' own repeat_kv path
    ref_values, ref_grads, repeated_bytes = run(model, shared)
    assert torch.equal(values, ref_values)  # the CPU flash kernel's forward is the same bit for bit
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    # repeat_kv keeps (rows, HEADS, keys, HEAD_DIM) keys and values per layer where 2 of them
    # (rows, KV_HEADS, ...) do: at least that difference must be gone.
    token_ids = grpo_batch()[0]
    rows, keys = len(token_ids), max(len(t) for t in token_ids)
    least_copy = LAYERS * 2 * rows * (HEADS - KV_HEADS) * HEAD_DIM * 4 * (keys - 10)
    assert repeated_bytes - grouped_bytes >= least_copy, (repeated_bytes, grouped_bytes)


def test_models_without_grouped_heads_keep_their_attention() -> None:
    model = tiny_llama(kv_heads=HEADS)
    seen = []
    with gqa_attention.grouped_query_attention(model):
        seen.append(model.config._attn_implementation)
    assert seen == ["sdpa"]
    grouped = tiny_llama()
    with gqa_attention.grouped_query_attention(grouped):
        seen.append(grouped.config._attn_implementation)
    assert seen[1] == gqa_attention.GQA_ATTENTION and grouped.config._attn_implementation == "sdpa"
