"""The ``data`` section: which datasets feed training and validation, and how rows become prompts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_serializer

from gym_bridge.train.config.base import DOTTED_PATH, Section

GRPO_PROCESSORS = ("default", "math_hf_data_processor", "math_data_processor", "nemo_gym_data_processor")
"""NeMo RL's processor names (``nemo_rl/data/processors.py``) that turn a row into a GRPO prompt."""
OTHER_NEMO_RL_PROCESSORS = (
    "helpsteer3_data_processor",
    "sft_processor",
    "multichoice_qa_processor",
    "vlm_hf_data_processor",
    "kd_data_processor",
)


class DatasetConfig(Section):
    """One dataset. Keys left out inherit from ``data.default``, then from the defaults below."""

    dataset_name: str = "ResponseDataset"
    """Dataset kind, as in NeMo RL: ResponseDataset (input_key / output_key rows), OpenMathInstruct-2
    (problem / expected_answer), DeepScaler (problem / answer). Rows that already are NeMo Gym task
    rows (``responses_create_params``) pass through whatever the kind. Default ResponseDataset."""

    data_path: str | None = None
    """Path of the JSONL file (relative paths are relative to the working directory). Default null."""

    input_key: str = "input"
    """Record key holding the prompt. Default input."""

    output_key: str = "output"
    """Record key holding the reference answer (online, sent as expected_answer) or the response
    (offline). Default output."""

    reward_key: str = "reward"
    """Record key holding the reward (offline mode). Default reward."""

    split_validation_size: float = Field(0.0, ge=0.0, lt=1.0)
    """Fraction of this training set held out for validation. Default 0."""

    seed: int = 42
    """Seed of the train/validation split. Default 42."""

    prompt_file: str | None = None
    """Text file with a ``{}`` placeholder the input is formatted into. Default null."""

    system_prompt_file: str | None = None
    """Text file with a system prompt. Default null."""

    env_name: str | None = None
    """Which ``env`` entry scores this dataset's rollouts (online mode). Default null."""

    processor: str = "default"
    """NeMo RL's data processor: how a row becomes a prompt. ``default`` and
    ``math_hf_data_processor`` (NeMo RL's default) and ``math_data_processor``: the system prompt file
    as a system message, the input formatted into the prompt file as the user message, the output as
    the reference answer; ``nemo_gym_data_processor``: rows must already be NeMo Gym task rows
    (``responses_create_params``), used as they are. NeMo RL's other processors (SFT, preference,
    multiple-choice, vision, distillation) do not make GRPO prompts and are refused. Default default."""

    subset: str | None = None
    """Hugging Face dataset configuration (``datasets.load_dataset(name, subset)``); must be null for
    a local file. Default null."""

    split: str = "train"
    """Hugging Face dataset split to read; a local JSONL file has only ``train``. Default train."""

    @field_validator("processor")
    @classmethod
    def _known_processor(cls, value: str) -> str:
        if value in GRPO_PROCESSORS:
            return value
        if value in OTHER_NEMO_RL_PROCESSORS:
            raise ValueError(
                f"NeMo RL's {value!r} does not make GRPO prompts; use one of {', '.join(GRPO_PROCESSORS)}"
            )
        raise ValueError(f"unknown processor {value!r}; expected one of {', '.join(GRPO_PROCESSORS)}")

    task_name: str | None = None
    """Task label attached to each record; null means env_name. Default null."""

    @model_serializer(mode="wrap")
    def _only_set_keys(self, handler: Any) -> dict[str, Any]:
        # Unset keys inherit from data.default, so saving them would change what a reload means.
        return {key: value for key, value in handler(self).items() if key in self.model_fields_set}


class DataConfig(Section):
    """Prompts and datasets (NeMo RL's ``data:`` section)."""

    max_input_seq_length: int | None = Field(None, ge=1)
    """Prompts longer than this (in tokens) are dropped; null means policy.max_total_sequence_length.
    Default null."""

    shuffle: bool = True
    """Shuffle training prompts each epoch. Default true."""

    train: list[DatasetConfig] | None = None
    """Training dataset(s): one mapping or a list of them. Default null."""

    validation: list[DatasetConfig] | None = None
    """Validation dataset(s): one mapping, a list, or null. Default null."""

    default: DatasetConfig = Field(default_factory=DatasetConfig)
    """Values every train/validation dataset inherits for keys it does not set."""

    use_multiple_dataloader: bool = False
    """One dataloader per training dataset, each giving num_prompts_per_dataloader prompts per step.
    Default false."""

    num_prompts_per_dataloader: int | None = Field(None, ge=1)
    """Prompts each dataloader contributes per step (with use_multiple_dataloader). Default null."""

    custom_dataloader: str | None = None
    """Dotted import path of a function choosing prompts from several dataloaders. Default null."""

    @field_validator("train", "validation", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @field_validator("custom_dataloader")
    @classmethod
    def _dotted(cls, value: str | None) -> str | None:
        if value is not None and not DOTTED_PATH.fullmatch(value):
            raise ValueError(f"expects a dotted import path like 'pkg.module.function', got {value!r}")
        return value

    def resolved(self, which: Literal["train", "validation"]) -> list[DatasetConfig]:
        """The ``train`` or ``validation`` datasets with ``data.default`` merged in, task_name filled."""
        base = self.default.model_dump(exclude_unset=True)
        out = []
        for dataset in getattr(self, which) or []:
            merged = DatasetConfig(**{**base, **dataset.model_dump(exclude_unset=True)})
            if merged.task_name is None:
                merged.task_name = merged.env_name
            out.append(merged)
        return out
