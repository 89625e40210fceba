"""Shared by the Ray tests: a private loopback Ray per module, a simulated two-node cluster on 127.0.0.1
per module, a real ``ray start`` head and worker pair on loopback, and the check that every Ray socket is on loopback (this process, or a given one, and every
process under it: GCS, raylets, agents, workers)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def loopback_ray_fixture(num_cpus: int, object_store_memory_mb: int = 100) -> Callable[..., Any]:
    """A module-scoped fixture: a private Ray on 127.0.0.1 with ``num_cpus`` logical CPUs, shut down
    after the module (starting one takes ~10 s on 2 cores). Assign it to a name in the test module."""

    @pytest.fixture(scope="module")
    def local_ray() -> Iterator[Any]:
        import ray

        from gym_bridge.distributed.ray_local import start_local_ray

        assert start_local_ray(num_cpus=num_cpus, object_store_memory_mb=object_store_memory_mb), (
            "Ray was already running in this process"
        )
        yield ray
        ray.shutdown()

    return local_ray


def two_node_cluster_fixture() -> Callable[..., Any]:
    """A module-scoped fixture: two Ray nodes on 127.0.0.1 (1 CPU each, ``ray.cluster_utils.Cluster``),
    joined by address as a ``ray start`` cluster would be. Tests add the pids they saw to
    ``cluster.started``; after the module every process the cluster (and the tests) started is gone."""

    @pytest.fixture(scope="module")
    def two_nodes() -> Iterator[Any]:
        import psutil
        import ray
        from ray.cluster_utils import Cluster

        from gym_bridge.distributed.ray_local import import_ray

        import_ray()  # loopback settings in place before any node starts
        assert not ray.is_initialized()
        # Its own Ray temp dir: the address file Cluster writes (and deletes) is not the machine's
        # /tmp/ray/ray_current_cluster, which another Ray on this machine may be using.
        temp_dir = tempfile.mkdtemp(prefix="gbr-", dir="/tmp")  # short: Ray's unix socket paths live in it
        saved = os.environ.get("RAY_TMPDIR")
        os.environ["RAY_TMPDIR"] = temp_dir
        node = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024 * 1024}
        started: set[int] = set()
        earlier = {p.pid for p in ray_processes()[1:]}  # other tests' children (a wandb service, verify pools)
        cluster = None
        try:
            cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
            cluster.add_node(**node)
            cluster.started = started  # tests add the pids they saw
            yield cluster
        finally:
            started |= {p.pid for p in ray_processes()[1:] if not _interpreter_helper(p)} - earlier
            if cluster is not None:
                cluster.shutdown()
            _, alive = psutil.wait_procs([psutil.Process(pid) for pid in started if psutil.pid_exists(pid)], timeout=15)
            alive = [p for p in alive if running(p)]
            if saved is None:
                os.environ.pop("RAY_TMPDIR", None)
            else:
                os.environ["RAY_TMPDIR"] = saved
            shutil.rmtree(temp_dir, ignore_errors=True)
            assert len(started) >= 3, started  # the check did see the nodes' processes (GCS, 2 raylets, ...)
            assert not alive, f"left running after the cluster shut down: {[(p.pid, p.name()) for p in alive]}"

    return two_nodes


RUN_MARK = "GYM_BRIDGE_TEST_RUN"
"""The environment variable a test sets on a run it starts: every process of the run (Ray's GCS, raylet and
workers among them) inherits it, so :func:`marked` finds them whoever their parent became."""


def marked(mark: str) -> dict[int, str]:
    """pid -> name of every live process whose environment carries ``RUN_MARK=mark``."""
    import psutil

    found = {}
    for process in psutil.process_iter(["pid", "name"]):
        try:
            if process.environ().get(RUN_MARK) == mark and process.status() != psutil.STATUS_ZOMBIE:
                found[process.pid] = process.info["name"]
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def _interpreter_helper(process: Any) -> bool:
    """multiprocessing's resource tracker: started by this interpreter's first spawn (an async-GRPO
    rollout process), it lives as long as the test process by design; not the cluster's."""
    import psutil

    try:
        return "multiprocessing.resource_tracker" in " ".join(process.cmdline())
    except psutil.Error:
        return False


def running(process: Any) -> bool:
    """The process exists and is not a zombie (exited, waiting to be reaped)."""
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ray_processes(root: Any = None) -> list[Any]:
    """This process (or ``root``, a psutil process) and all its descendants (psutil processes)."""
    import psutil

    me = root or psutil.Process()
    return [me, *me.children(recursive=True)]


def listeners(root: Any = None) -> list[tuple[str, str, int, int]]:
    """``(process name, address, port, pid)`` of every listening (or bound, unconnected) inet socket of
    this process (or ``root``) and its descendants, as ``ss -lntup`` would list them."""
    import psutil

    found: list[tuple[str, str, int, int]] = []
    for process in ray_processes(root):
        try:
            name, connections = process.name(), process.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        for c in connections:
            if c.status == psutil.CONN_LISTEN or (c.status == psutil.CONN_NONE and not c.raddr):
                found.append((name, c.laddr.ip, c.laddr.port, process.pid))
    return found


def off_loopback(entries: list[tuple[str, str, int, int]]) -> list[tuple[str, str, int, int]]:
    """The entries whose address is not loopback (what must stay empty)."""
    from gym_bridge.distributed.ray_local import is_loopback

    return [entry for entry in entries if not is_loopback(entry[1])]


@contextmanager
def ray_start_cluster(home: Path, head_ip: str = "127.0.0.2", worker_ip: str = "127.0.0.3") -> Iterator[str]:
    """A two-node cluster as users start one: ``ray start --head --block`` and ``ray start --address
    --block`` (real CLI processes, 1 CPU each), with ``HOME=home`` (Ray 2.60 keeps its token in
    ``home/.ray/auth_token``: a token there turns token authentication on), a private temp dir and free
    ports; yields the head's ``HOST:PORT``. Afterwards both nodes and every process under them are ended
    by PID (never ``ray stop``, which ends every Ray on the machine).

    Why 127.0.0.2 and .3: Ray resolves 127.0.0.1 and localhost to the machine's routable address when
    clustering is on (which ``ray start --address`` needs), but not the rest of 127.0.0.0/8, so the
    nodes' addresses stay on loopback. With clustering on, Ray's gRPC servers bind every interface.
    """
    import psutil

    from gym_bridge.distributed.ray_cluster import _ask_head

    ray_cli = str(Path(sys.executable).with_name("ray"))
    temp = Path(tempfile.mkdtemp(prefix="gbr-", dir="/tmp"))  # short: Ray's unix socket paths live in it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS", "RAY_ENABLE_WINDOWS"))}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0")
    token = (home / ".ray" / "auth_token").read_text().strip()
    port, client_port = free_port(), free_port()
    address = f"{head_ip}:{port}"
    common = ["--block", "--num-cpus=1", f"--object-store-memory={80 * 1024 * 1024}"]
    nodes: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str], extra_env: dict[str, str]) -> None:
        with open(temp / f"{name}.log", "wb") as log:
            nodes.append(subprocess.Popen([ray_cli, "start", *args, *common], env={**env, **extra_env}, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip

    def wait_for(what: str, done: Callable[[], bool], timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            exited = [p.args for p in nodes if p.poll() is not None]
            logs = " | ".join((temp / f"{n}.log").read_text(errors="replace")[-1500:] for n in ("head", "worker")
                              if (temp / f"{n}.log").exists())  # fmt: skip
            assert not exited and time.monotonic() < deadline, f"{what}: exited {exited}; logs: {logs}"
            time.sleep(0.3)

    seen: set[int] = set()
    try:
        start("head", ["--head", f"--port={port}", f"--node-ip-address={head_ip}", f"--temp-dir={temp / 'h'}",
                       "--include-dashboard=false", f"--ray-client-server-port={client_port}"], {})  # fmt: skip
        wait_for("the head answers with the token", lambda: _ask_head(address, token, timeout_s=2.0) is None)
        start("worker", [f"--address={address}", f"--node-ip-address={worker_ip}", f"--temp-dir={temp / 'w'}"],
              {"RAY_AUTH_MODE": "token"})  # fmt: skip
        wait_for("both nodes are alive", lambda: alive_nodes(address, token) == 2)
        for node in nodes:  # seen now: a process whose parent dies first is still ended by its PID
            seen |= {p.pid for p in ray_processes(psutil.Process(node.pid))}
        yield address
    finally:
        for node in nodes:
            seen |= {p.pid for p in ray_processes(psutil.Process(node.pid))} if node.poll() is None else set()
        procs = [psutil.Process(pid) for pid in seen if psutil.pid_exists(pid)]
        for process in procs:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=15)
        for node in nodes:
            node.wait(timeout=15)
        shutil.rmtree(temp, ignore_errors=True)
        assert not [p for p in alive if running(p)], f"left running: {[(p.pid, p.name()) for p in alive]}"


def free_port() -> int:
    """A TCP port free on every interface (Ray's GCS binds them all)."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def alive_nodes(address: str, token: str) -> int:
    """How many nodes the head at ``address`` has alive (asked with ``token``, over gRPC)."""
    import grpc
    from ray.core.generated import gcs_pb2, gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetAllNodeInfo(
                gcs_service_pb2.GetAllNodeInfoRequest(), timeout=5, metadata=[("authorization", f"Bearer {token}")]
            )
        except grpc.RpcError:
            return 0
    return sum(node.state == gcs_pb2.GcsNodeInfo.ALIVE for node in reply.node_info_list)
