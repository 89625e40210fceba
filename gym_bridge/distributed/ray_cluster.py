"""Join an existing Ray cluster and reserve its resources with placement groups, or fail fast.

Why a module of its own: :mod:`~gym_bridge.distributed.ray_local` starts a private single-node Ray on
127.0.0.1; this one is for a cluster someone else started (``ray start --head`` on one node,
``ray start --address=HEAD:PORT`` on the others). Both the data-parallel training workers and the
generation replicas reserve what they need here, as one placement group each (Ray's gang
scheduling: all bundles or none), and wait for it with a timeout: a cluster too small for the
request is a start-up error naming the keys, never a hang.

The address: ``cluster.ray_address``, else ``RAY_ADDRESS`` (Ray's own variable). A loopback address
(a cluster simulated on this machine) keeps the driver on 127.0.0.1; any other turns on Ray's
multi-host mode, so the driver registers with its routable address as ``ray start`` nodes do.

Token authentication (Ray 2.60): ``ray start --head`` turns it on when a token exists
(``~/.ray/auth_token``, which any local ``ray.init()`` writes), and a driver joining by address without
``RAY_AUTH_MODE=token`` is refused; Ray then retries for ~20 s and says only "Failed to connect to Ray
cluster". :func:`connect_ray` asks the head first (one gRPC call) and either says what to set or, for a
cluster on this machine that accepts this machine's token, sets ``RAY_AUTH_MODE=token`` for this process.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
from collections.abc import Callable
from typing import Any

from gym_bridge.distributed.ray_local import import_ray, is_loopback, keeps_sigterm

__all__ = [
    "RayActorLost",
    "RayClusterError",
    "check_cluster",
    "check_token_auth",
    "close_actors",
    "connect_ray",
    "describe_nodes",
    "gather",
    "gcs_answers",
    "in_bundle",
    "node_here",
    "remove_placement",
    "reserve",
    "resolve_address",
]


class RayClusterError(RuntimeError):
    """The Ray cluster named cannot be joined: nothing answers there, or it wants a token this process
    cannot give. The message names the key or option and what to do."""


class RayActorLost(RayClusterError):
    """An actor the run cannot go on without is gone (its process killed, its node lost) while it worked
    for the run: the message names which actor, where it ran and what it was doing (instead of Ray's
    traceback, which names a class and an actor id)."""


def resolve_address(configured: str | None) -> str | None:
    """The Ray cluster to join: ``cluster.ray_address``, else ``RAY_ADDRESS``, else None (none)."""
    return configured or os.environ.get("RAY_ADDRESS") or None


def _is_loopback_address(address: str) -> bool:
    host = address.removeprefix("ray://").rsplit(":", 1)[0]
    try:
        return is_loopback(host)
    except ValueError:  # a host name ("auto", "head-node")
        return host == "localhost"


def connect_ray(
    address: str, keys: str = "cluster.ray_address (or RAY_ADDRESS)", say: Callable[[str], None] | None = None
) -> bool:
    """Connect this process to the Ray cluster at ``address`` unless it is connected already.

    Returns True when this call connected (the caller then owns ``ray.shutdown()``, which disconnects
    this driver and leaves the cluster running). A cluster that cannot be reached, or that wants a token
    this process cannot give (:func:`check_token_auth`), is an error naming ``keys``. ``say``: where a
    note goes (stderr by default).
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    check_cluster(address, keys, say)
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = not _is_loopback_address(address)
    try:
        with keeps_sigterm():
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayClusterError(f"{keys} is {address!r}: cannot join that Ray cluster ({exc})") from exc
    return True


def check_cluster(address: str, keys: str, say: Callable[[str], None] | None = None) -> None:
    """What :func:`connect_ray` checks before ``ray.init`` (also run before a training run loads its
    model): a head answers at ``address``, and its token authentication lets this process in
    (:func:`check_token_auth`). Raises :class:`RayClusterError` naming ``keys``."""
    _reachable(address, keys)  # Ray itself retries an absent head for minutes
    check_token_auth(address, keys, say or (lambda text: print(text, file=sys.stderr, flush=True)))


def _reachable(address: str, keys: str, timeout_s: float = 10.0) -> None:
    """Fail fast when nothing answers at a ``HOST:PORT`` address (``auto`` and ``ray://`` are Ray's to resolve)."""
    if address == "auto" or "://" in address or ":" not in address:
        return
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        raise RayClusterError(
            f"{keys} is {address!r}: no Ray head answers there ({exc}); start one with "
            "`ray start --head --port=PORT` and pass its HEAD_IP:PORT"
        ) from exc


AUTH_MODE = "RAY_AUTH_MODE"
TOKEN_SOURCES = "~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
"""Where Ray 2.60 reads a token from (``ray get-auth-token`` on the head prints the cluster's)."""


def _local_token() -> str | None:
    """The token Ray would send from here (its own loader reads :data:`TOKEN_SOURCES`); None without one."""
    try:
        from ray._raylet import AuthenticationTokenLoader
    except ImportError:  # a Ray without token authentication
        return None
    loader = AuthenticationTokenLoader.instance()
    loader.reset_cache()  # the variables or the file may have changed since it last looked
    return loader.get_raw_token(ignore_auth_mode=True) or None


def _ask_head(address: str, token: str | None, timeout_s: float = 10.0) -> Any:
    """One call to the head's GCS (its cluster id), with ``token`` or without: None when it answers,
    else the gRPC status code (``UNAUTHENTICATED``: a token is wanted, or this one is wrong); ``False``
    when this Ray cannot ask (no such service in its generated code)."""
    try:
        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:
        return False
    metadata = [("authorization", f"Bearer {token}")] if token else None
    with grpc.insecure_channel(address) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s, metadata=metadata
            )
        except grpc.RpcError as err:
            return err.code()
    return None


def check_token_auth(address: str, keys: str, say: Callable[[str], None]) -> None:
    """Make sure this process can join ``address`` as far as token authentication goes, or say what to set.

    A head that answers without a token: nothing to do. One that wants a token: with ``RAY_AUTH_MODE=token``
    set, this process's token must be the cluster's; without it, a cluster on this machine that accepts
    this machine's token is joined with ``RAY_AUTH_MODE=token`` set for this process (the token never
    leaves the machine, and the cluster already holds it); any other case is a :class:`RayClusterError`
    naming what to set. Addresses Ray resolves itself (``auto``, ``ray://``) are left to Ray."""
    if address == "auto" or "://" in address or ":" not in address:
        return
    if getattr(_ask_head(address, None), "name", None) != "UNAUTHENTICATED":
        return  # no token wanted (or a problem ray.init reports better)
    mode = (os.environ.get(AUTH_MODE) or "").lower()
    token = _local_token()
    accepted = token is not None and _ask_head(address, token) is None
    wants = f"{keys} is {address!r}: that Ray cluster requires token authentication"
    if mode == "token":
        if token is None:
            raise RayClusterError(f"{wants}, and {AUTH_MODE}=token is set but this process has no token: "
                               f"put the head's token in {TOKEN_SOURCES} (`ray get-auth-token` on the head prints it)")  # fmt: skip
        if not accepted:
            raise RayClusterError(f"{wants}, and it refuses this process's token ({TOKEN_SOURCES}): give it the "
                               "head's token (`ray get-auth-token` on the head prints it)")  # fmt: skip
        return
    if accepted and not mode and _is_loopback_address(address):
        os.environ[AUTH_MODE] = "token"
        from ray._raylet import Config

        Config.initialize("")  # Ray reads the mode from its config, cached at import: refresh it
        say(f"{address}: the Ray cluster requires token authentication and accepts this machine's token; "
            f"joining with {AUTH_MODE}=token (set it yourself to say so)")  # fmt: skip
        return
    refused = " (it refuses the token this process has)" if token is not None and not accepted else ""
    raise RayClusterError(f"{wants}{refused} (Ray 2.60's `ray start --head` turns it on when a token exists): set "
                       f"{AUTH_MODE}=token for this command, with the head's token in {TOKEN_SOURCES} "
                       "(`ray get-auth-token` on the head prints it)")  # fmt: skip


def describe_nodes(ray: Any) -> str:
    """The alive nodes and their CPUs/GPUs, for error messages."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    parts = [
        f"{n.get('NodeManagerAddress')} ({n['Resources'].get('CPU', 0):g} CPU, {n['Resources'].get('GPU', 0):g} GPU)"
        for n in alive
    ]
    return f"{len(alive)} alive node(s): {', '.join(parts) or 'none'}"


def reserve(bundles: list[dict[str, float]], strategy: str, timeout_s: float, what: str) -> Any:
    """A ready placement group of ``bundles`` with ``strategy``; after ``timeout_s`` without one, the
    group is removed again and ``RuntimeError`` says ``what`` asked for it and what the cluster has."""
    ray = import_ray()
    from ray.util.placement_group import placement_group

    bundles = [{k: v for k, v in b.items() if v} for b in bundles]  # Ray refuses zero-valued entries
    group = placement_group(bundles, strategy=strategy)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement(group)
        raise RuntimeError(
            f"{what}: Ray could not place {len(bundles)} bundle(s) {bundles} ({strategy}) within "
            f"{timeout_s:g} s; the cluster has {describe_nodes(ray)}"
        ) from None
    return group


def in_bundle(group: Any, index: int) -> Any:
    """The scheduling strategy that puts an actor into bundle ``index`` of ``group``."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)


def remove_placement(group: Any) -> None:
    """Give the group's resources back (a cluster outlives the run; its reservations must not).

    Only while the cluster's GCS answers (:func:`gcs_answers`): Ray's own call waits for a GCS that is gone
    (a private Ray whose processes took the SIGTERM sent to the run's whole process group, a head that
    went away) for 60 s and then ends this process with exit status 1, so a run stopped by SIGTERM, its
    step saved, exited 1 a minute later instead of 143. A group whose GCS is gone went with it."""
    import ray

    if not ray.is_initialized() or not gcs_answers():  # disconnected (Ray's call would start a new Ray)
        return
    try:
        ray.util.remove_placement_group(group)
    except Exception:  # already removed, or Ray already disconnected (its groups went with it)
        pass


_GONE = ("UNAVAILABLE", "DEADLINE_EXCEEDED")
"""gRPC answers that mean nothing serves the GCS's address any more (any other answer is a GCS)."""


def gcs_answers(timeout_s: float = 2.0) -> bool:
    """Whether the GCS of the Ray this process is connected to answers one call within ``timeout_s``
    (not connected, or a Ray that cannot be asked: True, so callers do as before)."""
    import ray

    if not ray.is_initialized():  # (asking the runtime context would start a Ray)
        return True
    try:
        address = ray.get_runtime_context().gcs_address
    except Exception:  # a Ray that does not say
        return True
    code = _ask_head(address, None, timeout_s)  # without a token: UNAUTHENTICATED is an answer too
    return getattr(code, "name", None) not in _GONE


def close_actors(ray: Any, actors: list[Any], timeout_s: float = 30.0) -> None:
    """Ask each actor to stop what it serves (its ``close`` method), then kill it by handle: an actor
    already gone has nothing left to stop, and the kill ends the rest whatever ``close`` did."""
    try:
        ray.get([a.close.remote() for a in actors], timeout=timeout_s)
    except Exception:  # a dead actor's close raises; the kills below still run
        pass
    for actor in actors:
        ray.kill(actor)


def gather(
    ray: Any, refs: list[Any], labels: list[str], doing: str, timeout_s: float | None = None
) -> list[Any]:
    """``ray.get(refs)``, one ref per actor, ``labels[i]`` naming ref ``i``'s actor (what it is, its node and
    pid); an actor gone raises :class:`RayActorLost` naming it. Its peers may fail first (a collective
    whose connection closed): then the lost actor, if one of them is, is named rather than their error."""
    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.RayActorError as exc:
        lost = next((i for i, ref in enumerate(refs) if _actor_of(exc, ref)), None)
        raise _lost(labels, lost, doing, exc) from exc
    except ray.exceptions.RayTaskError:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=10)
        for index, ref in enumerate(refs):
            if ref in ready:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    raise _lost(labels, index, doing, exc) from exc
                except Exception:  # that peer's own error: the one raised below
                    pass
        raise


def _actor_of(exc: Any, ref: Any) -> bool:
    """Whether ``exc`` (an actor's death) is about the actor that made ``ref``."""
    try:
        return exc.actor_id is not None and ref.task_id().actor_id().hex() == exc.actor_id
    except Exception:  # an object ref not made by an actor task
        return False


def _lost(labels: list[str], index: int | None, doing: str, exc: Exception) -> RayActorLost:
    who = labels[index] if index is not None else f"one of {len(labels)} Ray actors ({'; '.join(labels)})"
    text = " ".join(str(exc).split())
    reason = text.split(". ", 1)[0].rstrip(".") if text else type(exc).__name__
    cause = re.search(r"The actor is dead because ([^.]*)", text)  # Ray's why: its worker process, its node
    reason += f"; {cause.group(1)}" if cause else ""
    return RayActorLost(f"{who} is gone during {doing} ({type(exc).__name__}: {reason}); the run cannot go on "
                        "without it: the same command resumes from the last checkpoint saved")  # fmt: skip


def node_here() -> dict[str, Any]:
    """Where the calling Ray actor runs: its node's id and address as Ray has them, and its process id
    (what a caller reports, binds servers to, and may end by PID)."""
    import ray

    return {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid()}  # fmt: skip
