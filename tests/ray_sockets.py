"""The Ray tests' loopback check: every listening socket of this process and its descendants.

Shared by the Ray tests (generation backend, collection shards): Ray's GCS, raylets, agents and worker
processes are all descendants of the test process (a private Ray, or a ``ray.cluster_utils.Cluster``),
so walking the process tree finds every socket Ray opened.
"""

from __future__ import annotations

import psutil

from gym_bridge.generation.ray_local import is_loopback

__all__ = ["listeners", "off_loopback"]


def listeners() -> list[tuple[str, str, int, int]]:
    """``(process name, address, port, pid)`` of every listening or unconnected inet socket in the tree."""
    me = psutil.Process()
    found: list[tuple[str, str, int, int]] = []
    for process in [me, *me.children(recursive=True)]:
        try:
            name, connections = process.name(), process.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        for c in connections:
            if c.status == psutil.CONN_LISTEN or (c.status == psutil.CONN_NONE and not c.raddr):
                found.append((name, c.laddr.ip, c.laddr.port, process.pid))
    return found


def off_loopback(found: list[tuple[str, str, int, int]]) -> list[tuple[str, str, int, int]]:
    """The entries of ``found`` bound to an address other than loopback (all interfaces included)."""
    return [entry for entry in found if not is_loopback(entry[1])]
