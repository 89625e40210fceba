"""Trainer data: dataset formats to task rows / offline groups, loaders, several dataloaders, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gym_bridge.train.batches.rollouts import (
    TurnMismatch,
    sequence_from_chat,
    sequence_from_items,
    sequence_from_text,
)
from gym_bridge.train.bookkeeping.logging import MetricsLogger, format_line, plot_curves, read_metrics
from gym_bridge.train.config import load_config
from gym_bridge.train.samplers.data import (
    DataError,
    PromptLoader,
    TrainBatches,
    load_offline_groups,
    load_prompts,
)

ROOT = Path(__file__).resolve().parents[2]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def data_config(*overrides: str):
    return load_config(None, ["data.default.env_name=math", "env.math.server=math", *overrides]).data


# ---------------------------------------------------------------------------------------------- datasets


def test_response_dataset_rows_become_task_rows_with_prompt_and_system_files(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": "What is 2 + 2?", "answer": "4", "source": "x"}])
    (tmp_path / "prompt.txt").write_text("Solve: {}\nPut the answer in \\boxed{}.")
    (tmp_path / "system.txt").write_text("Be brief.")
    cfg = data_config(
        f"data.train.data_path={data}",
        "data.train.input_key=question",
        "data.train.output_key=answer",
        f"data.default.prompt_file={tmp_path / 'prompt.txt'}",
        f"data.default.system_prompt_file={tmp_path / 'system.txt'}",
    )
    (prompt,), held_out = load_prompts(cfg, "train")
    assert held_out == []
    assert prompt.env_name == "math" and prompt.task_name == "math" and prompt.dataset == "qa"
    assert prompt.row["responses_create_params"]["input"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Solve: What is 2 + 2?\nPut the answer in \\boxed{}."},
    ]
    assert prompt.row["expected_answer"] == "4" and prompt.row["source"] == "x"
    assert "answer" not in prompt.row and "question" in prompt.row


def test_openmath_and_nemo_gym_rows(tmp_path: Path) -> None:
    openmath = write_jsonl(tmp_path / "om.jsonl", [{"problem": "1+1?", "expected_answer": "2"}])
    gym = write_jsonl(
        tmp_path / "gym.jsonl",
        [
            {
                "responses_create_params": {"input": [{"role": "user", "content": "3+3?"}]},
                "expected_answer": "6",
                "question": "3+3?",
            }
        ],
    )
    cfg = data_config(
        f"data.train=[{{dataset_name: OpenMathInstruct-2, data_path: {openmath}}}, {{data_path: {gym}, task_name: gym}}]"
    )
    prompts, _ = load_prompts(cfg, "train")
    assert prompts[0].row["responses_create_params"]["input"] == [{"role": "user", "content": "1+1?"}]
    assert prompts[0].row["expected_answer"] == "2"
    assert prompts[1].row == json.loads(gym.read_text())  # task rows pass through untouched
    assert [p.task_name for p in prompts] == ["math", "gym"]


def test_split_validation_size_holds_out_a_seeded_fraction(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [{"input": f"q{i}", "output": str(i)} for i in range(20)])
    cfg = data_config(
        f"data.train.data_path={data}", "data.train.split_validation_size=0.25", "data.train.seed=5"
    )
    train, held_out = load_prompts(cfg, "train")
    again, held_again = load_prompts(cfg, "train")
    assert len(train) == 15 and len(held_out) == 5
    assert {p.row["question"] for p in train}.isdisjoint({p.row["question"] for p in held_out})
    assert [p.row["question"] for p in held_out] == [p.row["question"] for p in held_again]
    assert all(p.dataset == "d_heldout" for p in held_out)


def test_missing_file_and_missing_key_name_the_key_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data\.train\[0\]\.data_path: file not found"):
        load_prompts(data_config(f"data.train.data_path={tmp_path / 'nope.jsonl'}"), "train")
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "x"}])
    with pytest.raises(DataError, match=r"data\.train\[0\]: .*d\.jsonl:1: no 'input' key"):
        load_prompts(data_config(f"data.train.data_path={data}"), "train")


def test_offline_groups_by_identical_input_from_grpo_rows_and_rollouts(tmp_path: Path) -> None:
    grpo_rows = write_jsonl(
        tmp_path / "grpo.jsonl",
        [
            {"input": "a?", "output": "1", "reward": 1.0},
            {"input": "b?", "output": "2", "reward": 0.0},
            {"input": "a?", "output": "3", "reward": 0.0},
        ],
    )
    rollouts = write_jsonl(
        tmp_path / "rollouts.jsonl",
        [
            {
                "responses_create_params": {"input": [{"role": "user", "content": "c?"}]},
                "response": {
                    "output": [
                        {
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": "9"}],
                        }
                    ]
                },
                "reward": 0.5,
            }
        ],
    )
    cfg = load_config(
        None, ["grpo.mode=offline", f"data.train=[{{data_path: {grpo_rows}}}, {{data_path: {rollouts}}}]"]
    ).data
    groups = load_offline_groups(cfg)
    assert [(g.messages[-1]["content"], [c.reward for c in g.completions]) for g in groups] == [
        ("a?", [1.0, 0.0]),
        ("b?", [0.0]),
        ("c?", [0.5]),
    ]
    assert groups[0].completions[1].text == "3"
    assert groups[2].completions[0].output_items[0]["type"] == "message"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('\n{"input": "a", "output": "b"}\n')  # line 2: blank lines count
    with pytest.raises(DataError, match=r"bad\.jsonl:2: no numeric 'reward'"):
        load_offline_groups(load_config(None, ["grpo.mode=offline", f"data.train.data_path={bad}"]).data)
    # A malformed rollout record is refused by the transforms' reader, naming file and line.
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"responses_create_params": {"input": 5}, "response": {"output": []}, "reward": 1}))
    with pytest.raises(DataError, match=r"broken\.jsonl:1: 'responses_create_params.input' must be a string"):
        load_offline_groups(load_config(None, ["grpo.mode=offline", f"data.train.data_path={broken}"]).data)


# ---------------------------------------------------------------------------------------------- loaders


def test_prompt_loader_epochs_reshuffle_and_resume() -> None:
    loader = PromptLoader(list(range(5)), shuffle=True, seed=1)
    first = loader.take(5)
    assert sorted(first) == list(range(5)) and loader.epochs_done == pytest.approx(1.0)
    second = loader.take(3)
    state = loader.state_dict()
    rest = loader.take(4)
    twin = PromptLoader(list(range(5)), shuffle=True, seed=1)
    twin.load_state_dict(state)
    assert twin.take(4) == rest
    assert first != second + rest[:2]  # the next epoch is reshuffled
    assert PromptLoader([1, 2, 3], shuffle=False).take(7) == [1, 2, 3, 1, 2, 3, 1]


class Item:
    def __init__(self, name: str, dataset: str) -> None:
        self.name, self.dataset = name, dataset

    def __repr__(self) -> str:
        return self.name


def two_datasets() -> list[Item]:
    return [Item(x, "letters") for x in "abcd"] + [Item(str(i), "digits") for i in range(1, 9)]


def names(batch: list[Item]) -> list[str]:
    return [i.name for i in batch]


def two_loaders(**kwargs: Any) -> TrainBatches:
    """Letters and digits, two prompts from each per step, in file order."""
    return TrainBatches(
        two_datasets(),
        num_prompts_per_step=4,
        shuffle=False,
        seed=0,
        use_multiple_dataloader=True,
        num_prompts_per_dataloader=2,
        **kwargs,
    )


def test_one_dataloader_and_several_as_in_nemo_rls_guide() -> None:
    single = TrainBatches(two_datasets(), num_prompts_per_step=4, shuffle=False, seed=0)
    assert [names(single.next_batch()) for _ in range(3)] == [list("abcd"), list("1234"), list("5678")]
    several = two_loaders()
    got = [names(several.next_batch()) for _ in range(3)]
    assert got == [["a", "b", "1", "2"], ["c", "d", "3", "4"], ["a", "b", "5", "6"]]
    state = several.state_dict()
    resumed = two_loaders()
    resumed.load_state_dict(state)
    assert names(resumed.next_batch()) == names(several.next_batch()) == ["c", "d", "7", "8"]


def digits_only(loaders, num_prompts_per_dataloader, **records):
    """A custom sampler: everything from the digits loader, and it sees the trainer's records."""
    assert "reward" in records
    return loaders["digits"].take(2 * num_prompts_per_dataloader)


def test_custom_dataloader_by_dotted_path_gets_the_records() -> None:
    batches = two_loaders(custom_dataloader=f"{__name__}.digits_only")
    batches.set_records(reward=0.3)
    assert names(batches.next_batch()) == ["1", "2", "3", "4"]
    with pytest.raises(DataError, match="data.custom_dataloader: cannot import"):
        two_loaders(custom_dataloader="no.such.fn")


# ---------------------------------------------------------------------------------------------- sequences


@pytest.fixture(scope="module")
def tokenizer():
    from gym_bridge.models.tokenizer import build_tokenizer

    return build_tokenizer()


def test_multi_turn_items_concatenate_turns_and_mask_tool_output() -> None:
    turn1 = {
        "prompt_token_ids": [1, 2, 3],
        "generation_token_ids": [4, 5],
        "generation_log_probs": [-0.1, -0.2],
    }
    turn2 = {
        "prompt_token_ids": [1, 2, 3, 4, 5, 9, 9],
        "generation_token_ids": [6],
        "generation_log_probs": [-0.3],
    }
    items = [
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", **turn1},
        {"type": "function_call_output", "call_id": "c", "output": "42"},
        {"type": "message", "role": "assistant", "content": [], **turn2},
    ]
    token_ids, mask, logprobs, turns = sequence_from_items(items)
    assert token_ids == [1, 2, 3, 4, 5, 9, 9, 6]
    assert mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert logprobs == [0, 0, 0, -0.1, -0.2, 0, 0, -0.3]
    assert turns == 2
    assert sequence_from_items([{"type": "message", "content": []}]) is None
    broken = [items[0], {**items[2], "prompt_token_ids": [7, 7, 7, 7, 7, 7]}]
    with pytest.raises(TurnMismatch):
        sequence_from_items(broken)


def test_text_and_chat_sequences_train_only_on_assistant_tokens(tokenizer) -> None:
    messages = [{"role": "user", "content": "What is 1 + 1?"}]
    token_ids, mask = sequence_from_text(tokenizer, messages, "\\boxed{2}")
    generated = [t for t, m in zip(token_ids, mask, strict=True) if m]
    assert tokenizer.decode(generated) == "\\boxed{2}<|im_end|>"

    completion = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}],
        },
        {"role": "tool", "content": "2"},
        {"role": "assistant", "content": "\\boxed{2}"},
    ]
    token_ids, mask = sequence_from_chat(tokenizer, messages, completion)
    trained = tokenizer.decode([t for t, m in zip(token_ids, mask, strict=True) if m])
    assert trained.count("<|im_end|>") == 2 and "tool_response" not in trained and "\\boxed{2}" in trained
    full = tokenizer.apply_chat_template(messages + completion, tokenize=False)
    assert tokenizer.decode(token_ids) == full


# ---------------------------------------------------------------------------------------------- logging and errors


def test_metrics_log_truncates_on_resume_and_plots(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path)
    for step in range(1, 5):
        logger.log(step, {"reward_mean": step / 10})
    logger.log(4, {"accuracy": 0.5}, split="val")
    logger.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "spl')  # a torn line from a crash
    resumed = MetricsLogger(tmp_path, resume_step=2)
    resumed.log(3, {"reward_mean": 0.9})
    resumed.close()
    assert [(r["step"], r["split"]) for r in read_metrics(tmp_path)] == [
        (1, "train"),
        (2, "train"),
        (3, "train"),
    ]
    assert plot_curves(tmp_path).stat().st_size > 1000
    assert "reward 0.900" in format_line(3, {"reward_mean": 0.9})


def test_cli_reports_bad_keys_by_path_before_loading_anything(tmp_path: Path) -> None:
    recipe = ROOT / "recipes" / "grpo_math_tiny.yaml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gym_bridge.cli",
            "train",
            "--config",
            str(recipe),
            "grpo.num_prompts_per_stp=3",
            "policy.optimizer.kwargs.lr=fast",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert (
        "grpo.num_prompts_per_stp" in done.stderr
        and "did you mean 'grpo.num_prompts_per_step'" in done.stderr
    )
    assert "policy.optimizer.kwargs.lr" in done.stderr
    assert not (tmp_path / "logs").exists()
