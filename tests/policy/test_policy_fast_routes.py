"""The policy server's generation routes answer as its FastAPI app answers them, good input or bad.

Two copies of the server run over the same scripted backend: one as shipped (``build_policy_app()``,
``/v1/responses`` and ``/v1/chat/completions`` served by its front), one with every route through
FastAPI (``fast_routes=False``). Each request goes to both; status, content type and body must match,
once the fresh ids and timestamps every answer carries are masked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gym_bridge.generation.backend import GenerationRequest, GenerationResult
from gym_bridge.policy.server import build_policy_app
from gym_bridge.server import start_in_thread

from .conftest import ScriptedBackend

TOOL_TEXT = 'Let me look. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


class CrashingBackend(ScriptedBackend):
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        raise RuntimeError("the backend fell over")


@pytest.fixture(scope="module")
def pairs(tokenizer: Any) -> Iterator[dict[str, tuple[str, str]]]:
    """``{"scripted": (fast_url, reference_url), "crashing": (...)}``."""
    started = []
    urls: dict[str, tuple[str, str]] = {}
    for name, backend in (
        ("scripted", ScriptedBackend(tokenizer, TOOL_TEXT)),
        ("crashing", CrashingBackend(tokenizer, "x")),
    ):
        fast = start_in_thread(build_policy_app(backend, batch_wait_ms=0, max_output_tokens=32))
        reference = start_in_thread(
            build_policy_app(backend, batch_wait_ms=0, max_output_tokens=32, fast_routes=False)
        )
        started += [fast, reference]
        urls[name] = (fast.url, reference.url)
    yield urls
    for running in started:
        running.stop()


def encoded(obj: Any) -> bytes:
    return json.dumps(obj).encode()


USER = {"role": "user", "content": "What is the weather in Paris?"}
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
EARLIER = {"role": "assistant", "content": "x", "prompt_token_ids": [1, 2], "generation_token_ids": [10**9]}

REQUESTS: list[tuple[str, bytes, dict[str, str]]] = [
    ("/v1/responses", encoded({"input": "Hello there"}), {}),
    ("/v1/responses", encoded({"input": [USER], "tools": TOOLS, "temperature": 0.5, "seed": 3}), {}),
    ("/v1/responses", encoded({"input": [USER], "return_token_ids": True, "metadata": {"a": "b"}}), {}),
    ("/v1/responses", encoded({"input": [USER], "instructions": "Be brief.", "max_output_tokens": 999}), {}),
    ("/v1/responses", encoded({"input": [USER]}), {"content-type": "text/plain"}),
    ("/v1/responses", encoded({"input": [USER], "temperature": -1}), {}),
    ("/v1/responses", encoded({"input": [{"role": "robot", "content": "x"}]}), {}),
    ("/v1/responses", encoded({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}), {}),
    ("/v1/responses", encoded({"input": [EARLIER, USER]}), {}),
    ("/v1/responses", encoded({"input": "word " * 2000}), {}),
    ("/v1/responses", encoded({"input": []}), {}),
    ("/v1/responses", encoded({"input": [USER], "tools": [{"type": "function"}]}), {}),
    ("/v1/responses", encoded({"input": [USER], "stream": True}), {}),
    ("/v1/responses", encoded({"model": "x"}), {}),
    ("/v1/responses", b"", {}),
    ("/v1/responses", b"null", {}),
    ("/v1/responses", b"[1]", {}),
    ("/v1/responses", b'{"input": "x",,}', {}),
    ("/v1/responses", b'{"input": "\\udc00"}', {}),
    ("/v1/responses", b"\xff\xfe\x00garbage", {}),
    ("/v1/chat/completions", encoded({"messages": [USER], "n": 2, "seed": 1, "logprobs": True}), {}),
    ("/v1/chat/completions", encoded({"messages": [USER], "return_token_ids": True, "tools": TOOLS}), {}),
    ("/v1/chat/completions", encoded({"messages": [USER], "top_logprobs": 5}), {}),
    ("/v1/chat/completions", encoded({"messages": []}), {}),
    ("/v1/chat/completions", encoded({"messages": [EARLIER, USER]}), {}),
    ("/v1/chat/completions", b"{", {}),
]

_FRESH = re.compile(rb'"((?:resp|msg|fc|call|rs|chatcmpl)_[0-9a-f]{32})"|"(created(?:_at)?)":\s*[0-9.]+')


def masked(body: bytes) -> bytes:
    return _FRESH.sub(lambda m: b'"<id>"' if m.group(1) else b'"' + m.group(2) + b'":0', body)


def exchange(url: str, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    sent = {"content-type": "application/json", **headers}
    return httpx.post(url + path, content=body, headers=sent, timeout=60)


@pytest.mark.parametrize(("path", "body", "headers"), REQUESTS, ids=[f"{i}:{r[0]}" for i, r in enumerate(REQUESTS)])
def test_generation_routes_answer_as_fastapi_does(
    pairs: dict[str, tuple[str, str]], path: str, body: bytes, headers: dict[str, str]
) -> None:
    fast_url, reference_url = pairs["scripted"]
    fast, reference = exchange(fast_url, path, body, headers), exchange(reference_url, path, body, headers)
    assert fast.status_code == reference.status_code, (fast.text, reference.text)
    assert masked(fast.content) == masked(reference.content)
    assert fast.headers["content-type"] == reference.headers["content-type"]


def test_the_comparison_covers_successes_and_every_kind_of_refusal(pairs: dict[str, tuple[str, str]]) -> None:
    fast_url = pairs["scripted"][0]
    statuses = {exchange(fast_url, path, body, headers).status_code for path, body, headers in REQUESTS}
    assert {200, 400, 422} <= statuses
    answer = exchange(fast_url, *REQUESTS[1]).json()
    assert [item["type"] for item in answer["output"]] == ["message", "function_call"]


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions"])
def test_a_backend_crash_is_the_same_json_500_on_both_paths(
    pairs: dict[str, tuple[str, str]], path: str
) -> None:
    body = encoded({"input": [USER]} if path == "/v1/responses" else {"messages": [USER]})
    fast_url, reference_url = pairs["crashing"]
    fast, reference = exchange(fast_url, path, body, {}), exchange(reference_url, path, body, {})
    assert fast.status_code == reference.status_code == 500
    assert fast.content == reference.content
    assert "RuntimeError: the backend fell over" in fast.json()["error"]["message"]
