"""The GRPO run configuration: NeMo RL's key names and layout, typed and checked at start-up.

A NeMo RL user should feel at home: the sections (``grpo``, ``loss_fn``, ``policy``, ``data``,
``env``, ``checkpointing``, ``logger``, ``cluster``) and their keys follow NeMo RL's
``examples/configs/grpo_math_1B.yaml``. Defaults follow that file for the algorithm's knobs and
are CPU-sized where it matters (``float32``, the ``transformers`` generation backend).

Every field is documented with an attribute docstring (read them with
``Model.model_fields[name].description``). Unknown keys and wrong types fail in
:func:`load_config` with a message naming the full key path.

YAML extras, as in NeMo RL:

- Relative data paths (``data.*.data_path``) and output directories (``checkpointing.checkpoint_dir``,
  ``logger.log_dir``) in a YAML file are relative to that file's folder; on the command line, to the
  working directory.
- ``defaults: base.yaml`` (or a list) inherits from other files, relative to the including file;
  mappings merge key by key, and a mapping holding ``_override_: true`` replaces instead.
- ``${dotted.key}`` refers to another value (e.g. ``tokenizer.name: ${policy.model_name}``).
- Overrides ``a.b.c=value`` on the command line; values are YAML scalars or lists
  (``=1e-4``, ``=true``, ``=null``, ``=[1,2]``); ``data.train.0.data_path=...`` indexes lists.

Modules: :mod:`.base` (the section base and :class:`ConfigError`), :mod:`.policy` (the ``policy``
section), :mod:`.advantages` (``grpo.adv_estimator`` and the reward components' weights),
:mod:`.data` (the ``data`` section), :mod:`.loss` (``loss_fn``), :mod:`.schema` (the other sections and
:class:`MasterConfig`), :mod:`.loader` (YAML files,
inheritance, interpolation, overrides and error messages).
"""

from gym_bridge.train.config.base import ConfigError
from gym_bridge.train.config.data import DataConfig, DatasetConfig
from gym_bridge.train.config.loader import config_to_dict, config_to_yaml, load_config, validate_config
from gym_bridge.train.config.loss import ClippedPGLossConfig
from gym_bridge.train.config.policy import (
    DTensorConfig,
    DynamicBatchingConfig,
    GenerationConfig,
    LoRAConfig,
    OptimizerConfig,
    OptimizerKwargs,
    PolicyConfig,
    RayConfig,
    SchedulerConfig,
    SequencePackingConfig,
    TokenizerConfig,
    VllmConfig,
)
from gym_bridge.train.config.schema import (
    AdvEstimatorConfig,
    CheckpointingConfig,
    ClusterConfig,
    EnvConfig,
    GRPOConfig,
    LoggerConfig,
    MasterConfig,
    RewardShapingConfig,
    WandbConfig,
)

__all__ = [
    "AdvEstimatorConfig",
    "CheckpointingConfig",
    "ClippedPGLossConfig",
    "ClusterConfig",
    "ConfigError",
    "DataConfig",
    "DatasetConfig",
    "DTensorConfig",
    "DynamicBatchingConfig",
    "EnvConfig",
    "GRPOConfig",
    "GenerationConfig",
    "LoRAConfig",
    "LoggerConfig",
    "MasterConfig",
    "OptimizerConfig",
    "OptimizerKwargs",
    "PolicyConfig",
    "RayConfig",
    "RewardShapingConfig",
    "SchedulerConfig",
    "SequencePackingConfig",
    "TokenizerConfig",
    "VllmConfig",
    "WandbConfig",
    "config_to_dict",
    "config_to_yaml",
    "load_config",
    "validate_config",
]
