"""TransformersBackend decodes into preallocated KV buffers (issue 38): the same tokens and log-probs as
transformers' concatenating ``DynamicCache``, with rows finishing at different steps, and a layer that
runs out of room grows instead of failing."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from gym_bridge.generation import transformers_backend
from gym_bridge.generation.backend import GenerationRequest, SamplingParams
from gym_bridge.generation.transformers_backend import TransformersBackend, preallocate


def test_preallocated_decoding_matches_the_dynamic_cache(tiny_model, tokenizer, monkeypatch) -> None:
    backend = TransformersBackend(tiny_model, tokenizer, model_name="tiny-test")
    backend.eos_token_ids = set()
    backend.written_out_decode = False  # the model's forward per token, through the cache under test
    prompts = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for q in ("What is 2 + 3?", "A longer question, so that the rows are left-padded", "Hi")
    ]
    # each prompt 3 times (GRPO's groups), rows stopping after 3 to 14 tokens: finished rows leave the batch
    requests = [
        GenerationRequest(p, SamplingParams(max_new_tokens=3 + 4 * g + k, temperature=1.0, seed=10 * g + k))
        for k, p in enumerate(prompts)
        for g in range(3)
    ]
    built: list[int] = []
    real = transformers_backend._PreallocatedLayer.__init__

    def counting(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        built.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(transformers_backend._PreallocatedLayer, "__init__", counting)
    runs = {}
    for flag in (False, True):
        backend.preallocate_cache = flag
        built.clear()
        runs[flag] = backend.generate(requests)
        assert bool(built) == flag  # the preallocated layers were (only) used when on
    for plain, fast in zip(runs[False], runs[True], strict=True):
        assert fast.token_ids == plain.token_ids and fast.finish_reason == plain.finish_reason
        assert fast.logprobs == pytest.approx(plain.logprobs, abs=1e-6)
    assert sorted({len(r.token_ids) for r in runs[True]}) == sorted({3 + 4 * g + k for k in range(3) for g in range(3)})


def test_a_preallocated_layer_grows_past_its_room_and_selects_rows() -> None:
    cache = DynamicCache()
    keys = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).view(2, 1, 3, 2)
    cache.update(keys, -keys, 0)
    preallocate(cache, tokens=1)
    for step in range(3):  # room for one: the second and third grow the buffers
        new = torch.full((2, 1, 1, 2), float(100 + step))
        k, v = cache.update(new, -new, 0)
        assert k.shape == (2, 1, 4 + step, 2) and torch.equal(k[:, :, -1:], new) and torch.equal(v, -k)
    assert torch.equal(k[:, :, :3], keys) and cache.get_seq_length() == 6
    cache.batch_select_indices(torch.tensor([1]))
    k, _ = cache.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2), 0)
    assert k.shape == (1, 1, 7, 2) and torch.equal(k[0, :, :3], keys[1])
