"""The config keys no other test exercised: each changes what the trainer does, or is refused naming it."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gym_bridge.train.batches.rollouts import Sample  # noqa: E402
from gym_bridge.train.config import ConfigError, load_config  # noqa: E402

BASE = ["data.train.data_path=a.jsonl", "grpo.mode=offline"]


def cfg_with(*overrides: str) -> Any:
    return load_config(None, [*BASE, *overrides])


def sample(group: int, reward: float, length: int = 6, truncated: bool = False) -> Sample:
    return Sample(
        group=group,
        token_ids=list(range(1, length + 1)),
        loss_mask=[0, 0] + [1] * (length - 2),
        reward=reward,
        truncated=truncated,
    )


def test_overlong_filtering_takes_truncated_samples_out_of_the_loss() -> None:
    from gym_bridge.train.learner.update import StepBatch

    samples = [sample(0, 1.0), sample(0, 0.0, truncated=True), sample(0, 1.0), sample(0, 0.0)]
    kept = StepBatch.from_samples(cfg_with("grpo.overlong_filtering=false").grpo, samples).sample_mask
    filtered = StepBatch.from_samples(cfg_with("grpo.overlong_filtering=true").grpo, samples).sample_mask
    assert kept.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert filtered.tolist() == [1.0, 0.0, 1.0, 1.0]


class CountingBatches:
    """Prompts 0, 1, 2, ... in order; records how many each draw asked for."""

    def __init__(self) -> None:
        self.next = 0
        self.asked: list[int] = []

    def next_batch(self, n: int | None = None) -> list[int]:
        n = n or 2
        self.asked.append(n)
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


class UninformativeSampler:
    """Every group's rewards are equal: dynamic sampling keeps none."""

    def sample(self, prompts: list[int], seeds: Any, group_offset: int = 0) -> tuple[list[Sample], dict]:
        return [sample(group_offset + i, 1.0) for i in range(len(prompts)) for _ in range(2)], {}


def test_dynamic_sampling_gives_up_after_max_gen_batches_drawing_batch_multiplier_prompts() -> None:
    from gym_bridge.train.samplers.sampling import sample_step

    for batches, multiplier, expected in ((3, 1.0, [2, 2, 2]), (2, 2.5, [5, 5])):
        cfg = cfg_with(
            "grpo.num_prompts_per_step=2",
            "grpo.num_generations_per_prompt=2",
            "grpo.use_dynamic_sampling=true",
            f"grpo.dynamic_sampling_max_gen_batches={batches}",
            f"grpo.batch_multiplier={multiplier}",
        )
        data = CountingBatches()
        samples, stats = sample_step(cfg, UninformativeSampler(), data, 1)  # type: ignore[arg-type]
        assert samples == [] and stats["generation_batches"] == batches
        assert data.asked == expected


def test_max_rollout_turns_is_the_agent_loops_step_limit(tmp_path: Any) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gym_bridge.generation.transformers_backend import TransformersBackend
    from gym_bridge.train.samplers.sampling import OnlineSampler
    from tests.train.helpers import PARITY_SERVER, save_random_tiny

    model_dir = save_random_tiny(tmp_path / "m")
    backend = TransformersBackend(
        AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    )
    cfg = load_config(
        None,
        [
            "data.train.data_path=a.jsonl",
            "data.default.env_name=p",
            f"env.p.server={PARITY_SERVER}",
            f"env.q.server={PARITY_SERVER}",
            "env.q.max_steps=2",
            "env.r.url=http://127.0.0.1:9",
            "env.r.api_key=env-sekrit",
            "grpo.max_rollout_turns=5",
        ],
    )
    sampler = OnlineSampler(cfg, backend, backend.tokenizer)
    try:
        assert sampler.agent_configs["p"].max_steps == 5  # grpo.max_rollout_turns
        assert sampler.agent_configs["q"].max_steps == 2  # an env's own max_steps wins
        assert sampler.agent_configs["p"].env_retry.request_timeout == 60.0  # env.p.timeout_s default
        assert sampler.agent_configs["r"].env_headers == {"authorization": "Bearer env-sekrit"}  # env.r.api_key
        assert sampler.agent_configs["p"].env_headers == {}
        assert not sampler.agent_configs["p"].model_retry.retry_timeouts  # a slow model is not asked twice
    finally:
        sampler.close()


def test_optimizer_foreach_and_fused_reach_the_optimizer() -> None:
    from gym_bridge.train.setup import build_optimizer

    model = torch.nn.Linear(3, 2)
    optimizer, _ = build_optimizer(cfg_with("policy.optimizer.kwargs.foreach=true"), model, 10)
    assert optimizer.defaults["foreach"] is True and optimizer.defaults["fused"] is None
    optimizer, _ = build_optimizer(cfg_with("policy.optimizer.kwargs.foreach=false"), model, 10)
    assert optimizer.defaults["foreach"] is False


def test_dynamic_batching_length_rounding_changes_the_micro_batches() -> None:
    from gym_bridge.train.batches.sequences import micro_batches

    samples = [sample(0, 1.0, length=n) for n in (10, 9, 9, 9, 5, 5)]
    common = ["policy.dynamic_batching.enabled=true", "policy.dynamic_batching.train_mb_tokens=36"]
    exact = micro_batches(cfg_with(*common), samples, list(range(6)), for_logprobs=False)
    rounded = micro_batches(
        cfg_with(*common, "policy.dynamic_batching.sequence_length_round=16"), samples, list(range(6)), for_logprobs=False
    )
    assert [len(g) for g in exact] == [3, 3]  # 3 x 10 and 3 x 9 fit 36 tokens
    assert [len(g) for g in rounded] == [2, 2, 2]  # every length rounds to 16: two per 36 tokens


def test_sequence_packing_length_rounding_aligns_packed_sequences() -> None:
    from gym_bridge.train.batches.sequences import make_micro_batch, packing_layout

    samples = [sample(0, 1.0, length=n) for n in (7, 5, 3)]
    cfg = cfg_with("policy.sequence_packing.enabled=true", "policy.sequence_packing.sequence_length_round=8")
    assert packing_layout(cfg) == (cfg.policy.max_total_sequence_length, 8)
    mb = make_micro_batch(samples, [0, 1, 2], 0, packing=packing_layout(cfg))
    assert mb.packed is not None and sorted(mb.packed.starts) == [0, 8, 16]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("policy.sequence_packing.algorithm=modified_first_fit_decreasing", "policy.sequence_packing.algorithm"),
    ],
)
def test_values_gym_bridge_cannot_run_are_refused_naming_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"config key '{key}' expects one of"):
        cfg_with(override)


def test_vllm_engine_settings_reach_the_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """vLLM cannot run here: a stand-in records what the trainer builds its engine with."""
    from gym_bridge.train.loop import train
    from tests.train.helpers import save_random_tiny

    engines: list[dict[str, Any]] = []

    class Built(Exception):
        pass

    class LLM:
        def __init__(self, model: str, **kwargs: Any) -> None:
            engines.append({"model": model, **kwargs})
            raise Built

    fake = types.ModuleType("vllm")
    fake.LLM = LLM
    monkeypatch.setitem(sys.modules, "vllm", fake)
    rows = tmp_path / "say.jsonl"
    rows.write_text('{"responses_create_params": {"input": [{"role": "user", "content": "Say 1."}]}}\n')
    model_dir = save_random_tiny(tmp_path / "m")
    cfg = load_config(
        None,
        [
            f"data.train.data_path={rows}",
            "data.default.env_name=math",
            "env.math.server=math",
            "grpo.num_prompts_per_step=1",
            "grpo.num_generations_per_prompt=2",
            "policy.train_global_batch_size=2",
            "policy.train_micro_batch_size=2",
            "policy.max_total_sequence_length=64",
            "policy.generation.max_new_tokens=8",
            f"policy.model_name={model_dir}",
            "policy.generation.backend=vllm",
            "policy.generation.vllm_cfg.tensor_parallel_size=2",
            "policy.generation.vllm_cfg.gpu_memory_utilization=0.3",
            "policy.generation.vllm_cfg.enforce_eager=true",
            "policy.generation.vllm_cfg.max_model_len=48",
            "cluster.gpus_per_node=2",
            "policy.device=cpu",  # the policy trains here; only the (stand-in) engine is on the GPUs
            f"logger.log_dir={tmp_path / 'logs'}",
            "checkpointing.enabled=false",
        ],
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(Built):
        train(cfg, show_progress=False)
    (engine,) = engines
    assert engine["tensor_parallel_size"] == 2 and engine["gpu_memory_utilization"] == 0.3
    assert engine["enforce_eager"] is True and engine["max_model_len"] == 48


def test_print_every_steps_prints_a_train_line_every_n_steps(capsys: pytest.CaptureFixture[str]) -> None:
    from gym_bridge.train.bookkeeping.logging import TerminalView

    for every, expected in ((1, 6), (3, 2)):
        cfg = cfg_with(f"logger.print_every_steps={every}")
        view = TerminalView(6, every=cfg.logger.print_every_steps, enabled=True)  # as the loop builds it
        view._progress.stop()  # plain prints, as without a terminal
        view._progress = None
        capsys.readouterr()
        for step in range(1, 7):
            view.step(step, {"reward_mean": 0.5})
        view.step(6, {"accuracy": 0.5}, split="val")  # validations always print
        lines = capsys.readouterr().out.splitlines()
        assert sum("[train]" in line for line in lines) == expected
        assert sum("[val]" in line for line in lines) == 1


def test_num_val_samples_to_print_prints_that_many_validation_samples() -> None:
    from gym_bridge.train.bookkeeping.metrics import validate

    class Sampler:
        class tokenizer:  # noqa: N801 - stands in for a tokenizer object
            @staticmethod
            def decode(ids: list[int], skip_special_tokens: bool = True) -> str:
                return " ".join(map(str, ids))

        def sample(self, prompts: list[Any], seeds: Any, group_offset: int = 0) -> tuple[list[Sample], dict]:
            out = [sample(group_offset + i, 1.0) for i in range(len(prompts))]
            for s in out:
                s.record = {"question": "q"}
            return out, {}

    class View:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def print(self, text: str) -> None:
            self.lines.append(text)

        def validation_progress(self, done: int, total: int, elapsed_s: float) -> None:
            pass

    prompts = [types.SimpleNamespace(dataset="d") for _ in range(5)]
    for count in (0, 3):
        view = View()
        metrics = validate(cfg_with(f"logger.num_val_samples_to_print={count}"), Sampler(), prompts, view)
        assert metrics["num_samples"] == 5
        assert sum("[val sample]" in line for line in view.lines) == count


def test_packing_logprob_budget_sets_the_log_prob_passes_rows() -> None:
    from gym_bridge.train.batches.sequences import micro_batches

    samples = [sample(0, 1.0, length=n) for n in (30, 30, 30, 30, 20, 20, 10, 10)]
    index = list(range(8))
    common = ["policy.sequence_packing.enabled=true", "policy.max_total_sequence_length=64"]
    small = cfg_with(*common, "policy.generation.max_new_tokens=8", "policy.sequence_packing.logprob_mb_tokens=64")
    large = cfg_with(*common, "policy.generation.max_new_tokens=8", "policy.sequence_packing.logprob_mb_tokens=256")
    assert len(micro_batches(small, samples, index, for_logprobs=True)) == 3  # one 60-64 token row each
    assert len(micro_batches(large, samples, index, for_logprobs=True)) == 1  # three rows in one pass
    # the training budget is a separate key
    assert len(micro_batches(small, samples, index, for_logprobs=False)) == 1
