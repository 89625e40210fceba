"""Start-up checks that need the machine, not just the YAML: run before the model loads.

The schema (:mod:`gym_bridge.train.config`) refuses keys that cannot work whatever the machine; these
refuse keys that cannot work *here* (a missing optional package, no GPU, an environment without the
worker pool a key sizes, an env URL where nothing answers, a Ray cluster that will not let the run
in), each with a message naming the key, before minutes go into loading a model.
"""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from gym_bridge.train.config import MasterConfig

__all__ = ["check_machine", "machine_problems", "service_problems", "unreachable"]


def machine_problems(cfg: MasterConfig) -> list[str]:
    """One message per configured key this machine cannot honour."""
    from gym_bridge.rollout.envs import load_server_class
    from gym_bridge.train.bookkeeping.logging import WANDB_INSTALL_HINT
    from gym_bridge.train.learner.device import device_problems

    problems = [
        f"{key} is {path}, which is a file, not a directory: give the run a directory"
        for key, path in _output_dirs(cfg)
        if path.exists() and not path.is_dir()
    ]  # used to fail with a FileExistsError traceback once the model and servers were up
    if cfg.logger.wandb_enabled and importlib.util.find_spec("wandb") is None:
        problems.append(f"logger.wandb_enabled needs the wandb package: {WANDB_INSTALL_HINT} (or set it to false)")
    if cfg.logger.monitor_gpus:
        from gym_bridge.train.bookkeeping.gpu_monitor import open_gpu_monitor
        from gym_bridge.train.config import ConfigError

        try:
            open_gpu_monitor(interval_s=3600.0).close()
        except ConfigError as err:
            problems.extend(err.problems)
    if cfg.policy.generation.backend == "vllm":
        from gym_bridge.generation.vllm_backend import VllmUnavailableError, _import_vllm

        try:
            _import_vllm()
        except VllmUnavailableError as err:
            problems.append(
                f"policy.generation.backend: {err}; in a training config that is policy.generation.backend: "
                "transformers, which generates on the policy's own device (the same GPU)"
            )
    problems.extend(device_problems(cfg))  # CUDA asked for and absent, bf16 on a GPU without it
    replicated = [name for name, env in cfg.env.items() if env.replicas]
    if replicated and importlib.util.find_spec("ray") is None:
        from gym_bridge.distributed.ray_local import RAY_EXTRA_HINT

        problems.extend(f"env.{name}.replicas runs the env's replicas on Ray: {RAY_EXTRA_HINT}" for name in replicated)
    for name, env in cfg.env.items():
        if env.num_workers is None or env.url is not None:
            continue
        server = env.server or name
        try:
            sized = getattr(load_server_class(server), "workers_setting", None)
        except ValueError as err:
            problems.append(f"env.{name}.server: {err}")
            continue
        if sized is None:
            problems.append(f"env.{name}.num_workers: environment '{server}' has no worker pool to size")
    return problems


def _output_dirs(cfg: MasterConfig) -> list[tuple[str, Path]]:
    dirs = [("logger.log_dir", Path(cfg.logger.log_dir))]
    if cfg.checkpointing.enabled:
        dirs.append(("checkpointing.checkpoint_dir", Path(cfg.checkpointing.checkpoint_dir)))
    return dirs


def service_problems(cfg: MasterConfig) -> list[str]:
    """One message per service the run needs that will not serve it: an ``env.<name>.url`` where nothing
    answers, a ``cluster.ray_address`` with no head or whose token authentication shuts the run out."""
    problems = []
    if cfg.grpo.mode == "online" or cfg.data.validation:  # the envs serve rollouts: one given by URL must answer
        problems.extend(
            f"env.{name}.url: {problem}" for name, env in cfg.env.items() if env.url and (problem := unreachable(env.url))
        )
    return problems + _ray_cluster_problems(cfg)


def _ray_cluster_problems(cfg: MasterConfig) -> list[str]:
    """The cluster at ``cluster.ray_address`` (or ``RAY_ADDRESS``), when the run puts anything on Ray:
    no head there, or one whose token authentication this process cannot pass (Ray 2.60), is said now
    rather than after the model has loaded."""
    from gym_bridge.distributed.ray_cluster import resolve_address

    address = resolve_address(cfg.cluster.ray_address)
    uses_ray = (
        cfg.cluster.train_workers_per_node > 0
        or cfg.policy.generation.backend == "ray"
        or any(env.replicas for env in cfg.env.values())
    )
    if not address or not uses_ray or importlib.util.find_spec("ray") is None:
        return []
    from gym_bridge.distributed.ray_cluster import RayClusterError, check_cluster

    try:
        check_cluster(address, "cluster.ray_address (or RAY_ADDRESS)")
    except RayClusterError as err:
        return [str(err)]
    return []


def unreachable(url: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing can answer at ``url`` (no such host, nothing listening), or None when a connection opens.

    Why: an env server that is not up failed every rollout of the first step, after the model had loaded
    (and, with ``--fresh``, after the earlier run had been set aside)."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as err:
        return f"{url!r} has no valid port ({err})"
    if not parts.hostname:
        return f"{url!r} names no host"
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as err:
        return f"nothing answers at {url} ({err.strerror or err}): start that server first"
    return None


def check_machine(cfg: MasterConfig) -> None:
    """Raise :class:`~gym_bridge.train.config.ConfigError` listing :func:`machine_problems` and
    :func:`service_problems`, if any."""
    from gym_bridge.train.config import ConfigError

    problems = machine_problems(cfg) or service_problems(cfg)  # services only once the machine can run
    if problems:
        raise ConfigError(problems)
