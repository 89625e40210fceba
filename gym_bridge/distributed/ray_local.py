"""Start (or join) a single-node Ray whose every socket stays on 127.0.0.1.

Why a module of its own: ``ray.init(_node_ip_address="127.0.0.1")`` alone is not enough on Linux. Ray
"resolves" a loopback node address to the machine's routable address (``resolve_ip_for_localhost``)
unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, and its gRPC servers (GCS, raylet, object manager,
core workers) bind the node address; with the variable unset they listened on every interface.
With it set before Ray starts, every listener (GCS, raylet, workers, runtime-env agent) is on
127.0.0.1, and :func:`start_local_ray` checks that the node came up on loopback before returning.
The dashboard (an HTTP server) is not started, nor are usage statistics sent.

Ray is optional (``pip install 'gym-bridge[ray]'``); importing this module does not import it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "RAY_EXTRA_HINT",
    "RayUnavailableError",
    "import_ray",
    "is_loopback",
    "keeps_sigterm",
    "start_local_ray",
]

RAY_EXTRA_HINT = "pip install 'gym-bridge[ray]' (or pip install ray)"

# Read by Ray when it is imported: keep the node on loopback, send no usage statistics.
_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


class RayUnavailableError(ImportError):
    """Ray is not installed; the ``ray`` generation backend needs the ``[ray]`` extra."""


def import_ray() -> Any:
    """The ``ray`` module, with the loopback settings in place; a clear error naming the extra if absent."""
    for key, value in _LOOPBACK_ENV.items():
        os.environ.setdefault(key, value)
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailableError(
            f"the 'ray' generation backend needs Ray: {RAY_EXTRA_HINT}; "
            "or set policy.generation.backend=transformers"
        ) from exc
    # Ray read the variable when it was first imported; if that happened before we set it, say so here.
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = _clustering_enabled()
    return ray


def _clustering_enabled() -> bool:
    """Ray's own reading of the variable (``true``/``1`` enable it)."""
    return os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "").lower() in ("true", "1")


@contextmanager
def keeps_sigterm() -> Iterator[None]:
    """Around ``ray.init``: put back this process's SIGTERM handling afterwards.

    Why: ``ray.init`` replaces it. Its core worker installs a crash handler that answers SIGTERM with a
    stack dump (``*** SIGTERM received ...``) and SIGABRT, so a run stopped by SIGTERM before its own
    handler was in place (loading, starting servers) exited 134, as a crash, not 143. The Ray processes a
    private Ray started end with this process anyway (Ray ties their life to it), and a joined cluster
    ends the actors of a driver that is gone. Only the main thread can set a handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (``::ffff:127.0.0.1``)."""
    address = ipaddress.ip_address(host.strip("[]").split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def start_local_ray(num_cpus: int, object_store_memory_mb: int = 200, num_gpus: int = 0) -> bool:
    """Start a private single-node Ray on 127.0.0.1 unless this process already has one.

    ``num_cpus`` is Ray's logical CPU count (what actors reserve), not a thread limit; ``num_gpus`` the
    GPUs it may hand to actors (data-parallel training workers). Returns True
    when this call started Ray (the caller then owns ``ray.shutdown()``), False when Ray was already
    up. Raises if the node is not on loopback (Ray then is shut down again).
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    if _clustering_enabled():
        raise RuntimeError(
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is set to enable clustering: Ray would listen on every "
            "interface; unset it to run the ray backend on 127.0.0.1"
        )
    with keeps_sigterm():
        ray.init(
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            object_store_memory=object_store_memory_mb * 1024 * 1024,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    node_ip = ray.util.get_node_ip_address()
    if not is_loopback(node_ip):
        ray.shutdown()
        raise RuntimeError(f"Ray came up on {node_ip}, not on loopback; shut it down again")
    return True
