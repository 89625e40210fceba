"""Serving an ASGI app with uvicorn from a background thread: how every server of the project runs.

Why its own module: the resources servers, the policy server, the viewer, and the tests' fake models all
start the same way (a loopback port, a large accept backlog, the head limits of
:mod:`gym_bridge.serving.header_limits`, a long keep-alive), and :func:`start_in_thread` is the one place
that says how.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from gym_bridge.serving.header_limits import HEADER_TIMEOUT_S, protocol_with_header_limits


@dataclass
class RunningServer:
    """A uvicorn server running in a background thread; ``stop()`` ends it."""

    url: str
    _server: Any
    _thread: threading.Thread

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


KEEP_ALIVE_S = HEADER_TIMEOUT_S
"""An idle keep-alive connection is closed this long after its last answer (uvicorn's default is 5 s).

Why: a busy client reads an answer and sends its next request on the same connection seconds later
(``collect --concurrency 65536`` on 2 cores: 15 s a round); closed after 5 s, half its requests met a
connection the server had just closed and were sent again (16,038 resends in 32,768 rollouts, 480
instead of 780 rollouts/s). An idle connection then costs what a new silent one does (the header deadline)."""


def start_in_thread(
    app: Any, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0, header_timeout_s: float = HEADER_TIMEOUT_S,
    keep_alive_s: float = KEEP_ALIVE_S,
) -> RunningServer:
    """Serve an ASGI app from a daemon thread on a (by default free) loopback port; return its URL."""
    import uvicorn

    # backlog: a burst of thousands of new connections (collect at high concurrency) must not overflow
    # the accept queue (dropped SYNs are retried after 1 s, 3 s, ...); the kernel caps it at somaxconn.
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="on", access_log=False, ws="none", backlog=4096,
        timeout_keep_alive=keep_alive_s,
        http=protocol_with_header_limits(header_timeout_s),
    )  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"server on {host}:{port} failed to start")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"server on {host}:{port} did not start within {timeout} s")
        time.sleep(0.002)  # start-up is ~5 ms: a coarse poll would dominate it
    bound_port = server.servers[0].sockets[0].getsockname()[1]
    return RunningServer(url=f"http://{host}:{bound_port}", _server=server, _thread=thread)
