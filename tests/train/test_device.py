"""Device and precision (issue 13 item 4): one resolver decides the device, CUDA asked for and absent
is refused before anything loads, every tensor of a training step is on the resolved device, and
float16 trains with a loss scaler. No GPU here: the same code paths run with the CPU as the device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gym_bridge.train.config import ConfigError, load_config
from gym_bridge.train.learner.device import Placement, device_problems, placement_for, resolve_device
from tests.train.helpers import save_random_tiny
from tests.train.test_lora import samples

BASE = ["grpo.mode=offline", "data.train.data_path=unused.jsonl"]


def cfg_with(*overrides: str) -> Any:
    return load_config(None, [*BASE, *overrides])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_device"), seed=7)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), "cpu"),
        (("cluster.gpus_per_node=0",), "cpu"),
        (("cluster.gpus_per_node=1",), "cuda"),
        (("cluster.gpus_per_node=4",), "cuda"),
        (("policy.device=cuda",), "cuda"),
        (("policy.device=cpu", "cluster.gpus_per_node=2"), "cpu"),
        (("policy.device=auto", "cluster.gpus_per_node=2"), "cuda"),
    ],
)
def test_the_resolver_puts_the_policy_on_cuda_exactly_when_the_config_asks_for_gpus(
    overrides: tuple[str, ...], expected: str
) -> None:
    assert resolve_device(cfg_with(*overrides)) == torch.device(expected)


def test_an_unknown_device_is_refused_naming_the_key_and_the_accepted_values() -> None:
    with pytest.raises(
        ConfigError, match=r"policy.device.*'auto', 'cpu' or 'cuda'|policy.device.*auto.*cpu.*cuda"
    ):
        cfg_with("policy.device=gpu")


@pytest.mark.parametrize("overrides", [("cluster.gpus_per_node=1",), ("policy.device=cuda",)])
def test_gpus_asked_for_without_cuda_is_a_clear_error_before_the_model_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, overrides: tuple[str, ...]
) -> None:
    from gym_bridge.train import loop

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    loaded: list[str] = []
    monkeypatch.setattr(
        loop, "build_learner", lambda *a, **k: loaded.append("model") or (_ for _ in ()).throw(AssertionError)
    )
    cfg = cfg_with(
        *overrides, f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}", f"logger.log_dir={tmp_path / 'logs'}"
    )
    (problem,) = device_problems(cfg)
    assert "CUDA is not available" in problem and "torch.cuda.is_available() is false" in problem
    assert overrides[0].split("=")[0] in problem  # names the key that asked for the GPU
    with pytest.raises(ConfigError, match="CUDA is not available"):
        loop.train(cfg, show_progress=False)
    assert loaded == []  # refused before anything heavy started


def test_a_cpu_config_has_no_device_problems_even_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_problems(cfg_with("policy.precision=float16")) == []
    assert device_problems(cfg_with("policy.device=cpu", "policy.precision=bfloat16")) == []


def test_bfloat16_on_a_gpu_without_it_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    (problem,) = device_problems(cfg_with("cluster.gpus_per_node=1", "policy.precision=bfloat16"))
    assert "policy.precision bfloat16" in problem
    assert device_problems(cfg_with("cluster.gpus_per_node=1", "policy.precision=float16")) == []


def test_precision_sets_weights_reference_and_scaler() -> None:
    cpu = torch.device("cpu")
    assert Placement(cpu, "float32").weights_dtype == torch.float32
    assert Placement(cpu, "bfloat16").weights_dtype == torch.bfloat16
    half = Placement(cpu, "float16")
    assert half.weights_dtype == torch.float32 and half.reference_dtype == torch.float16
    assert isinstance(half.grad_scaler(), torch.amp.GradScaler)
    assert Placement(cpu, "bfloat16").grad_scaler() is None
    with half.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    assert placement_for(cfg_with("policy.precision=float16")) == half


# ---------------------------------------------------------------------------------------- a training step


class DeviceRecorder:
    """Records the device of every tensor the step touches: each argument of the loss (through a
    wrapper around the learner's loss function) and each input of every module's forward (a hook)."""

    def __init__(self, learner: Any) -> None:
        self.devices: dict[str, set[torch.device]] = {}
        loss_fn = learner.loss_fn
        original = loss_fn.loss_and_metrics

        def recording(curr: torch.Tensor, **kwargs: Any) -> Any:
            self.add("loss:curr_logprobs", curr)
            for name, value in kwargs.items():
                self.add(f"loss:{name}", value)
            loss, metrics = original(curr, **kwargs)
            self.add("loss:loss", loss)
            for name, value in metrics.items():
                self.add(f"metric:{name}", value)
            return loss, metrics

        loss_fn.loss_and_metrics = recording
        self.handles = [
            module.register_forward_pre_hook(self._forward_inputs, with_kwargs=True)
            for module in learner.model.modules()
        ]

    def add(self, name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self.devices.setdefault(name, set()).add(value.device)

    def _forward_inputs(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        for i, value in enumerate(args):
            self.add(f"forward:{type(module).__name__}:{i}", value)
        for name, value in kwargs.items():
            self.add(f"forward:{type(module).__name__}:{name}", value)


def spy_moves(monkeypatch: pytest.MonkeyPatch) -> list[torch.device]:
    """Devices every micro-batch is moved to. On a CPU-only machine every tensor is on the CPU
    whatever the code does, so the test also checks that the move happens, to the resolved device,
    for every micro-batch: drop a move and it fails here as it would on a GPU."""
    from gym_bridge.train.batches.sequences import MicroBatch

    moves: list[torch.device] = []
    original = MicroBatch.to

    def to(self: MicroBatch, device: torch.device) -> MicroBatch:
        moves.append(device)
        return original(self, device)

    monkeypatch.setattr(MicroBatch, "to", to)
    return moves


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_every_tensor_of_a_training_step_is_on_the_resolved_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model_dir: Path, lora: bool, packing: bool
) -> None:
    from gym_bridge.train.batches.sequences import per_sample_logprobs
    from gym_bridge.train.learner.update import StepBatch, update_policy
    from gym_bridge.train.setup import build_learner

    moves = spy_moves(monkeypatch)
    overrides = [
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=4",
        "loss_fn.reference_policy_kl_penalty=0.1",
        f"policy.model_name={model_dir}",
        "policy.train_global_batch_size=4",  # two optimizer steps: prev log-probs from a pass
        "policy.train_micro_batch_size=2",
        "policy.max_total_sequence_length=32",
        "policy.generation.max_new_tokens=8",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
    ]
    if lora:
        overrides.append("policy.dtensor_cfg.lora_cfg.enabled=true")
    if packing:
        overrides.append("policy.sequence_packing.enabled=true")
    cfg = cfg_with(*overrides)
    target = resolve_device(cfg)
    learner, _ = build_learner(cfg, None, rollout_process=False)
    assert learner.placement.device == target
    recorder = DeviceRecorder(learner)
    batch = StepBatch.from_samples(cfg.grpo, samples())
    batch.prev_logprobs = per_sample_logprobs(cfg, learner.model, batch.samples, learner.pad_token_id)
    with learner.reference_policy() as reference:
        batch.reference_logprobs = per_sample_logprobs(cfg, reference, batch.samples, learner.pad_token_id)
    logprob_passes = len(moves)
    metrics = update_policy(cfg, learner, batch)
    assert metrics["optimizer_steps"] == 2
    assert logprob_passes >= 2 and len(moves) - logprob_passes >= 2  # both passes' micro-batches moved
    assert set(moves) == {target}

    wanted = {
        "loss:curr_logprobs",
        "loss:prev_logprobs",
        "loss:generation_logprobs",
        "loss:advantages",
        "loss:token_mask",
        "loss:sample_mask",
        "loss:reference_logprobs",
        "loss:loss",
        "metric:loss",
    }
    assert wanted <= set(recorder.devices)
    assert any(name.startswith("forward:") and name.endswith("input_ids") for name in recorder.devices)
    stray = {name: devices for name, devices in recorder.devices.items() if devices != {target}}
    assert stray == {}
    for log_probs in (*batch.prev_logprobs, *batch.reference_logprobs):
        assert log_probs.device == target
    for name, parameter in learner.model.named_parameters():
        assert parameter.device == target, name
    if learner.reference is not None:
        assert {p.device for p in learner.reference.parameters()} == {target}
    state = [t for s in learner.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    assert state and {t.device for t in state if t.dim() > 0} == {target}


# ---------------------------------------------------------------------------------------- float16


def fp16_learner(tmp_path: Path, model_dir: Path, *extra: str) -> tuple[Any, Any]:
    from gym_bridge.train.setup import build_learner

    cfg = cfg_with(
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=4",
        "loss_fn.reference_policy_kl_penalty=0.5",
        f"policy.model_name={model_dir}",
        "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=4",
        "policy.max_total_sequence_length=32",
        "policy.generation.max_new_tokens=8",
        "policy.optimizer.kwargs.lr=1e-2",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        *extra,
    )
    learner, _ = build_learner(cfg, None, rollout_process=False)
    return cfg, learner


def step(cfg: Any, learner: Any) -> dict[str, float]:
    from gym_bridge.train.batches.sequences import per_sample_logprobs
    from gym_bridge.train.learner.update import StepBatch, update_policy

    batch = StepBatch.from_samples(cfg.grpo, samples())
    with learner.reference_policy() as reference:
        batch.reference_logprobs = per_sample_logprobs(
            cfg, reference, batch.samples, learner.pad_token_id, learner.placement.autocast
        )
    return update_policy(cfg, learner, batch)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_float16_step_on_cpu_trains_with_a_loss_scaler_close_to_float32(
    tmp_path: Path, model_dir: Path, lora: bool
) -> None:
    extra = ["policy.dtensor_cfg.lora_cfg.enabled=true"] if lora else []
    cfg32, full = fp16_learner(tmp_path / "a", model_dir, *extra)
    cfg16, half = fp16_learner(tmp_path / "b", model_dir, "policy.precision=float16", *extra)
    assert isinstance(half.scaler, torch.amp.GradScaler) and full.scaler is None
    assert {p.dtype for p in half.model.parameters()} == {torch.float32}  # master weights
    if not lora:
        assert {p.dtype for p in half.reference.parameters()} == {torch.float16}
    before = {n: p.detach().clone() for n, p in half.model.named_parameters() if p.requires_grad}
    step(cfg32, full), step(cfg16, half)
    m32, m16 = step(cfg32, full), step(cfg16, half)
    assert m16["amp_skipped_steps"] == 0 and m16["amp_loss_scale"] > 1
    assert "amp_skipped_steps" not in m32
    assert any(not torch.equal(p, before[n]) for n, p in half.model.named_parameters() if p.requires_grad)
    assert m32["kl_penalty"] > 1e-4
    # float16 has 10 mantissa bits (bf16 has 7): at least as close to float32 as the bf16 test's bounds
    assert m16["loss"] == pytest.approx(m32["loss"], rel=0.03, abs=1e-4)
    assert m16["kl_penalty"] == pytest.approx(m32["kl_penalty"], rel=0.05)
    assert m16["grad_norm"] == pytest.approx(m32["grad_norm"], rel=0.03)


def test_an_overflowing_float16_step_is_skipped_and_counted(tmp_path: Path, model_dir: Path) -> None:
    cfg, learner = fp16_learner(tmp_path, model_dir, "policy.precision=float16")
    learner.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**120)  # scaled gradients overflow float32
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    metrics = step(cfg, learner)
    assert metrics["amp_skipped_steps"] == 1 and metrics["optimizer_steps"] == 1
    assert "grad_norm" not in metrics  # no gradient was applied
    assert metrics["amp_loss_scale"] == 2.0**119  # the scaler backed off
    for name, parameter in learner.model.named_parameters():
        assert torch.equal(parameter, before[name]), name


# ---------------------------------------------------------------------------------------- vLLM (stand-in)


class StandInLLM:
    """What the trainer uses of ``vllm.LLM``, run in this process: ``collective_rpc`` calls the function
    on a worker whose model records what ``load_weights`` received."""

    built: list[dict[str, Any]] = []

    def __init__(self, model: str, **kwargs: Any) -> None:
        import os

        self.kwargs = kwargs
        self.multiprocessing = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        self.loaded: list[tuple[str, torch.Tensor]] = []
        config = type("C", (), {"max_model_len": 64, "get_vocab_size": lambda self: 300})()
        self.llm_engine = type("E", (), {"model_config": config})()
        StandInLLM.built.append({"engine": self})

    def get_tokenizer(self) -> None:
        return None

    def collective_rpc(self, function: Any) -> None:
        loaded = self.loaded
        model = type("M", (), {"load_weights": lambda self, weights: loaded.extend(weights)})()
        worker = type("W", (), {"model_runner": type("R", (), {"model": model})()})()
        function(worker)


@pytest.fixture
def stand_in_vllm(monkeypatch: pytest.MonkeyPatch) -> type[StandInLLM]:
    import sys
    import types

    fake = types.ModuleType("vllm")
    fake.LLM = StandInLLM  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    StandInLLM.built = []
    return StandInLLM


def test_a_colocated_one_gpu_engine_runs_in_process_and_is_refit_with_the_trainers_own_tensors(
    stand_in_vllm: type[StandInLLM], model_dir: Path
) -> None:
    from gym_bridge.generation.vllm_backend import VllmBackend
    from gym_bridge.models.registry import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(str(model_dir))
    backend = VllmBackend(str(model_dir), colocated=True, tensor_parallel_size=1, gpu_memory_utilization=0.3)
    engine = backend.llm
    assert engine.multiprocessing == "0" and backend.in_process  # no engine process to ship weights to
    assert engine.kwargs["gpu_memory_utilization"] == 0.3
    backend.update_weights(model)
    params = dict(model.state_dict())
    assert {name for name, _ in engine.loaded} == set(params)
    for name, tensor in engine.loaded:  # the very memory of the trainer's weights: no copy anywhere
        assert tensor.data_ptr() == params[name].data_ptr(), name


def test_an_engine_not_colocated_keeps_vllms_own_process_layout(
    stand_in_vllm: type[StandInLLM], model_dir: Path
) -> None:
    from gym_bridge.generation.vllm_backend import VllmBackend

    assert not VllmBackend(str(model_dir), tensor_parallel_size=1).in_process
    assert stand_in_vllm.built[-1]["engine"].multiprocessing is None
    assert not VllmBackend(str(model_dir), colocated=True, tensor_parallel_size=2).in_process


def test_weights_for_worker_processes_go_by_value_only_from_the_cpu() -> None:
    import pickle

    from gym_bridge.generation.vllm_backend import weight_payload

    items = [("w", torch.arange(6.0).reshape(2, 3))]
    payload = weight_payload(items, shared=True)  # CPU tensors: there is no GPU memory to map
    ((name, tensor),) = pickle.loads(pickle.dumps(payload)).tensors()
    assert name == "w" and torch.equal(tensor, items[0][1])
    assert weight_payload(items, shared=False).tensors()[0][1] is items[0][1]


@pytest.mark.parametrize(
    ("utilization", "free_gib", "fits"),
    [(0.3, 60, True), (0.7, 60, False), (0.5, 48, True), (0.5, 47, False)],
)
def test_vllms_memory_share_must_fit_beside_the_policy_and_its_training_state(
    monkeypatch: pytest.MonkeyPatch, utilization: float, free_gib: int, fits: bool
) -> None:
    from gym_bridge.generation.vllm_backend import GIB, colocation_problem

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free_gib * GIB, 80 * GIB))
    problem = colocation_problem(utilization, 8 * GIB)  # 8 GiB of gradients and AdamW state to come
    if fits:
        assert problem is None
    else:
        assert problem is not None and "policy.generation.vllm_cfg.gpu_memory_utilization" in problem
        assert f"at most {(free_gib - 8) / 80:.2f}" in problem
