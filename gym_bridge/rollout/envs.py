"""Where environments come from: built-in resources servers by name, or any server by URL.

``collect`` and ``train`` accept either; a name starts the server in-process on a free loopback port
for the duration of the run.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

BUILTIN_SERVERS: dict[str, str] = {
    "math": "resources_servers.math.app:MathServer",
    "code": "resources_servers.code.app:CodeServer",
    "tool_use": "resources_servers.tool_use.app:ToolUseServer",
    "reasoning_gym": "resources_servers.reasoning_gym.app:ReasoningGymServer",
    "equivalence_judge": "resources_servers.equivalence_judge.app:EquivalenceJudgeServer",
}


def is_url(name_or_url: str) -> bool:
    return name_or_url.startswith(("http://", "https://"))


def load_server_class(name: str) -> type[Any]:
    """The resources-server class registered under ``name`` (or a ``module:Class`` path)."""
    target = BUILTIN_SERVERS.get(name, name if ":" in name else None)
    if target is None:
        known = ", ".join(sorted(BUILTIN_SERVERS))
        raise ValueError(f"unknown environment '{name}': use a URL or one of: {known}")
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ValueError(f"environment '{name}' is not available: {e}") from e
    return getattr(module, class_name)


def workers_setting(name: str) -> str | None:
    """The config field that sizes the worker pool of the server registered under ``name`` (its class's
    ``workers_setting``: the math server's verifier processes, the code server's sandboxes), or None."""
    return getattr(load_server_class(name), "workers_setting", None)


@contextmanager
def running_env(name_or_url: str, *, workers: int | None = None, **settings: Any) -> Iterator[str]:
    """Yield a base URL for the environment, starting a built-in server in-process when given a name.

    ``workers`` sizes the started server's worker pool (see :func:`workers_setting`); a ValueError
    says so for a URL or a server without one. ``settings`` are network settings
    (:class:`~gym_bridge.serving.server.ServerSettings`) or keys of the server's own config (the math server's
    ``extraction``...); a key that is neither is a ValueError naming it.
    """
    if is_url(name_or_url):
        if workers is not None:
            raise ValueError(f"cannot size the worker pool of the server at {name_or_url}: it runs on its own")
        yield name_or_url.rstrip("/")
        return
    from gym_bridge.serving.uvicorn_thread import start_in_thread

    where = {"host": settings.get("host", "127.0.0.1"), "port": settings.get("port", 0)}  # the settings' own
    running = start_in_thread(env_app(name_or_url, workers=workers, **settings), **where)
    try:
        yield running.url
    finally:
        running.stop()


def env_app(name: str, *, workers: int | None = None, **settings: Any) -> Any:
    """The ASGI app of the built-in server ``name``, configured as :func:`running_env` describes, not
    yet started (its lifespan starts it): for callers that serve it themselves (in-process training)."""
    from gym_bridge.serving.server import ServerSettings

    server_class = load_server_class(name)
    network = {k: v for k, v in settings.items() if k in ServerSettings.model_fields}
    own = {k: v for k, v in settings.items() if k not in network}
    server = server_class(ServerSettings(**network))
    if workers is not None:
        field = workers_setting(name)
        if field is None:
            raise ValueError(f"environment '{name}' has no worker pool to size")
        own[field] = workers
    if own:
        config = getattr(server, "config", None)
        if config is None:
            raise ValueError(f"environment '{name}' has no setting {', '.join(map(repr, own))}")
        config = config.model_validate({**config.model_dump(), **own})
        server = server_class(ServerSettings(**network), config=config)
    return server.build_app()
