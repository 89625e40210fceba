"""The NeMo Gym configs we ship (``resources_servers/<name>/configs/<name>.yaml``) and their entrypoint.

Without NeMo Gym installed: each config is held against NeMo Gym 0.7.0's own schema of a server entry
(vendored in tests/data/nemo_gym), its references are resolved as NeMo Gym resolves them, and the entrypoint
is run as ``gym env start`` runs it (``python nemo_gym_app.py`` in the server's directory, the config in
``NEMO_GYM_CONFIG_DICT``), then spoken to over HTTP. The run with NeMo Gym itself is
``scripts/check_nemo_gym_servers.sh``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gym_bridge.rollout.nemo_gym_entry import EntryError, plan_server
from gym_bridge.serving.uvicorn_thread import start_in_thread

REPO = Path(__file__).resolve().parents[2]
SERVERS = ("math", "code", "tool_use")
SERVER_TYPES = ("responses_api_models", "resources_servers", "responses_api_agents", "environment_servers")
EXTERNAL = {("responses_api_models", "policy_model")}  # supplied by NeMo Gym's --model-type config


def _config(name: str) -> dict:
    return yaml.safe_load((REPO / "resources_servers" / name / "configs" / f"{name}.yaml").read_text())


@pytest.fixture(scope="module")
def entry_schema(reference_dir) -> dict:
    return json.loads((reference_dir / "server_entry_schema_0.7.0.json").read_text())["schema"]


def _validate(value, spec: dict, defs: dict, where: str) -> None:
    """The part of JSON Schema pydantic emits for NeMo Gym's entry model: $ref, anyOf, const, enum, type,
    required, properties (extra keys allowed, as NeMo Gym allows them), items, minimum."""
    if "$ref" in spec:
        spec = defs[spec["$ref"].rsplit("/", 1)[1]]
    if "anyOf" in spec:
        errors = []
        for option in spec["anyOf"]:
            try:
                return _validate(value, option, defs, where)
            except AssertionError as e:
                errors.append(str(e))
        raise AssertionError(f"{where}: matches none of {errors}")
    if "const" in spec:
        assert value == spec["const"], f"{where}: {value!r} != {spec['const']!r}"
    if "enum" in spec:
        assert value in spec["enum"], f"{where}: {value!r} not one of {spec['enum']}"
    kinds = {"string": str, "integer": int, "object": dict, "array": list, "null": type(None), "boolean": bool}
    if "type" in spec:
        assert isinstance(value, kinds[spec["type"]]), f"{where}: {value!r} is not {spec['type']}"
    if isinstance(value, dict):
        for key in spec.get("required", []):
            assert key in value, f"{where}.{key}: required"
        for key, sub in spec.get("properties", {}).items():
            if key in value:
                _validate(value[key], sub, defs, f"{where}.{key}")
    if isinstance(value, list) and "items" in spec:
        for i, item in enumerate(value):
            _validate(item, spec["items"], defs, f"{where}.{i}")
    if "minimum" in spec:
        assert value >= spec["minimum"], where


@pytest.mark.parametrize("name", SERVERS)
def test_shipped_config_is_a_valid_nemo_gym_config(name, entry_schema):
    config = _config(name)
    defs = entry_schema["$defs"]
    names = {(server_type, top) for top, block in config.items() for server_type in block}
    for top, block in config.items():
        assert isinstance(block, dict) and len(block) == 1, top  # one server type per top-level entry
        ((server_type, inner),) = block.items()
        assert server_type in SERVER_TYPES and len(inner) == 1, top  # and one server (NeMo Gym's max_length=1)
        ((dir_name, entry),) = inner.items()
        _validate(entry, entry_schema, defs, f"{top}.{server_type}.{dir_name}")
        if server_type == "resources_servers":  # NeMo Gym: a domain is required for resources servers
            assert entry["domain"] in defs["Domain"]["enum"]
            server_dir = REPO / "resources_servers" / dir_name
            assert (server_dir / entry["entrypoint"]).is_file()  # resolved as NeMo Gym does: relative, in the dir
            assert (server_dir / "requirements.txt").is_file()  # NeMo Gym's marker of a server directory
        for key, value in entry.items():  # references to other servers resolve inside the config
            if isinstance(value, dict) and set(value) == {"type", "name"}:
                assert (value["type"], value["name"]) in names | EXTERNAL, f"{top}.{key}"
        for dataset in entry.get("datasets") or []:
            rows = (REPO / dataset["jsonl_fpath"]).read_text().splitlines()
            assert rows and all(json.loads(r).get("agent_ref", {"name": top})["name"] == top for r in rows), top
    assert ("resources_servers", name) in names and ("responses_api_agents", f"{name}_simple_agent") in names


@pytest.mark.parametrize("name", SERVERS)
def test_shipped_entry_plans_the_server_on_nemo_gyms_address(name):
    config = _config(name)
    config[name]["resources_servers"][name].update(host="127.0.0.1", port=8123)  # as NeMo Gym fills them in
    plan = plan_server(config, name, name)
    assert (plan.server, plan.host, plan.port, plan.already_running, plan.overrides) == (
        name, "127.0.0.1", 8123, False, {},
    )  # fmt: skip


def _entry_config(**entry) -> dict:
    base = {"entrypoint": "nemo_gym_app.py", "domain": "math", "host": "127.0.0.1", "port": 8001}
    return {"gb": {"resources_servers": {"math": {**base, **entry}}}}


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({"extractoin": "boxed"}, "gb.resources_servers.math.extractoin: unknown key"),
        ({"gym_bridge": {"confg": {}}}, "gb.resources_servers.math.gym_bridge.confg"),
        ({"gym_bridge": {"already_running": "maybe"}}, "gym_bridge.already_running"),
        ({"port": "eighty"}, "gb.resources_servers.math.port: expected an integer"),
        ({"port": None}, "gb.resources_servers.math.port: missing"),
        ({"gym_bridge": {"already_running": True, "config": {"extraction": "boxed"}}}, "already_running"),
    ],
)
def test_a_bad_entry_is_refused_naming_the_key(entry, named):
    with pytest.raises(EntryError, match=named.replace(".", r"\.")):
        plan_server(_entry_config(**entry), "gb", "math")


def test_num_workers_sizes_the_pool_and_is_refused_where_there_is_none():
    assert plan_server(_entry_config(num_workers=3), "gb", "math").overrides == {"pool_size": 3}
    config = {"gb": {"resources_servers": {"tool_use": {"entrypoint": "x", "host": "h", "port": 1, "num_workers": 2}}}}
    with pytest.raises(EntryError, match=r"tool_use\.num_workers: the tool_use server has no worker pool"):
        plan_server(config, "gb", "tool_use")
    with pytest.raises(EntryError, match="this entrypoint runs resources_servers/code"):
        plan_server(_entry_config(), "gb", "code")


# --------------------------------------------------------------------------- the entrypoint, run as NeMo Gym runs it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_entrypoint(name: str, config: dict, top: str) -> subprocess.Popen:
    env = {**os.environ, "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(config), "NEMO_GYM_CONFIG_PATH": top}
    env.pop("PYTHONPATH", None)  # the entrypoint finds its checkout itself
    server_dir = REPO / "resources_servers" / name
    return subprocess.Popen(
        [sys.executable, "nemo_gym_app.py"], cwd=server_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_health(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            return httpx.get(f"{url}/health", timeout=2).json()
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not come up")


def _stop(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, err


def test_entrypoint_serves_the_math_server_with_the_entrys_settings(tmp_path):
    port = _free_port()
    config = _config("math")
    entry = config["math"]["resources_servers"]["math"]
    entry.update(host="127.0.0.1", port=port, num_workers=1)
    entry["gym_bridge"]["config"] = {"extraction": "boxed"}
    proc = _run_entrypoint("math", config, "math")
    try:
        url = f"http://127.0.0.1:{port}"
        health = _wait_health(url, proc)
        assert health["server"] == "math" and health["extraction"] == "boxed"
        body = {
            "responses_create_params": {"input": [{"role": "user", "content": "2+2?"}]},
            "response": {"output": [{"type": "message", "role": "assistant",
                                     "content": [{"type": "output_text", "text": "The answer is 4"}]}]},
            "expected_answer": "4",
        }  # fmt: skip
        verdict = httpx.post(f"{url}/verify", json=body, timeout=30).json()
        assert verdict["reward"] == 0.0 and verdict["failure_kind"] == "no_answer"  # boxed only, as configured
        assert httpx.get(f"{url}/reverify_mode", timeout=5).json() == "stateless"
    finally:
        code, err = _stop(proc)
    assert code == 0, err


def test_entrypoint_refuses_a_bad_setting_naming_it():
    config = _config("math")
    entry = config["math"]["resources_servers"]["math"]
    entry.update(host="127.0.0.1", port=_free_port())
    entry["gym_bridge"]["config"] = {"extraction": "last_word"}
    proc = _run_entrypoint("math", config, "math")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "gym_bridge.config.extraction" in err


def test_already_running_uses_the_server_at_host_port_and_starts_nothing():
    from gym_bridge.rollout.envs import load_server_class

    with start_in_thread(load_server_class("tool_use")().build_app()) as running:
        port = int(running.url.rsplit(":", 1)[1])
        config = _config("tool_use")
        entry = config["tool_use"]["resources_servers"]["tool_use"]
        entry.update(host="127.0.0.1", port=port)
        entry["gym_bridge"]["already_running"] = True
        proc = _run_entrypoint("tool_use", config, "tool_use")
        time.sleep(3)
        assert proc.poll() is None  # alive, as NeMo Gym expects of a server process
        code, err = _stop(proc)
        assert code == 0, err
        assert httpx.get(f"{running.url}/health", timeout=5).json()["server"] == "tool_use"  # untouched

        config["tool_use"]["resources_servers"]["tool_use"]["port"] = _free_port()  # nothing there
        wrong = _config("math")
        wrong["math"]["resources_servers"]["math"].update(host="127.0.0.1", port=port, gym_bridge={"already_running": True})
        proc = _run_entrypoint("math", wrong, "math")  # a tool_use server where a math one is expected
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1 and "is not a gym-bridge math server" in err
