"""Slow clients cannot hold a server's connections: header and body read deadlines, over real sockets.

1,000 connections that trickle a request's headers a byte at a time are all closed by the server once
the header deadline passes, while ``/health`` keeps answering; a body that stops arriving gets a 408.
Short deadlines are configured here (1 s) so the test is quick; the defaults are 10 s and 60 s.
"""

from __future__ import annotations

import resource
import select
import socket
import time

import httpx

from gym_bridge.server import ServerSettings, start_in_thread

from .envs import ArithmeticEnv

CONNECTIONS = 1000


def test_trickled_headers_are_cut_off_and_the_server_keeps_answering():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 3 * CONNECTIONS + 200)), hard))
    with start_in_thread(ArithmeticEnv().build_app(), header_timeout_s=1.0) as running:
        host, port = running.url.removeprefix("http://").split(":")
        socks = []
        for _ in range(CONNECTIONS):
            sock = socket.create_connection((host, int(port)))
            sock.sendall(b"POST /verify HTTP/1.1\r\nHost: x\r\n")
            sock.setblocking(False)
            socks.append(sock)
        closed: set[int] = set()
        start = time.monotonic()
        health_answers = 0
        while len(closed) < CONNECTIONS and time.monotonic() - start < 20:
            for i, sock in enumerate(socks):  # one more header byte on each open connection
                if i not in closed:
                    try:
                        sock.send(b"X")
                    except OSError:
                        closed.add(i)
            poller = select.poll()  # select() cannot watch descriptors past 1024
            for i, sock in enumerate(socks):
                if i not in closed:
                    poller.register(sock, select.POLLIN)
            by_fd = {sock.fileno(): i for i, sock in enumerate(socks)}
            for fd, _ in poller.poll(200):
                try:
                    data = socks[by_fd[fd]].recv(4096)
                except OSError:
                    data = b""
                if not data:
                    closed.add(by_fd[fd])
            health_answers += httpx.get(running.url + "/health", timeout=5).status_code == 200
        elapsed = time.monotonic() - start
        for sock in socks:
            sock.close()
    assert len(closed) == CONNECTIONS, f"{CONNECTIONS - len(closed)} trickling connections still open"
    assert elapsed < 15, f"closing them took {elapsed:.1f} s"
    assert health_answers >= 3


def test_a_stalled_body_gets_a_408():
    env = ArithmeticEnv(ServerSettings(body_timeout_s=1.0))
    with start_in_thread(env.build_app()) as running:
        host, port = running.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /verify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
            start = time.monotonic()
            answer = sock.recv(4096)
            waited = time.monotonic() - start
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"request body not received within 1 s" in answer
        assert waited < 5
        assert httpx.get(running.url + "/health", timeout=5).status_code == 200
