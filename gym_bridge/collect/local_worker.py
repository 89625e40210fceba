"""One worker process of ``collect --workers N`` (``python -m gym_bridge.collect.local_worker FD``).

It starts its own envs as the single-process run does (``--env math`` served in-process on its own event
loop, or on a loopback port with ``--env-transport http``; a URL env is used as given) and its own HTTP
pool, then runs the rollouts its parent sends over the socket ``FD`` and sends each one back encoded
(:mod:`gym_bridge.collect.encoded`). It writes no file: the parent writes the output, so a worker that
dies loses only its rollouts in flight, which ``--resume`` makes again.

The conversation (:mod:`gym_bridge.collect.frames`): the parent's first frame is the set-up (routes, env
transport, agent config, slots, hosts); the worker answers ``("ready", {...})`` or ``("error", text)``.
Then the parent sends lists of ``(id, task, env name, extra params)`` and the worker lists of
``(id, encoded rollout)`` (or ``(id, ("raised", text))`` for an error in the agent itself). The end of the
parent's stream (it closed the socket, or died) ends the worker: rollouts still running are cancelled and
its envs shut down. Ctrl-C is the parent's to handle: the worker ignores SIGINT.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from contextlib import ExitStack
from typing import Any

from gym_bridge.collect.client import ClientPool, connection_cap
from gym_bridge.collect.encoded import encode
from gym_bridge.collect.frames import Outbox, read_frame, write_frame
from gym_bridge.collect.routing import EnvRoute
from gym_bridge.rollout.agent import AgentConfig, run_rollout
from gym_bridge.serving.event_loop import new_event_loop
from gym_bridge.serving.gc_policy import rare_collections
from gym_bridge.serving.in_process import InProcessClient

__all__ = ["WorkerSetup", "main", "serve"]

WorkerSetup = dict[str, Any]
"""The parent's first frame: ``routes`` (list of :class:`EnvRoute`), ``env_transport``, ``agent_config``
(:class:`AgentConfig`), ``slots`` (rollouts this worker holds at most) and ``hosts`` (servers it reaches
over HTTP, for its pool's per-host bound)."""


async def _start_envs(
    routes: list[EnvRoute], transport: str, stack: ExitStack, in_process: InProcessClient
) -> dict[str, str]:
    """Env name -> URL this worker reaches it at (as ``collect`` starts them; see the module docstring)."""
    from gym_bridge.collect.run import host_name
    from gym_bridge.rollout.envs import env_app, is_url, running_env

    url_of: dict[str, str] = {}
    names: set[str] = set()
    for route in routes:
        name = route.key or route.target
        try:
            if transport == "in-process" and not is_url(route.target):
                url_of[name] = await in_process.mount(host_name(route, names), env_app(route.target))
            else:
                url_of[name] = stack.enter_context(running_env(route.target))
        except Exception as e:
            raise RuntimeError(f"env '{route.target}' did not start: {type(e).__name__}: {e}") from None
    return url_of


async def serve(sock: socket.socket) -> None:
    """Answer the parent on ``sock`` until it closes its end (see the module docstring)."""
    reader, writer = await asyncio.open_connection(sock=sock)
    setup: WorkerSetup | None = await read_frame(reader)
    if setup is None:
        return
    agent_config: AgentConfig = setup["agent_config"]
    in_process = InProcessClient()
    running: set[asyncio.Task[None]] = set()
    pool: ClientPool | None = None
    with ExitStack() as stack:
        try:
            try:
                url_of = await _start_envs(setup["routes"], setup["env_transport"], stack, in_process)
            except RuntimeError as e:
                write_frame(writer, ("error", str(e)))
                await writer.drain()
                return
            pool = ClientPool(setup["slots"], connection_cap(), setup["hosts"], in_process)
            client = pool.client
            write_frame(writer, ("ready", {"pid": os.getpid(), "env_urls": url_of}))
            outbox = Outbox(writer)

            async def one(job_id: int, task: dict[str, Any], env_name: str, extra: dict[str, Any] | None) -> None:
                try:
                    rollout = await run_rollout(client, task, url_of[env_name], agent_config, extra_params=extra)
                    outbox.put((job_id, encode(rollout, task, env_name)))
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # the agent's own bug: the parent stops the run with it
                    outbox.put((job_id, ("raised", f"{type(e).__name__}: {e}")))

            while (jobs := await read_frame(reader)) is not None:
                for job in jobs:
                    task = asyncio.ensure_future(one(*job))
                    running.add(task)
                    task.add_done_callback(running.discard)
        finally:
            for task in list(running):
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            if pool is not None:
                await pool.aclose()
            await in_process.aclose()
            writer.close()


def main(argv: list[str] | None = None) -> None:
    """Serve the parent on the inherited socket whose descriptor is the one argument."""
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops its workers (Ctrl-C reaches the group)
    sock = socket.socket(fileno=int(args[0]))
    loop = new_event_loop()
    try:
        with rare_collections():
            loop.run_until_complete(serve(sock))
    finally:
        loop.close()


if __name__ == "__main__":
    main()
