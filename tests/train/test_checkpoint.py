"""Checkpoints: complete or absent whatever happens, exact state round trip, top-k pruning, SIGKILL."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from gym_bridge.train.bookkeeping.checkpoint import CheckpointManager, get_rng_state, set_rng_state

ROOT = Path(__file__).resolve().parents[2]


class TinyTokenizer:
    """Just enough of a tokenizer for ``save_pretrained``."""

    def save_pretrained(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "tokenizer.json").write_text("{}")


def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    return LlamaForCausalLM(config)


def save(manager: CheckpointManager, step: int, model, metrics: dict | None = None):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return manager.save(
        step,
        model=model,
        tokenizer=TinyTokenizer(),
        optimizer=optimizer,
        scheduler=scheduler,
        data_state={"all": {"epoch": 0, "position": step}},
        config_yaml="grpo: {}\n",
        metrics=metrics,
    )


def test_state_round_trips_exactly(tmp_path: Path) -> None:
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5**s)
    model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    optimizer.step()
    scheduler.step()
    random.seed(11)
    torch.manual_seed(12)
    manager = CheckpointManager(tmp_path)
    checkpoint = manager.save(
        3,
        model=model,
        tokenizer=TinyTokenizer(),
        optimizer=optimizer,
        scheduler=scheduler,
        data_state={"all": {"epoch": 1, "position": 5}},
        config_yaml="grpo: {seed: 1}\n",
        metrics={"val:accuracy": 0.5},
    )
    expected_draws = (random.random(), torch.rand(3))

    fresh = tiny_model()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    fresh_scheduler = torch.optim.lr_scheduler.LambdaLR(fresh_optimizer, lambda s: 0.5**s)
    from safetensors.torch import load_file

    fresh.load_state_dict(load_file(checkpoint.weights_dir / "model.safetensors"), strict=False)
    random.seed(0)
    restored = checkpoint.load_training_state(fresh_optimizer, fresh_scheduler)

    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    state, fresh_state = optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"]
    assert all(torch.equal(state[k]["exp_avg"], fresh_state[k]["exp_avg"]) for k in state)
    assert fresh_scheduler.get_last_lr() == scheduler.get_last_lr()
    assert restored["data"] == {"all": {"epoch": 1, "position": 5}}
    assert restored["info"]["step"] == 3 and restored["info"]["metrics"] == {"val:accuracy": 0.5}
    assert (random.random(), torch.rand(3))[0] == expected_draws[0]  # RNG continues where it was
    assert (checkpoint.path / "config.yaml").read_text() == "grpo: {seed: 1}\n"


def test_rng_state_helpers_restore_every_generator() -> None:
    import numpy as np

    state = get_rng_state()
    draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    set_rng_state(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == draws


def test_incomplete_directories_are_ignored_and_cleaned(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    save(manager, 2, tiny_model())
    (tmp_path / ".tmp-step_3-deadbeef" / "policy").mkdir(parents=True)  # a save killed midway
    (tmp_path / ".trash-step_1-cafebabe").mkdir()  # a prune killed midway
    (tmp_path / "step_9").mkdir()  # not written by us: no training_info.json
    assert manager.latest().step == 2
    removed = {p.name for p in manager.clean_leftovers()}
    assert removed == {".tmp-step_3-deadbeef", ".trash-step_1-cafebabe"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2", "step_9", "tokenizer"]  # the run's tokenizer


def test_keep_top_k_by_metric_always_keeps_the_latest(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_top_k=2, metric_name="val:accuracy", higher_is_better=True)
    model = tiny_model()
    for step, accuracy in ((1, 0.9), (2, 0.2), (3, 0.8), (4, 0.1)):
        save(manager, step, model, {"val:accuracy": accuracy})
    assert [c.step for c in manager.checkpoints()] == [1, 3, 4]  # the best two, plus the latest

    lower = CheckpointManager(
        tmp_path / "loss", keep_top_k=1, metric_name="train:loss", higher_is_better=False
    )
    for step, loss in ((1, 0.5), (2, 0.1), (3, 0.7)):
        save(lower, step, model, {"train:loss": loss})
    assert [c.step for c in lower.checkpoints()] == [2, 3]


def test_resaving_a_step_replaces_it_whole(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    save(manager, 5, tiny_model(), {"x": 1.0})
    save(manager, 5, tiny_model(), {"x": 2.0})
    assert [c.step for c in manager.checkpoints()] == [5]
    assert manager.latest().info["metrics"] == {"x": 2.0}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# A training run in a child process whose 3rd checkpoint save stops just before it is published
# (after every file is written): the test SIGKILLs it there, then restarts the run.
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import gym_bridge.train.bookkeeping.checkpoint as ckpt
    from test_trainer_offline import offline_config  # tests/train is on PYTHONPATH
    from gym_bridge.train.loop import train

    tmp, model_dir, data, marker = map(Path, sys.argv[1:5])
    extra = sys.argv[5:]
    original = ckpt._fsync_tree

    def slow_fsync(root):
        original(root)
        if "step_3" in root.name:
            marker.write_text("saving step 3")
            time.sleep(600)

    ckpt._fsync_tree = slow_fsync
    train(offline_config(tmp, model_dir, data, "checkpointing.save_period=1", *extra), show_progress=False)
    """
)


@contextmanager
def saving_child(run: Path, model_dir: Path, data: Path, marker: Path, *extra: str) -> Iterator[subprocess.Popen]:
    """A training child (:data:`CHILD`) held inside its third save, every file written but not published;
    killed on the way out if the test left it running."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(run), str(model_dir), str(data), str(marker), *extra],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent)])},
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert child.poll() is None, "the training child exited before its third save"
            assert time.monotonic() < deadline, "the training child never reached its third save"
            time.sleep(0.05)
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


LORA = ["policy.dtensor_cfg.lora_cfg.enabled=true", "policy.dtensor_cfg.lora_cfg.dim=4"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("extra", [[], LORA], ids=["full", "lora"])
def test_sigkill_during_a_save_resumes_from_the_last_complete_checkpoint(tmp_path: Path, extra: list[str]) -> None:
    """Full fine-tuning, and its LoRA twin (adapter and adapter-only optimizer state restored exactly)."""
    from gym_bridge.train.loop import train
    from tests.train.helpers import save_random_tiny

    from .test_trainer_offline import offline_config, train_lines, without_timings, write_scored

    model_dir = save_random_tiny(tmp_path / "model")
    data = write_scored(tmp_path / "scored.jsonl")

    run = tmp_path / "killed"
    with saving_child(run, model_dir, data, tmp_path / "marker", *extra) as child:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)

    names = sorted(p.name for p in (run / "ckpt").iterdir())
    assert len(names) == 4 and names[0].startswith(".tmp-step_3")
    assert names[1:] == ["step_1", "step_2", "tokenizer"]  # the run's tokenizer, written at the first save
    manager = CheckpointManager(run / "ckpt")
    assert manager.latest().step == 2  # the fully written but unpublished step 3 does not count

    result = train(offline_config(run, model_dir, data, "checkpointing.save_period=1", *extra), show_progress=False)
    assert result.resumed_from == 2 and result.steps == 4
    assert not [p for p in (run / "ckpt").iterdir() if p.name.startswith(".")]  # leftovers cleaned
    assert json.loads((run / "ckpt" / "step_4" / "training_info.json").read_text())["step"] == 4
    kept = "adapter" if extra else "weights"
    assert (run / "ckpt" / "step_4" / "policy" / kept).is_dir()

    straight = tmp_path / "straight"
    train(offline_config(straight, model_dir, data, "checkpointing.save_period=1", *extra), show_progress=False)
    expected = [without_timings(r) for r in train_lines(straight / "logs")]
    assert [without_timings(r) for r in train_lines(run / "logs")] == expected


def test_a_checkpoint_that_does_not_fit_is_refused_before_writing_and_names_the_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil
    from collections import namedtuple

    from gym_bridge.train.bookkeeping import checkpoint as checkpoint_module

    manager = CheckpointManager(tmp_path / "ckpt")
    model = tiny_model()
    save(manager, 1, model)
    Usage = namedtuple("Usage", "total used free")
    real = shutil.disk_usage
    monkeypatch.setattr(checkpoint_module.shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(checkpoint_module.CheckpointWriteError) as caught:
        save(manager, 2, model)
    message = str(caught.value)
    assert str(tmp_path / "ckpt" / "step_2") in message and "0.00 GiB free" in message
    assert "last complete checkpoint is step_1" in message and "run the same command again" in message
    monkeypatch.setattr(checkpoint_module.shutil, "disk_usage", real)
    assert [c.step for c in manager.checkpoints()] == [1]  # nothing half-written, step 1 untouched
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".tmp-")]
    # The estimate counts each tensor's bytes, a tied (shared) one once, through nested state.
    shared, other = torch.zeros(10), torch.zeros(3, dtype=torch.float64)
    assert checkpoint_module.tensor_bytes({"a": shared, "tied": shared, "x": [{"b": other}], "n": 4}) == 40 + 24


def test_a_write_that_fails_midway_says_where_and_how_to_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gym_bridge.train.bookkeeping import checkpoint as checkpoint_module

    manager = CheckpointManager(tmp_path / "ckpt")
    model = tiny_model()
    save(manager, 1, model)

    def full_disk(*args: object, **kwargs: object) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 757730368 vs 757730260")

    monkeypatch.setattr(checkpoint_module.torch, "save", full_disk)
    with pytest.raises(checkpoint_module.CheckpointWriteError, match="unexpected pos.*last complete checkpoint is step_1"):
        save(manager, 2, model)
    monkeypatch.undo()
    assert [c.step for c in manager.checkpoints()] == [1]
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".tmp-")]
