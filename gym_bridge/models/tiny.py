"""The tiny embedded policy: a 1M-parameter Llama warm-started on single-digit arithmetic.

Why: the README's main job must show GRPO learning on 2 CPU cores in minutes, with nothing
downloaded. A model half-way through learning is fragile (GRPO makes it worse) and a fully trained
one leaves nothing to learn, so the warm-start has two phases: clean labels until the model knows
the addition and subtraction tables, then a short phase at a small learning rate where 45% of the
targets are *near misses* (off by 1 or 2). The model still ranks the right answer first (greedy is
nearly always right) but samples a wrong one more than half the time at temperature 1.0, and
GRPO has a clear signal to sharpen.

Built in one to two minutes on 2 cores and cached (:func:`ensure_tiny`); ``python -m
gym_bridge.models.tiny`` builds it and prints the build report (including validation accuracy).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_bridge.data.arithmetic import DEFAULT_OPS, make_problems, prompt_for
from gym_bridge.models.progress import counted, waiting

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

TINY_NAME = "tiny-v1"
# Caches rebuild by themselves when the recipe changes; bump this when the code or tokenizer does.
BUILDER_VERSION = 2
BUILD_INFO_FILE = "gym_bridge_build.json"


@dataclass
class TinyRecipe:
    """Model shape and warm-start settings; the defaults make the cached ``tiny`` model."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 1024
    ops: tuple[str, ...] = DEFAULT_OPS
    clean_steps: int = 600
    near_miss_steps: int = 100
    batch_size: int = 16
    near_miss_batch_size: int = 32  # larger: near-miss labels are noisy targets
    learning_rate: float = 1e-3
    near_miss_learning_rate: float = 1e-4
    warmup_steps: int = 30
    weight_decay: float = 0.01
    near_miss_fraction: float = 0.45
    near_miss_offsets: tuple[int, ...] = field(default=(-2, -1, 1, 2))
    threads: int = 1

    @property
    def steps(self) -> int:
        return self.clean_steps + self.near_miss_steps


def default_cache_root() -> Path:
    """``$GYM_BRIDGE_CACHE`` or ``~/.cache/gym-bridge``."""
    return Path(os.environ.get("GYM_BRIDGE_CACHE") or "~/.cache/gym-bridge").expanduser()


class _WarmStartData:
    """Right-padded chat examples with near-miss labels; token ids cached per question and answer."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, recipe: TinyRecipe, seed: int) -> None:
        self.tokenizer = tokenizer
        self.recipe = recipe
        self.seed = seed
        self.rng = random.Random(seed)
        self._prompt_ids: dict[str, list[int]] = {}
        self._answer_ids: dict[int, list[int]] = {}

    def prompt_ids(self, question: str) -> list[int]:
        if question not in self._prompt_ids:
            messages = [{"role": "user", "content": prompt_for(question)}]
            prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            self._prompt_ids[question] = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return self._prompt_ids[question]

    def answer_ids(self, answer: int) -> list[int]:
        """``\\boxed{answer}`` followed by the end-of-turn token."""
        if answer not in self._answer_ids:
            ids = self.tokenizer(f"\\boxed{{{answer}}}", add_special_tokens=False)["input_ids"]
            self._answer_ids[answer] = ids + [self.tokenizer.eos_token_id]
        return self._answer_ids[answer]

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Input ids, attention mask and labels (only the assistant answer is supervised)."""
        import torch

        recipe = self.recipe
        near_miss = step >= recipe.clean_steps
        size = recipe.near_miss_batch_size if near_miss else recipe.batch_size
        problems = make_problems(size, seed=self.seed * 1_000_003 + step, ops=recipe.ops)
        sequences, label_starts = [], []
        for p in problems:
            answer = int(p["answer"])
            if near_miss and self.rng.random() < recipe.near_miss_fraction:
                answer += self.rng.choice(recipe.near_miss_offsets)
            prompt_ids = self.prompt_ids(p["question"])
            sequences.append(prompt_ids + self.answer_ids(answer))
            label_starts.append(len(prompt_ids))
        width = max(map(len, sequences))
        input_ids = torch.full((len(sequences), width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        labels = torch.full_like(input_ids, -100)
        for i, (seq, start) in enumerate(zip(sequences, label_starts, strict=True)):
            input_ids[i, : len(seq)] = torch.tensor(seq)
            attention[i, : len(seq)] = 1
            labels[i, start : len(seq)] = input_ids[i, start : len(seq)]
        return input_ids, attention, labels


def random_tiny_model(
    tokenizer: PreTrainedTokenizerBase | None = None,
    recipe: TinyRecipe | None = None,
    seed: int = 0,
    tie_word_embeddings: bool = False,
) -> PreTrainedModel:
    """A random-weight Llama of the recipe's shape, in eval mode, wired to the tokenizer's special tokens.

    Why: tests and benchmarks need a real model of a chosen shape in milliseconds, with no warm-start
    and nothing downloaded; the same seed and shape always give the same weights. Defaults: the
    project's tokenizer and the tiny model's shape (only the recipe's shape fields are used).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if tokenizer is None:
        from gym_bridge.models.tokenizer import build_tokenizer

        tokenizer = build_tokenizer()
    recipe = recipe or TinyRecipe()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model.eval()


def new_tiny_model(tokenizer: PreTrainedTokenizerBase, recipe: TinyRecipe, seed: int = 0) -> PreTrainedModel:
    """The tiny model before its warm-start: random, tied embeddings, in training mode."""
    return random_tiny_model(tokenizer, recipe, seed, tie_word_embeddings=True).train()


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    recipe: TinyRecipe,
    seed: int = 0,
    progress: Any = None,
) -> list[float]:
    """Supervised warm-start: a clean phase, then a near-miss phase (AdamW); returns the losses."""
    import math

    import torch

    torch.manual_seed(seed)
    data = _WarmStartData(tokenizer, recipe, seed)

    def clean_schedule(step: int) -> float:
        """Linear warm-up, then cosine to zero."""
        if step < recipe.warmup_steps:
            return (step + 1) / recipe.warmup_steps
        done = (step - recipe.warmup_steps) / max(1, recipe.clean_steps - recipe.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * done))

    # A fresh optimizer for the near-miss phase: AdamW moments left by the (by then low-loss) clean
    # phase would turn the first noisy near-miss gradients into large steps that unlearn the tables.
    phases = [
        (range(recipe.clean_steps), recipe.learning_rate, clean_schedule),
        (range(recipe.clean_steps, recipe.steps), recipe.near_miss_learning_rate, lambda _: 1.0),
    ]
    model.train()
    losses: list[float] = []
    for steps, learning_rate, schedule in phases:
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=recipe.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        for step in steps:
            input_ids, attention, labels = data.batch(step)
            loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            if progress is not None:
                progress(step + 1, loss.item())
    model.eval()
    return losses


def build_tiny_model(
    out_dir: str | Path,
    seed: int = 0,
    recipe: TinyRecipe | None = None,
    show_progress: bool = True,
    evaluate: bool = True,
) -> Path:
    """Build the tokenizer and a warm-started tiny Llama, save both (safetensors) to ``out_dir``.

    With ``evaluate``, greedy and sampled (T=1, 4 per problem) accuracy on the validation problems
    are recorded in the build info file (a few seconds).
    """
    import torch

    from gym_bridge.models.tokenizer import build_tokenizer

    recipe = recipe or TinyRecipe()
    out = Path(out_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, min(recipe.threads, os.cpu_count() or 1)))
    started = time.monotonic()
    try:
        tokenizer = build_tokenizer()
        model = new_tiny_model(tokenizer, recipe, seed=seed)
        if show_progress:
            with counted("building the tiny model (first use; cached afterwards)", recipe.steps) as update:
                losses = warm_start(model, tokenizer, recipe, seed, update)
        else:
            losses = warm_start(model, tokenizer, recipe, seed)
    finally:
        torch.set_num_threads(threads)
    train_seconds = time.monotonic() - started
    accuracy = {}
    if evaluate:
        with waiting("measuring the tiny model's validation accuracy") if show_progress else nullcontext():
            accuracy = _validation_accuracy(model, tokenizer, recipe)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    info = {
        **_build_key(recipe, seed),
        "parameters": sum(p.numel() for p in model.parameters()),
        "initial_loss": losses[0] if losses else None,
        "final_loss": sum(losses[-20:]) / len(losses[-20:]) if losses else None,
        "train_seconds": round(train_seconds, 1),
        "validation": accuracy,
        "torch": torch.__version__,
    }
    (out / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return out


def _build_key(recipe: TinyRecipe, seed: int) -> dict[str, Any]:
    key = {"name": TINY_NAME, "builder_version": BUILDER_VERSION, "seed": seed, "recipe": asdict(recipe)}
    return json.loads(json.dumps(key))


def _validation_accuracy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, recipe: TinyRecipe
) -> dict[str, float]:
    """Greedy and sampled accuracy over the whole problem space of the recipe's operations."""
    from gym_bridge.data.arithmetic import to_nemo_gym_row, validation_problems
    from gym_bridge.models.evaluate import evaluate_accuracy

    rows = [to_nemo_gym_row(p) for p in validation_problems(ops=recipe.ops)]
    greedy = evaluate_accuracy(model, tokenizer, rows, temperature=0.0)
    sampled = evaluate_accuracy(model, tokenizer, rows, temperature=1.0, n=4)
    return {
        "problems": len(rows),
        "greedy_accuracy": greedy.accuracy,
        "sampled_accuracy_t1": sampled.accuracy,
    }


def is_complete_build(path: Path, recipe: TinyRecipe | None = None, seed: int = 0) -> bool:
    """True when ``path`` holds a finished build of this recipe (the info file is written last)."""
    info_file = path / BUILD_INFO_FILE
    if not (info_file.is_file() and (path / "model.safetensors").is_file()):
        return False
    try:
        info = json.loads(info_file.read_text())
    except (OSError, ValueError):
        return False
    key = _build_key(recipe or TinyRecipe(), seed)
    return all(info.get(k) == v for k, v in key.items())


def ensure_tiny(
    cache_dir: str | Path | None = None,
    seed: int = 0,
    recipe: TinyRecipe | None = None,
    evaluate: bool = True,
) -> Path:
    """The cached tiny model directory, built on first use (and rebuilt if the recipe changed).

    ``cache_dir`` is the gym-bridge cache root (default :func:`default_cache_root`); the model lives
    in ``<root>/models/tiny-v1``. The build happens in a temporary sibling directory that is renamed
    into place, so an interrupted or concurrent build never leaves a half-written model behind.
    A non-default ``recipe`` (tests, experiments) shares the directory and replaces the default build;
    ``evaluate=False`` skips recording the validation accuracy.
    """
    recipe = recipe or TinyRecipe()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    final = root / "models" / (TINY_NAME if seed == 0 else f"{TINY_NAME}-seed{seed}")
    if is_complete_build(final, recipe, seed):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.build.", dir=final.parent))
    try:
        build_tiny_model(tmp, seed=seed, recipe=recipe, evaluate=evaluate)
        if final.exists() and not is_complete_build(final, recipe, seed):
            # A stale or broken build: move it aside first, so the rename below stays atomic.
            stale = Path(tempfile.mkdtemp(prefix=f".{final.name}.stale.", dir=final.parent))
            os.replace(final, stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
        try:
            os.rename(tmp, final)
        except OSError:
            if not is_complete_build(final, recipe, seed):  # another process won the race: use its build
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def main(argv: list[str] | None = None) -> None:
    """``python -m gym_bridge.models.tiny [--out DIR] [--seed N]``: build (or find) and report."""
    import argparse

    parser = argparse.ArgumentParser(description="Build the tiny model and print its build report.")
    parser.add_argument("--out", help="build into this directory (default: the cache, via ensure_tiny)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = build_tiny_model(args.out, seed=args.seed) if args.out else ensure_tiny(seed=args.seed)
    print(path)
    print((path / BUILD_INFO_FILE).read_text(), end="")


if __name__ == "__main__":
    main()
