"""The Ray generation backend for real: a private Ray on 127.0.0.1, replicas in actors, the trainer on top.

One Ray per module (starting it takes ~10 s on 2 cores) with 4 logical CPUs: the module's 2-replica
backend and the trainer's. Ray comes with the ``[dev]`` extra (as ``[ray]``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import ray

from gym_bridge.generation.backend import GenerationRequest, SamplingParams
from gym_bridge.generation.ray_backend import split_by_prompt
from tests.ray_loopback import listeners, loopback_ray_fixture, off_loopback
from tests.train.helpers import PARITY_SERVER, SMALL_ONLINE_RUN, write_say_prompts

ROOT = Path(__file__).resolve().parents[2]


def make_llama(tokenizer: Any, seed: int) -> Any:
    """A random LlamaForCausalLM (hidden 64, 2 layers, max 256 positions) sized to the tokenizer."""
    from gym_bridge.models.tiny import TinyRecipe, random_tiny_model

    shape = TinyRecipe(
        hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_position_embeddings=256
    )
    return random_tiny_model(tokenizer, shape, seed=seed)


local_ray = loopback_ray_fixture(num_cpus=4)


@pytest.fixture
def one_thread() -> Any:
    """Local reference runs on one torch thread, as the replicas do (thread count can move float sums)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from gym_bridge.models.tokenizer import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer: Any) -> Any:
    return make_llama(tokenizer, seed=0)


@pytest.fixture(scope="module")
def ray_backend(local_ray: Any, model: Any, tokenizer: Any) -> Any:
    from gym_bridge.generation.ray_backend import RayBackend

    backend = RayBackend(model, tokenizer, seed=7, num_workers=2)
    yield backend
    backend.close()


def grpo_batch(tokenizer: Any, prompts: int = 6, group: int = 4) -> list[GenerationRequest]:
    """GRPO-shaped requests: each prompt ``group`` times; seeded and unseeded rows, mixed sampling."""
    requests = []
    for i in range(prompts):
        ids = tokenizer.encode(f"What is {i} + {i + 1}?")
        for g in range(group):
            params = SamplingParams(
                max_new_tokens=4 + (i + g) % 5,
                temperature=[1.0, 0.7, 0.0][g % 3],
                top_k=5 if i % 2 else 0,
                seed=None if g == 1 else 1000 * i + g,
            )
            requests.append(GenerationRequest(ids, params))
    return requests


def outputs(results: list[Any]) -> list[tuple[Any, ...]]:
    return [(r.prompt_token_ids, r.token_ids, r.logprobs, r.finish_reason, r.text) for r in results]


def assert_same_samples(results: list[Any], expected: list[Any]) -> None:
    """Same tokens, text and finish reasons; log-probs equal up to float noise from batch shapes
    (a replica decodes its share, padded to that share's longest prompt)."""
    assert [(r.prompt_token_ids, r.token_ids, r.finish_reason, r.text) for r in results] == [
        (r.prompt_token_ids, r.token_ids, r.finish_reason, r.text) for r in expected
    ]
    for result, reference in zip(results, expected, strict=True):
        assert result.logprobs == pytest.approx(reference.logprobs, abs=1e-5)


# ------------------------------------------------------------------------------- the split


def test_split_keeps_identical_prompts_together_and_balances_rows() -> None:
    requests = [GenerationRequest([p]) for p in [1, 2, 1, 3, 2, 1, 4, 4, 3, 2, 1, 5]]
    shares = split_by_prompt(requests, 2)
    assert sorted(i for share in shares for i in share) == list(range(len(requests)))
    assert all(share == sorted(share) for share in shares)
    prompt_share = {}
    for s, share in enumerate(shares):
        for i in share:
            assert prompt_share.setdefault(requests[i].prompt_token_ids[0], s) == s
    assert [len(share) for share in shares] == [6, 6]  # groups 4,3,2,2,1 -> {4,2} and {3,2,1}
    assert split_by_prompt(requests, 1) == [list(range(len(requests)))]
    assert split_by_prompt(requests[:1], 3) == [[0], [], []]
    with pytest.raises(ValueError):
        split_by_prompt(requests, 0)


def test_weights_travel_as_numpy_and_come_back_exact_in_every_dtype() -> None:
    import numpy as np
    import torch

    from gym_bridge.generation.ray_backend import _pack, _unpack

    state = {
        "bf16": torch.randn(3, 4).to(torch.bfloat16),
        "bf16_scalar": torch.tensor(1.5, dtype=torch.bfloat16),
        "fp16": torch.randn(2, 2).half(),
        "fp32": torch.randn(5),
        "int64": torch.arange(4),
        "strided": torch.randn(4, 6)[:, ::2],
    }
    packed = _pack(state)
    assert all(isinstance(array, np.ndarray) for array, _ in packed.values())
    unpacked = _unpack(packed)
    for name, tensor in state.items():
        assert unpacked[name].dtype == tensor.dtype and torch.equal(unpacked[name], tensor), name


# ------------------------------------------------------------------------------- replicas vs local


def test_replicas_return_what_a_local_backend_samples(
    ray_backend: Any, model: Any, tokenizer: Any, one_thread: None
) -> None:
    from gym_bridge.generation.transformers_backend import TransformersBackend

    requests = grpo_batch(tokenizer)
    before = [ray.get(r.served.remote()) for r in ray_backend.replicas]
    results = ray_backend.generate(requests)
    local = TransformersBackend(model, tokenizer, seed=7).generate(requests)
    assert_same_samples(results, local)  # unseeded rows too: seeds are drawn as the local backend does
    assert [r.prompt_token_ids for r in results] == [r.prompt_token_ids for r in requests]
    assert all(r.params.seed is None for r in requests[1::4])  # the caller's requests are left alone

    # The batch was split: both replicas worked, and each prompt's group went to one replica whole.
    served = [ray.get(r.served.remote()) for r in ray_backend.replicas]
    new = [
        {p: n - old.get(p, 0) for p, n in now.items() if n > old.get(p, 0)}
        for now, old in zip(served, before, strict=True)
    ]
    assert all(new) and not set(new[0]) & set(new[1])
    assert sorted(n for share in new for n in share.values()) == [4] * 6

    # The next call continues the seed stream for unseeded rows exactly as the local backend does.
    again_local = TransformersBackend(model, tokenizer, seed=7)
    again_local.generate(requests)
    assert_same_samples(ray_backend.generate(requests), again_local.generate(requests))


def test_each_replica_is_bit_identical_to_a_local_backend_on_its_share(
    ray_backend: Any, model: Any, tokenizer: Any, one_thread: None
) -> None:
    from gym_bridge.generation.transformers_backend import TransformersBackend

    requests = grpo_batch(tokenizer)
    for r in requests:
        r.params.seed = 5 if r.params.seed is None else r.params.seed
    results = ray_backend.generate(requests)
    local = TransformersBackend(model, tokenizer)
    for share in split_by_prompt(requests, 2):
        assert outputs([results[i] for i in share]) == outputs(local.generate([requests[i] for i in share]))


def test_update_weights_refits_every_replica(
    ray_backend: Any, model: Any, tokenizer: Any, one_thread: None
) -> None:
    from gym_bridge.generation.transformers_backend import TransformersBackend

    new = make_llama(tokenizer, seed=2)
    requests = grpo_batch(tokenizer, prompts=4, group=2)
    for r in requests:
        r.params.seed = 5 if r.params.seed is None else r.params.seed
    before = ray_backend.generate(requests)
    try:
        ray_backend.update_weights(new)  # a model ...
        after = ray_backend.generate(requests)
        assert_same_samples(after, TransformersBackend(new, tokenizer).generate(requests))
        assert [r.logprobs for r in after] != [r.logprobs for r in before]
    finally:
        ray_backend.update_weights(model.state_dict())  # ... or a state_dict
    assert outputs(ray_backend.generate(requests)) == outputs(before)


def test_precision_makes_bfloat16_replicas_that_sample_as_a_local_bfloat16_copy(
    local_ray: Any, ray_backend: Any, model: Any, tokenizer: Any, one_thread: None
) -> None:
    """``policy.generation.precision`` for the ray backend: replicas in that dtype, refit by casting."""
    import torch

    from gym_bridge.generation.ray_backend import RayBackend
    from gym_bridge.generation.transformers_backend import TransformersBackend

    requests = grpo_batch(tokenizer, prompts=4, group=2)
    for r in requests:
        r.params.seed = 5 if r.params.seed is None else r.params.seed
    backend = RayBackend(model, tokenizer, num_workers=1, precision="bfloat16")
    try:
        replica = backend.replicas[0]
        assert ray.get(replica.dtype.remote()) == "bfloat16"
        got = backend.generate(requests)
        assert outputs(got) == outputs(TransformersBackend(model, tokenizer, precision="bfloat16").generate(requests))
        assert [r.logprobs for r in got] != [r.logprobs for r in ray_backend.generate(requests)]  # not float32's
        new = make_llama(tokenizer, seed=2)
        backend.update_weights(new)
        assert outputs(backend.generate(requests)) == outputs(
            TransformersBackend(new, tokenizer, precision="bfloat16").generate(requests)
        )
        assert all(p.dtype == torch.float32 for p in new.parameters())
    finally:
        backend.close()


def test_bad_requests_raise_the_replicas_error(ray_backend: Any) -> None:
    assert ray_backend.generate([]) == []
    with pytest.raises(ValueError, match="prompt_token_ids must be in"):
        ray_backend.generate([GenerationRequest([ray_backend.vocab_size + 5])])


def test_too_many_replicas_for_the_running_ray_is_a_clear_error(
    local_ray: Any, model: Any, tokenizer: Any
) -> None:
    from gym_bridge.generation.ray_backend import RayBackend

    with pytest.raises(ValueError, match="need 6 Ray CPUs"):
        RayBackend(model, tokenizer, num_workers=3, threads_per_worker=2)
    assert ray.is_initialized()  # a Ray this backend did not start stays up


# ------------------------------------------------------------------------------- loopback only


def test_every_ray_socket_is_on_loopback(ray_backend: Any) -> None:
    ray_backend.generate(grpo_batch(ray_backend.tokenizer, prompts=2, group=2))  # everything is up
    found = listeners()
    names = {name for name, *_ in found}
    assert {"gcs_server", "raylet"} <= names, found  # the check does see Ray's servers
    assert sum(1 for name, *_ in found if name.startswith("ray::Generation")) >= 2, found
    assert off_loopback(found) == [], f"Ray sockets bound off loopback: {off_loopback(found)}"
    assert ray.util.get_node_ip_address() == "127.0.0.1"


def test_is_loopback() -> None:
    from gym_bridge.distributed.ray_local import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("192.0.2.2")


# ------------------------------------------------------------------------------- Ray is optional


def test_missing_ray_is_a_clear_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, model: Any, tokenizer: Any
) -> None:
    from gym_bridge.generation import load_backend
    from gym_bridge.generation.ray_backend import RayBackend, RayUnavailableError

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(RayUnavailableError, match=r"gym-bridge\[ray\]"):
        RayBackend(model, tokenizer)
    with pytest.raises(ImportError, match=r"gym-bridge\[ray\]"):
        load_backend("no-such-model-is-loaded", kind="ray")


def test_train_without_ray_is_a_plain_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer: Any
) -> None:
    from typer.testing import CliRunner

    from gym_bridge.cli import app

    model_dir = tmp_path / "model"
    make_llama(tokenizer, seed=3).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    monkeypatch.chdir(ROOT)  # the recipe's data paths are relative to the repository
    monkeypatch.setitem(sys.modules, "ray", None)
    args = ["train", "--config", "recipes/grpo_math_tiny.yaml", "--quiet", "policy.generation.backend=ray"]
    args += [
        f"policy.model_name={model_dir}",
        f"logger.log_dir={tmp_path / 'logs'}",
        "checkpointing.enabled=false",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "gym-bridge[ray]" in result.output and "Traceback" not in result.output


def test_gym_bridge_imports_without_ray() -> None:
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import gym_bridge, gym_bridge.cli, gym_bridge.generation, gym_bridge.generation.ray_backend\n"
        "from gym_bridge.train.config import load_config\n"
        "cfg = load_config('recipes/grpo_math_tiny.yaml', ['policy.generation.backend=ray', "
        "'policy.generation.ray.num_workers=3'])\n"
        "assert cfg.policy.generation.ray.num_workers == 3\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# ------------------------------------------------------------------------------- the trainer on Ray


def _train(tmp_path: Path, model_dir: Path, backend: str, *extra: str) -> list[dict[str, Any]]:
    from gym_bridge.train.bookkeeping.logging import read_metrics
    from gym_bridge.train.config import load_config
    from gym_bridge.train.loop import train

    rows = write_say_prompts(tmp_path / "parity.jsonl", 16)
    run = tmp_path / backend
    cfg = load_config(
        None,
        [
            *SMALL_ONLINE_RUN,
            "grpo.max_num_steps=3",
            "grpo.val_period=0",
            "grpo.val_at_start=false",
            "grpo.val_at_end=true",
            "grpo.max_val_samples=8",
            f"policy.model_name={model_dir}",
            "policy.train_micro_batch_size=16",
            f"policy.generation.backend={backend}",
            "policy.generation.ray.num_workers=2",
            f"data.train.data_path={rows}",
            "data.train.env_name=parity",
            f"data.validation.data_path={ROOT / 'recipes/data/arith_val.jsonl'}",
            "data.validation.env_name=math",
            "env.math.server=math",
            f"env.parity.server={PARITY_SERVER}",
            "checkpointing.enabled=false",
            f"logger.log_dir={run / 'logs'}",
            "logger.tensorboard_enabled=false",
            *extra,
        ],
    )
    train(cfg, show_progress=False)
    return read_metrics(run / "logs")


@pytest.fixture
def ray_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts RayBackend.generate / update_weights calls: proof the trainer did use the replicas."""
    from gym_bridge.generation.ray_backend import RayBackend

    calls = {"generate": 0, "update_weights": 0}
    for name in calls:
        original = getattr(RayBackend, name)

        def counted(self: Any, *args: Any, _name: str = name, _original: Any = original) -> Any:
            calls[_name] += 1
            return _original(self, *args)

        monkeypatch.setattr(RayBackend, name, counted)
    return calls


@pytest.fixture
def model_dir(tmp_path: Path, tokenizer: Any) -> Path:
    path = tmp_path / "model"
    make_llama(tokenizer, seed=3).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.timeout(300)
def test_trainer_on_ray_replicas_is_the_same_run_as_in_process(
    local_ray: Any, tmp_path: Path, model_dir: Path, ray_calls: dict[str, int]
) -> None:
    on_ray = _train(tmp_path, model_dir, "ray")
    assert ray_calls["generate"] >= 3 and ray_calls["update_weights"] == 3  # one refit per step
    in_process = _train(tmp_path, model_dir, "transformers")

    steps = [r for r in on_ray if r["split"] == "train"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert any(r["grad_norm"] > 0 for r in steps)  # the weights moved, so refits mattered
    # Every step sampled from the weights the trainer had just produced: the trainer's log-probs of the
    # served tokens are the replicas' (a missed refit makes steps 2-3 off-policy at lr 3e-2).
    assert all(r["gen_kl_error"] < 1e-4 for r in steps)
    keys = ("reward_mean", "loss", "grad_norm", "gen_length_mean", "gen_kl_error")
    assert [r[k] for r in steps for k in keys] == pytest.approx(
        [r[k] for r in in_process if r["split"] == "train" for k in keys], rel=1e-5, abs=1e-7
    )
    assert [r["accuracy"] for r in on_ray if r["split"] == "val"] == [
        r["accuracy"] for r in in_process if r["split"] == "val"
    ]


@pytest.mark.timeout(300)
def test_async_grpo_on_ray_replicas_is_the_same_run_as_in_process(
    local_ray: Any, tmp_path: Path, model_dir: Path, ray_calls: dict[str, int]
) -> None:
    async_grpo = ("grpo.async_grpo.enabled=true", "grpo.async_grpo.max_trajectory_age_steps=1")
    on_ray = _train(tmp_path, model_dir, "ray", *async_grpo)
    # The replicas sampled (no rollout process took over) and were refit with each weight version.
    assert ray_calls["generate"] >= 3 and ray_calls["update_weights"] >= 3
    in_process = _train(
        tmp_path, model_dir, "transformers", *async_grpo, "grpo.async_grpo.rollout_process=false"
    )

    steps = [r for r in on_ray if r["split"] == "train"]
    assert [r["trajectory_age_steps"] for r in steps] == [0.0, 1.0, 1.0]
    assert steps[0]["gen_kl_error"] < 1e-4 and all(r["gen_kl_error"] > 1e-4 for r in steps[1:])
    keys = ("reward_mean", "loss", "grad_norm", "gen_kl_error")
    assert [r[k] for r in steps for k in keys] == pytest.approx(
        [r[k] for r in in_process if r["split"] == "train" for k in keys], rel=1e-5, abs=1e-7
    )


def test_backend_stop_token_ids_reach_the_replicas(
    local_ray: Any, model: Any, tokenizer: Any, one_thread: None
) -> None:
    """``policy.generation.stop_token_ids`` on the Ray backend: replicas cut where a local backend does."""
    from gym_bridge.generation.ray_backend import RayBackend
    from gym_bridge.generation.transformers_backend import TransformersBackend

    prompt = tokenizer.encode("What is 3 + 4?")
    request = GenerationRequest(prompt, SamplingParams(max_new_tokens=16, temperature=1.0, seed=11))
    free = TransformersBackend(model, tokenizer, seed=7).generate([request])[0]
    stop = free.token_ids[len(free.token_ids) // 2]
    expected = TransformersBackend(model, tokenizer, seed=7, stop_token_ids=[stop]).generate([request])
    assert len(expected[0].token_ids) < len(free.token_ids) and expected[0].token_ids[-1] == stop
    backend = RayBackend(model, tokenizer, seed=7, num_workers=1, stop_token_ids=[stop])
    try:
        assert_same_samples(backend.generate([request]), expected)
    finally:
        backend.close()
