"""LoRA (``policy.dtensor_cfg.lora_cfg``): only adapters train, the reference is the base model, generation
sees the merged weights, checkpoints hold a peft adapter that peft and the trainer's resume load."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from gym_bridge.train.batches.rollouts import Sample
from gym_bridge.train.config import ConfigError, load_config
from tests.train.helpers import save_random_tiny

peft = pytest.importorskip("peft")

LORA = "policy.dtensor_cfg.lora_cfg"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_lora"), seed=4)


def config(tmp: Path, model_dir: Path, *extra: str) -> Any:
    return load_config(
        None,
        [
            "grpo.mode=offline",
            "data.train.data_path=unused.jsonl",
            "grpo.num_prompts_per_step=2",
            "grpo.num_generations_per_prompt=4",
            "grpo.max_num_steps=2",
            "loss_fn.reference_policy_kl_penalty=0.05",
            f"policy.model_name={model_dir}",
            "policy.train_global_batch_size=8",
            "policy.train_micro_batch_size=4",
            "policy.max_total_sequence_length=32",
            "policy.generation.max_new_tokens=8",
            "policy.optimizer.kwargs.lr=5e-2",
            f"{LORA}.enabled=true",
            f"{LORA}.dim=4",
            f"checkpointing.checkpoint_dir={tmp / 'ckpt'}",
            f"logger.log_dir={tmp / 'logs'}",
            *extra,
        ],
    )


def samples(seed: int = 0) -> list[Sample]:
    """Two groups of four 12-token sequences (4 prompt tokens), rewards that differ within each group."""
    rng = random.Random(seed)
    out = []
    for group in range(2):
        prompt = [rng.randrange(10, 200) for _ in range(4)]
        for k in range(4):
            completion = [rng.randrange(10, 200) for _ in range(8)]
            out.append(Sample(group, prompt + completion, [0] * 4 + [1] * 8, reward=float(k % 2)))
    return out


def one_update(cfg: Any, learner: Any) -> None:
    from gym_bridge.train.batches.sequences import per_sample_logprobs
    from gym_bridge.train.learner.update import StepBatch, update_policy

    batch = StepBatch.from_samples(cfg.grpo, samples())
    with learner.reference_policy() as reference:
        batch.reference_logprobs = per_sample_logprobs(cfg, reference, batch.samples, learner.pad_token_id)
    update_policy(cfg, learner, batch)


def lora_learner(tmp_path: Path, model_dir: Path, *extra: str) -> tuple[Any, Any]:
    from gym_bridge.train.setup import build_learner

    cfg = config(tmp_path, model_dir, *extra)
    learner, _ = build_learner(cfg, None, rollout_process=False)
    return cfg, learner


def test_only_adapter_parameters_train_and_hold_optimizer_state(tmp_path: Path, model_dir: Path) -> None:
    cfg, learner = lora_learner(tmp_path, model_dir)
    before = {name: p.detach().clone() for name, p in learner.model.named_parameters()}
    trainable = {name for name, p in learner.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # every linear layer but the output one is adapted (match_all_linear, NeMo RL's default)
    adapted = {n.split(".lora_")[0] for n in trainable}
    assert {n.rsplit(".", 1)[-1] for n in adapted} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }

    one_update(cfg, learner)

    changed = {n for n, p in learner.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable  # base weights untouched, adapters moved
    assert any(".lora_B." in n for n in changed)
    state = learner.optimizer.state_dict()["state"]
    held = sum(s["exp_avg"].numel() for s in state.values())
    assert held == sum(p.numel() for n, p in learner.model.named_parameters() if n in trainable)


def test_reference_logprobs_are_the_base_models(tmp_path: Path, model_dir: Path) -> None:
    from gym_bridge.models.registry import load_model_and_tokenizer
    from gym_bridge.train.batches.sequences import per_sample_logprobs

    cfg, learner = lora_learner(tmp_path, model_dir)
    one_update(cfg, learner)
    base, _ = load_model_and_tokenizer(str(model_dir))
    batch = samples(seed=1)
    expected = per_sample_logprobs(cfg, base, batch, learner.pad_token_id)
    with learner.reference_policy() as reference:
        assert reference is learner.model  # no second copy: the adapters are switched off
        got = per_sample_logprobs(cfg, reference, batch, learner.pad_token_id)
    adapted = per_sample_logprobs(cfg, learner.model, batch, learner.pad_token_id)  # adapters back on
    for e, g, a in zip(expected, got, adapted, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-6)
        assert not torch.allclose(a, e, atol=1e-4)
    assert learner.reference is None


def _randomise_adapters(model: Any, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)


def test_merged_weights_generate_what_base_plus_adapter_does(tmp_path: Path, model_dir: Path) -> None:
    from gym_bridge.generation.transformers_backend import TransformersBackend
    from gym_bridge.generation.weights import plain_state_dict
    from gym_bridge.models.registry import load_model_and_tokenizer
    from gym_bridge.train.learner.lora import merged_model

    _, learner = lora_learner(tmp_path, model_dir)
    _randomise_adapters(learner.model)
    prompt = torch.tensor([[5, 17, 42, 99, 7, 3]])

    def greedy(model: Any) -> list[int]:
        model.eval()
        with torch.no_grad():
            out = model.generate(
                prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=12
            )
        return out[0, prompt.shape[1] :].tolist()

    adapted = greedy(learner.model)
    merged = greedy(merged_model(learner.peft))
    refit, _ = load_model_and_tokenizer(str(model_dir))  # a plain copy refit as the backends are
    base = greedy(refit)
    TransformersBackend(refit, learner.tokenizer).update_weights(learner.model)
    assert merged == adapted and greedy(refit) == adapted
    assert base != adapted  # the adapters do change what is generated
    state = plain_state_dict(learner.model)
    assert not any("lora" in k or "base_layer" in k for k in state)
    assert set(state) == set(refit.state_dict())


def test_trainable_parameter_count(tmp_path: Path, model_dir: Path) -> None:
    from gym_bridge.train.learner.lora import parameter_counts, trainable_parameters_line

    _, learner = lora_learner(
        tmp_path, model_dir, f"{LORA}.match_all_linear=false", f"{LORA}.target_modules=[q_proj,v_proj]"
    )
    trainable, total = parameter_counts(learner.model)
    # tiny: hidden 32, 2 layers; q_proj 32->32 and v_proj 32->(kv heads x head dim) get A (4x32) and B (out x 4)
    config = learner.model.config
    v_out = config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
    assert trainable == config.num_hidden_layers * ((4 * 32 + 32 * 4) + (4 * 32 + v_out * 4))
    assert trainable_parameters_line(learner.model) == (
        f"trainable parameters: {trainable:,} / {total:,} ({100 * trainable / total:.2f}%)"
    )


def test_setting_up_lora_shows_no_library_deprecation_warnings(tmp_path: Path, model_dir: Path) -> None:
    """peft reads transformers' deprecated ``is_gradient_checkpointing``; a user's first LoRA run must not
    print that (nor any other FutureWarning) as if it were theirs to fix."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        lora_learner(tmp_path, model_dir, "policy.dtensor_cfg.activation_checkpointing=true")


def test_saving_a_lora_checkpoint_warns_nothing_and_saves_only_the_adapter(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A base model named by its Hub id, offline (the SmolLM2 recipe): peft's ``save_embedding_layers="auto"``
    looked its config up on every save and warned "Could not find a config file ... will assume that the
    vocabulary was not modified" (issue 35). The trainer never resizes the vocabulary: nothing to look up."""
    import warnings

    from safetensors.torch import load_file

    from gym_bridge.train.bookkeeping.checkpoint import CheckpointManager

    _, learner = lora_learner(tmp_path, model_dir)
    learner.peft.peft_config["default"].base_model_name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        saved = CheckpointManager(tmp_path / "ckpt").save(
            1, model=learner.model, tokenizer=learner.tokenizer, optimizer=learner.optimizer,
            scheduler=learner.scheduler, data_state={}, config_yaml="", peft_model=learner.peft,
        )  # fmt: skip
    assert [str(w.message) for w in caught if issubclass(w.category, UserWarning)] == []
    tensors = load_file(saved.path / "policy" / "adapter" / "adapter_model.safetensors")
    assert tensors and all(".lora_A." in k or ".lora_B." in k for k in tensors)  # no embedding layer copied


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [f"{LORA}.match_all_linear=false", f"{LORA}.target_modules=[nope]"],
            f"{LORA}.target_modules selects no",
        ),
        (
            [f"{LORA}.match_all_linear=false", f"{LORA}.target_modules=[lm_head]"],
            "tied to the input embeddings",
        ),
    ],
)
def test_a_selection_the_model_cannot_take_is_refused_naming_the_key(
    tmp_path: Path, model_dir: Path, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        lora_learner(tmp_path, model_dir, *overrides)


def test_lora_keys_are_checked_and_unknown_ones_refused(tmp_path: Path, model_dir: Path) -> None:
    cfg = config(tmp_path, model_dir, f"{LORA}.use_triton=true")  # a kernel choice: accepted, no effect
    assert cfg.policy.dtensor_cfg.lora_cfg.dim == 4
    with pytest.raises(ConfigError, match=f"unknown config key '{LORA}.rank'"):
        config(tmp_path, model_dir, f"{LORA}.rank=4")
    with pytest.raises(ConfigError, match="match_all_linear adapts every linear layer"):
        config(tmp_path, model_dir, f"{LORA}.target_modules=[q_proj]")
    with pytest.raises(ConfigError, match="checkpointing.save_merged"):
        config(tmp_path, model_dir, f"{LORA}.enabled=false", "checkpointing.save_merged=true")


def test_post_dropout_drops_the_adapter_output_only_while_training(tmp_path: Path, model_dir: Path) -> None:
    _, learner = lora_learner(tmp_path, model_dir, f"{LORA}.dropout=0.5", f"{LORA}.dropout_position=post")
    _randomise_adapters(learner.model)
    ids = torch.tensor([[5, 17, 42, 99]])
    model = learner.model
    model.eval()
    with torch.no_grad():
        first, second = model(ids).logits, model(ids).logits
        assert torch.equal(first, second)
        model.train()
        assert not torch.equal(model(ids).logits, first)
        with learner.peft.disable_adapter():  # the base path has no dropout
            assert torch.equal(model(ids).logits, model(ids).logits)


# ---------------------------------------------------------------------------------------------- runs


def test_lora_checkpoint_loads_in_peft_in_transformers_and_in_resume(tmp_path: Path, model_dir: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from gym_bridge.train.loop import train

    from .test_trainer_offline import offline_config, train_lines, without_timings, write_scored

    data = write_scored(tmp_path / "scored.jsonl")
    lora = [
        f"{LORA}.enabled=true",
        f"{LORA}.dim=4",
        "policy.optimizer.kwargs.lr=3e-2",
        "checkpointing.save_period=1",
    ]
    run = tmp_path / "run"
    result = train(
        offline_config(run, model_dir, data, *lora, "grpo.max_num_steps=2", "checkpointing.save_merged=true"),
        show_progress=False,
    )
    trainable, total = result.trainable_parameters
    assert 0 < trainable < total / 5
    step = run / "ckpt" / "step_2" / "policy"
    assert sorted(p.name for p in step.iterdir()) == ["adapter", "merged", "optimizer.pt", "tokenizer"]
    assert {"adapter_model.safetensors", "adapter_config.json"} <= {
        p.name for p in (step / "adapter").iterdir()
    }
    saved = load_file(step / "adapter" / "adapter_model.safetensors")
    assert sum(t.numel() for t in saved.values()) == trainable
    optimizer = torch.load(step / "optimizer.pt", weights_only=False)["optimizer"]["state"]
    assert sum(s["exp_avg"].numel() for s in optimizer.values()) == trainable  # the adapter's state only

    # peft loads the adapter as is; transformers loads the merged model; both compute the same
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        base_logits = base(ids).logits
        adapted = peft.PeftModel.from_pretrained(base, step / "adapter").eval()
        adapted_logits = adapted(ids).logits
        merged_logits = AutoModelForCausalLM.from_pretrained(step / "merged").eval()(ids).logits
    torch.testing.assert_close(merged_logits, adapted_logits, rtol=0, atol=1e-5)
    assert not torch.allclose(adapted_logits, base_logits, atol=1e-4)  # it learned something

    # resume: steps 3-4 after steps 1-2 log what a straight 4-step run logs
    resumed = train(offline_config(run, model_dir, data, *lora, "grpo.max_num_steps=4"), show_progress=False)
    assert resumed.resumed_from == 2 and resumed.steps == 4
    straight = tmp_path / "straight"
    train(offline_config(straight, model_dir, data, *lora, "grpo.max_num_steps=4"), show_progress=False)
    expected = [without_timings(r) for r in train_lines(straight / "logs")]
    assert [without_timings(r) for r in train_lines(run / "logs")] == expected
    info = json.loads((run / "ckpt" / "step_4" / "training_info.json").read_text())
    assert info["step"] == 4

    # a LoRA checkpoint is not resumed as full fine-tuning
    with pytest.raises(ConfigError, match=f"{LORA}.enabled is false but"):
        train(offline_config(run, model_dir, data, "grpo.max_num_steps=6"), show_progress=False)


def test_lora_recipe_trains_end_to_end_through_the_cli(tmp_path: Path, model_dir: Path) -> None:
    """``gym-bridge train --config recipes/grpo_math_tiny_lora.yaml``: async GRPO with the rollout process
    refit with merged weights, the trainable count on the terminal, adapter checkpoints."""
    from typer.testing import CliRunner

    from gym_bridge.cli import app

    root = Path(__file__).resolve().parents[2]
    args = [
        "train",
        "--config",
        str(root / "recipes" / "grpo_math_tiny_lora.yaml"),
        f"policy.model_name={model_dir}",
        "grpo.max_num_steps=3",
        "grpo.num_prompts_per_step=4",
        "grpo.num_generations_per_prompt=4",
        "policy.train_global_batch_size=16",
        "policy.train_micro_batch_size=16",
        "grpo.val_period=0",
        "grpo.max_val_samples=8",
        "grpo.val_batch_size=8",
        "checkpointing.save_period=3",
        "checkpointing.save_merged=true",
        "logger.tensorboard_enabled=false",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        f"logger.log_dir={tmp_path / 'logs'}",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("trainable parameters: "))
    trainable, total = (int(n.replace(",", "")) for n in line.split(": ")[1].split(" (")[0].split(" / "))
    assert 0 < trainable < total and line.endswith(f"({100 * trainable / total:.2f}%)")
    assert "done: 3 steps" in result.output
    policy = tmp_path / "ckpt" / "step_3" / "policy"
    assert (policy / "adapter" / "adapter_model.safetensors").is_file()
    assert (policy / "merged" / "model.safetensors").is_file()
    assert not (policy / "weights").exists()


# ------------------------------------------------------------------------- refits of other backends


def _requests() -> list[Any]:
    from gym_bridge.generation.backend import GenerationRequest, SamplingParams

    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=11)
    return [GenerationRequest([5, 17, 42, 99, 7], params), GenerationRequest([8, 9, 10], params)]


def test_vllm_refit_sends_merged_weights_under_the_base_names(tmp_path: Path, model_dir: Path) -> None:
    """VllmBackend.update_weights over a stand-in engine (vLLM needs CUDA): what its model loads."""
    from gym_bridge.generation.vllm_backend import VllmBackend
    from gym_bridge.models.registry import load_model_and_tokenizer
    from gym_bridge.train.learner.lora import merged_model

    _, learner = lora_learner(tmp_path, model_dir)
    _randomise_adapters(learner.model)
    loaded: dict[str, torch.Tensor] = {}

    class Engine:
        def collective_rpc(self, function: Any) -> None:
            worker = type("W", (), {})()
            worker.model_runner = type("R", (), {})()
            worker.model_runner.model = type(
                "M", (), {"load_weights": lambda self, weights: loaded.update(weights)}
            )()
            function(worker)

    backend = object.__new__(VllmBackend)
    backend.llm = Engine()
    backend.update_weights(learner.model)
    expected = merged_model(learner.peft).state_dict()
    base, _ = load_model_and_tokenizer(str(model_dir))
    assert set(loaded) == set(base.state_dict())
    for name, tensor in expected.items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=1e-6)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(loaded[q], base.state_dict()[q])  # the adapter is in it


@pytest.mark.timeout(180)
def test_ray_replicas_generate_what_the_adapted_policy_does(tmp_path: Path, model_dir: Path) -> None:
    pytest.importorskip("ray")
    from gym_bridge.generation.ray_backend import RayBackend
    from gym_bridge.generation.transformers_backend import TransformersBackend

    _, learner = lora_learner(tmp_path, model_dir)
    _randomise_adapters(learner.model, seed=1)
    local = TransformersBackend(learner.model, learner.tokenizer, seed=7)
    replicas = RayBackend(learner.model, learner.tokenizer, seed=7, num_workers=1)
    try:
        assert [r.token_ids for r in replicas.generate(_requests())] == [
            r.token_ids for r in local.generate(_requests())
        ]
        _randomise_adapters(learner.model, seed=2)  # a training step's worth of change, then the refit
        replicas.update_weights(learner.model)
        after = [r.token_ids for r in replicas.generate(_requests())]
        assert after == [r.token_ids for r in local.generate(_requests())]
    finally:
        replicas.close()
