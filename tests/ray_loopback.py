"""Shared by the Ray tests: a private loopback Ray per module, and the check that every Ray socket is
on loopback (this process and every process under it: GCS, raylets, agents, workers)."""

from __future__ import annotations

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


def ray_processes() -> list[Any]:
    """This process and all its descendants (psutil processes)."""
    import psutil

    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def listeners() -> list[tuple[str, str, int, int]]:
    """``(process name, address, port, pid)`` of every listening (or bound, unconnected) inet socket of
    this process and its descendants, as ``ss -lntup`` would list them."""
    import psutil

    found: list[tuple[str, str, int, int]] = []
    for process in ray_processes():
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
