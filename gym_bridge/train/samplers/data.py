"""Training and validation prompts from the ``data`` config: datasets, task routing, resumable loaders.

Why one module: NeMo RL spreads this over dataset classes, processors and dataloaders; here a dataset
is a JSONL file (or a ``datasets`` name when a hub is reachable) read into plain records:

* **Online** (:class:`Prompt`): a NeMo Gym task row that the agent loop runs as is. Rows that are
  already task rows (``responses_create_params``) pass through; ResponseDataset rows
  (``input_key``/``output_key``), OpenMathInstruct-2 rows (``problem``/``expected_answer``) and
  chat rows (``messages``) become task rows with the reference answer as ``expected_answer``, the
  input formatted into ``prompt_file`` and ``system_prompt_file`` as the system message.
* **Offline** (:class:`OfflineGroup`): scored completions grouped by identical prompt, from
  ``{"input","output","reward"}`` rows (the ``transform grpo`` output, keys configurable) or from
  rollout JSONL (``responses_create_params`` + ``response`` + ``reward``).

Each record carries its ``task_name`` and ``env_name`` (which resources server scores it) and a
dataset label for per-dataset validation metrics. :class:`PromptLoader` walks a list in seeded,
reshuffled epochs and can be checkpointed; :class:`TrainBatches` draws each step's prompts from one
loader or, with ``data.use_multiple_dataloader``, from one loader per dataset through a pluggable
sampling function (``data.custom_dataloader``).
"""

from __future__ import annotations

import importlib
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_bridge.records.jsonl import JsonlError, iter_jsonl
from gym_bridge.records.schema import assistant_text, content_text, is_finite_number
from transforms.common import RecordError, check_rollout, output_items, prompt_messages

if TYPE_CHECKING:
    from gym_bridge.train.config import DataConfig, DatasetConfig

__all__ = [
    "DataError",
    "OfflineGroup",
    "Prompt",
    "PromptLoader",
    "ScoredCompletion",
    "TrainBatches",
    "drop_long_prompts",
    "load_offline_groups",
    "load_prompts",
    "load_rows",
    "sequential_sampler",
]

# Reference-answer keys of the built-in dataset kinds (used when the config does not set them).
DATASET_KEYS: dict[str, tuple[str, str]] = {
    "ResponseDataset": ("input", "output"),
    "OpenMathInstruct-2": ("problem", "expected_answer"),
    "DeepScaler": ("problem", "answer"),
}


class DataError(ValueError):
    """A dataset that cannot be used; the message names the config key path (``data.train[0]...``)."""


@dataclass
class Prompt:
    """One online prompt: the NeMo Gym task row the agent loop runs, and where to score it."""

    idx: int
    dataset: str
    task_name: str
    env_name: str | None
    row: dict[str, Any]

    def messages(self) -> list[dict[str, Any]]:
        """The prompt as chat messages (for length checks and the chat template)."""
        return prompt_messages(self.row)


@dataclass
class ScoredCompletion:
    """One scored completion of an offline group.

    ``text`` is the assistant answer; ``output_items`` are a rollout's output items when the record
    is a rollout (they may carry the policy server's token ids, which are then used as they are).
    """

    reward: float
    text: str | None = None
    output_items: list[dict[str, Any]] | None = None


@dataclass
class OfflineGroup:
    """All scored completions of one prompt (identical input) in an offline dataset."""

    idx: int
    dataset: str
    task_name: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    completions: list[ScoredCompletion] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- loading


def load_rows(dataset: DatasetConfig, where: str) -> list[tuple[str, dict[str, Any]]]:
    """The raw rows of one dataset as ``("file:line", row)``: a local JSONL file, or a ``datasets``
    name when a hub is reachable (then ``"name:index"``)."""
    if dataset.data_path is None:
        raise DataError(
            f"{where}.data_path: no file given for dataset {dataset.dataset_name!r} (set a local JSONL path)"
        )
    path = Path(dataset.data_path).expanduser()
    if path.is_file():
        if dataset.subset is not None or dataset.split != "train":
            raise DataError(
                f"{where}: subset {dataset.subset!r} / split {dataset.split!r} name parts of a Hugging Face "
                f"dataset; {dataset.data_path} is a local file (leave subset null and split 'train')"
            )
        try:
            return [(f"{path}:{line}", row) for line, row in iter_jsonl(path)]
        except JsonlError as exc:  # names file:line; a DataError so the CLI prints it instead of a traceback
            raise DataError(f"{where}.data_path: {exc}") from None
    if path.suffix in (".jsonl", ".json") or path.is_absolute() or dataset.data_path.startswith("."):
        raise DataError(f"{where}.data_path: file not found: {dataset.data_path}")
    try:
        import datasets

        rows = datasets.load_dataset(dataset.data_path, dataset.subset, split=dataset.split)
        return [(f"{dataset.data_path}:{i + 1}", dict(row)) for i, row in enumerate(rows)]
    except Exception as exc:  # noqa: BLE001 - any hub/network failure becomes one clear message
        raise DataError(
            f"{where}.data_path: {dataset.data_path!r} is not a local file and could not be loaded with "
            f"`datasets` ({type(exc).__name__}: {exc})"
        ) from None


def _keys(dataset: DatasetConfig) -> tuple[str, str]:
    """Input and output keys: set in the config, else the dataset kind's, else the defaults."""
    kind_input, kind_output = DATASET_KEYS.get(dataset.dataset_name, ("input", "output"))
    input_key = dataset.input_key if "input_key" in dataset.model_fields_set else kind_input
    output_key = dataset.output_key if "output_key" in dataset.model_fields_set else kind_output
    return input_key, output_key


def _read_text(path: str | None, where: str) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).expanduser().read_text()
    except OSError as exc:
        raise DataError(f"{where}: cannot read {path}: {exc.strerror}") from None


def _format_prompt(template: str | None, text: str) -> str:
    """``template`` with the input in its placeholder ``{}``.

    ``str.format`` first (NeMo RL's prompt files escape literal braces as ``{{}}``); when the file
    also has unescaped LaTeX braces such as ``\\boxed{}``, the first ``{}`` not right after a letter
    is the placeholder.
    """
    if template is None:
        return text
    try:
        return template.format(text)
    except (IndexError, KeyError, ValueError):
        found = re.search(r"(?<![A-Za-z])\{\}", template)
        return template[: found.start()] + text + template[found.end() :] if found else template + text


def _label(dataset: DatasetConfig, index: int, taken: set[str]) -> str:
    base = Path(dataset.data_path).stem if dataset.data_path else dataset.dataset_name
    label = base if base not in taken else f"{base}_{index}"
    taken.add(label)
    return label


class _RowFormatter:
    """Turns one raw row of a dataset into chat messages plus the reference answer."""

    def __init__(self, dataset: DatasetConfig, where: str) -> None:
        self.where = where
        self.input_key, self.output_key = _keys(dataset)
        self.prompt = _read_text(dataset.prompt_file, f"{where}.prompt_file")
        self.system = _read_text(dataset.system_prompt_file, f"{where}.system_prompt_file")

    def messages(self, text: str) -> list[dict[str, Any]]:
        out = [{"role": "system", "content": self.system}] if self.system else []
        return out + [{"role": "user", "content": _format_prompt(self.prompt, text)}]

    def prompt_and_answer(self, row: dict[str, Any], line: str) -> tuple[list[dict[str, Any]], Any]:
        """Prompt messages and the output value of a ResponseDataset / chat row."""
        if self.input_key in row:
            value = row[self.input_key]
            if isinstance(value, list):  # already chat messages
                return list(value), row.get(self.output_key)
            return self.messages(str(value)), row.get(self.output_key)
        if isinstance(row.get("messages"), list) and row["messages"]:
            messages = list(row["messages"])
            if messages[-1].get("role") == "assistant":
                return messages[:-1], content_text(messages[-1].get("content"))
            return messages, row.get(self.output_key)
        raise DataError(f"{self.where}: {line}: no '{self.input_key}' key in the row (set input_key)")


def load_prompts(data: DataConfig, which: str = "train") -> tuple[list[Prompt], list[Prompt]]:
    """Online prompts of ``data.train`` or ``data.validation``; with ``which="train"`` also the
    validation prompts split off by ``split_validation_size`` (second element, else empty)."""
    prompts: list[Prompt] = []
    held_out: list[Prompt] = []
    taken: set[str] = set()
    for i, dataset in enumerate(data.resolved(which)):  # type: ignore[arg-type]
        where = f"data.{which}[{i}]"
        label = _label(dataset, i, taken)
        formatter = _RowFormatter(dataset, where)
        task_name = dataset.task_name or dataset.env_name or label
        rows = load_rows(dataset, where)
        if not rows:
            raise DataError(f"{where}.data_path: {dataset.data_path} holds no rows")
        records = []
        for index, (line, row) in enumerate(rows):
            if "responses_create_params" in row:
                task_row = dict(row)
            elif dataset.processor == "nemo_gym_data_processor":
                raise DataError(
                    f"{where}: {line}: processor 'nemo_gym_data_processor' expects NeMo Gym task rows "
                    "(with responses_create_params)"
                )
            else:
                messages, answer = formatter.prompt_and_answer(row, line)
                task_row = {k: v for k, v in row.items() if k not in (formatter.input_key, "messages")}
                task_row["responses_create_params"] = {"input": messages}
                if answer is not None:
                    if formatter.output_key != "expected_answer":
                        task_row.pop(formatter.output_key, None)
                    task_row.setdefault("expected_answer", answer)
                question = row.get(formatter.input_key)
                if isinstance(question, str):
                    task_row.setdefault("question", question)
            records.append(Prompt(index, label, task_name, dataset.env_name, task_row))
        train_part, val_part = _split(records, dataset.split_validation_size, dataset.seed)
        prompts.extend(train_part)
        for p in val_part:
            p.dataset = f"{label}_heldout"
        held_out.extend(val_part)
    return prompts, held_out


def _split(records: list[Any], fraction: float, seed: int) -> tuple[list[Any], list[Any]]:
    """Hold out ``fraction`` of ``records`` (seeded shuffle); order of the kept part is preserved."""
    if fraction <= 0 or len(records) < 2:
        return records, []
    n_val = max(1, round(len(records) * fraction))
    picked = set(random.Random(seed).sample(range(len(records)), n_val))
    return [r for i, r in enumerate(records) if i not in picked], [
        r for i, r in enumerate(records) if i in picked
    ]


def _output_text(value: Any) -> str:
    """An output field as text: a string, a message, a list of messages or output items."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return content_text(value.get("content"))
    return assistant_text(value, sep="")


def load_offline_groups(data: DataConfig) -> list[OfflineGroup]:
    """Scored completions of ``data.train`` grouped by identical prompt (first-seen order)."""
    groups: list[OfflineGroup] = []
    taken: set[str] = set()
    for i, dataset in enumerate(data.resolved("train")):
        where = f"data.train[{i}]"
        label = _label(dataset, i, taken)
        formatter = _RowFormatter(dataset, where)
        task_name = dataset.task_name or dataset.env_name or label
        by_prompt: dict[str, OfflineGroup] = {}
        for line, row in load_rows(dataset, where):
            reward = row.get(dataset.reward_key)
            if not isinstance(reward, (int, float)) or isinstance(reward, bool):
                raise DataError(
                    f"{where}: {line}: no numeric '{dataset.reward_key}' in the row (set reward_key)"
                )
            if not is_finite_number(reward):  # NaN made every weight NaN; 1e400 as an integer raised OverflowError
                raise DataError(f"{where}: {line}: '{dataset.reward_key}' is {str(reward)[:40]}: a reward must be a finite number")
            if "responses_create_params" in row and "response" in row:  # a rollout record: the transforms' reader
                try:
                    messages, items = prompt_messages(check_rollout(row)), output_items(row)
                except RecordError as exc:
                    raise DataError(f"{where}: {line}: {exc}") from None
                tools = row["responses_create_params"].get("tools") or None
                completion = ScoredCompletion(float(reward), output_items=list(items))
            else:
                messages, output = formatter.prompt_and_answer(row, line)
                tools = None
                completion = ScoredCompletion(float(reward), text=_output_text(output))
            key = json.dumps([messages, tools], sort_keys=True)
            group = by_prompt.get(key)
            if group is None:
                group = by_prompt[key] = OfflineGroup(len(by_prompt), label, task_name, messages, tools)
            group.completions.append(completion)
        if not by_prompt:
            raise DataError(f"{where}.data_path: {dataset.data_path} holds no rows")
        groups.extend(by_prompt.values())
    return groups


def drop_long_prompts(
    prompts: list[Any], count_tokens: Callable[[Any], int], max_tokens: int
) -> tuple[list[Any], int]:
    """Prompts whose chat-templated length is within ``max_tokens``, and how many were dropped."""
    kept = [p for p in prompts if count_tokens(p) <= max_tokens]
    return kept, len(prompts) - len(kept)


# ---------------------------------------------------------------------------------------------- loaders


class PromptLoader:
    """Endless, resumable walk over a list in epochs, reshuffled per epoch from ``seed``.

    ``take(n)`` continues into the next epoch when this one runs out, so every batch is full.
    The state is just ``(epoch, position)``: the order of an epoch is recomputed from the seed.
    """

    def __init__(self, items: Sequence[Any], *, shuffle: bool = True, seed: int = 0) -> None:
        if not items:
            raise ValueError("a loader needs at least one item")
        self.items = list(items)
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._epoch_order(0)

    def __len__(self) -> int:
        return len(self.items)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.items)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, n: int) -> list[Any]:
        out = []
        while len(out) < n:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._epoch_order(self.epoch)
            out.append(self.items[self._order[self.position]])
            self.position += 1
        return out

    @property
    def epochs_done(self) -> float:
        """Fractional passes completed (2.5 = two epochs and half of the third)."""
        return self.epoch + self.position / len(self.items)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch, "position": self.position, "size": len(self.items), "seed": self.seed,
            "shuffle": self.shuffle,
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off; a DataError when it was a walk over a list of another size, or
        shuffled otherwise (its position would fall elsewhere in another order: prompts skipped or repeated)."""
        size = state.get("size")  # absent in checkpoints written before it was saved
        if size is not None and int(size) != len(self.items):
            raise DataError(
                f"the checkpoint's data position is for {size} prompts, and the data now holds {len(self.items)}: "
                "resuming would continue at a position of another order, skipping or repeating prompts"
            )
        order = {"shuffle": self.shuffle, "seed": self.seed if self.shuffle else None}
        saved = {"shuffle": state.get("shuffle", self.shuffle), "seed": state.get("seed", self.seed)}
        saved["seed"] = saved["seed"] if saved["shuffle"] else None
        if saved != order:  # absent in checkpoints written before the order was saved: as before
            raise DataError(
                f"the checkpoint's data position is in an order {_order_words(saved)}, this run's is "
                f"{_order_words(order)} (grpo.seed, data.shuffle, or the order of data.train with several "
                "dataloaders, whose seeds follow it): resuming would continue at a position of another order, "
                "skipping or repeating prompts"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._epoch_order(self.epoch)


def _order_words(order: dict[str, Any]) -> str:
    return f"shuffled with seed {order['seed']}" if order["shuffle"] else "not shuffled"


SamplerFn = Callable[..., list[Any]]

# Where TrainBatches' state keeps the sampler's records: dataset labels are file stems, which hold no "/".
RECORDS_KEY = "sampler/records"


def _check_json(value: Any, where: str) -> None:
    """A DataError naming ``where`` when ``value`` would not come back from JSON as it is (a set, a tuple,
    an object, a non-string key)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise DataError(f"data.custom_dataloader: {where} has the key {key!r}; JSON keys are strings")
            _check_json(item, f"{where}[{key!r}]")
        return
    raise DataError(
        f"data.custom_dataloader: {where} is a {type(value).__name__}, which a checkpoint cannot save as JSON "
        "(records go into the checkpoint so a resumed run's sampler continues as the uninterrupted one)"
    )


def sequential_sampler(
    loaders: dict[str, PromptLoader], num_prompts_per_dataloader: int, **records: Any
) -> list[Any]:
    """The default multi-dataloader sampler: ``num_prompts_per_dataloader`` from each loader in turn.

    A custom sampler (``data.custom_dataloader``) has the same signature; ``records`` holds what the
    trainer reported last step (e.g. ``reward`` per task), so a sampler can favour weak tasks.
    """
    out: list[Any] = []
    for loader in loaders.values():
        out.extend(loader.take(num_prompts_per_dataloader))
    return out


def _import_function(dotted: str) -> SamplerFn:
    module_name, _, name = dotted.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise DataError(f"data.custom_dataloader: cannot import {dotted!r}: {exc}") from None
    if not callable(fn):
        raise DataError(f"data.custom_dataloader: {dotted!r} is not a function")
    return fn


class TrainBatches:
    """Each step's training prompts (or offline groups), from one loader or one per dataset."""

    def __init__(
        self,
        items: list[Any],
        *,
        num_prompts_per_step: int,
        shuffle: bool,
        seed: int,
        use_multiple_dataloader: bool = False,
        num_prompts_per_dataloader: int | None = None,
        custom_dataloader: str | None = None,
    ) -> None:
        self.num_prompts_per_step = num_prompts_per_step
        self.records: dict[str, Any] = {}
        if use_multiple_dataloader:
            by_dataset: dict[str, list[Any]] = {}
            for item in items:
                by_dataset.setdefault(item.dataset, []).append(item)
            self.loaders = {
                name: PromptLoader(rows, shuffle=shuffle, seed=seed + i)
                for i, (name, rows) in enumerate(by_dataset.items())
            }
            self.per_loader = num_prompts_per_dataloader or num_prompts_per_step
            self.sampler: SamplerFn | None = (
                _import_function(custom_dataloader) if custom_dataloader else sequential_sampler
            )
            round_size = self.per_loader * len(self.loaders)
            if self.sampler is sequential_sampler and num_prompts_per_step % round_size:
                raise DataError(
                    f"grpo.num_prompts_per_step ({num_prompts_per_step}) is not a multiple of "
                    f"data.num_prompts_per_dataloader ({self.per_loader}) x {len(self.loaders)} training datasets "
                    f"({round_size}): each step would drop prompts drawn from the last datasets "
                    f"({', '.join(by_dataset)}), and some would never be trained on"
                )
        elif custom_dataloader:
            raise DataError("data.custom_dataloader is only used with data.use_multiple_dataloader: true (set it)")
        else:
            self.loaders = {"all": PromptLoader(items, shuffle=shuffle, seed=seed)}
            self.per_loader = num_prompts_per_step
            self.sampler = None

    def next_batch(self, n: int | None = None) -> list[Any]:
        """The next ``n`` (default ``num_prompts_per_step``) prompts."""
        n = n or self.num_prompts_per_step
        if self.sampler is None:
            return self.loaders["all"].take(n)
        out: list[Any] = []
        while len(out) < n:
            drawn = self.sampler(self.loaders, self.per_loader, **self.records)
            if not isinstance(drawn, (list, tuple)) or not drawn:  # [] looped here for ever; None was a TypeError
                raise DataError(
                    f"data.custom_dataloader: the sampler returned {drawn!r:.60}; it must return a non-empty "
                    "list of prompts taken from the loaders"
                )
            if len(out) + len(drawn) > n:  # cut off, they were taken from their loaders and never trained on
                who = (
                    "data.num_prompts_per_dataloader x the training datasets"
                    if self.sampler is sequential_sampler
                    else "data.custom_dataloader: the sampler"
                )
                raise DataError(
                    f"{who} gave {len(drawn)} prompts where {n - len(out)} were still needed for a draw of {n} "
                    "(grpo.num_prompts_per_step, times grpo.batch_multiplier with dynamic sampling): the surplus, "
                    "taken from its loaders, would never be trained on"
                )
            out.extend(drawn)
        return out

    def set_records(self, **records: Any) -> None:
        """Metrics from the last step that a custom sampler may use (NeMo RL's ``set_records``).

        They go into the checkpoint (a resumed run's first step would otherwise call the sampler with
        ``{}`` and draw other prompts than the uninterrupted run), so each must be JSON: a DataError
        names the first that is not."""
        for key, value in records.items():
            _check_json(value, f"records[{key!r}]")
        self.records = records

    @property
    def epochs_done(self) -> float:
        """Passes over the data (the slowest loader's, with several)."""
        return min(loader.epochs_done for loader in self.loaders.values())

    def state_dict(self) -> dict[str, Any]:
        """Each loader's position and the sampler's records (under a key no dataset label can be)."""
        return self.with_records({name: loader.state_dict() for name, loader in self.loaders.items()})

    def with_records(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` (loader positions taken when a batch was drawn) with the records set since: what a
        checkpoint saved at the end of the step must hold for the next draw to match."""
        return {**{k: v for k, v in state.items() if k != RECORDS_KEY}, RECORDS_KEY: dict(self.records)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Each loader's position and the records from a checkpoint; a DataError naming ``data.train`` when
        the training data is not the checkpoint's (another number of prompts, other datasets). A checkpoint
        written before records were saved restores none."""
        state = dict(state)
        records = state.pop(RECORDS_KEY, {})
        if not isinstance(records, dict):  # a damaged or hand-edited train_dataloader.json: not a traceback
            raise DataError(f"the checkpoint's {RECORDS_KEY!r} is a {type(records).__name__}, not a mapping of records")
        if set(state) != set(self.loaders):
            raise DataError(
                f"data.train: the checkpoint's data loaders are {sorted(state)}, this run's are {sorted(self.loaders)}: "
                "resume with the checkpoint's training data, or train on this data from step 0 (--fresh, or a new "
                "checkpointing.checkpoint_dir)"
            )
        for name, loader_state in state.items():
            try:
                self.loaders[name].load_state_dict(loader_state)
            except DataError as err:
                raise DataError(
                    f"data.train{'' if name == 'all' else f' ({name})'}: {err}. Resume with the checkpoint's "
                    "training data, or train on this data from step 0 (--fresh, or a new checkpointing.checkpoint_dir)"
                ) from None
        self.records = dict(records)
