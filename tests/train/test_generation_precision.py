"""``policy.generation.precision``: completions sampled from a copy of the policy in another dtype, which
follows every update (in-process, LoRA merged in, in the async rollout process and after a write in
shared memory), while the trainer's weights and log-probs stay float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gym_bridge.generation.backend import GenerationRequest, SamplingParams
from gym_bridge.generation.transformers_backend import TransformersBackend
from gym_bridge.generation.weights import plain_state_dict
from gym_bridge.models.registry import load_model_and_tokenizer
from gym_bridge.train.bookkeeping.logging import read_metrics
from gym_bridge.train.config import ConfigError, load_config
from gym_bridge.train.loop import train
from tests.train.helpers import PARITY_SERVER, SMALL_ONLINE_RUN, save_random_tiny, write_say_prompts

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_generation_precision"), seed=3)


def greedy(backend: TransformersBackend, prompts: list[list[int]]) -> list[list[int]]:
    requests = [GenerationRequest(p, SamplingParams(max_new_tokens=6, temperature=0.0)) for p in prompts]
    return [r.token_ids for r in backend.generate(requests)]


def copy_matches(backend: TransformersBackend, source: dict[str, torch.Tensor]) -> bool:
    copy = backend._copy.model.state_dict()
    return all(torch.equal(copy[name], tensor.to(copy[name].dtype)) for name, tensor in source.items())


def perturb(model: torch.nn.Module, scale: float = 0.5) -> None:
    """An update the way an optimizer makes one: in place, under no_grad."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=generator) * scale)


def test_bfloat16_copy_follows_in_place_updates_and_leaves_the_model_float32(model_dir: Path) -> None:
    model, tokenizer = load_model_and_tokenizer(str(model_dir))
    backend = TransformersBackend(model, tokenizer, precision="bfloat16")
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    greedy(backend, prompts)
    assert backend._copy.model.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert copy_matches(backend, plain_state_dict(model))

    before = {k: v.clone() for k, v in backend._copy.model.state_dict().items()}
    perturb(model)
    greedy(backend, prompts)
    assert copy_matches(backend, plain_state_dict(model))  # refreshed from the updated weights
    assert not all(torch.equal(before[k], v) for k, v in backend._copy.model.state_dict().items())


def test_a_write_no_version_counter_sees_is_announced_by_update_weights(model_dir: Path) -> None:
    """The async rollout process's parameters are shared memory the trainer writes: the child is told."""
    model, tokenizer = load_model_and_tokenizer(str(model_dir))
    backend = TransformersBackend(model, tokenizer, precision="bfloat16")
    greedy(backend, [[5, 6, 7]])
    with torch.no_grad():
        for p in model.parameters():
            p.data.mul_(-1.0)  # .data: invisible to the parameter's version counter, like another process
    greedy(backend, [[5, 6, 7]])
    assert not copy_matches(backend, plain_state_dict(model))  # the copy cannot know ...
    backend.update_weights(model)  # ... until told (the rollout worker's load_weights)
    greedy(backend, [[5, 6, 7]])
    assert copy_matches(backend, plain_state_dict(model))


def test_lora_adapters_are_merged_into_the_copy_and_the_base_stays_untouched(model_dir: Path) -> None:
    from gym_bridge.train.config.policy import LoRAConfig
    from gym_bridge.train.learner.lora import apply_lora

    model, tokenizer = load_model_and_tokenizer(str(model_dir))
    peft_model = apply_lora(model, LoRAConfig(enabled=True, dim=4, alpha=8))
    perturb(peft_model, scale=0.2)  # only the adapters train: B moves off zero
    base_before = {k: v.clone() for k, v in model.state_dict().items() if "base_layer" in k}
    backend = TransformersBackend(model, tokenizer, precision="bfloat16")
    greedy(backend, [[5, 6, 7]])
    merged = plain_state_dict(model)
    assert copy_matches(backend, merged)
    assert any(not torch.equal(merged[k.replace(".base_layer.", ".")], v) for k, v in base_before.items())
    assert all(torch.equal(model.state_dict()[k], v) for k, v in base_before.items())


def test_unknown_precision_is_refused_naming_it(model_dir: Path) -> None:
    model, tokenizer = load_model_and_tokenizer(str(model_dir))
    with pytest.raises(ValueError, match="precision"):
        TransformersBackend(model, tokenizer, precision="bf16")
    with pytest.raises(ConfigError, match="policy.generation.precision"):
        load_config(None, ["policy.generation.precision=bf16"])


def online_run(tmp_path: Path, model_dir: Path, *overrides: str) -> list[dict]:
    cfg = load_config(
        None,
        [
            *SMALL_ONLINE_RUN,
            "grpo.max_num_steps=3",
            "grpo.val_at_start=false",
            "grpo.val_period=0",
            f"policy.model_name={model_dir}",
            f"data.train.data_path={write_say_prompts(tmp_path / 'say.jsonl', 8)}",
            "data.train.env_name=parity",
            f"env.parity.server={PARITY_SERVER}",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            f"logger.log_dir={tmp_path / 'logs'}",
            *overrides,
        ],
    )
    train(cfg, show_progress=False)
    return [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "overrides",
    [[], ["policy.dtensor_cfg.lora_cfg.enabled=true", "policy.dtensor_cfg.lora_cfg.dim=4"]],
    ids=["full", "lora"],
)
def test_training_samples_from_a_bfloat16_copy_that_follows_the_policy(
    tmp_path: Path, model_dir: Path, overrides: list[str]
) -> None:
    """The sampler's log-probs differ from the float32 trainer's by bfloat16 rounding at every step, not
    more: a copy left behind by the updates (lr 3e-2 moves this model far) measured token_mult_prob_error
    1.15-1.30 and gen_kl_error 0.015-0.054 at steps 2-3 (float32 sampling: 1 and 0 within float32 rounding)."""
    steps = online_run(tmp_path, model_dir, "policy.generation.precision=bfloat16", *overrides)
    assert [r["step"] for r in steps] == [1, 2, 3]
    for record in steps:
        assert record["rollout_failures"] == 0
        assert 1.0 + 1e-4 < record["token_mult_prob_error"] < 1.01  # sampled in bfloat16 ...
        assert record["gen_kl_error"] < 1e-3  # ... from the current weights


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rollout_process", [True, False], ids=["rollout-process", "in-process"])
def test_async_grpo_samples_from_a_bfloat16_copy_refit_every_step(
    tmp_path: Path, model_dir: Path, rollout_process: bool
) -> None:
    """Async GRPO samples from weights one step old by design; in bfloat16 they are the same step's
    weights as in float32 (the same gap to the trainer, up to rounding), so the child's copy is refit."""
    runs = {}
    for precision in ("float32", "bfloat16"):
        (tmp_path / precision).mkdir()
        runs[precision] = online_run(
            tmp_path / precision,
            model_dir,
            f"policy.generation.precision={precision}",
            "grpo.async_grpo.enabled=true",
            "grpo.async_grpo.max_trajectory_age_steps=1",
            f"grpo.async_grpo.rollout_process={str(rollout_process).lower()}",
        )
    assert [r["step"] for r in runs["bfloat16"]] == [1, 2, 3]
    # float32: the trainer's own log-probs up to float32 rounding (the sampler's normaliser is summed in
    # float64, the trainer's logsumexp in float32); bfloat16: rounding of another order
    assert runs["float32"][0]["token_mult_prob_error"] == pytest.approx(1.0, abs=1e-6)
    assert runs["bfloat16"][0]["token_mult_prob_error"] > 1.0 + 1e-4
    for full, low in zip(runs["float32"], runs["bfloat16"], strict=True):
        assert low["gen_kl_error"] == pytest.approx(full["gen_kl_error"], abs=1e-3)
    assert runs["bfloat16"][-1]["gen_kl_error"] > 0.01  # (the one-step gap is there to see)


def test_bfloat16_sampling_on_a_cpu_without_native_bfloat16_is_noted_at_start_up() -> None:
    from gym_bridge.train.learner.device import generation_precision_notice

    recipe = ROOT / "recipes" / "grpo_smollm2_135m_lora.yaml"  # sets policy.generation.precision: bfloat16
    cfg = load_config(recipe)
    note = generation_precision_notice(cfg, flags={"avx2", "avx512f"})
    assert note is not None and "policy.generation.precision=float32" in note
    assert generation_precision_notice(cfg, flags={"avx512f", "amx_bf16"}) is None
    assert generation_precision_notice(cfg, flags={"avx512_bf16"}) is None
    float32 = load_config(recipe, ["policy.generation.precision=float32"])
    assert generation_precision_notice(float32, flags={"avx2"}) is None
