"""A scripted, OpenAI-compatible Responses server for tests and benchmarks: fixed answers, injected faults.

Tests need a model that answers deterministically, calls tools on cue and misbehaves on purpose (rate
limits, 5xx, hangs, dropped connections, broken JSON, slow drips), over real HTTP on loopback::

    from fake_model import FakeModel, Fault, function_call, message

    def script(request, n):                   # n: how many times this prompt has been asked, this call included
        return Fault.status(500) if n <= 2 else "The answer is \\\\boxed{4}"

    with FakeModel({"2 + 2": script}) as model:   # serves on 127.0.0.1:<free port>
        ...  # point a client at model.url  (".../v1"; POST {model.url}/responses)
    assert model.calls["What is 2 + 2? ..."] == 3  # calls are counted per prompt (last user message text)

A *script* is a callable ``(request: dict, n: int) -> Reply`` or a dict of them (or of plain replies)
keyed by a substring of the prompt; unmatched prompts go to ``default`` (by default
:func:`solve_arithmetic`, which answers "What is A + B?" correctly in ``\\boxed{}``). A *Reply* is

* a ``str``: one assistant message with that text;
* a ``list`` of output items (build them with :func:`message` and :func:`function_call`);
* a ``dict`` with an ``"output"`` key: response fields merged over the defaults (e.g. ``incomplete_details``);
* a :class:`Fault`: the server misbehaves instead of answering.

The server is a raw ASGI app run by uvicorn (``gym_bridge.serving.uvicorn_thread.start_in_thread``): raw ASGI is what
lets it drop a connection without any answer, and it keeps the per-request cost low for benchmarks.
``python tests/fake_model.py`` serves the arithmetic solver in its own process and prints its URL.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gym_bridge.records.schema import content_text, last_user_text
from gym_bridge.serving.uvicorn_thread import RunningServer, start_in_thread

Reply = Any  # str | list[dict] | dict | Fault
Script = Callable[[dict[str, Any], int], Reply]

__all__ = [
    "FakeModel",
    "Fault",
    "arithmetic_row",
    "flaky",
    "function_call",
    "message",
    "solve_arithmetic",
    "tool_outputs",
]


# --------------------------------------------------------------------------- output items


def message(text: str, **extra: Any) -> dict[str, Any]:
    """An assistant ``message`` output item with one ``output_text`` part."""
    return {
        "id": f"msg_fake_{next(_ids)}",
        "content": [{"annotations": [], "text": text, "type": "output_text", "logprobs": None}],
        "role": "assistant",
        "status": "completed",
        "type": "message",
        **extra,
    }


def function_call(
    name: str, arguments: Mapping[str, Any] | str, call_id: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A ``function_call`` output item; ``arguments`` may be a dict (dumped to JSON) or a raw string."""
    n = next(_ids)
    return {
        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        "call_id": call_id or f"call_fake_{n}",
        "name": name,
        "type": "function_call",
        "id": f"fc_fake_{n}",
        "status": "completed",
        **extra,
    }


def tool_outputs(request: Mapping[str, Any]) -> list[str]:
    """The ``output`` texts of the ``function_call_output`` items in a request's input, in order."""
    items = request.get("input")
    if not isinstance(items, list):
        return []
    return [
        str(i.get("output")) for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]


_ARITHMETIC = re.compile(r"What is (-?\d+) ([+\-*]) (-?\d+)\?")


def solve_arithmetic(request: Mapping[str, Any], n: int) -> Reply:
    """Answer "What is A op B?" correctly as ``\\boxed{result}``; anything else gets "I don't know"."""
    match = _ARITHMETIC.search(last_user_text(dict(request)))
    if not match:
        return "I don't know."
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return f"The answer is \\boxed{{{value}}}."


def arithmetic_row(a: int, b: int, **extra: Any) -> dict[str, Any]:
    """A NeMo Gym math task row: "What is a + b?" and its answer (the one :func:`solve_arithmetic` solves)."""
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": f"What is {a} + {b}? Put the answer in \\boxed{{}}."}]
        },
        "question": f"What is {a} + {b}?",
        "expected_answer": str(a + b),
        **extra,
    }


# --------------------------------------------------------------------------- faults


@dataclass(frozen=True)
class Fault:
    """A way to misbehave; build one with the class methods."""

    kind: str
    status: int = 500
    body: bytes = b""
    retry_after: str | None = None
    seconds: float = 0.0
    then: Reply = None

    @classmethod
    def http(
        cls, status: int = 500, body: str | None = None, retry_after: float | str | None = None
    ) -> Fault:
        """Answer with ``status`` (429 with ``retry_after`` sets the ``Retry-After`` header)."""
        text = body if body is not None else json.dumps({"error": {"message": f"fake error {status}"}})
        return cls(
            "http",
            status=status,
            body=text.encode(),
            retry_after=None if retry_after is None else str(retry_after),
        )

    @classmethod
    def slow(cls, seconds: float, then: Reply = "slow answer") -> Fault:
        """Say nothing for ``seconds`` (beyond a client's timeout, typically), then answer ``then``."""
        return cls("slow", seconds=seconds, then=then)

    @classmethod
    def drop(cls) -> Fault:
        """Close the connection without sending a single byte back."""
        return cls("drop")

    @classmethod
    def malformed(cls) -> Fault:
        """Answer 200 with a body that is not JSON (a truncated object)."""
        return cls("malformed", status=200, body=b'{"id": "resp_broken", "output": [{"type": "mess')

    @classmethod
    def drip(cls, seconds: float, then: Reply = "dripped answer") -> Fault:
        """Send the headers at once, then the body a few bytes at a time over ``seconds``."""
        return cls("drip", seconds=seconds, then=then)


def flaky(fault: Fault, times: int, then: Reply | Script = solve_arithmetic) -> Script:
    """A script that answers with ``fault`` for the first ``times`` calls of a prompt, then ``then``."""

    def script(request: dict[str, Any], n: int) -> Reply:
        if n <= times:
            return fault
        return then(request, n) if callable(then) else then

    return script


# --------------------------------------------------------------------------- the server

_ids = itertools.count(1)


def _words(text: str) -> int:
    return len(text.split())


class FakeModel:
    """The scripted server; see the module docstring. Use as a context manager or ``start()``/``stop()``."""

    def __init__(
        self,
        script: Script | Mapping[str, Reply | Script] | None = None,
        *,
        default: Reply | Script = solve_arithmetic,
        latency: float = 0.0,
        record_requests: bool = True,
        model_name: str = "fake-model",
    ) -> None:
        self.script = script
        self.default = default
        self.latency = latency
        """Seconds every answer waits before it is sent (a slow model)."""
        self.record_requests = record_requests
        self.model_name = model_name
        self.calls: Counter[str] = Counter()
        """Requests seen per prompt (the text of the request's last user message)."""
        self.requests: list[dict[str, Any]] = []
        """Every request body, in arrival order (when ``record_requests``)."""
        self._lock = threading.Lock()
        self._running: RunningServer | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """The API base URL, ``http://127.0.0.1:<port>/v1``."""
        if self._running is None:
            raise RuntimeError("the fake model is not running; call start() first")
        return self._running.url + "/v1"

    def start(self) -> FakeModel:
        self._running = start_in_thread(self)
        return self

    def stop(self) -> None:
        if self._running is not None:
            self._running.stop(timeout=5)
            self._running = None

    def __enter__(self) -> FakeModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def requests_for(self, prompt_part: str) -> list[dict[str, Any]]:
        """The recorded requests whose prompt contains ``prompt_part``."""
        with self._lock:
            return [r for r in self.requests if prompt_part in last_user_text(r)]

    # ------------------------------------------------------------------ scripting

    def reply_for(self, request: dict[str, Any]) -> Reply:
        """Count the call and pick the reply the script gives for it."""
        prompt = last_user_text(request)
        with self._lock:
            self.calls[prompt] += 1
            n = self.calls[prompt]
            if self.record_requests:
                self.requests.append(request)
        chosen: Reply | Script = self.default
        if callable(self.script):
            chosen = self.script
        elif isinstance(self.script, Mapping):
            for key, value in self.script.items():
                if key in prompt:
                    chosen = value
                    break
        return chosen(request, n) if callable(chosen) else chosen

    def response_body(self, request: dict[str, Any], reply: Reply) -> dict[str, Any]:
        """A full Responses ``response`` object for a non-fault reply."""
        fields: dict[str, Any] = {}
        if isinstance(reply, str):
            output = [message(reply)]
        elif isinstance(reply, list):
            output = reply
        elif isinstance(reply, dict):
            fields = dict(reply)
            output = fields.pop("output")
        else:
            raise TypeError(f"a script returned {type(reply).__name__}; expected str, list, dict or Fault")
        items = request.get("input")
        input_text = (
            items
            if isinstance(items, str)
            else " ".join(
                content_text(i.get("content"))
                if "content" in i
                else str(i.get("output") or i.get("arguments") or "")
                for i in (items or [])
                if isinstance(i, dict)
            )
        )
        out_words = sum(
            _words(content_text(i.get("content")))
            if i.get("type") == "message"
            else _words(str(i.get("arguments", "")))
            for i in output
        )
        in_words = _words(input_text)
        n = next(_ids)
        body = {
            "id": f"resp_fake_{n}",
            "created_at": float(int(time.time())),
            "error": None,
            "incomplete_details": None,
            "instructions": request.get("instructions"),
            "metadata": request.get("metadata") or {},
            "model": request.get("model") or self.model_name,
            "object": "response",
            "output": output,
            "parallel_tool_calls": request.get("parallel_tool_calls", True),
            "temperature": request.get("temperature", 1.0),
            "tool_choice": request.get("tool_choice", "auto"),
            "tools": request.get("tools") or [],
            "top_p": request.get("top_p", 1.0),
            "max_output_tokens": request.get("max_output_tokens"),
            "status": "completed",
            "usage": {
                "input_tokens": in_words,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": out_words,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": in_words + out_words,
            },
        }
        body.update(fields)
        return body

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path, method = scope["path"].rstrip("/"), scope["method"]
        if method == "GET" and path in ("/health", "/v1/models"):
            await _send(send, 200, json.dumps({"status": "ok", "data": [{"id": self.model_name}]}).encode())
            return
        if method != "POST" or not path.endswith("/responses"):
            await _send(send, 404, b'{"detail": "not found"}')
            return
        raw = bytearray()
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        try:
            request = json.loads(raw)
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except ValueError as e:
            await _send(send, 400, json.dumps({"detail": f"request body is not a JSON object: {e}"}).encode())
            return
        reply = self.reply_for(request)
        if self.latency and await _client_left(receive, self.latency):
            return
        if isinstance(reply, Fault):
            await self._misbehave(reply, request, receive, send)
            return
        await _send(send, 200, json.dumps(self.response_body(request, reply)).encode())

    async def _misbehave(self, fault: Fault, request: dict[str, Any], receive: Any, send: Any) -> None:
        if fault.kind in ("http", "malformed"):
            extra = [(b"retry-after", fault.retry_after.encode())] if fault.retry_after else []
            await _send(send, fault.status, fault.body, extra)
        elif fault.kind == "slow":
            if not await _client_left(receive, fault.seconds):
                await _send(send, 200, json.dumps(self.response_body(request, fault.then)).encode())
        elif fault.kind == "drop":
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            if transport is not None:
                transport.abort()
                await asyncio.sleep(0.01)  # let the server see the connection go before the app returns
                return
            # Not uvicorn's own send: start an answer, then break off mid-way (the server closes the socket).
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1000")]}
            )
            raise ConnectionAbortedError("fake model dropped the connection")
        elif fault.kind == "drip":
            body = json.dumps(self.response_body(request, fault.then)).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            steps = 20
            for i in range(steps):
                chunk = body[i * len(body) // steps : (i + 1) * len(body) // steps]
                await send({"type": "http.response.body", "body": chunk, "more_body": i < steps - 1})
                if i < steps - 1 and await _client_left(receive, fault.seconds / steps):
                    return
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r}")


async def _send(
    send: Any, status: int, body: bytes, extra_headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra_headers or [])})
    await send({"type": "http.response.body", "body": body})


async def _client_left(receive: Any, seconds: float) -> bool:
    """Wait ``seconds``; return True early if the client disconnects meanwhile (so hung answers end)."""
    waiter = asyncio.ensure_future(receive())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=seconds)
        return bool(done) and waiter.result().get("type") == "http.disconnect"
    finally:
        waiter.cancel()


def main(argv: list[str] | None = None) -> None:
    """Serve the arithmetic solver in this process; print the base URL on one line, run until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds every answer waits")
    args = parser.parse_args(argv)
    model = FakeModel(latency=args.latency, record_requests=False)
    model._running = start_in_thread(model, port=args.port)
    print(model.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        model.stop()


if __name__ == "__main__":
    sys.exit(main())
