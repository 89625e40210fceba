"""How our server stops when NeMo Gym runs it (``nemo_gym_app.py`` -> ``gym_bridge/rollout/nemo_gym_entry.py``).

NeMo Gym 0.7.0's own servers run uvicorn with its signal handlers: SIGINT or SIGTERM ends them, exit
status 0; ``gym`` stops its servers with SIGINT and kills one still there 1 s later. Ours do the same, and
also stop when the ``gym`` that started them is gone (``gym eval reverify`` exits without stopping its
servers). Each test runs the entrypoint as NeMo Gym does, in a process group of its own, for real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import yaml
from test_nemo_gym_configs import REPO, _config, _free_port, _run_entrypoint, _wait_health

from gym_bridge.serving.uvicorn_thread import start_in_thread


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    out = subprocess.run(["ps", "-eo", "pid=,pgid="], capture_output=True, text=True).stdout
    return [int(p) for p, g in (line.split() for line in out.splitlines()) if int(g) == pgid and _alive(int(p))]


def _math_entry(port: int) -> subprocess.Popen:
    config = _config("math")
    config["math"]["resources_servers"]["math"].update(host="127.0.0.1", port=port, num_workers=1)
    env = {**os.environ, "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(config), "NEMO_GYM_CONFIG_PATH": "math"}
    env.pop("PYTHONPATH", None)
    return subprocess.Popen(
        [sys.executable, "nemo_gym_app.py"], cwd=REPO / "resources_servers" / "math", env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


def test_sigint_to_the_process_group_stops_the_server_and_its_workers_with_status_0():
    """A terminal's Ctrl-C: SIGINT to every process of the group, the verifier workers included."""
    port = _free_port()
    proc = _math_entry(port)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(url, proc)
        body = {
            "responses_create_params": {"input": "x^2+1?"},
            "response": {"output": [{"type": "message", "role": "assistant",
                                     "content": [{"type": "output_text", "text": "\\boxed{1+x^2}"}]}]},
            "expected_answer": "x^2+1",
        }  # fmt: skip
        assert httpx.post(f"{url}/verify", json=body, timeout=60).json()["reward"] == 1.0  # math-verify's pool
        assert len(_group(proc.pid)) > 1  # the server and its verifier processes
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert "stopping (signal)" in out
    assert took < 10, took  # NeMo Gym waits 1 s; a loaded test machine gets more room
    deadline = time.monotonic() + 10
    while _group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _group(proc.pid) == []  # nothing left behind


PARENT = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "nemo_gym_app.py"], cwd=sys.argv[1], start_new_session=True,
                         stderr=subprocess.DEVNULL)  # its stdout is ours
print(child.pid, flush=True)
sys.stdin.readline()  # until the test says so; then go, without stopping the child (gym eval reverify does)
os._exit(0)
"""


def _orphan_after(parent: subprocess.Popen) -> int:
    """Wait for the child entrypoint to say it serves, end its parent, return the child's pid."""
    child = int(parent.stdout.readline())
    line = parent.stdout.readline()  # "... listening on URL" or "... using the server already at URL"
    assert "listening on" in line or "using the server already" in line, line
    parent.stdin.write("go\n")
    parent.stdin.flush()
    parent.wait(10)
    return child


def _stops_by_itself(child: int, url: str) -> None:
    try:
        deadline = time.monotonic() + 15
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the server outlived the process that started it"
        try:
            httpx.get(f"{url}/health", timeout=2)
            raise AssertionError(f"{url} still answers")
        except httpx.HTTPError:
            pass
    finally:
        if _alive(child):
            os.killpg(child, signal.SIGKILL)


def test_the_server_stops_when_the_process_that_started_it_is_gone():
    port = _free_port()
    config = _config("tool_use")
    config["tool_use"]["resources_servers"]["tool_use"].update(host="127.0.0.1", port=port)
    env = {**os.environ, "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(config), "NEMO_GYM_CONFIG_PATH": "tool_use"}
    env.pop("PYTHONPATH", None)
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(REPO / "resources_servers" / "tool_use")], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    _stops_by_itself(_orphan_after(parent), url)


def test_an_entry_for_an_already_running_server_ends_with_its_parent_and_leaves_the_server_alone():
    from gym_bridge.rollout.envs import load_server_class

    with start_in_thread(load_server_class("tool_use")().build_app()) as running:
        port = int(running.url.rsplit(":", 1)[1])
        config = _config("tool_use")
        entry = config["tool_use"]["resources_servers"]["tool_use"]
        entry.update(host="127.0.0.1", port=port)
        entry["gym_bridge"]["already_running"] = True
        env = {**os.environ, "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(config), "NEMO_GYM_CONFIG_PATH": "tool_use"}
        env.pop("PYTHONPATH", None)
        parent = subprocess.Popen([sys.executable, "-c", PARENT, str(REPO / "resources_servers" / "tool_use")],
                                  env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        child = _orphan_after(parent)
        try:
            deadline = time.monotonic() + 15
            while _alive(child) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _alive(child)
        finally:
            if _alive(child):
                os.killpg(child, signal.SIGKILL)
        assert httpx.get(f"{running.url}/health", timeout=5).json()["server"] == "tool_use"  # untouched


def test_sigterm_and_a_sigint_to_the_server_alone_stop_it_with_status_0():
    for sig in (signal.SIGTERM, signal.SIGINT):
        port = _free_port()
        config = _config("tool_use")
        config["tool_use"]["resources_servers"]["tool_use"].update(host="127.0.0.1", port=port)
        proc = _run_entrypoint("tool_use", config, "tool_use")
        _wait_health(f"http://127.0.0.1:{port}", proc)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "stopping (signal)" in out, (sig, err)
