"""Limits on a connection's request head, which uvicorn does not set: a deadline and a size.

Why: uvicorn arms no timer on a new connection nor while headers trickle in, so 1,000 clients that open
connections and send a header byte now and then hold 1,000 descriptors forever; and it puts no bound on
a head's size, so one connection streaming a header for the whole deadline grows the server by ~100 MB
(h11 has ``max_incomplete_event_size``; httptools has nothing like it). :func:`protocol_with_header_limits`
is uvicorn's httptools protocol with both; :mod:`gym_bridge.serving.uvicorn_thread` serves every app with it.
"""

from __future__ import annotations

import json
from typing import Any

from gym_bridge.serving.deadlines import Deadlines

HEADER_TIMEOUT_S = 60.0
"""A connection must deliver a request's whole header block this long after it opens (or after the
request's first byte); slower ones are closed. Bodies have their own limit (``JsonApp.body_timeout_s``).

60 s, nginx's ``client_header_timeout``: an honest client can be slow too. ``collect --concurrency
10000`` on a loaded 2-core machine opens thousands of connections faster than its own event loop writes
their requests; with 10 s the server closed 7,495 of 20,000 rollouts' connections before their headers
came (all retried, then failed)."""

MAX_HEADER_BYTES = 64 * 1024
"""Most bytes of a request's head (request line and headers); more is a 431 and the connection closes."""


def protocol_with_header_limits(header_timeout_s: float, max_header_bytes: int = MAX_HEADER_BYTES) -> type:
    """uvicorn's httptools protocol, closing connections whose headers do not arrive in time or do not end.

    Why: uvicorn arms no timer on a new connection nor while headers trickle in, so 1,000 clients that
    open connections and send a header byte now and then hold 1,000 descriptors forever; and it puts no
    bound on a head's size, so one connection streaming a header for the whole deadline grows the
    server by ~100 MB (h11 has ``max_incomplete_event_size``; httptools has nothing like it).
    """
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    refusal = json.dumps({"detail": f"request headers larger than the limit of {max_header_bytes} bytes"}).encode()
    answer_431 = (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(refusal), refusal)
    )

    feed = HttpToolsProtocol.data_received
    heads: list[Deadlines] = []  # this server's header deadlines: one timer for all its connections

    def too_slow(protocol: HeaderLimits) -> None:
        protocol.transport.close()

    class HeaderLimits(HttpToolsProtocol):  # type: ignore[misc]
        _in_head = True  # between a request's first byte (or the connection's start) and its end of headers
        _head_bytes = 0

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            HttpToolsProtocol.connection_made(self, transport)
            if not heads or heads[0].loop is not self.loop:
                heads[:] = [Deadlines(self.loop, header_timeout_s, too_slow)]
            self._heads = heads[0]
            self._heads.set(self)

        def data_received(self, data: bytes) -> None:
            if not self._in_head:
                feed(self, data)
                return
            budget = max_header_bytes - self._head_bytes  # feed the head at most its budget
            if len(data) <= budget:  # the usual case: no copy
                self._head_bytes += len(data)
                feed(self, data)
                return
            self._head_bytes = max_header_bytes
            feed(self, data[:budget])
            rest = data[budget:]
            if self.transport.is_closing():
                return
            if self._in_head:
                self._heads.clear(self)
                self.transport.write(answer_431)
                self.transport.close()
            else:  # the headers ended inside the budget: the rest is body (or the next request)
                self.data_received(rest)

        def on_message_begin(self) -> None:
            HttpToolsProtocol.on_message_begin(self)
            self._heads.set(self)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._heads.clear(self)
            HttpToolsProtocol.on_headers_complete(self)

        def on_message_complete(self) -> None:
            self._in_head, self._head_bytes = True, 0
            HttpToolsProtocol.on_message_complete(self)

        def connection_lost(self, exc: Exception | None) -> None:
            self._heads.clear(self)
            HttpToolsProtocol.connection_lost(self, exc)

    return HeaderLimits
