"""What the run talks to: one bounded HTTP connection pool for the model and the envs given by URL (the
envs the run starts itself are called in-process, see :mod:`gym_bridge.serving.in_process`), and, with
``--policy``, the embedded policy model served in-process as the model endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from gym_bridge.collect.config import CollectError
from gym_bridge.rollout.agent import make_session
from gym_bridge.serving.retry import Client, RoutedClient

if TYPE_CHECKING:
    from gym_bridge.serving.in_process import InProcessClient

__all__ = ["ClientPool", "concurrency_bound", "connection_cap", "ephemeral_ports", "running_policy"]


class ClientPool:
    """The run's HTTP client: one aiohttp session with up to a connection per worker to each host.

    A rollout makes one request at a time, so a worker never needs two connections to one host. The
    session keeps idle connections per host, so its open connections are bounded per host:
    ``connection_cap`` (what the open-file limit affords) is shared by the ``hosts`` it talks to over HTTP.
    ``in_process``: the envs the run serves in-process; their URLs go there, not over the session.
    """

    def __init__(
        self, workers: int, connection_cap: int, hosts: int = 1, in_process: InProcessClient | None = None
    ) -> None:
        per_host = max(2, min(workers, connection_cap // max(1, hosts)))
        self.session = make_session(max_connections=per_host * max(1, hosts), max_per_host=per_host)
        self.client: Client = self.session
        """What the run's requests are sent with: the session, or a router that also reaches ``in_process``."""
        if in_process is not None and in_process.urls:
            self.client = RoutedClient(self.session, dict.fromkeys(in_process.urls, in_process))

    def for_worker(self, i: int) -> Client:
        return self.client

    async def aclose(self) -> None:
        await self.session.close()


def connection_cap() -> int:
    """Client connections we can afford: half the open-file limit (raised to its hard maximum)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):
                pass
        return max(64, (soft - 512) // 2)
    except (ImportError, OSError):
        return 512


def ephemeral_ports() -> int | None:
    """How many local ports the OS hands out for outgoing connections (one per connection to a given
    address: the ceiling of connections to one server); None where it does not say."""
    try:
        low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    except (OSError, ValueError):
        return None
    return max(0, high - low + 1)


def concurrency_bound(hosts: int) -> tuple[int, str] | None:
    """The most rollouts that can be in flight when they talk to ``hosts`` servers over HTTP, and why
    (the open-file limit and the ephemeral ports); None when nothing goes over HTTP.

    Why: a worker holds one connection at a time; more workers than connections wait in the pool, their
    wait counts against the request timeout, and past the port range connecting fails outright; either
    way a rollout fails that the machine could have run. collect runs at most this many (and says so).
    """
    if hosts <= 0:
        return None
    cap = connection_cap()  # (raises the soft limit to the hard one first)
    try:
        import resource

        files = f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]:,}"
    except (ImportError, OSError):
        files = "unknown"
    ports = ephemeral_ports()
    by_files = max(2, cap // hosts)
    why = f"open-file limit {files} (half for connections: {by_files:,} to each of {hosts} server(s))"
    bound = by_files
    if ports is not None:
        by_ports = max(2, ports * 9 // 10)  # a tenth left for TIME_WAIT and other clients
        why += f", {ports:,} ephemeral ports a destination"
        bound = min(bound, by_ports)
    return bound, why


@contextmanager
def running_policy(name: str, seed: int = 0) -> Iterator[str]:
    """Serve the embedded policy model ``name`` in-process for the run; yield its API base URL.

    This is the only path of ``collect`` that imports torch and transformers.
    """
    try:
        from gym_bridge.generation import load_backend
        from gym_bridge.policy.server import build_policy_app
    except ImportError as e:
        raise CollectError(
            f"--policy needs the embedded policy server (gym_bridge.policy.server), which is not available "
            f"in this install ({e}); serve the model yourself and pass --model-url"
        ) from None
    from gym_bridge.serving.uvicorn_thread import start_in_thread

    try:
        backend = load_backend(name, kind="transformers", seed=seed)
    except (ValueError, OSError) as e:
        raise CollectError(f"--policy {name}: {e}") from None
    running = start_in_thread(build_policy_app(backend, model_name=name), timeout=120.0)
    try:
        yield running.url + "/v1"
    finally:
        running.stop()
