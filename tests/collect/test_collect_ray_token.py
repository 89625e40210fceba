"""``collect --ray ADDRESS`` on a cluster started the way users start one, with Ray 2.60's token auth on (issue 37).

``ray start --head`` turns token authentication on when a token exists (``~/.ray/auth_token``; here a
private HOME), and a second node joins with ``RAY_AUTH_MODE=token`` (tests/ray_loopback.py's
:func:`ray_start_cluster`: real ``ray start`` processes on 127.0.0.2 and 127.0.0.3, ended by PID). A
driver run the way a user runs it, without ``RAY_AUTH_MODE``, used to retry for ~20 s and say only
"Failed to connect to Ray cluster at ADDRESS".
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from collect_helpers import rollout_pairs as pairs
from collect_helpers import write_rows
from fake_model import FakeModel, arithmetic_row

from gym_bridge.collect import metrics_path_for
from tests.ray_loopback import ray_start_cluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(head address, the HOME whose ~/.ray/auth_token is the cluster's token)."""
    home = tmp_path_factory.mktemp("ray-home")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    with ray_start_cluster(home) as address:
        yield address, home


def collect_on(address: str, tasks: Path, out: Path, model_url: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``gym-bridge collect --ray ADDRESS`` as a user runs it: no RAY_* variables but those in ``env``."""
    command = [
        sys.executable, "-m", "gym_bridge.cli", "collect", str(tasks), "-o", str(out), "--env", "math",
        "--model-url", model_url, "--num-repeats", "2", "--concurrency", "4", "--no-progress", "--ray", address,
    ]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**clean, "COLUMNS": "250", **env})  # fmt: skip


@pytest.mark.timeout(240)
def test_a_driver_on_this_machine_joins_a_token_cluster_without_ray_auth_mode(tmp_path, token_cluster):
    address, home = token_cluster
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(i, 3) for i in range(10)])
    out = tmp_path / "rollouts.jsonl"
    with FakeModel(latency=0.02, record_requests=False) as model:
        done = collect_on(address, tasks, out, model.url, HOME=str(home))
    text = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0, text[-3000:]
    assert "requires token authentication and accepts this machine's token; joining with RAY_AUTH_MODE=token" in text
    everything = pairs(out)
    assert Counter(everything).most_common(1)[0][1] == 1  # exactly once
    assert sorted(everything) == [(t, r) for t in range(10) for r in range(2)]
    shards = json.loads(metrics_path_for(out).read_text())["run"]["ray"]["shards"]
    assert sorted(s["node_ip"] for s in shards) == ["127.0.0.2", "127.0.0.3"]  # both `ray start` nodes ran rollouts
    assert all(s["rollouts"] > 0 for s in shards), shards


@pytest.mark.timeout(240)
def test_a_driver_without_the_clusters_token_is_told_what_to_set(tmp_path, token_cluster):
    address, _ = token_cluster
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1)])
    elsewhere = tmp_path / "home"  # no ~/.ray/auth_token here
    elsewhere.mkdir()
    started = time.monotonic()
    no_token = collect_on(address, tasks, tmp_path / "a.jsonl", "http://127.0.0.1:9/v1", HOME=str(elsewhere))
    text = " ".join(no_token.stderr.split())
    assert no_token.returncode == 2, text
    assert f"--ray (or RAY_ADDRESS) is '{address}': that Ray cluster requires token authentication" in text, text
    assert "set RAY_AUTH_MODE=token for this command, with the head's token in ~/.ray/auth_token, RAY_AUTH_TOKEN" in text
    assert "Traceback" not in text
    assert time.monotonic() - started < 20  # said at once, not after Ray's retries

    wrong = collect_on(address, tasks, tmp_path / "b.jsonl", "http://127.0.0.1:9/v1", HOME=str(elsewhere),
                       RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))  # fmt: skip
    text = " ".join(wrong.stderr.split())
    assert wrong.returncode == 2 and "it refuses this process's token" in text, text


@pytest.mark.timeout(240)
def test_train_with_cluster_ray_address_names_the_key_and_what_to_set(tmp_path, token_cluster):
    """The trainer joins by ``cluster.ray_address`` through the same check, before its model loads (the
    built-in ``tiny`` is never loaded here): exit 2 naming the key, no traceback."""
    from tests.train.helpers import SMALL_ONLINE_RUN

    address, _ = token_cluster
    config = tmp_path / "train.yaml"
    config.write_text("grpo:\n  mode: online\n")
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()
    command = [
        sys.executable, "-m", "gym_bridge.cli", "train", "--config", str(config), "-q", *SMALL_ONLINE_RUN,
        "policy.model_name=tiny", "policy.train_micro_batch_size=16",
        f"data.train.data_path={REPO / 'recipes/data/arith_train.jsonl'}", "data.train.env_name=math",
        "env.math.server=math", "env.math.replicas=1", f"cluster.ray_address={address}",
        f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}", f"logger.log_dir={tmp_path / 'logs'}",
    ]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=180,
                          env={**clean, "COLUMNS": "250", "HOME": str(elsewhere)})  # fmt: skip
    text = " ".join(done.stderr.split())
    assert done.returncode == 2, text[-3000:]
    assert f"cluster.ray_address (or RAY_ADDRESS) is '{address}': that Ray cluster requires token authentication" in text
    assert "RAY_AUTH_MODE=token" in text and "Traceback" not in text
