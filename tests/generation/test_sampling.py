"""The backend's sampler: draws follow the weights, zero weights are never drawn, rows stay independent."""

from __future__ import annotations

import pytest
import torch

from gym_bridge.generation import transformers_backend as tb


def test_inverse_cdf_follows_the_weights_across_blocks() -> None:
    vocab = 3 * tb._CDF_BLOCK + 17  # a padded last block
    weights = torch.zeros(vocab)
    picks = {0: 1.0, 5: 3.0, tb._CDF_BLOCK - 1: 2.0, tb._CDF_BLOCK: 4.0, vocab - 1: 6.0}
    for index, w in picks.items():
        weights[index] = w
    draws = 20_000
    uniforms = 1.0 - torch.rand(draws, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    chosen, total = tb._inverse_cdf(weights.expand(draws, vocab).contiguous(), uniforms)
    assert total.dtype == torch.float64 and torch.all(total == sum(picks.values()))
    counts = torch.bincount(chosen, minlength=vocab)
    assert set(torch.nonzero(counts).flatten().tolist()) == set(picks)  # zero weights never drawn
    total = sum(picks.values())
    for index, w in picks.items():
        assert counts[index].item() / draws == pytest.approx(w / total, abs=0.015)


def test_inverse_cdf_edges_pick_the_first_and_last_positive_weight() -> None:
    weights = torch.zeros(2, 600)
    weights[:, [3, 300, 580]] = 1.0
    ends = torch.tensor([1e-300, 1.0], dtype=torch.float64)
    assert tb._inverse_cdf(weights, ends)[0].tolist() == [3, 580]


def test_sample_is_row_independent_and_greedy_at_zero_temperature() -> None:
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(1))
    temperature = torch.tensor([1.0, 0.0, 0.7, 1.3])
    top_p = torch.tensor([1.0, 1.0, 0.9, 1.0])
    top_k = torch.tensor([0, 0, 0, 20])
    uniforms = torch.tensor([0.3, 0.5, 0.9, 0.01], dtype=torch.float64)
    tokens, logprobs = tb._sample(logits, temperature, top_p, top_k, uniforms)
    assert tokens[1] == logits[1].argmax()
    for i in range(4):
        one, one_lp = tb._sample(logits[i : i + 1], temperature[i : i + 1], top_p[i : i + 1], top_k[i : i + 1],
                                 uniforms[i : i + 1])  # fmt: skip
        assert one.item() == tokens[i].item()
        assert one_lp.item() == pytest.approx(logprobs[i].item(), abs=1e-6)
    assert torch.allclose(logprobs, torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1), atol=1e-5)


def test_threads_auto_uses_one_thread_only_when_oversubscribed(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    monkeypatch.setattr(tb.os, "getloadavg", lambda: (100.0 * (tb.os.cpu_count() or 1), 0.0, 0.0))
    with tb._torch_threads("auto"):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    monkeypatch.setattr(tb.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    with tb._torch_threads("auto"):
        assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads"):
        tb.TransformersBackend(None, None, threads=0)
