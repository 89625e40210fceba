"""The entrypoint NeMo Gym's ``gym env start`` runs for our resources servers (``resources_servers/<name>/nemo_gym_app.py``).

NeMo Gym 0.7.0 starts every server entry of its config as ``<venv>/bin/python <entrypoint>`` in the server's
directory (``resources_servers/<name>``, found under ``--search-dir``/cwd), with the whole resolved config
as YAML in ``NEMO_GYM_CONFIG_DICT`` and the entry's top-level name in ``NEMO_GYM_CONFIG_PATH``; it then
waits until ``http://host:port/`` answers and talks to the server at that address. This module reads the
entry and serves the gym-bridge server of that directory there. An entry::

    gym_bridge_math:                 # any top-level name; agents refer to it
      resources_servers:
        math:                        # the directory: math, code or tool_use
          entrypoint: nemo_gym_app.py
          domain: math               # NeMo Gym requires a domain for resources servers
          host: 127.0.0.1            # optional: NeMo Gym picks them when absent
          port: 8001
          num_workers: 2             # optional: the server's worker pool (math: verifier processes,
                                     # code: sandboxes); refused for tool_use, which has none
          expose_tools_over_mcp: true  # optional, NeMo Gym 0.7.0's key: the tools also at /mcp
          gym_bridge:                # optional, ours:
            config: {extraction: boxed}   # the server's own settings over its config.yaml
            already_running: false   # true: start nothing, use the server already serving host:port

``already_running: true`` is how NeMo Gym uses a server it did not start (NeMo Gym 0.7.0 only knows
entries with an ``entrypoint``): the entrypoint checks that ``host:port`` answers ``/health`` as this
server, then waits until NeMo Gym stops it. NeMo Gym's descriptive keys (``domain``, ``description``,
``verified``, ``value``, ``datasets``, ...) are left to NeMo Gym; any other key is refused by name.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["EntryError", "GymBridgeBlock", "ServerPlan", "main", "plan_from_env", "plan_server"]

CONFIG_DICT_VAR = "NEMO_GYM_CONFIG_DICT"
CONFIG_PATH_VAR = "NEMO_GYM_CONFIG_PATH"
SERVERS = ("math", "code", "tool_use", "reasoning_gym")
NEMO_GYM_KEYS = frozenset(
    {"entrypoint", "host", "port", "domain", "datasets", "verified", "description", "value", "license",
     "verified_url", "supported_agents", "supported_models", "name"}
)  # fmt: skip
"""Keys NeMo Gym 0.7.0 puts on a resources-server entry for itself; the entrypoint does not use them."""


class EntryError(ValueError):
    """A config entry this entrypoint cannot run; the message names the key."""


class GymBridgeBlock(BaseModel):
    """The entry's ``gym_bridge:`` block."""

    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] = {}
    """The server's own settings (the keys of ``resources_servers/<name>/config.yaml``), over its defaults."""
    already_running: bool = False
    """Start nothing; use the gym-bridge server already serving the entry's ``host:port``."""


@dataclass
class ServerPlan:
    """What the entrypoint does: which server, where, with which settings."""

    server: str
    host: str
    port: int
    already_running: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)
    expose_tools_over_mcp: bool = False


def plan_server(config_dict: dict[str, Any], top_level: str, server: str) -> ServerPlan:
    """The plan for entry ``top_level`` of NeMo Gym's resolved config, run from ``resources_servers/<server>``."""
    if server not in SERVERS:
        raise EntryError(f"resources_servers/{server}: not a gym-bridge server (one of: {', '.join(SERVERS)})")
    where = f"{top_level}.resources_servers"
    block = (config_dict.get(top_level) or {}).get("resources_servers")
    if not isinstance(block, dict) or len(block) != 1:
        raise EntryError(f"{where}: expected one resources server entry")
    (name, entry), = block.items()
    where = f"{where}.{name}"
    if name != server or not isinstance(entry, dict):
        raise EntryError(f"{where}: this entrypoint runs resources_servers/{server}; name the entry '{server}'")
    unknown = sorted(set(entry) - NEMO_GYM_KEYS - {"num_workers", "gym_bridge", "expose_tools_over_mcp"})
    if unknown:
        raise EntryError(
            f"{where}.{unknown[0]}: unknown key (gym-bridge reads host, port, num_workers, expose_tools_over_mcp and "
            "gym_bridge.config / gym_bridge.already_running; NeMo Gym's own keys are left to it)"
        )
    for key in ("host", "port"):
        if entry.get(key) in (None, ""):
            raise EntryError(f"{where}.{key}: missing (NeMo Gym fills it in when it resolves the config)")
    try:
        port = int(entry["port"])
    except (TypeError, ValueError):
        raise EntryError(f"{where}.port: expected an integer, got {entry['port']!r}") from None
    try:
        ours = GymBridgeBlock.model_validate(entry.get("gym_bridge") or {})
    except ValidationError as e:
        error = e.errors()[0]
        loc = ".".join(str(part) for part in error["loc"])
        raise EntryError(f"{where}.gym_bridge.{loc}: {error['msg']}") from None
    overrides = dict(ours.config)
    if entry.get("num_workers") is not None:
        from gym_bridge.rollout.envs import workers_setting

        setting = workers_setting(server)
        if setting is None:
            raise EntryError(f"{where}.num_workers: the {server} server has no worker pool to size")
        overrides[setting] = entry["num_workers"]
    mcp = entry.get("expose_tools_over_mcp", False)
    if not isinstance(mcp, bool):
        raise EntryError(f"{where}.expose_tools_over_mcp: expected true or false, got {mcp!r}")
    if ours.already_running and (overrides or mcp):
        raise EntryError(f"{where}.gym_bridge.already_running: a running server's settings cannot be changed here")
    return ServerPlan(server, str(entry["host"]), port, ours.already_running, overrides, mcp)


def plan_from_env(server: str, environ: dict[str, str] | None = None) -> ServerPlan:
    """The plan from the environment NeMo Gym gives its servers."""
    env = os.environ if environ is None else environ
    if CONFIG_DICT_VAR not in env or CONFIG_PATH_VAR not in env:
        raise EntryError(f"{CONFIG_DICT_VAR}/{CONFIG_PATH_VAR} not set: this entrypoint is run by NeMo Gym's gym env start")
    config_dict = yaml.safe_load(env[CONFIG_DICT_VAR])
    return plan_server(config_dict, env[CONFIG_PATH_VAR], server)


def build_server(plan: ServerPlan) -> Any:
    """The server object of ``plan``, its settings checked by the server's own config model."""
    from gym_bridge.rollout.envs import load_server_class
    from gym_bridge.serving.server import ServerSettings

    server_class = load_server_class(plan.server)
    settings = ServerSettings(host=plan.host, port=plan.port, expose_tools_over_mcp=plan.expose_tools_over_mcp)
    server = server_class(settings)
    if plan.overrides:
        try:
            config = server.config.model_validate({**server.config.model_dump(), **plan.overrides})
        except ValidationError as e:
            error = e.errors()[0]
            loc = ".".join(str(part) for part in error["loc"])
            raise EntryError(f"gym_bridge.config.{loc}: {error['msg']}") from None
        server = server_class(settings, config=config)
    return server


def check_running(plan: ServerPlan, timeout_s: float = 30.0) -> dict[str, Any]:
    """The ``/health`` of the server at the plan's address, once it answers as ``plan.server``."""
    url = f"http://{plan.host}:{plan.port}/health"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                health = json.loads(resp.read())
            break
        except (OSError, ValueError) as e:
            if time.monotonic() > deadline:
                raise EntryError(f"gym_bridge.already_running: nothing answers {url} ({e})") from None
            time.sleep(0.5)
    if not isinstance(health, dict) or health.get("server") != plan.server:
        raise EntryError(f"gym_bridge.already_running: {url} is not a gym-bridge {plan.server} server: {health!r}")
    return health


def _wait_for_stop(stop: threading.Event, parent: int, alive: Callable[[], bool] = lambda: True) -> str:
    """Block until the server should stop; say why: a signal (``stop`` set), ``parent gone`` or ``server stopped``.

    Why the parent: NeMo Gym 0.7.0's ``gym eval reverify`` exits without stopping the servers it started,
    and a ``gym`` that is killed cannot stop them; a server whose parent is gone stops itself.
    """
    while not stop.wait(0.25):
        if os.getppid() != parent:
            return "parent gone"
        if not alive():
            return "server stopped"
    return "signal"


def main(server: str) -> None:
    """Run (or attach to) the server NeMo Gym's config asks for, until NeMo Gym stops it.

    As NeMo Gym's own servers do (uvicorn's signal handlers), it stops on SIGINT or SIGTERM and exits 0:
    ``gym`` stops its servers with SIGINT and kills one that is still there 1 s later. It also stops when
    the ``gym`` process that started it is gone.
    """
    parent = os.getppid()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        plan = plan_from_env(server)
        if plan.already_running:
            check_running(plan)
            print(f"gym-bridge {server}: using the server already at http://{plan.host}:{plan.port}", flush=True)
            _wait_for_stop(stop, parent)
            return
        from gym_bridge.serving.uvicorn_thread import start_in_thread

        app = build_server(plan).build_app()
        running = start_in_thread(app, host=plan.host, port=plan.port)
    except EntryError as e:
        sys.exit(f"gym-bridge {server} (NeMo Gym entrypoint): {e}")
    print(f"gym-bridge {server} resources server listening on {running.url}", flush=True)
    why = _wait_for_stop(stop, parent, running._thread.is_alive)
    if why == "server stopped":
        sys.exit(f"gym-bridge {server}: the server stopped")
    try:
        print(f"gym-bridge {server}: stopping ({why})", flush=True)
    except OSError:  # the parent that read our output is gone
        pass
    running.stop()
