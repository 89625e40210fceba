"""release_freed_memory gives memory that ``free`` kept mapped back to the OS, and the update calls it."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

from gym_bridge.models import host_memory


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(host_memory._glibc() is None, reason="glibc's malloc_trim only")
def test_freed_heap_memory_that_free_keeps_goes_back_to_the_os() -> None:
    """256 MB in 16 KB blocks below one live block: ``free`` cannot shrink the heap past the live
    block, so the freed pages stay resident until malloc_trim returns them."""
    malloc, free = ctypes.CDLL(None).malloc, ctypes.CDLL(None).free
    malloc.restype, malloc.argtypes, free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    blocks = []
    for _ in range(16384):
        block = malloc(16384)
        ctypes.memset(block, 1, 16384)  # touched: resident
        blocks.append(block)
    pin = malloc(16384)  # above the freed blocks: the heap's top is in use
    for block in blocks:
        free(block)
    before = _rss_bytes()
    assert host_memory.release_freed_memory()
    after = _rss_bytes()
    free(pin)
    assert before - after > 128 * 2**20


@pytest.mark.skipif(host_memory._glibc() is None, reason="glibc's malloc_trim only")
def test_min_gain_skips_the_trim_until_the_resident_size_grew_that_much() -> None:
    """A trim, then 64 MB touched and freed below a live block: a 256 MB ``min_gain`` skips (and the
    pages stay resident), a 32 MB one trims them back."""
    malloc, free = ctypes.CDLL(None).malloc, ctypes.CDLL(None).free
    malloc.restype, malloc.argtypes, free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    assert host_memory.release_freed_memory()
    blocks = []
    for _ in range(4096):
        block = malloc(16384)
        ctypes.memset(block, 1, 16384)
        blocks.append(block)
    pin = malloc(16384)
    for block in blocks:
        free(block)
    before = _rss_bytes()
    assert host_memory.release_freed_memory(min_gain=256 * 2**20) is False
    assert _rss_bytes() > before - 16 * 2**20  # nothing given back
    assert host_memory.release_freed_memory(min_gain=32 * 2**20) is True
    after = _rss_bytes()
    free(pin)
    assert before - after > 32 * 2**20


def test_elsewhere_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    host_memory._glibc.cache_clear()
    monkeypatch.setattr(sys, "platform", "darwin")
    try:
        assert host_memory.release_freed_memory() is False
    finally:
        monkeypatch.undo()
        host_memory._glibc.cache_clear()


def test_a_cpu_update_releases_before_and_after_its_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from gym_bridge.train.algorithm.loss import ClippedPGLossFn
    from gym_bridge.train.batches.rollouts import Sample
    from gym_bridge.train.config import load_config
    from gym_bridge.train.learner import update
    from gym_bridge.train.setup import build_optimizer

    events: list[str] = []
    monkeypatch.setattr(update, "release_freed_memory", lambda min_gain=0: events.append("release") or True)
    real = update.micro_batch_logprobs
    monkeypatch.setattr(update, "micro_batch_logprobs", lambda *a, **k: events.append("pass") or real(*a, **k))
    from gym_bridge.models.tiny import TinyRecipe, new_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer

    model = new_tiny_model(build_tokenizer(), TinyRecipe(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32))
    cfg = load_config(None, ["data.train.data_path=a.jsonl", "grpo.mode=offline", "policy.train_global_batch_size=4",
                             "policy.train_micro_batch_size=2", "loss_fn.reference_policy_kl_penalty=0.0"])
    samples = [Sample(group=0, token_ids=[5, 6, 7, 8 + i], loss_mask=[0, 0, 1, 1], reward=float(i % 2)) for i in range(4)]
    optimizer, scheduler = build_optimizer(cfg, model, 1)
    learner = update.Learner(model, None, optimizer, scheduler, ClippedPGLossFn(cfg.loss_fn), None, 0)
    update.update_policy(cfg, learner, update.StepBatch.from_samples(cfg.grpo, samples))
    # before the pass, after each micro-batch's backward, after the pass
    assert events == ["release", "pass", "release", "pass", "release", "release"]
    assert torch.isfinite(next(model.parameters())).all()
