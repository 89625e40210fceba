"""The policy server refuses what a web page could send it, over real HTTP (issue 33, finding 11).

A generation request sent as ``text/plain`` (no CORS preflight) gets 415 and generates nothing; a foreign
``Host`` name (DNS rebinding) gets 421 in OpenAI's error shape; the OpenAI SDK (JSON) is answered.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gym_bridge.policy.server import build_policy_app
from gym_bridge.serving.uvicorn_thread import start_in_thread
from tests.raw_http import send

from .conftest import ScriptedBackend

CHAT = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def served(tokenizer: Any) -> Iterator[tuple[ScriptedBackend, int]]:
    backend = ScriptedBackend(tokenizer, "Hello.")
    with start_in_thread(
        build_policy_app(backend, model_name="scripted", allowed_hosts=["policy.lan"])
    ) as running:
        yield backend, int(running.url.rsplit(":", 1)[1])


def test_a_text_plain_generation_request_is_refused_and_generates_nothing(
    served: tuple[ScriptedBackend, int],
) -> None:
    backend, port = served
    before = len(backend.requests)
    status, answer = send(
        port, "POST", "/v1/chat/completions", json.dumps(CHAT).encode(), content_type="text/plain"
    )
    assert status == 415 and "Content-Type 'text/plain'" in answer["error"]["message"]
    assert len(backend.requests) == before


def test_a_foreign_host_is_refused_and_the_configured_name_answered(
    served: tuple[ScriptedBackend, int],
) -> None:
    _, port = served
    status, answer = send(port, "GET", "/v1/models", host=f"evil.example:{port}")
    assert status == 421 and "evil.example" in answer["error"]["message"]
    assert send(port, "GET", "/v1/models", host=f"policy.lan:{port}")[0] == 200
    assert send(port, "GET", "/v1/models", host=f"localhost:{port}")[0] == 200


def test_the_openai_sdk_is_answered(served: tuple[ScriptedBackend, int]) -> None:
    _, port = served
    client = openai.OpenAI(base_url=f"http://localhost:{port}/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(**CHAT)
    assert answer.choices[0].message.content == "Hello."
