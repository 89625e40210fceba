"""``gym-bridge audit`` against a deliberately weak server: each weakness is reported under its class, the
exit code says so, and the JSON report holds the same findings; an audit that cannot run exits 2."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gym_bridge.serving.uvicorn_thread import start_in_thread

from .weak_math_server import build_app

CLI = [sys.executable, "-m", "gym_bridge.cli", "audit"]


@pytest.fixture(scope="module")
def weak_url() -> Iterator[str]:
    running = start_in_thread(build_app())
    try:
        yield running.url
    finally:
        running.stop()


def audit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


def test_every_weakness_is_found(weak_url: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    only = ["tiny_excess", "tiny_deficit", "recanted", "python_in_box", "text_plain_verify", "foreign_host",
            "not_json", "stale_verdict"]  # fmt: skip
    done = audit(weak_url, "--env", "math", "--json", str(report), *(f"--only={name}" for name in only))
    assert done.returncode == 1, done.stdout + done.stderr
    found = {(f["attack"], f["attack_class"]) for f in json.loads(report.read_text())["findings"]}
    assert ("tiny_excess", "wrong-reward") in found  # float tolerance
    assert ("tiny_deficit", "wrong-reward") in found
    assert ("python_in_box", "escape/leak") in found  # eval ran the answer: the marker file appeared
    assert ("text_plain_verify", "escape/leak") in found  # any content type is read
    assert ("foreign_host", "escape/leak") in found  # any Host is served
    assert ("not_json", "crash") in found  # json.loads raised: a 500
    assert ("stale_verdict", "wrong-reward") in found  # it echoes the row's earlier reward_components
    assert ("recanted", "wrong-reward") not in found  # it reads the last box, as it should
    by_class = json.loads(report.read_text())["by_class"]
    assert by_class["escape/leak"]["findings"] == 3 and by_class["crash"]["findings"] == 1
    assert "FINDING escape/leak: python_in_box" in done.stdout


def test_unreachable_server_exits_2_naming_it() -> None:
    done = audit("http://127.0.0.1:9", "--env", "math")
    assert done.returncode == 2
    assert "127.0.0.1:9" in done.stderr and "nothing was audited" in done.stderr


def test_a_server_of_another_kind_exits_2(weak_url: str) -> None:
    done = audit(weak_url, "--env", "tool_use")  # the weak math server pays nothing for a tool call
    assert done.returncode == 2
    assert "control" in done.stderr and "nothing was audited" in done.stderr


def test_unknown_env_and_attack_are_refused(weak_url: str) -> None:
    assert audit(weak_url, "--env", "chess").returncode == 2
    done = audit(weak_url, "--env", "math", "--only", "no_such_attack")
    assert done.returncode == 2 and "no_such_attack" in done.stderr
