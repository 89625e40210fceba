"""A resumed run's custom sampler (``data.custom_dataloader``) gets the records it would have got uninterrupted.

Before: ``TrainBatches.records`` (the last step's metrics the trainer hands the sampler through
``set_records``) was not in the checkpoint, so the first step after a resume called the sampler with
``{}``: a sampler that picks datasets by the records drew other prompts than the uninterrupted run, and
the resumed run no longer continued line for line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from gym_bridge.train.loop import train
from gym_bridge.train.samplers.data import DataError, TrainBatches
from tests.train.helpers import save_random_tiny
from tests.train.test_trainer_data import names, two_datasets
from tests.train.test_trainer_offline import offline_config, write_scored

CALLS: list[dict[str, Any]] = []


def by_last_step(loaders, num_prompts_per_dataloader, **records):
    """After an even step from ``b``, else (and without records) from ``a``; logs each call."""
    name = "b" if records and records["step"] % 2 == 0 else "a"
    picked = loaders[name].take(2 * num_prompts_per_dataloader)
    CALLS.append({"records": dict(records), "picked": [f"{g.dataset}:{g.idx}" for g in picked]})
    return picked


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_sampler_resume"), seed=0)


def sampler_run(tmp: Path, model_dir: Path, *extra: str):
    tmp.mkdir(exist_ok=True)
    first = write_scored(tmp / "a.jsonl", prompts=6, seed=1)
    second = write_scored(tmp / "b.jsonl", prompts=6, seed=2)
    return offline_config(
        tmp,
        model_dir,
        first,
        f"data.train=[{{data_path: {first}}}, {{data_path: {second}}}]",
        "data.use_multiple_dataloader=true",
        "data.num_prompts_per_dataloader=2",
        f"data.custom_dataloader={__name__}.by_last_step",
        *extra,
    )


@pytest.mark.timeout(300)
def test_a_resumed_custom_sampler_gets_the_last_steps_records_and_draws_the_same_prompts(
    tmp_path: Path, model_dir: Path
) -> None:
    CALLS.clear()
    train(sampler_run(tmp_path / "straight", model_dir), show_progress=False)
    straight = list(CALLS)
    assert [c["records"].get("step") for c in straight] == [None, 1, 2, 3]
    assert {p.split(":")[0] for c in straight for p in c["picked"]} == {"a", "b"}  # the records steer it

    CALLS.clear()
    run = tmp_path / "resumed"
    train(sampler_run(run, model_dir, "grpo.max_num_steps=2"), show_progress=False)
    saved = json.loads((run / "ckpt" / "step_2" / "train_dataloader.json").read_text())
    assert saved["sampler/records"]["step"] == 2 and math.isfinite(saved["sampler/records"]["reward"])
    result = train(sampler_run(run, model_dir), show_progress=False)
    assert result.resumed_from == 2
    assert CALLS == straight  # same records, same prompts, step for step


def test_records_survive_a_state_round_trip_and_what_json_cannot_save_is_refused_by_name() -> None:
    def batches() -> TrainBatches:
        return TrainBatches(
            two_datasets(), num_prompts_per_step=4, shuffle=False, seed=0, use_multiple_dataloader=True,
            num_prompts_per_dataloader=2,
        )  # fmt: skip

    run = batches()
    run.next_batch()
    run.set_records(reward=0.25, step=1, per_task={"letters": [0.5, 1.0]})
    resumed = batches()
    resumed.load_state_dict(json.loads(json.dumps(run.state_dict())))
    assert resumed.records == run.records
    assert names(resumed.next_batch()) == names(run.next_batch())
    old = {k: v for k, v in run.state_dict().items() if k != "sampler/records"}  # a checkpoint written before records were saved
    batches().load_state_dict(old)
    with pytest.raises(DataError, match="'sampler/records' is a list, not a mapping"):
        batches().load_state_dict({**old, "sampler/records": [1]})
    for bad, where in (({"x": {1, 2}}, r"records\['x'\]"), ({"t": {"a": (1, 2)}}, r"records\['t'\]\['a'\]")):
        with pytest.raises(DataError, match=where):
            run.set_records(**bad)


# ------------------------------------------------------------------------------- samplers that lose prompts


@pytest.mark.timeout(300)
def test_a_step_smaller_than_one_round_of_the_dataloaders_is_refused_not_trained_on_the_first_dataset_only(
    tmp_path: Path, model_dir: Path
) -> None:
    """2 datasets x 2 prompts per dataloader, 2 prompts per step: every step drew 2 from each and cut the
    batch to the first dataset's, so the second was never trained on, without a word."""
    first = write_scored(tmp_path / "a.jsonl", prompts=6, seed=1)
    second = write_scored(tmp_path / "b.jsonl", prompts=6, seed=2)
    cfg = offline_config(
        tmp_path, model_dir, first, f"data.train=[{{data_path: {first}}}, {{data_path: {second}}}]",
        "data.use_multiple_dataloader=true", "data.num_prompts_per_dataloader=2", "grpo.num_prompts_per_step=2",
        "policy.train_global_batch_size=8",
    )  # fmt: skip
    with pytest.raises(DataError, match=r"grpo.num_prompts_per_step \(2\) is not a multiple of .*\(4\).*a, b"):
        train(cfg, show_progress=False)


def empty_sampler(loaders, num_prompts_per_dataloader, **records):
    return []


def none_sampler(loaders, num_prompts_per_dataloader, **records):
    return None


def greedy_sampler(loaders, num_prompts_per_dataloader, **records):
    return loaders["letters"].take(3) + loaders["digits"].take(3)


def short_tuple_sampler(loaders, num_prompts_per_dataloader, **records):
    return tuple(loaders["digits"].take(1))


def custom(fn: str, **kwargs: Any) -> TrainBatches:
    return TrainBatches(
        two_datasets(), num_prompts_per_step=4, shuffle=False, seed=0, use_multiple_dataloader=True,
        num_prompts_per_dataloader=2, custom_dataloader=f"{__name__}.{fn}", **kwargs,
    )  # fmt: skip


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("empty_sampler", r"returned \[\]; it must return a non-empty list"),  # looped for ever
        ("none_sampler", r"returned None"),  # a TypeError traceback
        ("greedy_sampler", r"the sampler gave 6 prompts where 4 were still needed"),  # 2 dropped unseen per step
    ],
)
def test_a_sampler_that_returns_nothing_or_too_many_is_refused_by_name(fn: str, message: str) -> None:
    with pytest.raises(DataError, match=rf"data.custom_dataloader: .*{message}"):
        custom(fn).next_batch()


def test_what_samplers_may_do_held() -> None:
    """A sampler returning fewer than a batch is called again (a tuple is fine); the default sampler's
    rounds that divide the step lose nothing; a custom sampler without several dataloaders is refused."""
    assert names(custom("short_tuple_sampler").next_batch()) == ["1", "2", "3", "4"]
    rounds = TrainBatches(
        two_datasets(), num_prompts_per_step=4, shuffle=False, seed=0, use_multiple_dataloader=True,
        num_prompts_per_dataloader=1,
    )  # fmt: skip
    assert names(rounds.next_batch()) == ["a", "1", "b", "2"]
    with pytest.raises(DataError, match=r"draw of 3"):  # dynamic sampling's draw that splits a round
        rounds.next_batch(3)
    with pytest.raises(DataError, match="data.custom_dataloader is only used with data.use_multiple_dataloader"):
        TrainBatches(two_datasets(), num_prompts_per_step=4, shuffle=False, seed=0, custom_dataloader=f"{__name__}.none_sampler")


# ---------------------------------------------------------------------------- a resume on another data order


@pytest.mark.timeout(300)
def test_resuming_with_another_data_order_is_refused_naming_grpo_seed(tmp_path: Path, model_dir: Path) -> None:
    """The checkpoint's position (4 of 12 prompts) was applied to the order another grpo.seed shuffles (or
    data.shuffle, or data.train reordered with several dataloaders, which swaps their seeds): the rest of the
    epoch repeated 3 of the 4 prompts already trained on and skipped 3 others, without a word."""
    scored = write_scored(tmp_path / "scored.jsonl")
    train(offline_config(tmp_path, model_dir, scored, "grpo.max_num_steps=1"), show_progress=False)
    with pytest.raises(DataError, match=r"data.train: .*shuffled with seed 3, this run's is shuffled with seed 4 \(grpo.seed"):
        train(offline_config(tmp_path, model_dir, scored, "grpo.seed=4"), show_progress=False)
    with pytest.raises(DataError, match=r"data.train: .*data.shuffle"):
        train(offline_config(tmp_path, model_dir, scored, "data.shuffle=false"), show_progress=False)
    assert train(offline_config(tmp_path, model_dir, scored, "grpo.max_num_steps=2"), show_progress=False).resumed_from == 1


def test_a_reordered_data_train_with_several_dataloaders_is_refused() -> None:
    items = two_datasets()
    kwargs: dict[str, Any] = {"num_prompts_per_step": 4, "shuffle": True, "seed": 0, "use_multiple_dataloader": True,
                              "num_prompts_per_dataloader": 2}  # fmt: skip
    run = TrainBatches(items, **kwargs)
    run.next_batch()
    reordered = TrainBatches(items[4:] + items[:4], **kwargs)  # digits first: the loaders' seeds swap
    with pytest.raises(DataError, match=r"data.train \(letters\): .*seed 0.*seed 1"):
        reordered.load_state_dict(run.state_dict())
    old = {name: {k: v for k, v in s.items() if k not in ("seed", "shuffle")} for name, s in run.state_dict().items()
           if name != "sampler/records"}  # fmt: skip
    TrainBatches(items, **kwargs).load_state_dict(old)  # a checkpoint from before the order was saved: as before
