"""The written-out Llama decode step (gym_bridge/generation/llama_decode.py, issue 38): the logits of the
model's own forward pass, in float32 and bfloat16, with grouped key/value heads, left padding and
shared prompts; prepared weights that follow the model's; and the models it refuses."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from gym_bridge.generation import llama_decode
from gym_bridge.generation.backend import GenerationRequest, SamplingParams
from gym_bridge.generation.llama_decode import decoder_for
from gym_bridge.generation.transformers_backend import TransformersBackend
from gym_bridge.models.shared_prefix import distinct_prompts, prefill

VOCAB = 97


def gqa_llama(seed: int = 0, **overrides: Any) -> Any:
    """A random Llama with 4 query heads sharing 2 key/value heads (SmolLM2's grouping, smaller)."""
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
    )
    settings.update(overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**settings)).eval()


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [5, 6, 7, 8, 9, 10, 11], [20, 21, 22, 23]]
"""Different lengths (left padding) and a repeated prompt (one prefill, fanned out)."""


def decode_logits(model: Any, steps: list[list[int]]) -> list[torch.Tensor]:
    """Logits after each step's tokens (one per row), through the decoder after a shared-prompt prefill."""
    decoder = decoder_for(model)
    assert decoder is not None
    prompts, row_prompt = distinct_prompts(PROMPTS)
    with torch.inference_mode():
        first = prefill(model, prompts, row_prompt, 0, torch.device("cpu"), logits_to_keep=1)
        mask = first.attention_mask[first.fan_out]
        position = first.positions[first.fan_out][:, -1]
        state = decoder.start(first.cache, mask, len(steps))
        out = [first.output.logits[:, -1].float()[first.fan_out]]
        for tokens in steps:
            position = position + 1
            out.append(decoder.step(state, torch.tensor(tokens), position).float())
    return out


def reference_logits(model: Any, steps: list[list[int]]) -> list[torch.Tensor]:
    """The same logits from plain unpadded forward passes, one row at a time."""
    out = []
    with torch.inference_mode():
        for n in range(len(steps) + 1):
            rows = [PROMPTS[r] + [s[r] for s in steps[:n]] for r in range(len(PROMPTS))]
            out.append(torch.stack([model(torch.tensor([row])).logits[0, -1].float() for row in rows]))
    return out


STEPS = [[30, 31, 32, 33], [40, 41, 42, 43], [50, 51, 52, 53], [60, 61, 62, 63]]


def test_step_logits_are_the_models_own_in_float32() -> None:
    model = gqa_llama()
    for got, want in zip(decode_logits(model, STEPS), reference_logits(model, STEPS), strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_step_logits_follow_the_model_in_bfloat16_with_prepared_weights() -> None:
    model = gqa_llama().to(torch.bfloat16)
    decoder = decoder_for(model)
    assert decoder is not None
    got, want = decode_logits(model, STEPS), reference_logits(model, STEPS)
    for g, w in zip(got[1:], want[1:], strict=True):
        assert (g - w).abs().max().item() < 0.05 * w.abs().max().item()  # bfloat16 rounding, not a bug
        assert (g.argmax(-1) == w.argmax(-1)).all()
    if llama_decode._onednn_bf16():
        decoder._prepare(4)
        assert decoder._linears[0]["qkv"].packed is not None


def test_the_backend_decodes_with_it_and_matches_the_forward_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from gym_bridge.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = gqa_llama(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    backend = TransformersBackend(model, tokenizer, model_name="gqa")
    backend.eos_token_ids = set()
    requests = [
        GenerationRequest(p, SamplingParams(max_new_tokens=3 + 3 * i, temperature=1.0, seed=i))
        for i, p in enumerate(PROMPTS)
    ]  # rows finish at different steps and leave the batch
    steps: list[int] = []
    real_step = llama_decode.LlamaDecoder.step
    monkeypatch.setattr(
        llama_decode.LlamaDecoder, "step", lambda self, *a: steps.append(1) or real_step(self, *a)
    )
    written = backend.generate(requests)
    assert len(steps) == 3 + 3 * 3 - 1  # every token after the prompt pass's first
    backend.written_out_decode = False
    forward = backend.generate(requests)
    assert len(steps) == 11  # not used when off
    for a, b in zip(written, forward, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert [len(r.token_ids) for r in written] == [3, 6, 9, 12]


def test_prepared_weights_follow_the_models_weights() -> None:
    """bfloat16 weights are held reordered; a change the version counters see (load_state_dict, an
    optimizer step) prepares them again, and one they do not (a write through ``.data``, as another
    process writes shared memory) after ``mark_stale``, which the backend's update_weights calls."""
    model = gqa_llama().to(torch.bfloat16)
    other = gqa_llama(seed=1).to(torch.bfloat16)
    before = decode_logits(model, STEPS[:1])[1]
    model.load_state_dict(other.state_dict())
    torch.testing.assert_close(decode_logits(model, STEPS[:1])[1], decode_logits(other, STEPS[:1])[1])
    assert not torch.equal(before, decode_logits(model, STEPS[:1])[1])

    from gym_bridge.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = gqa_llama(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id).to(torch.bfloat16)
    twin = gqa_llama(seed=2, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id).to(
        torch.bfloat16
    )
    backend = TransformersBackend(model, tokenizer)
    request = [GenerationRequest(PROMPTS[0], SamplingParams(max_new_tokens=6, temperature=1.0, seed=3))]
    backend.generate(request)  # prepares the weights
    for mine, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        mine.data.copy_(theirs.data)  # unseen by version counters
    backend.update_weights(backend.model)
    got = backend.generate(request)[0]
    want = TransformersBackend(twin, tokenizer).generate(request)[0]
    assert got.token_ids == want.token_ids and got.logprobs == pytest.approx(want.logprobs, abs=1e-6)


def test_models_it_does_not_apply_to() -> None:
    assert decoder_for(gqa_llama()) is not None
    assert decoder_for(gqa_llama().train()) is None  # a model being trained (dropout, autograd)
    assert decoder_for(gqa_llama(attention_bias=True)) is None
    assert decoder_for(gqa_llama(mlp_bias=True)) is None
    assert decoder_for(gqa_llama(hidden_act="gelu")) is None
    assert (
        decoder_for(gqa_llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}))
        is None
    )
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(gqa_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert decoder_for(lora) is None and decoder_for(lora.get_base_model()) is None

    from transformers import Qwen2Config, Qwen2ForCausalLM

    qwen = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).eval()
    assert decoder_for(qwen) is None
