"""Which env a task row goes to: ``--env`` arguments parsed into routes, and the :class:`Router`.

With one env every row goes to it. With several (``--env KEY=NAME_OR_URL``; a bare name is its own key,
so ``--env math`` is ``math=math``), a row goes to the env keyed by its ``env`` field, else by its
``agent_ref.name``, else by that name without a ``_simple_agent``/``_agent`` suffix, else to the env keyed
``default`` (or the one env given as a bare URL). A row that matches none is a bad row.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from gym_bridge.collect.config import CollectError

__all__ = ["EnvRoute", "Router", "parse_env_args"]


@dataclass(frozen=True)
class EnvRoute:
    """One ``--env``: an optional routing key and a built-in env name or a URL."""

    key: str | None
    target: str


_KEY = re.compile(r"^[A-Za-z0-9_.\-]+$")


def parse_env_args(values: list[str]) -> list[EnvRoute]:
    """``["math", "tools=http://h:1", "http://h:2"]`` -> routes; a bare name is its own key."""
    from gym_bridge.rollout.envs import is_url

    routes: list[EnvRoute] = []
    for value in values:
        key, sep, target = value.partition("=")
        if sep and _KEY.match(key) and "://" not in key and target:
            routes.append(EnvRoute(key, target))
        elif is_url(value):
            routes.append(EnvRoute(None, value))
        elif _KEY.match(value) or ":" in value:
            routes.append(EnvRoute(value, value))
        else:
            raise CollectError(f"--env {value!r}: expected NAME, URL or KEY=NAME_OR_URL")
    keys = [r.key for r in routes if r.key is not None]
    duplicates = sorted(k for k, n in Counter(keys).items() if n > 1)
    if duplicates:
        raise CollectError(f"--env: key(s) given more than once: {', '.join(duplicates)}")
    if sum(r.key is None for r in routes) > 1:
        raise CollectError("--env: only one env may be a bare URL (the default); give the others a KEY=URL")
    return routes


class Router:
    """Picks a row's env (see the module docstring for the rule)."""

    def __init__(self, routes: list[EnvRoute], urls: list[str]) -> None:
        self.by_key = {r.key: (r, url) for r, url in zip(routes, urls, strict=True) if r.key is not None}
        self.url_of = {r.key or r.target: url for r, url in zip(routes, urls, strict=True)}
        """Env name (its ``--env`` key, or the URL of a bare-URL env) -> URL."""
        self.default: tuple[EnvRoute, str] | None = None
        if len(routes) == 1:
            self.default = (routes[0], urls[0])
        else:
            for route, url in zip(routes, urls, strict=True):
                if route.key is None or route.key == "default":
                    self.default = (route, url)

    def route(self, row: dict[str, Any]) -> tuple[str, str, str] | None:
        """``(agent name, env URL, env name)`` for a row, or None when no env fits."""
        agent_name = (
            (row.get("agent_ref") or {}).get("name") if isinstance(row.get("agent_ref"), dict) else None
        )
        candidates = [row.get("env"), agent_name]
        if isinstance(agent_name, str):
            candidates += [re.sub(r"(_simple)?_agent$", "", agent_name)]
        for key in candidates:
            if isinstance(key, str) and key in self.by_key:
                route, url = self.by_key[key]
                return agent_name or key, url, key
        if self.default is not None:
            route, url = self.default
            return agent_name or route.key or route.target, url, route.key or route.target
        return None

    def urls(self) -> list[str]:
        """Every env URL a row can be routed to."""
        found = [url for _, url in self.by_key.values()]
        return found + ([self.default[1]] if self.default is not None else [])

    def describe(self) -> str:
        """The routing table in a few words, for a row that matches none of it."""
        keys = ", ".join(sorted(self.by_key)) or "none"
        return f"env keys: {keys}" + ("; with a default" if self.default else "; no default")
