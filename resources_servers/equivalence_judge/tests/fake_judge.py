"""A scripted judge for tests: a FastAPI app on 127.0.0.1 answering ``/v1/responses`` and ``/v1/chat/completions``.

A script is ``(prompt: str, n: int) -> Reply``: ``prompt`` is the request's user message, ``n`` counts the
calls so far (this one included). A Reply is the judge's text (``str``) or a fault: ``Slow(seconds, text)``
answers late, ``Status(code)`` answers with that HTTP status, ``Garbage(body)`` answers 200 with a body that
is not a model answer, ``Cut(text)`` answers ``text`` marked cut off at the token limit (Responses ``status:
incomplete``, chat ``finish_reason: length``), ``Raw(body)`` answers 200 with that JSON body. Every request
body is kept in ``requests``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from gym_bridge.serving.uvicorn_thread import RunningServer, start_in_thread


@dataclass(frozen=True)
class Slow:
    seconds: float
    text: str = "[[A=B]]"


@dataclass(frozen=True)
class Status:
    code: int = 500
    message: str | None = None
    """The error's message (default: "scripted CODE")."""


@dataclass(frozen=True)
class Garbage:
    body: bytes = b"<html>bad gateway</html>"


@dataclass(frozen=True)
class Cut:
    text: str


@dataclass(frozen=True)
class Raw:
    """Answer 200 with this JSON body as it is."""

    body: dict[str, Any]


Reply = Any  # str | Slow | Status | Garbage | Cut | Raw
Script = Callable[[str, int], Reply]


def _user_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return str(messages)
    texts = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return str(texts[-1]) if texts else ""


class FakeJudge:
    """Run with ``with FakeJudge(script) as judge:``; ``judge.url`` is the ``/v1`` base URL."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.auth: list[str | None] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        """Most ``Slow`` answers pending at once (how many calls the client had open together)."""
        self._lock = threading.Lock()
        self._running: RunningServer | None = None
        self.app = FastAPI()
        self.app.post("/v1/responses")(self._responses)
        self.app.post("/v1/chat/completions")(self._chat)

    @property
    def url(self) -> str:
        assert self._running is not None
        return self._running.url + "/v1"

    def __enter__(self) -> FakeJudge:
        self._running = start_in_thread(self.app)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._running is not None:
            self._running.stop(timeout=5)

    def prompts(self) -> list[str]:
        with self._lock:
            return [_user_text(r.get("input", r.get("messages"))) for r in self.requests]

    async def _reply(self, request: Request, key: str) -> tuple[dict[str, Any], Reply]:
        body = await request.json()
        with self._lock:
            self.requests.append(body)
            self.paths.append(request.url.path)
            self.auth.append(request.headers.get("authorization"))
            n = len(self.requests)
        reply = self.script(_user_text(body.get(key)), n)
        if isinstance(reply, Slow):
            with self._lock:
                self.in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            try:
                await asyncio.sleep(reply.seconds)
            finally:
                with self._lock:
                    self.in_flight -= 1
            reply = reply.text
        return body, reply

    @staticmethod
    def _fault(reply: Reply) -> Response | None:
        if isinstance(reply, Status):
            message = reply.message or f"scripted {reply.code}"
            return JSONResponse({"error": {"message": message}}, status_code=reply.code)
        if isinstance(reply, Garbage):
            return Response(reply.body, media_type="text/html")
        if isinstance(reply, Raw):
            return JSONResponse(reply.body)
        return None

    async def _responses(self, request: Request) -> Response:
        body, reply = await self._reply(request, "input")
        fault = self._fault(reply)
        if fault is not None:
            return fault
        cut = isinstance(reply, Cut)
        reply = reply.text if cut else reply
        output = [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "[[A=B]] thinking"}]},
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": reply, "annotations": []}]},
        ]  # fmt: skip
        done = {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}} if cut else {"status": "completed"}
        return JSONResponse({"id": "resp_judge", "object": "response", "model": body.get("model"), "output": output,
                             **done})  # fmt: skip

    async def _chat(self, request: Request) -> Response:
        body, reply = await self._reply(request, "messages")
        fault = self._fault(reply)
        if fault is not None:
            return fault
        cut = isinstance(reply, Cut)
        message = {"role": "assistant", "content": reply.text if cut else reply, "reasoning_content": "[[A=B]] thinking"}
        return JSONResponse({"id": "chat_judge", "object": "chat.completion", "model": body.get("model"),
                             "choices": [{"index": 0, "message": message, "finish_reason": "length" if cut else "stop"}]})  # fmt: skip
