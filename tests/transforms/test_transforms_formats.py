"""The four target formats on built rollouts: GRPO options, DPO pairing and ties, ranked ranks and round trip."""

from __future__ import annotations

import pytest
from transform_rollouts import rollout

from transforms.common import RecordError, check_rollout, task_name_of
from transforms.dpo import dpo_pairs
from transforms.grouping import NotContiguous, group_key, iter_contiguous_groups, iter_groups_on_disk
from transforms.grpo import to_grpo, to_grpo_chat
from transforms.ranked import check_ranked, dense_ranks, rank_reward, ranked_to_grpo, to_ranked


def _task(rewards, task=7, prompt="What is 3 + 4?"):
    return [rollout(prompt, f"answer {n}", r, task=task, repeat=n) for n, r in enumerate(rewards)]


# ---------------------------------------------------------------- GRPO


def test_grpo_renames_keys_and_refuses_a_missing_reward_unless_defaulted():
    """An unscored rollout had become reward 0.0 (NeMo Gym's documented script does so): GRPO learned it as
    a wrong answer. Now it is refused unless the caller names the default."""
    record = rollout("What is 1 + 1?", "It is 2", None, system="Be brief.")
    with pytest.raises(RecordError, match="no 'reward'"):
        to_grpo(record)
    with pytest.raises(RecordError, match="no 'reward'"):
        to_grpo_chat(record)
    assert to_grpo(record, input_key="question", output_key="answer", reward_key="score", default_reward=0.0) == {
        "question": "What is 1 + 1?",
        "answer": "It is 2",
        "score": 0.0,
    }


def test_grpo_kept_fields_never_overwrite_the_record_keys():
    record = rollout("q", "a 5", 1.0)
    record["input"] = "a task field that collides"
    out = to_grpo(record, keep_fields=["expected_answer", "input", "absent"])
    assert out == {"input": "q", "output": "a 5", "reward": 1.0, "expected_answer": "5"}


def test_grpo_chat_joins_system_prompt_and_assistant_turn():
    record = rollout("q?", "a", 0.5, system="Be brief.", agent=None)
    record["_ng_environment_server"] = "math_env"
    assert to_grpo_chat(record, reward_key="r") == {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "q?"},
            {"role": "assistant", "content": "a"},
        ],
        "task_name": "math_env",
        "r": 0.5,
    }
    del record["_ng_environment_server"]
    assert task_name_of(record) == "default"


def test_output_message_texts_are_joined_by_a_space():
    record = rollout("q", "first", 1.0)
    record["response"]["output"].append(
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "second"}]}
    )
    assert to_grpo(record)["output"] == "first second"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda r: r.pop("responses_create_params"), "responses_create_params"),
        (lambda r: r["responses_create_params"].pop("input"), "input"),
        (lambda r: r.pop("response"), "response.output"),
        (lambda r: r.__setitem__("reward", "1.0"), "reward"),
        (lambda r: r.__setitem__("reward", float("nan")), "reward"),
        (lambda r: r.__setitem__("reward", float("inf")), "reward"),
        (lambda r: r.__setitem__("reward", True), "reward"),
        (lambda r: r.__setitem__("reward", {"value": 1}), "reward"),
        (lambda r: r.__setitem__("reward", 10**400), "reward"),  # had raised OverflowError: a traceback
    ],
)
def test_records_missing_fields_are_rejected_by_name(mutate, reason):
    record = rollout("q", "a", 1.0)
    mutate(record)
    with pytest.raises(RecordError, match=reason):
        check_rollout(record)


# ---------------------------------------------------------------- DPO


def test_dpo_pairs_best_against_worst():
    group = _task([0.5, 1.0, 0.0, 1.0, 0.0])
    (pair,) = dpo_pairs(group)
    assert pair == {
        "prompt": "What is 3 + 4?",
        "chosen": "answer 1",
        "rejected": "answer 2",
        "chosen_reward": 1.0,
        "rejected_reward": 0.0,
    }


def test_dpo_skips_ties_and_lone_rollouts():
    assert dpo_pairs(_task([1.0, 1.0, 1.0])) == []
    assert dpo_pairs(_task([0.0, 0.0])) == []
    assert dpo_pairs(_task([1.0])) == []


def test_dpo_all_pairs_respects_the_margin():
    group = _task([0.0, 1.0, 0.6, 0.6])
    pairs = dpo_pairs(group, all_pairs=True)
    assert {(p["chosen"], p["rejected"]) for p in pairs} == {
        ("answer 1", "answer 0"),
        ("answer 1", "answer 2"),
        ("answer 1", "answer 3"),
        ("answer 2", "answer 0"),
        ("answer 3", "answer 0"),
    }
    wide = dpo_pairs(group, all_pairs=True, min_margin=0.5)
    assert {(p["chosen"], p["rejected"]) for p in wide} == {
        ("answer 1", "answer 0"),
        ("answer 2", "answer 0"),
        ("answer 3", "answer 0"),
    }
    assert dpo_pairs(_task([0.7, 0.4]), min_margin=0.5) == []


def test_dpo_chat_form_carries_messages():
    group = [rollout("q", "good", 1.0, task=1, system="S"), rollout("q", "bad", 0.0, task=1, system="S")]
    (pair,) = dpo_pairs(group, chat=True)
    assert pair["prompt"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}]
    assert pair["chosen"] == [{"role": "assistant", "content": "good"}]
    assert pair["rejected"] == [{"role": "assistant", "content": "bad"}]


# ---------------------------------------------------------------- ranked


def test_dense_ranks_share_ties():
    assert dense_ranks([1.0, 0.5, 0.5, 0.0]) == [1, 2, 2, 3]
    assert dense_ranks([0.0, 1.0, 0.0]) == [2, 1, 2]
    assert dense_ranks([0.3, 0.3]) == [1, 1]


def test_ranked_group_is_listed_best_first_with_shared_ranks():
    ranked = to_ranked(_task([0.0, 1.0, 0.5, 1.0]))
    assert ranked == {
        "prompt": "What is 3 + 4?",
        "group": [
            {"response": "answer 1", "rank": 1, "reward": 1.0},
            {"response": "answer 3", "rank": 1, "reward": 1.0},
            {"response": "answer 2", "rank": 2, "reward": 0.5},
            {"response": "answer 0", "rank": 3, "reward": 0.0},
        ],
    }


def test_rank_reward_is_linear_from_best_to_worst():
    assert [rank_reward(r, 1, 4) for r in (1, 2, 3, 4)] == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0])
    assert rank_reward(1, 1, 1) == 1.0


@pytest.mark.parametrize("rewards", [[0.0, 1.0, 1.0, 0.0], [1.0, 0.5, 0.0, 0.5], [0.25, 0.0]])
def test_ranked_round_trip_gives_back_evenly_spaced_rewards(rewards):
    group = _task(rewards)
    back = ranked_to_grpo(to_ranked(group))
    expected = sorted(
        ((to_grpo(r)["input"], to_grpo(r)["output"], min(1.0, r["reward"] / max(rewards))) for r in group),
        key=lambda t: t[1],
    )
    assert sorted(((b["input"], b["output"], b["reward"]) for b in back), key=lambda t: t[1]) == expected


def test_ranked_to_grpo_reads_chat_groups_and_third_party_ranks():
    back = ranked_to_grpo(to_ranked(_task([1.0, 0.0]), chat=True), input_key="prompt", reward_key="score")
    assert back == [
        {"prompt": "What is 3 + 4?", "output": "answer 0", "score": 1.0},
        {"prompt": "What is 3 + 4?", "output": "answer 1", "score": 0.0},
    ]
    seed = {
        "prompt": "p",
        "group": [{"response": "a", "rank": 1}, {"response": "b", "rank": 2}, {"response": "c", "rank": 3}],
    }
    assert [g["reward"] for g in ranked_to_grpo(seed)] == [1.0, 0.5, 0.0]


@pytest.mark.parametrize(
    "bad",
    [
        {"group": []},
        {"prompt": "p"},
        {"prompt": "p", "group": [{"rank": 1}]},
        {"prompt": "p", "group": [{"response": "a", "rank": 0}]},
    ],
)
def test_bad_ranked_records_are_rejected(bad):
    with pytest.raises(RecordError):
        check_ranked(bad)


# ---------------------------------------------------------------- grouping


def test_group_key_is_task_index_and_request():
    assert group_key(rollout("q", "a", 1.0, task=3))[0] == 3
    assert group_key(rollout("q", "a", 1.0, task=3)) == group_key(rollout("q", "b", 0.0, task=3))
    assert group_key(rollout("q", "a", 1.0, task=3)) != group_key(rollout("other", "a", 1.0, task=3))
    a, b, c = rollout("q", "x", 1.0), rollout("q", "y", 0.0), rollout("other", "x", 1.0)
    assert group_key(a) == group_key(b) != group_key(c)


def test_contiguous_groups_stream_and_detect_disorder():
    ordered = [
        (n, r) for n, r in enumerate(_task([1, 0], task=1) + _task([0, 0, 1], task=2) + _task([1], task=5), 1)
    ]
    groups = list(iter_contiguous_groups(ordered))
    assert [[n for n, _ in g] for g in groups] == [[1, 2], [3, 4, 5], [6]]

    split = [(n, r) for n, r in enumerate(_task([1], task=1) + _task([0], task=2) + _task([0], task=1), 1)]
    with pytest.raises(NotContiguous) as err:
        list(iter_contiguous_groups(split))
    assert err.value.lineno == 3
    by_request = [(1, rollout("a", "x", 1.0)), (2, rollout("b", "x", 1.0)), (3, rollout("a", "y", 0.0))]
    with pytest.raises(NotContiguous):
        list(iter_contiguous_groups(by_request))


def test_on_disk_grouping_collects_split_tasks_in_first_seen_order(tmp_path):
    records = _task([1], task=4) + _task([0], task=2) + _task([0.5], task=4) + [rollout("free", "z", 1.0)]
    groups = list(iter_groups_on_disk(enumerate(records, 1), tmp_path))
    assert [[n for n, _ in g] for g in groups] == [[1, 3], [2], [4]]
    assert groups[0][1][1] == records[2]
    assert list(tmp_path.iterdir()) == []  # the spill file is gone
