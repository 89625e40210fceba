"""The run configuration: recipes load, bad keys fail with full paths, YAML extras, round trips."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from gym_bridge.train.config import (
    ConfigError,
    MasterConfig,
    SchedulerConfig,
    config_to_dict,
    config_to_yaml,
    load_config,
    validate_config,
)
from gym_bridge.train.config import policy as config_policy
from gym_bridge.train.config import schema as config_schema
from gym_bridge.train.config.base import Section

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("grpo_*.yaml"))
# The smallest valid online config, as overrides on the built-in defaults.
MINIMAL = [
    "data.train.data_path=train.jsonl",
    "data.default.env_name=math",
    "env.math.server=math",
]


def problems_of(path: Path | None, overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return info.value.problems


# ---------------------------------------------------------------------------------------------- recipes


def test_the_four_recipes_exist() -> None:
    names = {p.name for p in RECIPES}
    assert {
        "grpo_math_tiny.yaml",
        "grpo_offline.yaml",
        "grpo_smollm2_135m.yaml",
        "grpo_math_1.5B_vllm.yaml",
    } <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_loads_validates_and_round_trips(recipe: Path) -> None:
    cfg = load_config(recipe, [])
    assert cfg.data.train, "a recipe must name training data"
    assert validate_config(config_to_dict(cfg)) == cfg
    assert validate_config(yaml.safe_load(config_to_yaml(cfg))) == cfg


def test_tiny_recipe_is_the_cpu_main_job() -> None:
    cfg = load_config(ROOT / "recipes/grpo_math_tiny.yaml", [])
    assert (cfg.grpo.num_prompts_per_step, cfg.grpo.num_generations_per_prompt) == (8, 8)
    assert cfg.grpo.mode == "online"
    assert cfg.policy.model_name == "tiny" and cfg.policy.tokenizer.name == "tiny"
    assert cfg.policy.generation.backend == "transformers"
    assert cfg.policy.generation.max_new_tokens == 16
    assert cfg.policy.optimizer.kwargs.lr == pytest.approx(1e-4)
    assert cfg.policy.precision == "float32"
    assert 0.0 <= cfg.loss_fn.reference_policy_kl_penalty <= 0.01
    assert cfg.grpo.val_period == 20 and cfg.grpo.max_num_steps == 200
    assert cfg.cluster.gpus_per_node == 0
    train, val = cfg.data.resolved("train"), cfg.data.resolved("validation")
    assert train[0].data_path == str(ROOT / "recipes/data/arith_train.jsonl")
    assert val[0].data_path == str(ROOT / "recipes/data/arith_val.jsonl")
    assert train[0].env_name == "math" and train[0].task_name == "math"
    assert (ROOT / train[0].data_path).is_file() and (ROOT / val[0].data_path).is_file()


def test_offline_recipe_inherits_and_switches_mode() -> None:
    cfg = load_config(ROOT / "recipes/grpo_offline.yaml", [])
    assert cfg.grpo.mode == "offline"
    train = cfg.data.resolved("train")[0]
    assert (train.dataset_name, train.input_key, train.output_key, train.reward_key) == (
        "ResponseDataset",
        "input",
        "output",
        "reward",
    )
    # inherited from grpo_math_tiny.yaml
    assert cfg.policy.model_name == "tiny" and cfg.grpo.num_generations_per_prompt == 8
    assert cfg.data.resolved("validation")[0].data_path == str(ROOT / "recipes/data/arith_val.jsonl")


def test_smollm2_recipe_resolves_tokenizer_from_its_own_model() -> None:
    cfg = load_config(ROOT / "recipes/grpo_smollm2_135m.yaml", [])
    assert cfg.policy.model_name == "smollm2-135m"
    assert cfg.policy.tokenizer.name == "smollm2-135m"  # ${policy.model_name} resolved after inheritance
    assert cfg.data.resolved("validation")[0].data_path == str(ROOT / "recipes/data/word_val.jsonl")
    assert cfg.env["math"].config["extraction"] == "boxed_or_final"  # the phrase format its prompts ask for


def test_smollm2_lora_recipe_is_the_full_recipe_with_adapters() -> None:
    full = load_config(ROOT / "recipes/grpo_smollm2_135m.yaml", [])
    lora = load_config(ROOT / "recipes/grpo_smollm2_135m_lora.yaml", [])
    assert lora.policy.dtensor_cfg.lora_cfg.enabled and not full.policy.dtensor_cfg.lora_cfg.enabled
    assert lora.data == full.data and lora.grpo.val_period == full.grpo.val_period  # the same task and validation
    # the same completions per step and per update (8 problems x 4 samples against 4 x 8)
    completions = lora.grpo.num_prompts_per_step * lora.grpo.num_generations_per_prompt
    assert completions == full.grpo.num_prompts_per_step * full.grpo.num_generations_per_prompt
    assert completions == lora.policy.train_global_batch_size == full.policy.train_global_batch_size


def test_vllm_recipe_refuses_to_run_without_a_gpu() -> None:
    recipe = ROOT / "recipes/grpo_math_1.5B_vllm.yaml"
    cfg = load_config(recipe, [])
    assert cfg.policy.generation.backend == "vllm" and cfg.policy.model_name == "Qwen/Qwen2.5-1.5B-Instruct"
    assert "cannot run on CPU" in recipe.read_text()
    problems = problems_of(recipe, ["cluster.gpus_per_node=0"])
    assert any("vllm" in p and "cluster.gpus_per_node" in p for p in problems)


# ------------------------------------------------------------------------------------------ error messages


def test_unknown_key_names_full_path_and_suggests_the_right_one() -> None:
    problems = problems_of(None, MINIMAL + ["grpo.num_generation_per_prompt=4"])
    assert problems == [
        "unknown config key 'grpo.num_generation_per_prompt' "
        "(did you mean 'grpo.num_generations_per_prompt'?)"
    ]


def test_key_in_the_wrong_section_points_to_the_right_section() -> None:
    problems = problems_of(None, MINIMAL + ["grpo.reference_policy_kl_penalty=0.1"])
    assert problems == [
        "unknown config key 'grpo.reference_policy_kl_penalty' "
        "(did you mean 'loss_fn.reference_policy_kl_penalty'?)"
    ]


def test_wrong_type_names_full_path_expected_type_and_value() -> None:
    assert problems_of(None, MINIMAL + ["policy.optimizer.kwargs.lr=abc"]) == [
        "config key 'policy.optimizer.kwargs.lr' expects a float, got 'abc'"
    ]


def test_all_problems_are_reported_at_once() -> None:
    problems = problems_of(
        None,
        MINIMAL + ["grpo.val_at_start=maybe", "policy.precision=fp32", "grpo.num_prompts_per_step=0"],
    )
    assert len(problems) == 3
    assert "config key 'grpo.val_at_start' expects a boolean (true/false), got 'maybe'" in problems
    assert any(p.startswith("config key 'policy.precision' expects one of 'float32'") for p in problems)
    assert any(p.startswith("config key 'grpo.num_prompts_per_step'") and "got 0" in p for p in problems)


def test_unknown_key_inside_a_dataset_list_shows_its_index(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "data:\n  train:\n    - {data_path: a.jsonl}\n    - {data_path: b.jsonl, input_kee: q}\n"
        "  default: {env_name: math}\nenv: {math: {}}\n"
    )
    assert problems_of(recipe, []) == [
        "unknown config key 'data.train[1].input_kee' (did you mean 'data.train[1].input_key'?)"
    ]


def test_unknown_key_in_an_env_entry() -> None:
    problems = problems_of(None, MINIMAL + ["env.math.num_worker=2"])
    assert problems == ["unknown config key 'env.math.num_worker' (did you mean 'env.math.num_workers'?)"]


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (
            ["grpo.num_prompts_per_step=3", "grpo.num_generations_per_prompt=5"],
            "multiple of policy.train_global_batch_size",
        ),
        (
            ["policy.train_global_batch_size=512", "policy.train_micro_batch_size=3"],
            "multiple of policy.train_micro_batch_size",
        ),
        (["data.default.env_name=code"], "data.train[0].env_name 'code' is not an env entry"),
        (["loss_fn.ratio_clip_c=1.0"], "config key 'loss_fn.ratio_clip_c'"),
        (
            ["grpo.advantage_clip_low=1", "grpo.advantage_clip_high=-1"],
            "grpo.advantage_clip_low (1.0) must not exceed",
        ),
        (["policy.dynamic_batching.enabled=true", "policy.sequence_packing.enabled=true"], "exclusive"),
        (["loss_fn.truncated_importance_sampling_ratio=2.0"], "use_importance_sampling_correction"),
        (["checkpointing.metric_name=accuracy"], "expects 'val:<metric>' or 'train:<metric>'"),
        (["env.math.url=http://127.0.0.1:1"], "env.math: set either server or url, not both"),
        (["env.math.api_key=k"], "env.math: api_key is sent to a running server: set url"),
        (["policy.optimizer.name=adamw"], "expects a dotted import path"),
        (["data.use_multiple_dataloader=true"], "needs data.num_prompts_per_dataloader"),
    ],
)
def test_inconsistent_settings_fail_at_start_up(overrides: list[str], fragment: str) -> None:
    problems = problems_of(None, MINIMAL + overrides)
    assert any(fragment in p for p in problems), problems


def test_offline_mode_needs_a_scored_data_file() -> None:
    problems = problems_of(None, ["grpo.mode=offline", "data.train.reward_key=score"])
    assert problems == ["data.train[0].data_path is required in offline mode (scored rollouts JSONL)"]
    cfg = load_config(None, ["grpo.mode=offline", "data.train.data_path=r.jsonl"])
    assert cfg.env == {}  # offline training needs no environment


def test_missing_training_data_is_an_error() -> None:
    assert problems_of(None, []) == ["data.train: no training dataset configured"]


# ------------------------------------------------------------------------------------------ YAML extras


def test_defaults_inheritance_merges_mappings_and_honours_override_marker(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    (tmp_path / "base/common.yaml").write_text(
        "grpo: {num_prompts_per_step: 4, num_generations_per_prompt: 4, seed: 7}\n"
        "policy: {train_global_batch_size: 16, optimizer: {kwargs: {lr: 1.0e-3, weight_decay: 0.5}}}\n"
        "data: {train: {data_path: base.jsonl}, default: {env_name: math, prompt_file: p.txt}}\n"
        "env: {math: {num_workers: 3}}\n"
    )
    (tmp_path / "base/logging.yaml").write_text("logger: {log_dir: base_logs}\ngrpo: {seed: 8}\n")
    child = tmp_path / "child.yaml"
    child.write_text(
        "defaults: [base/common.yaml, base/logging.yaml]\n"
        "grpo: {num_prompts_per_step: 8, num_generations_per_prompt: 2}\n"
        "policy: {optimizer: {kwargs: {lr: 2.0e-4}}}\n"
        "data: {default: {_override_: true, env_name: math}}\n"
    )
    cfg = load_config(child, [])
    assert cfg.grpo.num_prompts_per_step == 8  # child wins
    assert cfg.grpo.seed == 8  # later parent wins over earlier parent
    assert cfg.policy.optimizer.kwargs.lr == pytest.approx(2e-4)
    assert cfg.policy.optimizer.kwargs.weight_decay == pytest.approx(0.5)  # merged, not replaced
    assert cfg.env["math"].num_workers == 3
    assert cfg.logger.log_dir == str(tmp_path / "base/base_logs")  # relative to the file that sets it
    assert cfg.data.resolved("train")[0].data_path == str(tmp_path / "base/base.jsonl")
    assert cfg.data.resolved("train")[0].prompt_file is None  # data.default was replaced wholesale


def test_circular_defaults_are_reported(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("defaults: b.yaml\n")
    (tmp_path / "b.yaml").write_text("defaults: a.yaml\n")
    problems = problems_of(tmp_path / "a.yaml", [])
    assert "circular" in problems[0]


def test_missing_file_is_reported(tmp_path: Path) -> None:
    assert problems_of(tmp_path / "nope.yaml", [])[0].startswith("config file not found")


def test_overrides_parse_yaml_scalars_and_lists(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "data:\n  train: [{data_path: a.jsonl}, {data_path: b.jsonl}]\n  default: {env_name: math}\n"
        "env: {math: {}}\n"
    )
    cfg = load_config(
        recipe,
        [
            "policy.optimizer.kwargs.lr=1e-4",  # YAML 1.1 would read this as a string
            "policy.optimizer.kwargs.betas=[0.8, 0.95]",
            "grpo.val_at_start=true",
            "grpo.max_val_samples=null",
            "policy.generation.stop_strings=['</answer>']",
            "policy.generation.top_k=50",
            "data.train.1.data_path=c.jsonl",
            "++logger.log_dir=elsewhere",
        ],
    )
    kwargs = cfg.policy.optimizer.kwargs
    assert isinstance(kwargs.lr, float) and kwargs.lr == pytest.approx(1e-4)
    assert kwargs.betas == (0.8, 0.95)
    assert cfg.grpo.val_at_start is True and cfg.grpo.max_val_samples is None
    assert cfg.policy.generation.stop_strings == ["</answer>"] and cfg.policy.generation.top_k == 50
    # The file's paths are relative to its folder, the command line's to the working directory.
    assert [d.data_path for d in cfg.data.resolved("train")] == [str(tmp_path / "a.jsonl"), "c.jsonl"]
    assert cfg.logger.log_dir == "elsewhere"


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("grpo.seed", "must look like section.key=value"),
        ("data.train.5.data_path=x", "not an index"),
        ("grpo.seed.x=1", "'grpo.seed' is not a mapping"),
    ],
)
def test_malformed_overrides_are_reported(override: str, fragment: str) -> None:
    problems = problems_of(None, ["data.train=[{data_path: a}]", "grpo.seed=1", override])
    assert fragment in problems[0]


def test_scientific_notation_in_yaml_files_is_a_float(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("policy: {optimizer: {kwargs: {eps: 1e-8, lr: 3E-5}}}\n")
    cfg = load_config(recipe, MINIMAL)
    assert cfg.policy.optimizer.kwargs.eps == 1e-8 and cfg.policy.optimizer.kwargs.lr == 3e-5
    dumped = config_to_dict(cfg)["policy"]["optimizer"]["kwargs"]
    assert isinstance(dumped["eps"], float)


def test_interpolation_keeps_types_and_fills_strings() -> None:
    cfg = load_config(
        None,
        MINIMAL
        + [
            "policy.model_name=my-model",
            "policy.tokenizer.name=${policy.model_name}",
            "policy.generation.max_new_tokens=${policy.max_total_sequence_length}",
            "logger.log_dir=logs/${policy.model_name}/seed${grpo.seed}",
        ],
    )
    assert cfg.policy.tokenizer.name == "my-model"
    assert cfg.policy.generation.max_new_tokens == 512
    assert cfg.logger.log_dir == "logs/my-model/seed42"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["logger.log_dir=${policy.nope}"], "refers to unknown key 'policy.nope'"),
        (["grpo.seed=${grpo.seed}"], "circular interpolation"),
        (
            ["policy.dynamic_batching.train_mb_tokens=${mul:${policy.max_total_sequence_length}, 4}"],
            "unsupported interpolation",
        ),
    ],
)
def test_bad_interpolations_are_reported(overrides: list[str], fragment: str) -> None:
    problems = problems_of(None, MINIMAL + overrides)
    assert fragment in problems[0]


# ---------------------------------------------------------------------------------------- data sections


def test_datasets_inherit_unset_keys_from_default_and_keep_explicit_nulls(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "data:\n"
        "  train:\n"
        "    - {data_path: a.jsonl}\n"
        "    - {data_path: b.jsonl, prompt_file: null, input_key: question, env_name: code}\n"
        "  validation: {data_path: v.jsonl}\n"
        "  default: {env_name: math, prompt_file: cot.txt, input_key: problem}\n"
        "env: {math: {}, code: {}}\n"
    )
    cfg = load_config(recipe, [])
    first, second = cfg.data.resolved("train")
    cot = str(tmp_path / "cot.txt")
    assert (first.prompt_file, first.input_key, first.env_name) == (cot, "problem", "math")
    assert (second.prompt_file, second.input_key, second.env_name) == (None, "question", "code")
    assert second.output_key == "output"  # built-in default
    assert cfg.data.resolved("validation")[0].prompt_file == cot
    # The saved form keeps only what was set, so reloading inherits the same way.
    saved = config_to_dict(cfg)["data"]
    assert saved["train"][0] == {"data_path": str(tmp_path / "a.jsonl")}
    reloaded = validate_config(config_to_dict(cfg))
    assert reloaded.data.resolved("train") == cfg.data.resolved("train")


def test_recipe_paths_are_relative_to_the_recipe_folder_from_any_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(ROOT / "recipes/grpo_math_tiny.yaml", ["logger.log_dir=mine"])
    train = cfg.data.resolved("train")[0]
    assert Path(train.data_path).is_file() and train.data_path == str(ROOT / "recipes/data/arith_train.jsonl")
    assert cfg.checkpointing.checkpoint_dir == str(ROOT / "results/grpo_math_tiny")
    assert cfg.logger.log_dir == "mine"  # an override is relative to where the user typed it
    absolute = tmp_path / "x.jsonl"
    recipe = tmp_path / "sub" / "r.yaml"
    recipe.parent.mkdir()
    recipe.write_text(f"data:\n  train: {{data_path: {absolute}}}\n  validation: {{data_path: '${{logger.log_dir}}/v.jsonl'}}\n")
    cfg = load_config(recipe, ["data.default.env_name=math", "env.math.server=math"])
    assert cfg.data.resolved("train")[0].data_path == str(absolute)  # absolute paths stay as they are
    assert cfg.data.resolved("validation")[0].data_path == "logs/v.jsonl"  # interpolations are the target's


def test_env_without_server_or_url_uses_its_own_name() -> None:
    cfg = load_config(
        None, ["data.train.data_path=a.jsonl", "data.default.env_name=math", "env.math.num_workers=2"]
    )
    assert cfg.env["math"].server == "math" and cfg.env["math"].url is None


# ------------------------------------------------------------------------------------- documentation


def _section_models() -> list[type[BaseModel]]:
    return [
        obj
        for module in (config_policy, config_schema)
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, Section) and obj is not Section
    ]


def test_every_field_of_every_section_is_documented() -> None:
    models = _section_models()
    assert MasterConfig in models and len(models) >= 15
    undocumented = [
        f"{model.__name__}.{name}"
        for model in models
        for name, field in model.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert undocumented == []


def test_defaults_follow_nemo_rl_for_the_algorithm() -> None:
    cfg = MasterConfig()
    assert cfg.grpo.normalize_rewards and cfg.grpo.use_leave_one_out_baseline
    assert (cfg.loss_fn.ratio_clip_min, cfg.loss_fn.ratio_clip_max, cfg.loss_fn.ratio_clip_c) == (
        0.2,
        0.2,
        None,
    )
    assert cfg.loss_fn.reference_policy_kl_penalty == 0.01 and cfg.loss_fn.reference_policy_kl_type == "k3"
    assert (cfg.loss_fn.kl_input_clamp_value, cfg.loss_fn.kl_output_clamp_value) == (20.0, 10.0)
    assert cfg.loss_fn.token_level_loss is True
    assert cfg.checkpointing.checkpoint_dir == "results/grpo"
    assert cfg.policy.tokenizer.name == cfg.policy.model_name
    assert cfg.data.max_input_seq_length == cfg.policy.max_total_sequence_length


def test_importing_the_config_does_not_import_torch() -> None:
    code = "import sys, gym_bridge.train.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ------------------------------------------------------------------------------------------- scheduler


def test_scheduler_warmup_then_constant() -> None:
    sched = SchedulerConfig(name="constant", warmup_steps=4, warmup_start_factor=0.2)
    factors = [sched.lr_factor(step, total_steps=100) for step in range(6)]
    assert factors == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])


def test_scheduler_cosine_and_linear_decay_to_the_floor() -> None:
    cosine = SchedulerConfig(name="cosine", warmup_steps=10, min_lr_ratio=0.1)
    assert cosine.lr_factor(10, total_steps=110) == pytest.approx(1.0)
    assert cosine.lr_factor(60, total_steps=110) == pytest.approx(
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2))
    )
    assert cosine.lr_factor(110, total_steps=110) == pytest.approx(0.1)
    assert cosine.lr_factor(500, total_steps=110) == pytest.approx(0.1)
    linear = SchedulerConfig(name="linear", total_steps=20)
    assert linear.lr_factor(5, total_steps=999) == pytest.approx(0.75)  # its own total_steps wins


def test_micro_batch_token_budgets_default_from_lengths() -> None:
    cfg = load_config(
        None,
        MINIMAL
        + [
            "policy.max_total_sequence_length=100",
            "policy.generation.max_new_tokens=50",
            "policy.train_micro_batch_size=4",
        ],
    )
    assert cfg.policy.train_mb_tokens == 400 and cfg.policy.logprob_mb_tokens == 400
    cfg = load_config(
        None, MINIMAL + ["policy.dynamic_batching.enabled=true", "policy.dynamic_batching.train_mb_tokens=77"]
    )
    assert cfg.policy.train_mb_tokens == 77
