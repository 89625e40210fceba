"""The tiny-model builder on a reduced recipe: a loadable safetensors checkpoint, caching, evaluation."""

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from gym_bridge.models.evaluate import evaluate_accuracy, extract_boxed, row_messages
from gym_bridge.models.progress import waiting
from gym_bridge.models.tiny import (
    BUILD_INFO_FILE,
    TinyRecipe,
    build_tiny_model,
    default_cache_root,
    ensure_tiny,
    is_complete_build,
    new_tiny_model,
    random_tiny_model,
)
from gym_bridge.models.tokenizer import build_tokenizer

SMALL = TinyRecipe(
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    clean_steps=6,
    near_miss_steps=4,
    batch_size=8,
    near_miss_batch_size=8,
)
ROWS = [
    {"responses_create_params": {"input": [{"role": "user", "content": "What is 1 + 2? Put the answer in \\boxed{}."}]},
     "expected_answer": "3"},
    {"problem": "What is 4 - 6? Put the answer in \\boxed{}.", "expected_answer": "-2"},
]  # fmt: skip


@pytest.fixture(scope="module")
def small_build(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0, recipe=SMALL, show_progress=False)


def test_build_writes_a_loadable_safetensors_checkpoint(small_build):
    assert (small_build / "model.safetensors").is_file()
    assert not list(small_build.glob("*.bin"))
    model = AutoModelForCausalLM.from_pretrained(small_build)
    tokenizer = AutoTokenizer.from_pretrained(small_build)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    info = json.loads((small_build / BUILD_INFO_FILE).read_text())
    assert info["recipe"]["clean_steps"] == 6 and info["parameters"] > 0
    validation = info["validation"]  # the fixture build evaluates on the whole problem space
    assert validation["problems"] == 200
    assert 0.0 <= validation["greedy_accuracy"] <= 1.0 and 0.0 <= validation["sampled_accuracy_t1"] <= 1.0
    assert info["final_loss"] == pytest.approx(info["final_loss"]) and info["final_loss"] < 10


def test_build_is_deterministic(small_build, tmp_path):
    again = build_tiny_model(tmp_path, seed=0, recipe=SMALL, show_progress=False, evaluate=False)
    first, second = load_file(small_build / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    other = load_file(
        build_tiny_model(tmp_path / "s1", seed=1, recipe=SMALL, show_progress=False, evaluate=False)
        / "model.safetensors"
    )
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_random_tiny_model_is_seeded_and_shaped_by_the_recipe():
    model = random_tiny_model(recipe=SMALL, seed=3)
    assert not model.training and not model.config.tie_word_embeddings
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (32, 2)
    same, other = random_tiny_model(recipe=SMALL, seed=3), random_tiny_model(recipe=SMALL, seed=4)
    weights = model.state_dict()
    assert all(torch.equal(weights[k], v) for k, v in same.state_dict().items())
    assert not all(torch.equal(weights[k], v) for k, v in other.state_dict().items())
    tied = new_tiny_model(build_tokenizer(), SMALL, seed=3)
    assert tied.training and tied.get_output_embeddings().weight is tied.get_input_embeddings().weight


def test_warm_start_lowers_the_loss(tmp_path):
    recipe = replace(SMALL, clean_steps=30, near_miss_steps=0, learning_rate=1e-2, warmup_steps=3)
    info = json.loads(
        (
            build_tiny_model(tmp_path, recipe=recipe, show_progress=False, evaluate=False) / BUILD_INFO_FILE
        ).read_text()
    )
    assert info["initial_loss"] > 5.0  # a random model starts near ln(vocab) ~ 6
    assert info["final_loss"] < 2.0


def test_ensure_tiny_builds_once_and_rebuilds_on_recipe_change(tmp_path):
    path = ensure_tiny(tmp_path, recipe=SMALL, evaluate=False)
    assert path == tmp_path / "models" / "tiny-v1"
    assert is_complete_build(path, SMALL)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny(tmp_path, recipe=SMALL, evaluate=False) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    changed = replace(SMALL, near_miss_steps=2)
    assert not is_complete_build(path, changed)
    assert ensure_tiny(tmp_path, recipe=changed, evaluate=False) == path
    assert is_complete_build(path, changed)
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny-v1"]  # no temp dirs left


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GYM_BRIDGE_CACHE", str(tmp_path))
    assert default_cache_root() == tmp_path
    monkeypatch.delenv("GYM_BRIDGE_CACHE")
    assert default_cache_root().parts[-2:] == (".cache", "gym-bridge")


def test_extract_boxed():
    assert extract_boxed("so \\boxed{7}") == "7"
    assert extract_boxed("\\boxed{1} then \\boxed{ -2 }") == "-2"
    assert extract_boxed("the answer is 5") is None


def test_row_messages_accepts_both_row_formats():
    assert row_messages(ROWS[0])[0]["content"].startswith("What is 1 + 2?")
    assert row_messages(ROWS[1]) == [{"role": "user", "content": ROWS[1]["problem"]}]


def test_evaluate_accuracy_counts_and_is_seeded(small_build):
    model = AutoModelForCausalLM.from_pretrained(small_build)
    tokenizer = AutoTokenizer.from_pretrained(small_build)
    tokenizer.padding_side = "right"
    model.train()
    greedy = evaluate_accuracy(model, tokenizer, ROWS, temperature=0.0, n=5, max_new_tokens=6)
    assert greedy.total == len(ROWS)  # greedy ignores n
    sampled = evaluate_accuracy(model, tokenizer, ROWS, temperature=1.0, n=3, max_new_tokens=6, seed=4)
    again = evaluate_accuracy(model, tokenizer, ROWS, temperature=1.0, n=3, max_new_tokens=6, seed=4)
    assert sampled.total == 6 and sampled.completions == again.completions
    assert 0.0 <= sampled.accuracy <= 1.0 and sampled.correct == round(sampled.accuracy * 6)
    assert tokenizer.padding_side == "right" and model.training  # evaluation restores both


def test_clean_training_teaches_the_answer_format(tmp_path):
    """A few clean supervised steps: greedy answers are then boxed numbers that the scorer can read."""
    recipe = replace(SMALL, clean_steps=60, near_miss_steps=0, batch_size=16, learning_rate=3e-3, ops=("+",))
    path = build_tiny_model(tmp_path, recipe=recipe, show_progress=False, evaluate=False)
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    greedy = evaluate_accuracy(model, tokenizer, ROWS, temperature=0.0)
    assert all(extract_boxed(text) is not None for text in greedy.completions), greedy.completions


def test_a_build_says_what_it_does_with_progress_off_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Piped or logged (no terminal), the build prints a line per tenth of its steps on stderr, not
    one blank line for a minute or two; stdout stays clean."""
    build_tiny_model(tmp_path, recipe=SMALL, show_progress=True, evaluate=False)
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0].startswith(f"building the tiny model (first use; cached afterwards): {SMALL.steps} steps")
    progress = [line for line in lines if f"/{SMALL.steps} steps, loss" in line]
    assert 10 <= len(progress) <= 11 and progress[-1].strip().startswith(f"building the tiny model (first use; cached afterwards): {SMALL.steps}/")
    # each a whole line: piped, rich cut them at 80 columns ("loss \n0.507", issue 35)
    assert all(re.fullmatch(r"  .*: \d+/\d+ steps, loss \d+\.\d{3}, \d+ s", line) for line in progress), progress
    assert any(line.startswith("building the tiny model (first use; cached afterwards): done in") for line in lines)


def test_a_wait_without_steps_says_what_it_waits_for_and_how_long_it_took(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with waiting("loading and de-quantising model.gguf"):
        pass
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[0] == "loading and de-quantising model.gguf ..."
    assert err.splitlines()[1].startswith("loading and de-quantising model.gguf: done in ")
