"""One HTTP request with exactly the headers given (``Host`` and ``Content-Type`` included or left out), for
tests of what a server refuses before it reads a body (``gym_bridge/serving/request_guard.py``)."""

from __future__ import annotations

import http.client
import json
from typing import Any


def send(port: int, method: str, path: str, body: bytes | None = None, **headers: str) -> tuple[int, Any]:
    """``method path`` to 127.0.0.1:``port`` with these headers (``content_type=`` for ``content-type``); the
    status and the JSON answer. Without ``host=``, ``http.client`` sends ``Host: 127.0.0.1:PORT``."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.putrequest(method, path, skip_host="host" in headers, skip_accept_encoding=True)
        for key, value in headers.items():
            connection.putheader(key.replace("_", "-"), value)
        if body is not None:
            connection.putheader("content-length", str(len(body)))
        connection.endheaders(body)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read() or b"null")
    finally:
        connection.close()
