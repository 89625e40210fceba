"""Task families for pretrained-model recipes: held-out validation problems and correct answers."""

from __future__ import annotations

import re

import pytest

from gym_bridge.data.families import FAMILIES, PROMPT_FORMATS, messages_for, problem_space, split_problems


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_validation_problems_are_disjoint_from_training_and_answers_are_right(family: str) -> None:
    train, val = split_problems(family, n_val=200, seed=3)
    assert len(val) == 200 and len(train) >= 200
    assert not {p["question"] for p in train} & {p["question"] for p in val}
    for problem in problem_space(family)[:50] + val[:50]:
        numbers = [int(n) for n in re.findall(r"\d+", problem["question"])]
        if family != "word":  # "a + b" or "a + b - c"
            expected = numbers[0] + numbers[1] - (numbers[2] if len(numbers) == 3 else 0)
            assert problem["answer"] == str(expected), problem
    assert split_problems(family, n_val=200, seed=3) == (train, val)  # seeded
    assert split_problems(family, n_val=200, seed=4)[1] != val


def test_unknown_family_and_every_prompt_format() -> None:
    with pytest.raises(ValueError, match="unknown task family"):
        problem_space("nope")
    for fmt in PROMPT_FORMATS:
        messages = messages_for("What is 1 + 2?", fmt)
        assert messages[-1] == {"role": "user", "content": messages[-1]["content"]}
        assert "What is 1 + 2?" in messages[-1]["content"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_worked_examples_are_outside_the_problem_space_and_shown_before_the_question(family: str) -> None:
    from gym_bridge.data.families import WORKED_EXAMPLES

    questions = {p["question"] for p in problem_space(family)}
    for question, answer in WORKED_EXAMPLES[family]:
        assert question not in questions  # no validation problem is answered inside its own prompt
        assert answer.endswith(f"The answer is {answer.split()[-1]}")
    messages = messages_for("Q?", "phrase_one_shot", family)
    shots = WORKED_EXAMPLES[family]
    assert len(messages) == 2 + 2 * len(shots)
    assert [m["content"] for m in messages[1:-1:2]] == [q for q, _ in shots]
    assert messages[-1] == {"role": "user", "content": "Q?"}


def test_word_problems_are_possible_and_their_answers_follow_the_story() -> None:
    for problem in problem_space("word"):
        has, moved = (int(n) for n in re.findall(r"\d+", problem["question"]))
        if "gives away" in problem["question"]:
            assert moved <= has, problem  # nobody gives away more than they have
            assert problem["answer"] == str(has - moved), problem
        else:
            assert " buys " in problem["question"] and problem["answer"] == str(has + moved), problem


def test_committed_word_recipe_files_are_what_the_generator_writes(tmp_path) -> None:
    from pathlib import Path

    from gym_bridge.data.families import write_split

    write_split("word", tmp_path, prompt_format="phrase_one_shot", n_val=200, n_train=2000)
    recipes_data = Path(__file__).resolve().parents[2] / "recipes" / "data"
    for name in ("word_train.jsonl", "word_val.jsonl"):
        assert (tmp_path / name).read_bytes() == (recipes_data / name).read_bytes(), name
