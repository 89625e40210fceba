"""Shared by the Ray tests: a private loopback Ray per module, a simulated two-node cluster on 127.0.0.1
per module, and the check that every Ray socket is on loopback (this process, or a given one, and every
process under it: GCS, raylets, agents, workers)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest


def loopback_ray_fixture(num_cpus: int, object_store_memory_mb: int = 100) -> Callable[..., Any]:
    """A module-scoped fixture: a private Ray on 127.0.0.1 with ``num_cpus`` logical CPUs, shut down
    after the module (starting one takes ~10 s on 2 cores). Assign it to a name in the test module."""

    @pytest.fixture(scope="module")
    def local_ray() -> Iterator[Any]:
        import ray

        from gym_bridge.generation.ray_local import start_local_ray

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

        from gym_bridge.generation.ray_local import import_ray

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
    from gym_bridge.generation.ray_local import is_loopback

    return [entry for entry in entries if not is_loopback(entry[1])]
