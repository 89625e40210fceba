"""Keys that used to be accepted and ignored now do what they say, or are refused naming the key:
``env.<name>.timeout_s`` and ``env.<name>.num_workers``, ``logger.wandb_enabled``,
``logger.monitor_gpus``, ``policy.generation.stop_token_ids`` and ``cluster.gpus_per_node``."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import httpx
import pytest

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.server import ResourcesServer, Session
from gym_bridge.train.bookkeeping.gpu_monitor import GpuMonitor, open_gpu_monitor
from gym_bridge.train.bookkeeping.logging import open_metrics_logger, read_metrics
from gym_bridge.train.bookkeeping.preflight import machine_problems
from gym_bridge.train.config import ConfigError, load_config
from tests.train.helpers import SMALL_ONLINE_RUN, save_random_tiny, write_say_prompts

ROOT = Path(__file__).resolve().parents[2]


class SlowServer(ResourcesServer):
    """Scores every completion 1.0, after ``delay`` seconds (a slow verifier)."""

    name = "slow"
    delay = 1.0

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        await asyncio.sleep(self.delay)
        return VerifyResponse(**dump(body), reward=1.0)


SLOW_SERVER = f"{__name__}:SlowServer"


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_tiny(tmp_path_factory.mktemp("tiny_random_keys"), seed=2)


def online(tmp_path: Path, model_dir: Path, *extra: str) -> Any:
    tmp_path.mkdir(parents=True, exist_ok=True)
    rows = write_say_prompts(tmp_path / "say.jsonl", 8)
    return load_config(
        None,
        [
            *SMALL_ONLINE_RUN,
            "grpo.max_num_steps=2",
            "grpo.val_period=0",
            f"policy.model_name={model_dir}",
            "policy.train_micro_batch_size=16",
            f"data.train.data_path={rows}",
            "data.train.env_name=say",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            "checkpointing.enabled=false",
            f"logger.log_dir={tmp_path / 'logs'}",
            *extra,
        ],
    )


# ---------------------------------------------------------------------------------------- env.timeout_s


@pytest.mark.timeout(300)
def test_env_timeout_bounds_each_request_to_that_environment(tmp_path: Path, tiny_model_dir: Path) -> None:
    from gym_bridge.generation.transformers_backend import TransformersBackend
    from gym_bridge.models.registry import load_model_and_tokenizer
    from gym_bridge.train.samplers.data import load_prompts
    from gym_bridge.train.samplers.sampling import OnlineSampler

    model, tokenizer = load_model_and_tokenizer(str(tiny_model_dir))
    results = {}
    for timeout in (0.2, 10.0):
        cfg = online(tmp_path / str(timeout), tiny_model_dir, f"env.say.server={SLOW_SERVER}", f"env.say.timeout_s={timeout}")
        prompts = load_prompts(cfg.data, "train")[0][:1]
        sampler = OnlineSampler(cfg, TransformersBackend(model, tokenizer), tokenizer)
        try:
            results[timeout] = sampler.sample(prompts, [[1]])[0]
        except RuntimeError as exc:
            results[timeout] = exc
        finally:
            sampler.close()
    assert isinstance(results[0.2], RuntimeError) and "timeout" in str(results[0.2])
    assert results[10.0][0].reward == 1.0


@pytest.mark.timeout(300)
def test_trainer_applies_env_timeout(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = online(tmp_path, tiny_model_dir, f"env.say.server={SLOW_SERVER}", "env.say.timeout_s=0.2")
    from gym_bridge.train.loop import train

    with pytest.raises(RuntimeError, match=r"16 of 16 rollouts failed .*16 x verify/env_timeout; e.g. .*within 0.2 s"):
        train(cfg, show_progress=False)


# ---------------------------------------------------------------------------------------- env.num_workers


def test_num_workers_sizes_the_math_servers_verifier_pool() -> None:
    from gym_bridge.rollout.envs import running_env

    sizes = {}
    for workers in (None, 3):
        with running_env("math", workers=workers) as url:
            sizes[workers] = httpx.get(f"{url}/health").json()["verifier_pool"]["size"]
    assert sizes[3] == 3
    assert sizes[None] != 3  # the server's own default (one per core on this machine)


def test_num_workers_sizes_the_code_servers_sandboxes() -> None:
    from gym_bridge.rollout.envs import load_server_class, workers_setting

    assert workers_setting("code") == "max_concurrency"
    assert load_server_class("code")  # importable: the trainer builds it with max_concurrency=num_workers


def test_num_workers_is_refused_where_there_is_no_pool() -> None:
    tool_use = load_config(
        None, ["data.train.data_path=a.jsonl", "data.default.env_name=t", "env.t.server=tool_use", "env.t.num_workers=2"]
    )
    assert machine_problems(tool_use) == ["env.t.num_workers: environment 'tool_use' has no worker pool to size"]
    with pytest.raises(ConfigError, match=r"env\.r\.num_workers sizes a built-in server's worker pool"):
        load_config(
            None,
            ["data.train.data_path=a.jsonl", "data.default.env_name=r", "env.r.url=http://127.0.0.1:9", "env.r.num_workers=2"],
        )


# ---------------------------------------------------------------------------------------- env.replicas


def test_env_replicas_keys_are_refused_where_they_cannot_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from gym_bridge.train.samplers.env_replicas import private_ray_cpus

    base = ["data.train.data_path=a.jsonl", "data.default.env_name=m"]
    with pytest.raises(ConfigError, match=r"env\.m: replicas start copies of a built-in server: unset url"):
        load_config(None, [*base, "env.m.url=http://127.0.0.1:9", "env.m.replicas=2"])
    with pytest.raises(ConfigError, match=r"env\.m: placement_strategy places the env's Ray replicas: set replicas"):
        load_config(None, [*base, "env.m.server=math", "env.m.placement_strategy=PACK"])
    with pytest.raises(ConfigError, match=r"env\.m\.placement_strategy"):
        load_config(None, [*base, "env.m.replicas=2", "env.m.placement_strategy=EVERYWHERE"])
    replicated = [*base, "env.m.server=math", "env.m.replicas=3", "env.m.num_workers=2"]
    cfg = load_config(None, [*replicated, "cluster.ray_address=127.0.0.1:6379"])  # replicas alone use Ray
    assert private_ray_cpus(cfg) == 3 * 2 and machine_problems(cfg) == []
    generating = load_config(None, [*replicated, "policy.generation.backend=ray", "policy.generation.ray.num_workers=2"])
    assert private_ray_cpus(generating) == 3 * 2 + 2  # a private Ray is sized for replicas and generation
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "ray" else object())  # no Ray
    assert machine_problems(cfg) == ["env.m.replicas runs the env's replicas on Ray: pip install 'gym-bridge[ray]' "
                                     "(or pip install ray)"]  # fmt: skip


def test_the_tiny_recipes_num_workers_reaches_the_math_server() -> None:
    cfg = load_config(ROOT / "recipes/grpo_math_tiny.yaml")
    assert cfg.env["math"].num_workers == 4
    assert machine_problems(cfg) == []


# ---------------------------------------------------------------------------------------- stop_token_ids


ROLLOUT_PROCESS = [
    "grpo.async_grpo.enabled=true",
    "grpo.async_grpo.rollout_process=true",
    "loss_fn.use_importance_sampling_correction=true",
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["in_process", "rollout_process"])
def test_stop_token_ids_end_every_training_completion(tmp_path: Path, tiny_model_dir: Path, where: str) -> None:
    """Every id a stop token: each completion is one token long (max_new_tokens is 6), whether the
    trainer samples itself or async GRPO's rollout process does."""
    from gym_bridge.train.loop import train
    from tests.train.helpers import PARITY_SERVER

    every_id = "[" + ",".join(str(i) for i in range(406)) + "]"
    mode = ROLLOUT_PROCESS if where == "rollout_process" else []
    runs = {}
    for name, extra in {"free": [], "stopped": [f"policy.generation.stop_token_ids={every_id}"]}.items():
        cfg = online(tmp_path / name, tiny_model_dir, f"env.say.server={PARITY_SERVER}", *mode, *extra)
        train(cfg, show_progress=False)
        runs[name] = [r for r in read_metrics(tmp_path / name / "logs") if r["split"] == "train"]
    assert all(r["gen_length_max"] == 1 and r["truncation_rate"] == 0 for r in runs["stopped"])
    assert max(r["gen_length_max"] for r in runs["free"]) > 1


# ---------------------------------------------------------------------------------------- logger.wandb_enabled


def test_wandb_receives_every_record_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_config(
        None,
        [
            "data.train.data_path=a.jsonl",
            "grpo.mode=offline",
            "logger.wandb_enabled=true",
            "logger.wandb.project=keys-test",
            "logger.wandb.name=run-a",
            f"logger.log_dir={tmp_path}",
        ],
    )
    logger = open_metrics_logger(cfg)
    run = logger.wandb_run
    assert run.project == "keys-test" and run.name == "run-a"
    assert run.config["grpo"]["mode"] == "offline"
    logger.log(1, {"reward_mean": 0.25, "loss": 1.5})
    logger.log(2, {"reward_mean": 0.75, "loss": 1.0})
    logger.log(2, {"accuracy": 0.5}, split="val")
    logger.log(3, {"reward_mean": 0.5, "loss": 0.5})  # W&B commits a step's row when the next begins
    assert run.summary["train/reward_mean"] == 0.75 and run.summary["val/accuracy"] == 0.5
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    logger.close()
    (written,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    deadline = time.monotonic() + 30  # W&B's service process writes the file behind the run
    while b"val/accuracy" not in written.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    data = written.read_bytes()
    assert b"train/reward_mean" in data and b"val/accuracy" in data and b"keys-test" in data

    resumed = open_metrics_logger(cfg, resume_step=2)  # a resumed run continues the same W&B run
    assert resumed.wandb_run.id == run_id
    resumed.close()


def test_wandb_missing_is_refused_with_the_install_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "wandb" else object())
    cfg = load_config(None, ["data.train.data_path=a.jsonl", "grpo.mode=offline", "logger.wandb_enabled=true", f"logger.log_dir={tmp_path}"])
    hint = r"logger\.wandb_enabled needs the wandb package: pip install 'gym-bridge\[wandb\]'"
    assert any("logger.wandb_enabled" in p and "gym-bridge[wandb]" in p for p in machine_problems(cfg))
    with pytest.raises(ConfigError, match=hint):
        open_metrics_logger(cfg)


# ---------------------------------------------------------------------------------------- logger.monitor_gpus


def fake_nvml(utilizations: list[int], used_mb: list[int], devices: int = 1) -> types.ModuleType:
    """A stand-in for ``pynvml`` whose devices report the given readings in turn."""
    nvml = types.ModuleType("pynvml")
    state = {"calls": 0, "init": 0, "shutdown": 0}

    def reading() -> int:
        return min(state["calls"] // devices, len(utilizations) - 1)

    def utilization(handle: int) -> Any:
        value = types.SimpleNamespace(gpu=utilizations[reading()], memory=0)
        return value

    def memory(handle: int) -> Any:
        value = types.SimpleNamespace(used=used_mb[reading()] * 2**20, total=16_000 * 2**20)
        state["calls"] += 1
        return value

    nvml.nvmlInit = lambda: state.__setitem__("init", state["init"] + 1)
    nvml.nvmlShutdown = lambda: state.__setitem__("shutdown", state["shutdown"] + 1)
    nvml.nvmlDeviceGetCount = lambda: devices
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetUtilizationRates = utilization
    nvml.nvmlDeviceGetMemoryInfo = memory
    nvml.state = state
    return nvml


def test_gpu_monitor_reports_mean_utilisation_and_peak_memory_between_reads() -> None:
    nvml = fake_nvml([10, 50, 90, 30], [100, 400, 200, 50])
    monitor = GpuMonitor(nvml, start=False)
    monitor.poll()
    monitor.poll()
    monitor.poll()
    first = monitor.read()
    assert first == {"gpu0/utilization_pct": 50.0, "gpu0/memory_used_mb": 400.0, "gpu0/memory_total_mb": 16000.0}
    second = monitor.read()  # nothing polled since: a fresh reading
    assert second["gpu0/utilization_pct"] == 30.0 and second["gpu0/memory_used_mb"] == 50.0
    monitor.close()
    assert nvml.state["init"] == 1 and nvml.state["shutdown"] == 1


def test_monitor_gpus_on_this_cpu_machine_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"logger\.monitor_gpus: no NVIDIA GPU to monitor on this machine"):
        open_gpu_monitor()
    cfg = load_config(None, ["data.train.data_path=a.jsonl", "grpo.mode=offline", "logger.monitor_gpus=true"])
    assert any(p.startswith("logger.monitor_gpus: no NVIDIA GPU") for p in machine_problems(cfg))


@pytest.mark.timeout(300)
def test_monitor_gpus_adds_gpu_readings_to_every_train_record(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gym_bridge.train.loop import train
    from tests.train.helpers import PARITY_SERVER

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([40, 60], [1000, 1200], devices=2))
    cfg = online(tmp_path, tiny_model_dir, f"env.say.server={PARITY_SERVER}", "logger.monitor_gpus=true")
    train(cfg, show_progress=False)
    records = [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]
    assert len(records) == 2
    for record in records:
        for device in (0, 1):
            assert 40 <= record[f"gpu{device}/utilization_pct"] <= 60
            assert record[f"gpu{device}/memory_total_mb"] == 16000.0


# ---------------------------------------------------------------------------------------- cluster.gpus_per_node


def test_gpus_that_torch_cannot_see_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    cfg = load_config(None, ["data.train.data_path=a.jsonl", "grpo.mode=offline", "cluster.gpus_per_node=2"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # one GPU where two are asked for
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert "cluster.gpus_per_node is 2 but torch sees 1 CUDA device(s) here" in machine_problems(cfg)


# ---------------------------------------------------------------------------------------- logger.num_rollout_groups_to_log


@pytest.mark.timeout(300)
def test_rollout_groups_to_log_writes_whole_groups_with_their_advantages(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Each step's first N groups land whole in <log_dir>/rollouts/step_NNNNNN.jsonl; 0 writes none."""
    from gym_bridge.train.bookkeeping.sample_log import list_sample_files
    from gym_bridge.train.loop import train
    from tests.train.helpers import PARITY_SERVER

    cfg = online(tmp_path / "one", tiny_model_dir, f"env.say.server={PARITY_SERVER}", "logger.num_rollout_groups_to_log=1")
    train(cfg, show_progress=False)
    files = list_sample_files(tmp_path / "one" / "logs")
    assert [step for step, _ in files] == [1, 2]
    group_size = cfg.grpo.num_generations_per_prompt
    for step, path in files:
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(lines) == group_size and {line["_gb_group"] for line in lines} == {lines[0]["_gb_group"]}
        assert all(line["_gb_step"] == step and "response" in line for line in lines)
        rewards = [line["reward"] for line in lines]
        mean = sum(rewards) / len(rewards)
        for line, reward in zip(lines, rewards, strict=True):  # the advantage has the sign of reward - mean
            assert (line["advantage"] > 0) == (reward > mean) and (line["advantage"] < 0) == (reward < mean)

    off = online(tmp_path / "off", tiny_model_dir, f"env.say.server={PARITY_SERVER}", "logger.num_rollout_groups_to_log=0")
    train(off, show_progress=False)
    assert list_sample_files(tmp_path / "off" / "logs") == []
