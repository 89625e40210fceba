"""``env.<name>.replicas`` on a simulated 2-node Ray cluster on 127.0.0.1 (``ray.cluster_utils.Cluster``).

The env is tool_use, whose state (each rollout's store) lives in the session of the replica that
seeded it; the policy is :class:`~tests.train.shopper.Shopper`, which makes the right tool call, so a
rollout scores 1 only when its tool call and ``/verify`` reach the replica holding its session.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from gym_bridge.models.tokenizer import build_tokenizer
from gym_bridge.train.config import load_config
from gym_bridge.train.samplers.data import load_prompts
from gym_bridge.train.samplers.rollout_failures import TooManyFailedRollouts
from tests.ray_loopback import listeners, off_loopback, two_node_cluster_fixture
from tests.train.helpers import SMALL_ONLINE_RUN, save_random_tiny
from tests.train.shopper import Shopper, write_shop_rows

ray = pytest.importorskip("ray")

two_nodes = two_node_cluster_fixture()


def shop_config(tmp_path: Path, address: str, *extra: str) -> Any:
    rows = write_shop_rows(tmp_path / "shop.jsonl", 8)
    return load_config(
        None,
        [*SMALL_ONLINE_RUN, "policy.max_total_sequence_length=512", "policy.generation.max_new_tokens=64",
         "grpo.max_rollout_turns=2", "grpo.num_generations_per_prompt=2", "policy.train_global_batch_size=8",
         f"data.train.data_path={rows}",
         "data.train.env_name=shop", "env.shop.server=tool_use", "env.shop.replicas=2", "env.shop.timeout_s=5",
         f"cluster.ray_address={address}", *extra],
    )  # fmt: skip


def health(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
        return json.loads(answer.read())


def gone(pid: int, timeout: float = 30.0) -> bool:
    import psutil

    deadline = time.monotonic() + timeout
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.timeout(300)
def test_sessions_spread_over_replicas_on_two_nodes_and_each_stays_on_its_own(
    tmp_path: Path, two_nodes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gym_bridge.rollout import agent
    from gym_bridge.train.samplers.env_replicas import start_env_replicas
    from gym_bridge.train.samplers.sampling import OnlineSampler

    cfg = shop_config(tmp_path, two_nodes.address, "policy.model_name=tiny")
    tokenizer = build_tokenizer()
    prompts = load_prompts(cfg.data, "train")[0]
    seeds = [[10 * i + g for g in range(2)] for i in range(len(prompts))]  # 8 prompts x 2: 16 rollouts
    with ExitStack() as stack:
        (replicas,) = start_env_replicas(cfg, stack).values()
        two_nodes.started.update(w["pid"] for w in replicas.where)
        endpoints = replicas.endpoints()
        sampler = OnlineSampler(cfg, Shopper(tokenizer), tokenizer, replicas={"shop": endpoints})
        stack.callback(sampler.close)
        samples, stats = sampler.sample(prompts, seeds)
        found = listeners()
        sessions = [health(url)["sessions"] for url in endpoints.urls]
        with pytest.raises(urllib.error.HTTPError) as refused:  # the replicas want the run's token
            urllib.request.urlopen(
                urllib.request.Request(
                    f"{endpoints.urls[0]}/seed_session", b"{}", headers={"content-type": "application/json"}
                ),
                timeout=10,
            )

        # The control: a router that seeds on one replica and sends the rest of the session to the other.
        seed_on_a_replica = agent._seed_on_a_replica

        async def misrouted(client: Any, router: Any, env: Any, task: Any) -> Any:
            replica = await seed_on_a_replica(client, router, env, task)
            other = router.replicas[1 - replica.index]
            router.end_session(replica)
            other.open += 1
            env.url = other.url  # every later request of the session goes to the other replica
            return other

        monkeypatch.setattr(agent, "_seed_on_a_replica", misrouted)
        with pytest.raises(TooManyFailedRollouts) as misrouted_run:
            sampler.sample(prompts, seeds)
        monkeypatch.undo()
    assert not ray.is_initialized()  # the replicas' start joined the cluster, so it disconnected

    assert stats["rollout_failures"] == 0 and stats["env_replicas_lost"] == 0
    assert len(samples) == 16 and all(s.reward == 1.0 and s.turns == 2 for s in samples)
    assert all(s.record["state_diff"] == [] and s.record["tool_calls_made"] == 1 for s in samples)
    assert sessions == [8, 8]  # spread over both, and no request of a session opened one elsewhere
    # what a broken stickiness meets: the other replica never had the session, so /verify refuses it (409)
    # rather than score the work as undone
    assert "16 of 16 rollouts failed" in str(misrouted_run.value), misrouted_run.value
    assert "409" in str(misrouted_run.value) and "session is gone" in str(misrouted_run.value)

    nodes = {n["NodeID"] for n in two_nodes.global_state.node_table() if n["Alive"]}
    assert {w["node_id"] for w in replicas.where} == nodes  # SPREAD: one replica per node
    assert all(url.startswith("http://127.0.0.1:") for url in endpoints.urls)
    assert refused.value.code == 401
    names = {name for name, *_ in found}
    assert "ray::EnvReplica" in names and {"raylet", "gcs_server"} <= names, found
    assert sum(name == "ray::EnvReplica" for name, *_ in found) >= 2, found  # both replicas' servers
    assert off_loopback(found) == [], f"sockets bound off loopback: {off_loopback(found)}"
    assert all(gone(w["pid"]) for w in replicas.where)  # closed with the run


@pytest.mark.timeout(300)
def test_a_replica_killed_mid_run_loses_no_step_and_with_none_left_the_run_stops_naming_it(
    tmp_path: Path, two_nodes: Any, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from gym_bridge.train import loop, setup
    from gym_bridge.train.bookkeeping.logging import read_metrics
    from gym_bridge.train.samplers.rollout_failures import TooManyFailedRollouts

    model_dir = save_random_tiny(tmp_path / "tiny", seed=4)
    cfg = shop_config(
        tmp_path, two_nodes.address, f"policy.model_name={model_dir}", "grpo.max_num_steps=3", "grpo.val_period=0",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        "checkpointing.save_period=1", f"logger.log_dir={tmp_path / 'logs'}", "logger.tensorboard_enabled=false",
    )  # fmt: skip
    started: list[Any] = []
    start_env_replicas, save_checkpoint = setup.start_env_replicas, loop.save_checkpoint

    def recorded(cfg: Any, stack: ExitStack) -> Any:
        replicas = start_env_replicas(cfg, stack)
        started.append(replicas["shop"])
        two_nodes.started.update(w["pid"] for w in replicas["shop"].where)
        return replicas

    def save_then_kill(cfg: Any, checkpoints: Any, learner: Any, step: int, *args: Any) -> None:
        save_checkpoint(cfg, checkpoints, learner, step, *args)
        if step in (1, 2):  # after step 1 replica 0 crashes, after step 2 replica 1: by the PID it reported
            pid = started[0].where[step - 1]["pid"]
            os.kill(pid, signal.SIGKILL)
            assert gone(pid)

    monkeypatch.setattr(setup, "_generation_backend", lambda cfg, stack, learner: Shopper(learner.tokenizer))
    monkeypatch.setattr(setup, "start_env_replicas", recorded)
    monkeypatch.setattr(loop, "save_checkpoint", save_then_kill)
    with pytest.raises(TooManyFailedRollouts) as caught:
        loop.train(cfg, show_progress=False)
    assert not ray.is_initialized()
    err = caught.value
    assert err.step == 3 and err.failed == err.requested == 8, str(err)
    assert err.kinds == {"seed_session/env_connection_error": 8}, err.kinds
    assert "no replica of env 'shop' is left (env.shop replica 0 on node" in str(err)

    # Steps 1 and 2 trained on whole batches: step 2's sessions all opened on the replica left.
    steps = [r for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]
    assert [r["step"] for r in steps] == [1, 2]
    assert [r["rollout_failures"] for r in steps] == [0, 0] and [r["reward_mean"] for r in steps] == [1.0, 1.0]
    assert [r["env_replicas_lost"] for r in steps] == [0, 1]
    assert (tmp_path / "ckpt" / "step_2").is_dir() and not (tmp_path / "ckpt" / "step_3").exists()
    stderr = capfd.readouterr().err
    assert "warning: env.shop replica 0 on node" in stderr and "new sessions go to the 1 replica(s) left" in stderr
    assert len({w["node_id"] for w in started[0].where}) == 2


@pytest.mark.timeout(300)
def test_the_async_rollout_process_spreads_its_sessions_over_the_trainers_replicas(
    tmp_path: Path, two_nodes: Any
) -> None:
    from gym_bridge.models.registry import load_model_and_tokenizer
    from gym_bridge.train.samplers.env_replicas import start_env_replicas
    from gym_bridge.train.samplers.rollout_worker import ProcessSampler

    model_dir = save_random_tiny(tmp_path / "tiny", seed=5)
    cfg = shop_config(tmp_path, two_nodes.address, f"policy.model_name={model_dir}", "grpo.async_grpo.enabled=true")
    model, tokenizer = load_model_and_tokenizer(str(model_dir))
    prompts = load_prompts(cfg.data, "train")[0]
    with ExitStack() as stack:
        (replicas,) = start_env_replicas(cfg, stack).values()
        two_nodes.started.update(w["pid"] for w in replicas.where)
        endpoints = replicas.endpoints()
        sampler = ProcessSampler(cfg, tokenizer, model.state_dict(), replicas={"shop": endpoints})
        stack.callback(sampler.close)
        samples, stats = sampler.sample(prompts, [[i, 100 + i] for i in range(len(prompts))])
        sessions = [health(url)["sessions"] for url in endpoints.urls]
    assert not ray.is_initialized()
    assert stats["rollout_failures"] == 0 and len(samples) == 16  # a random model: no tool call, reward 0
    assert sessions == [8, 8]  # the child process reached both replicas with the run's token
