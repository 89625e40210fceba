"""Crash-safe GRPO checkpoints: ``<checkpoint_dir>/step_<n>/``, written atomically, resumed exactly.

Layout of one checkpoint (close to NeMo RL's)::

    step_12/
        policy/weights/        model.save_pretrained (safetensors) + config (full fine-tuning)
        policy/adapter/        with LoRA instead: adapter_model.safetensors + adapter_config.json,
                               loadable by peft.PeftModel.from_pretrained as is
        policy/merged/         with LoRA and checkpointing.save_merged: base + adapter merged, a
                               plain transformers model (vLLM loads it too)
        policy/tokenizer       a relative symlink to the run directory's tokenizer/ (below)
        policy/optimizer.pt    optimizer and LR-scheduler state (with LoRA: the adapter's only)
        rng_state.pt           python, numpy and torch RNG states
        train_dataloader.json  where the prompt loaders are
        config.yaml            the resolved run config
        training_info.json     step, metrics (written last)

The tokenizer (3.4 MB for SmolLM2, more than a rank-8 adapter's weights) is the same at every step, so
it is written once per run directory, ``<checkpoint_dir>/tokenizer/`` (atomically, at a process's
first save), and each step links to it: readers of ``policy/tokenizer`` work unchanged, and a
checkpoint costs its adapter or weights plus the optimizer state. A checkpoint's tokenizer never
changes after it is written: a resumed run's identical tokenizer leaves the directory as it is, and
one that differs (a new ``policy.tokenizer.chat_template``) is copied into each of its own steps.

Why it survives SIGKILL: everything is written into a hidden temporary directory beside the final
one, every file and the directory are fsynced, and only then is it renamed to ``step_<n>`` (one
atomic ``rename``). A ``step_<n>`` directory is therefore always complete; a kill leaves at most a
``.tmp-*`` directory, which :meth:`CheckpointManager.latest` ignores and :meth:`clean_leftovers`
removes. Old checkpoints are renamed to ``.trash-*`` before they are deleted, for the same reason.
"""

from __future__ import annotations

import filecmp
import json
import os
import pickle
import random
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

__all__ = [
    "Checkpoint",
    "CheckpointDamaged",
    "CheckpointManager",
    "CheckpointWriteError",
    "checkpoint_of",
    "get_rng_state",
    "load_model_or_checkpoint",
    "set_rng_state",
]

STEP_DIR = re.compile(r"step_(\d+)")
INFO_FILE = "training_info.json"
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
TOKENIZER_DIR = "tokenizer"


SPACE_MARGIN = 1.1
"""Free space a save wants, as a multiple of the tensors it writes (file headers, the tokenizer, slack)."""


class CheckpointWriteError(OSError):
    """A checkpoint that does not fit on its filesystem (said before writing), or whose write failed:
    the message names the directory, the sizes, the last complete checkpoint and how to resume, where
    torch says only "unexpected pos" on a full disk."""


class CheckpointDamaged(RuntimeError):
    """A ``step_<n>`` whose files cannot be read back (a damaged disk, an interrupted copy, a file changed
    by hand): named with the way on, where safetensors, torch or json would end the run in a traceback."""


UNREADABLE = (OSError, ValueError, RuntimeError, EOFError, KeyError, pickle.UnpicklingError, SafetensorError)
"""What reading a damaged checkpoint file raises (a truncated file, a missing one, garbage)."""


def tensor_bytes(state: Any) -> int:
    """Bytes of every tensor in a (nested) state dict, each storage once (tied weights share one)."""
    seen: set[tuple[int, int]] = set()
    total = 0

    def visit(value: Any) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor):
            key = (value.untyped_storage().data_ptr(), value.untyped_storage().nbytes())
            if key not in seen:
                seen.add(key)
                total += value.numel() * value.element_size()
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)

    visit(state)
    return total


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def get_rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states (everything a seeded run draws from)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (so a rename publishes durable contents)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _same_files(a: Path, b: Path) -> bool:
    """Whether two directories hold the same files with the same bytes."""
    files = [sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file()) for root in (a, b)]
    return files[0] == files[1] and all(filecmp.cmp(a / name, b / name, shallow=False) for name in files[0])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Checkpoint:
    """A complete checkpoint on disk."""

    step: int
    path: Path

    @property
    def info(self) -> dict[str, Any]:
        with self._reading():
            return json.loads((self.path / INFO_FILE).read_text())

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """Turn a failed read of this checkpoint's files into :class:`CheckpointDamaged`, naming the
        checkpoint before it (what a resumed run can start from once this one is moved aside)."""
        try:
            yield
        except UNREADABLE as err:
            earlier = [c for c in CheckpointManager(self.path.parent).checkpoints() if c.step < self.step]
            way_on = (
                f"move it out of {self.path.parent} to resume from {earlier[-1].path.name}"
                if earlier
                else f"move it out of {self.path.parent} to start again from step 0"
            )
            raise CheckpointDamaged(
                f"checkpoint {self.path} cannot be read ({type(err).__name__}: {str(err)[:200]}): it is damaged "
                f"or incomplete; {way_on}"
            ) from err

    @property
    def weights_dir(self) -> Path:
        return self.path / "policy" / "weights"

    @property
    def adapter_dir(self) -> Path:
        return self.path / "policy" / "adapter"

    @property
    def merged_dir(self) -> Path:
        return self.path / "policy" / "merged"

    @property
    def is_lora(self) -> bool:
        """Whether this checkpoint holds a LoRA adapter rather than whole weights."""
        return self.adapter_dir.is_dir()

    @property
    def tokenizer_dir(self) -> Path:
        return self.path / "policy" / "tokenizer"

    def load_weights(self, model: Any) -> None:
        """Load the saved weights into ``model`` (same architecture); tied output weights are re-tied."""
        state: dict[str, Any] = {}
        with self._reading():
            shards = sorted(self.weights_dir.glob("*.safetensors"))
            if not shards:
                raise FileNotFoundError(f"no *.safetensors in {self.weights_dir}")
            for shard in shards:
                state.update(load_file(shard))
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = (
            {k for k in missing if k.endswith("lm_head.weight")}
            if model.config.tie_word_embeddings
            else set()
        )
        if set(missing) - tied or unexpected:
            raise RuntimeError(
                f"checkpoint {self.path} does not fit the model (missing {missing}, unexpected {unexpected})"
            )
        model.tie_weights()

    def load_training_state(self, optimizer: Any, scheduler: Any) -> dict[str, Any]:
        """Restore optimizer, scheduler and RNG states; return the data-loader state and the info."""
        with self._reading():
            states = torch.load(self.path / "policy" / "optimizer.pt", map_location="cpu", weights_only=False)
            optimizer_state, scheduler_state = states["optimizer"], states.get("scheduler")
            rng = torch.load(self.path / "rng_state.pt", weights_only=False)
            data = json.loads((self.path / "train_dataloader.json").read_text())
        optimizer.load_state_dict(optimizer_state)
        if scheduler is not None and scheduler_state is not None:
            scheduler.load_state_dict(scheduler_state)
        set_rng_state(rng)
        return {
            "data": data,
            "info": self.info,
        }


class CheckpointManager:
    """Saves, finds, ranks and prunes the ``step_<n>`` checkpoints of one run directory.

    ``keep_top_k`` keeps the k best by ``metric_name`` (a key of the saved ``metrics``, e.g.
    ``val:accuracy``); checkpoints without the metric rank last, ties go to the newer one, and the
    latest checkpoint is always kept so a run can resume.
    """

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike[str],
        keep_top_k: int | None = None,
        metric_name: str | None = None,
        higher_is_better: bool = True,
    ) -> None:
        self.root = Path(checkpoint_dir)
        self.keep_top_k = keep_top_k
        self.metric_name = metric_name
        self.higher_is_better = higher_is_better
        self._tokenizer_shared: bool | None = None
        """Whether this manager's steps link to ``<checkpoint_dir>/tokenizer/`` (None: not known before its first save)."""

    # ------------------------------------------------------------------ finding

    def checkpoints(self) -> list[Checkpoint]:
        """Complete checkpoints, oldest first (a ``step_<n>`` without its info file is skipped)."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            match = STEP_DIR.fullmatch(entry.name)
            if match and entry.is_dir() and (entry / INFO_FILE).is_file():
                found.append(Checkpoint(int(match.group(1)), entry))
        return sorted(found, key=lambda c: c.step)

    def latest(self) -> Checkpoint | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def clean_leftovers(self) -> list[Path]:
        """Delete temporary and half-deleted directories left by a killed run; return what was removed."""
        if not self.root.is_dir():
            return []
        removed = []
        for entry in self.root.iterdir():
            if entry.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
        return removed

    # ------------------------------------------------------------------ saving

    def save(
        self,
        step: int,
        *,
        model: Any,
        tokenizer: Any,
        optimizer: Any,
        scheduler: Any,
        data_state: dict[str, Any],
        config_yaml: str,
        metrics: dict[str, Any] | None = None,
        extra_info: dict[str, Any] | None = None,
        peft_model: Any = None,
        save_merged: bool = False,
    ) -> Checkpoint:
        """Write ``step_<step>`` atomically, then prune to ``keep_top_k``; return the new checkpoint.

        With ``peft_model`` (LoRA) the adapter is saved instead of the weights, and with
        ``save_merged`` the merged model besides it."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step_{step}"
        if peft_model is None:
            needed = tensor_bytes(model.state_dict())
        else:  # the adapter, and the merged model on request
            needed = tensor_bytes([p for p in peft_model.parameters() if p.requires_grad])
            needed += tensor_bytes(model.state_dict()) if save_merged else 0
        needed += tensor_bytes(optimizer.state)
        free = self._check_space(final, needed)
        try:
            with self._atomic_dir(final) as tmp:
                policy = tmp / "policy"
                if peft_model is None:
                    model.save_pretrained(policy / "weights", safe_serialization=True)
                else:
                    # The trainer never resizes the vocabulary, so the embeddings stay the base model's:
                    # peft's "auto" would look the base model's config up (on the Hub when its name is not a
                    # local directory) on every save, and warn "Could not find a config file" offline.
                    peft_model.save_pretrained(
                        policy / "adapter", safe_serialization=True, save_embedding_layers=False
                    )
                    if save_merged:
                        from gym_bridge.train.learner.lora import merged_model

                        merged_model(peft_model).save_pretrained(policy / "merged", safe_serialization=True)
                self._save_tokenizer(tokenizer, policy / "tokenizer")
                torch.save(
                    {
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict() if scheduler else None,
                    },
                    policy / "optimizer.pt",
                )
                torch.save(get_rng_state(), tmp / "rng_state.pt")
                (tmp / "train_dataloader.json").write_text(json.dumps(data_state))
                (tmp / "config.yaml").write_text(config_yaml)
                info = {"step": step, "metrics": metrics or {}, **(extra_info or {})}
                (tmp / INFO_FILE).write_text(json.dumps(info, indent=2, default=float))
        except (OSError, RuntimeError) as err:  # on a full disk torch.save says only "unexpected pos"
            raise CheckpointWriteError(
                f"writing checkpoint {final} failed ({err}); {self._resume_hint()}. The filesystem had "
                f"{_gib(free)} free for about {_gib(needed)} of tensors: if it filled up meanwhile, free space "
                f"and run the same command again to resume"
            ) from err
        self.prune()
        return Checkpoint(step, final)

    def _check_space(self, final: Path, needed: int) -> int:
        """The filesystem's free bytes; refuses a save that cannot fit (``needed`` bytes of tensors),
        naming the directory, the sizes and the way on."""
        free = shutil.disk_usage(self.root).free
        if free < needed * SPACE_MARGIN:
            raise CheckpointWriteError(
                f"no room for checkpoint {final}: it needs about {_gib(needed * SPACE_MARGIN)}, the "
                f"filesystem has {_gib(free)} free; {self._resume_hint()}. Free space (or point "
                f"checkpointing.checkpoint_dir elsewhere, or lower checkpointing.keep_top_k), then run the "
                f"same command again to resume"
            )
        return free

    def _resume_hint(self) -> str:
        latest = self.latest()
        return f"the last complete checkpoint is {latest.path.name}" if latest else "there is no checkpoint yet"

    def _save_tokenizer(self, tokenizer: Any, link: Path) -> None:
        """The step's ``policy/tokenizer``: a link to ``<checkpoint_dir>/tokenizer/`` when that holds this
        run's tokenizer (checked at this manager's first save), else the step's own copy."""
        shared = self.root / TOKENIZER_DIR
        if self._tokenizer_shared is None or (self._tokenizer_shared and not shared.is_dir()):
            self._tokenizer_shared = self._share_tokenizer(tokenizer)
        if self._tokenizer_shared:
            os.symlink(Path("..", "..", TOKENIZER_DIR), link, target_is_directory=True)
        else:
            tokenizer.save_pretrained(link)

    def _share_tokenizer(self, tokenizer: Any) -> bool:
        """Make ``<checkpoint_dir>/tokenizer/`` this run's tokenizer; False when it must stay another one.

        The same files already there (a resumed run's) are kept as they are. Other files (a resumed run
        with a new ``policy.tokenizer.chat_template``) replace them only when no checkpoint links to them:
        a checkpoint's tokenizer never changes after it is written, and replacing a directory takes two
        renames, between which a kill would leave every link dangling."""
        shared = self.root / TOKENIZER_DIR
        tmp = self.root / f"{TMP_PREFIX}{TOKENIZER_DIR}-{uuid.uuid4().hex[:8]}"
        try:
            tokenizer.save_pretrained(tmp)
            if shared.is_dir() and _same_files(tmp, shared):
                return True
            if shared.exists() and self.checkpoints():
                return False
            self._publish(tmp, shared)
            return True
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @contextmanager
    def _atomic_dir(self, final: Path) -> Iterator[Path]:
        """Yield a fresh ``.tmp-*`` directory to fill, then :meth:`_publish` it as ``final``. A kill
        midway leaves only a ``.tmp-*`` directory; an error removes it."""
        tmp = self.root / f"{TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            yield tmp
            self._publish(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _publish(self, tmp: Path, final: Path) -> None:
        """fsync ``tmp`` and rename it to ``final``. A previous ``final`` (re-saving a step) is renamed to
        ``.trash-*`` just before and deleted only once the new one is in place."""
        _fsync_tree(tmp)
        old = self.root / f"{TRASH_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        shutil.rmtree(old, ignore_errors=True)

    def _discard(self, path: Path) -> None:
        """Remove a checkpoint so that a kill midway never leaves a half-deleted ``step_<n>``."""
        trash = self.root / f"{TRASH_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}"
        os.rename(path, trash)
        _fsync_dir(self.root)
        shutil.rmtree(trash, ignore_errors=True)

    def _score(self, checkpoint: Checkpoint) -> tuple[int, float, int]:
        """Sort key, best first after ``sorted(reverse=True)``: has metric, metric, recency."""
        try:
            value = checkpoint.info.get("metrics", {}).get(self.metric_name) if self.metric_name else None
        except CheckpointDamaged:  # ranks as one without the metric, rather than stopping every later save
            value = None
        if not isinstance(value, (int, float)):
            return (0, 0.0, checkpoint.step)
        return (1, float(value) if self.higher_is_better else -float(value), checkpoint.step)

    def prune(self) -> list[Checkpoint]:
        """Delete all but the ``keep_top_k`` best checkpoints (plus the latest); return the deleted."""
        found = self.checkpoints()
        if self.keep_top_k is None or len(found) <= self.keep_top_k:
            return []
        latest = found[-1]
        ranked = sorted(found, key=self._score, reverse=True)
        keep = {c.step for c in ranked[: self.keep_top_k]} | {latest.step}
        deleted = [c for c in found if c.step not in keep]
        for checkpoint in deleted:
            self._discard(checkpoint.path)
        return deleted


# ---------------------------------------------------------------------- a checkpoint as a model


def checkpoint_of(path: Path) -> Path | None:
    """The trainer checkpoint at ``path``: ``path`` itself (``step_<n>/``), or the latest ``step_<n>``
    of a checkpoint directory; None when ``path`` is not one."""
    if (path / "policy").is_dir():
        return path
    latest = CheckpointManager(path).latest()
    return latest.path if latest is not None else None


def _base_model_name(checkpoint: Path) -> str:
    """The model a LoRA checkpoint's adapter sits on: ``policy.model_name`` of its saved config."""
    import yaml

    config = yaml.safe_load((checkpoint / "config.yaml").read_text()) or {}
    name = (config.get("policy") or {}).get("model_name")
    if not isinstance(name, str):
        raise ValueError(f"{checkpoint}/config.yaml names no policy.model_name for the adapter's base model")
    return name


def load_model_or_checkpoint(name: str, device: str = "cpu") -> tuple[Any, Any]:
    """The model and tokenizer ``--model name`` means: a built-in name, a directory or hub id (through
    the one loader, :func:`gym_bridge.models.registry.load_model_and_tokenizer`), or a trainer checkpoint
    (``step_<n>/``, or a checkpoint directory, whose latest step is used: full weights, the merged model,
    or base model + LoRA adapter, merged here)."""
    from gym_bridge.models.registry import load_model_and_tokenizer

    path = Path(name).expanduser()
    checkpoint = checkpoint_of(path) if path.is_dir() else None
    if checkpoint is None:
        return load_model_and_tokenizer(name, device=device)
    policy = checkpoint / "policy"
    tokenizer_dir = policy / "tokenizer"
    tokenizer_name = str(tokenizer_dir) if tokenizer_dir.is_dir() else None
    for whole in (policy / "weights", policy / "merged"):
        if whole.is_dir():
            return load_model_and_tokenizer(str(whole), device=device, tokenizer_name=tokenizer_name)
    adapter = policy / "adapter"
    if not adapter.is_dir():
        raise ValueError(f"{checkpoint} has neither policy/weights, policy/merged nor policy/adapter")
    from peft import PeftModel

    from gym_bridge.train.learner.lora import without_peft_deprecation_warnings

    model, tokenizer = load_model_and_tokenizer(_base_model_name(checkpoint), device=device, tokenizer_name=tokenizer_name)
    with without_peft_deprecation_warnings():
        merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    return merged.eval(), tokenizer
