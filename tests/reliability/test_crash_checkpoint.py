"""A process killed at every file-system step of a checkpoint save leaves every earlier checkpoint usable.

Round four (crash consistency). A save is a short protocol of renames, fsyncs, a symlink and deletions
(:mod:`gym_bridge.train.bookkeeping.checkpoint`). Here a forked child runs one real save and dies at the
k-th of those steps, for every k in turn, by ``os._exit`` (no ``finally``, no ``except``: what SIGKILL, the
OOM killer or a power cut leave). The parent, standing for the next run, then checks that each complete
checkpoint loads as a model with its tokenizer (``gym-bridge eval --model <step_n>``) and that saving
goes on.

Found for real: a resumed run's first save replaced the run's shared ``tokenizer/`` by moving the old
one to ``.trash-*``, deleting it, and only then renaming the new one in; killed in between, every
checkpoint's ``policy/tokenizer`` link dangled (``Couldn't instantiate the backend tokenizer``), and the
next start deleted both copies as leftovers. And a resumed run with a new chat template replaced the
tokenizer that the earlier checkpoints link to.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from gym_bridge.train.bookkeeping import checkpoint as ckpt
from gym_bridge.train.bookkeeping.checkpoint import CheckpointManager, load_model_or_checkpoint

from .conftest import REPO

STEPS_WATCHED = ("rename", "symlink", "rmtree", "_fsync_dir", "_fsync_tree")
"""The save protocol's file-system steps the child can die at (each call, before it happens)."""


def tiny_parts() -> tuple[Any, Any]:
    from gym_bridge.models.tokenizer import build_tokenizer

    from .conftest import make_tiny_llama

    tokenizer = build_tokenizer()
    return make_tiny_llama(tokenizer), tokenizer


def save(manager: CheckpointManager, step: int, model: Any, tokenizer: Any) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    manager.save(
        step, model=model, tokenizer=tokenizer, optimizer=optimizer, scheduler=None,
        data_state={"all": {"epoch": 0, "position": step}}, config_yaml="grpo: {}\n",
    )  # fmt: skip


def die_at(k: int) -> None:
    """From now on in this (child) process, the checkpoint module's ``k``-th file-system step ends the
    process before it happens, as a SIGKILL would."""
    calls = [0]

    def watched(fn: Any) -> Any:
        def step(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == k:
                os._exit(137)
            return fn(*args, **kwargs)

        return step

    ckpt.os = SimpleNamespace(**{**vars(os), "rename": watched(os.rename), "symlink": watched(os.symlink)})  # type: ignore[assignment]
    ckpt.shutil = SimpleNamespace(**{**vars(shutil), "rmtree": watched(shutil.rmtree)})  # type: ignore[assignment]
    ckpt._fsync_dir = watched(ckpt._fsync_dir)  # type: ignore[assignment]
    ckpt._fsync_tree = watched(ckpt._fsync_tree)  # type: ignore[assignment]


def save_in_child_dying_at(k: int, root: Path, step: int, model: Any, tokenizer: Any) -> bool:
    """Fork; the child (a new process, so a new manager: a resumed run) saves ``step`` and dies at step
    ``k``. True when it died, False when the save finished before its ``k``-th step."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            torch.set_num_threads(1)
            die_at(k)
            save(CheckpointManager(root, keep_top_k=1), step, model, tokenizer)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 137


def assert_usable(root: Path, at_least: int) -> None:
    """Every complete checkpoint loads as a model with its tokenizer, and the latest is ``at_least`` or later."""
    manager = CheckpointManager(root)
    found = manager.checkpoints()
    assert found and found[-1].step >= at_least, [p.name for p in root.iterdir()]
    for checkpoint in found:
        assert (checkpoint.tokenizer_dir / "tokenizer.json").is_file(), (
            f"{checkpoint.path.name}: no tokenizer"
        )
        model, tokenizer = load_model_or_checkpoint(str(checkpoint.path))
        assert tokenizer("2 + 2")["input_ids"] and model.config.vocab_size == len(tokenizer)


@pytest.mark.timeout(240)
def test_a_kill_at_any_step_of_a_resumed_runs_save_leaves_the_checkpoints_usable(tmp_path: Path) -> None:
    model, tokenizer = tiny_parts()
    killed = 0
    for k in range(1, 40):
        root = tmp_path / f"k{k}"
        save(CheckpointManager(root, keep_top_k=1), 2, model, tokenizer)  # the run before the kill
        if not save_in_child_dying_at(k, root, 3, model, tokenizer):
            break  # the save finished before its k-th step: every step has been tried
        killed += 1
        assert_usable(root, at_least=2)
        manager = CheckpointManager(root, keep_top_k=1)  # the next run: cleans up, resumes, saves on
        manager.clean_leftovers()
        assert_usable(root, at_least=2)
        save(manager, 4, model, tokenizer)
        assert_usable(root, at_least=4)
        assert not [p.name for p in root.iterdir() if p.name.startswith(".")]
    assert killed >= 8  # the protocol's steps were each tried (tokenizer, step, prune)


def test_a_resumed_run_with_another_chat_template_leaves_the_earlier_checkpoints_tokenizer_as_it_was(
    tmp_path: Path,
) -> None:
    """Found for real (``gym-bridge train`` resumed with a new ``policy.tokenizer.chat_template``): the resumed
    run's first save replaced the shared ``tokenizer/``, so ``step_1``, trained with the old template, was
    evaluated with the new one. Now a checkpoint's tokenizer never changes: the new run's steps keep their own."""
    model, tokenizer = tiny_parts()
    save(CheckpointManager(tmp_path), 1, model, tokenizer)
    before = load_model_or_checkpoint(str(tmp_path / "step_1"))[1].chat_template

    tokenizer.chat_template = "{% for m in messages %}NEW {{ m.content }}{% endfor %}"
    resumed = CheckpointManager(tmp_path)  # a new process: a resumed run
    save(resumed, 2, model, tokenizer)
    save(resumed, 3, model, tokenizer)
    assert (
        load_model_or_checkpoint(str(tmp_path / "step_1"))[1].chat_template
        == before
        != tokenizer.chat_template
    )
    for step in (2, 3):
        assert (
            load_model_or_checkpoint(str(tmp_path / f"step_{step}"))[1].chat_template
            == tokenizer.chat_template
        )
    assert_usable(tmp_path, at_least=3)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


# `gym-bridge train` held where its checkpoint code first touches a path named with one of the prefixes in
# CRASH_HOLD (comma-separated: fsyncing a new step's files, deleting a replaced directory), so that a test
# can SIGKILL the real process right there.
CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from types import SimpleNamespace
    import gym_bridge.train.bookkeeping.checkpoint as ckpt
    from gym_bridge.cli import main

    marker, hold = Path(os.environ["CRASH_MARKER"]), tuple(os.environ["CRASH_HOLD"].split(","))

    def held(fn):
        def step(*args, **kwargs):
            if any(Path(a).name.startswith(hold) for a in args):
                marker.write_text("held")
                time.sleep(600)
            return fn(*args, **kwargs)
        return step

    ckpt.shutil = SimpleNamespace(**{**vars(ckpt.shutil), "rmtree": held(ckpt.shutil.rmtree)})
    ckpt._fsync_tree = held(ckpt._fsync_tree)
    sys.argv = ["gym-bridge", *sys.argv[1:]]
    main()
    """
)


def train_killed_in_save(args: list[str], hold: str, marker: Path) -> None:
    """Run ``gym-bridge ARGS`` until its checkpoint code reaches a path starting with ``hold`` (see
    :data:`CHILD`), then SIGKILL it (its process group)."""
    from .procs import child_env, kill9, start

    proc = start(
        [sys.executable, "-c", CHILD, *args], env=child_env(CRASH_MARKER=str(marker), CRASH_HOLD=hold)
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, f"the run never reached {hold}"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        kill9(proc)


def offline_train_args(tmp_path: Path, model_dir: Path) -> list[str]:
    """``gym-bridge train`` arguments of the reliability suite's offline run (6 steps, a checkpoint each)
    in ``tmp_path/run``."""
    from .test_kill_resume import train_args, write_scored

    config = tmp_path / "train.yaml"
    config.write_text("grpo:\n  mode: offline\n")
    return train_args(config, tmp_path / "run", model_dir, write_scored(tmp_path / "scored.jsonl"))[3:]


@pytest.mark.timeout(300)
def test_sigkill_of_a_resumed_train_in_its_first_save_keeps_every_checkpoint_loadable(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The real CLI: 1 step, then a resumed run SIGKILLed in its first save, then ``load_model_or_checkpoint``
    (what ``gym-bridge eval --model`` uses) on the checkpoint left."""
    from .procs import child_env

    args = offline_train_args(tmp_path, tiny_model_dir)
    first = subprocess.run(
        [sys.executable, "-m", "gym_bridge.cli", *args, "grpo.max_num_steps=1"],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert first.returncode == 0, first.stderr[-2000:]
    train_killed_in_save([*args, "grpo.max_num_steps=2"], ".trash-tokenizer,.tmp-step_", tmp_path / "marker")
    assert_usable(
        tmp_path / "run" / "ckpt", at_least=1
    )  # (the next run resumes and saves on: the test above)
