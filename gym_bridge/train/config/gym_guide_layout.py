"""The short config layout of NeMo Gym's GRPO guide, translated to NeMo RL's layout.

NeMo Gym's "train with NeMo RL" guide shows a compact config that users copy first::

    data:
      dataset_name: ResponseDataset
      train_data_path: "grpo_train.jsonl"
      input_key: "input"
      output_key: "output"
      reward_key: "reward"
    model:
      pretrained_model: "Qwen/Qwen2.5-1.5B-Instruct"
    training:
      algorithm: "grpo"
      num_epochs: 3
      train_micro_batch_size: 4
      train_global_batch_size: 512

NeMo RL itself (and this trainer) calls these ``data.train``, ``policy.model_name``,
``grpo.max_num_epochs`` and ``policy.train_*_batch_size``. Rather than refuse the guide's file, the
loader rewrites it here, before validation, and says in one line per key what each became. A file
that mixes both spellings of one setting is refused, naming both.

Records holding a reward (``reward_key``, as ``gym-bridge transform grpo`` writes them) are
already-scored rollouts: the translated run trains on them offline (``grpo.mode: offline``).
"""

from __future__ import annotations

from typing import Any

from gym_bridge.train.config.base import ConfigError

__all__ = ["translate_gym_guide_layout"]

# data.<guide key> -> key of one data.train entry
_DATA_KEYS = {
    "dataset_name": "dataset_name",
    "train_data_path": "data_path",
    "input_key": "input_key",
    "output_key": "output_key",
    "reward_key": "reward_key",
}
# training.<guide key> -> (section, key) in NeMo RL's layout
_TRAINING_KEYS = {
    "num_epochs": ("grpo", "max_num_epochs"),
    "train_micro_batch_size": ("policy", "train_micro_batch_size"),
    "train_global_batch_size": ("policy", "train_global_batch_size"),
}


def translate_gym_guide_layout(tree: dict[str, Any]) -> list[str]:
    """Rewrite the guide's ``model:``, ``training:`` and flat ``data:`` keys in ``tree`` (in place)
    into NeMo RL's layout; return one note per rewritten key. A tree without them is left alone."""
    notes: list[str] = []
    problems: list[str] = []
    data = tree.get("data")
    if isinstance(data, dict) and any(key in data for key in _DATA_KEYS):
        _translate_data(tree, data, notes, problems)
    model = tree.get("model")
    if model is not None:
        _translate_model(tree, model, notes, problems)
    training = tree.get("training")
    if training is not None:
        _translate_training(tree, training, notes, problems)
    if problems:
        raise ConfigError(problems)
    return notes


def _translate_data(
    tree: dict[str, Any], data: dict[str, Any], notes: list[str], problems: list[str]
) -> None:
    if data.get("train") is not None:
        flat = sorted(key for key in _DATA_KEYS if key in data)
        problems.append(
            f"data: {', '.join('data.' + k for k in flat)} (NeMo Gym's guide layout) and data.train "
            "(NeMo RL's) both name the training data; keep one"
        )
        return
    entry = {}
    for guide_key, key in _DATA_KEYS.items():
        if guide_key in data:
            entry[key] = data.pop(guide_key)
            notes.append(f"data.{guide_key} -> data.train[0].{key}")
    data["train"] = [entry]
    if "reward_key" in entry:
        grpo = tree.setdefault("grpo", {})
        if isinstance(grpo, dict) and "mode" not in grpo:
            grpo["mode"] = "offline"
            notes.append(
                "data.reward_key (scored records) -> grpo.mode: offline (train on the given rewards)"
            )


def _translate_model(tree: dict[str, Any], model: Any, notes: list[str], problems: list[str]) -> None:
    if not isinstance(model, dict) or set(model) - {"pretrained_model"}:
        extra = sorted(set(model) - {"pretrained_model"}) if isinstance(model, dict) else [repr(model)]
        problems.append(
            f"config key 'model': only model.pretrained_model (NeMo Gym's guide) is understood here, "
            f"got {', '.join(map(str, extra))}; NeMo RL's layout puts the model under policy.model_name"
        )
        return
    policy = tree.setdefault("policy", {})
    if isinstance(policy, dict) and "model_name" in policy:
        problems.append("model.pretrained_model and policy.model_name both name the model; keep one")
        return
    del tree["model"]
    policy["model_name"] = model["pretrained_model"]
    notes.append("model.pretrained_model -> policy.model_name")


def _translate_training(tree: dict[str, Any], training: Any, notes: list[str], problems: list[str]) -> None:
    if not isinstance(training, dict):
        problems.append(f"config key 'training': expects a mapping, got {training!r}")
        return
    algorithm = training.get("algorithm", "grpo")
    if str(algorithm).lower() != "grpo":
        problems.append(
            f"config key 'training.algorithm': gym-bridge train runs GRPO only, got {algorithm!r} "
            "(for SFT or DPO data see `gym-bridge transform sft|dpo`)"
        )
    unknown = sorted(set(training) - set(_TRAINING_KEYS) - {"algorithm"})
    if unknown:
        problems.append(
            f"config key 'training.{unknown[0]}': not a key of NeMo Gym's guide layout "
            f"(known: algorithm, {', '.join(_TRAINING_KEYS)})"
        )
    if problems:
        return
    for guide_key, (section, key) in _TRAINING_KEYS.items():
        if guide_key not in training:
            continue
        target = tree.setdefault(section, {})
        if key in target:
            problems.append(f"training.{guide_key} and {section}.{key} both set it; keep one")
            continue
        target[key] = training[guide_key]
        notes.append(f"training.{guide_key} -> {section}.{key}")
    if "algorithm" in training:
        notes.append("training.algorithm: grpo (the trainer's algorithm)")
    if not problems:
        del tree["training"]
