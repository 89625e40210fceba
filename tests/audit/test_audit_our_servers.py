"""``gym-bridge audit`` against each of our five servers, each run with ``gym-bridge serve`` in its own
process: zero findings in every class (the earlier round's and this round's hostile answers included),
exit 0. The code server runs with short limits so the sleepers and spinners cost seconds."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.reliability.procs import cli, start, stop, wait_for_line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _audit(url: str, env: str, report: Path, *extra: str) -> dict:
    done = subprocess.run(cli("audit", url, "--env", env, "--json", str(report), *extra),
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert report.exists(), done.stdout + done.stderr
    result = json.loads(report.read_text())
    assert done.returncode == 0, (done.stdout[-3000:], result["findings"])
    return result


def _serving(args: list[str]):
    proc = start(args, stderr=subprocess.DEVNULL)
    line = wait_for_line(proc, "http://")
    url = next(word for word in line.split() if word.startswith("http://"))
    return proc, url.rstrip("/")


@pytest.mark.parametrize("env", ["math", "tool_use", "reasoning_gym"])
def test_no_findings(env: str, tmp_path: Path) -> None:
    proc, url = _serving(cli("serve", env, "--port", "0"))
    try:
        result = _audit(url, env, tmp_path / "report.json")
    finally:
        stop(proc)
    assert result["findings"] == []
    ran = {o["attack"] for o in result["outcomes"]}
    assert {"text_plain_verify", "foreign_host"} <= ran  # the web-page requests are part of every audit
    assert result["by_class"]["escape/leak"]["attacks"] >= 3 and result["by_class"]["crash"]["attacks"] >= 5


def test_no_findings_code(tmp_path: Path) -> None:
    config = tmp_path / "code.yaml"
    config.write_text(yaml.safe_dump({"code": {"timeout_s": 2.0, "wall_timeout_s": 6.0, "max_concurrency": 2}}))
    proc, url = _serving(cli("serve", "code", "--port", "0", "--config", str(config)))
    try:
        result = _audit(url, "code", tmp_path / "report.json", "--code-cpu-limit", "2")
    finally:
        stop(proc)
    assert result["findings"] == []
    ran = {o["attack"] for o in result["outcomes"]}
    assert {"read_the_tests", "reaped_children_cpu", "sysv_shared_memory", "kernel_keyring", "float_for_integer"} <= ran


def test_no_findings_judge(tmp_path: Path) -> None:
    judge_port = _free_port()
    proc, url = _serving(cli("serve", "equivalence_judge", "--port", "0", "--judge-url",
                             f"http://127.0.0.1:{judge_port}/v1"))  # fmt: skip
    try:
        result = _audit(url, "judge", tmp_path / "report.json", "--judge-port", str(judge_port))
    finally:
        stop(proc)
    assert result["findings"] == []
    assert {"zero_width_fence", "fullwidth_fence", "verdict_first"} <= {o["attack"] for o in result["outcomes"]}
