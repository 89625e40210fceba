"""``gym-bridge serve policy --model DIR``: the real command, in its own process, answering over HTTP."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import openai
import pytest


@contextmanager
def serve_policy(*options: str) -> Iterator[str]:
    """``gym-bridge serve policy OPTIONS --port 0`` in its own process; yields its URL."""
    command = [sys.executable, "-m", "gym_bridge.cli", "serve", "policy", "--port", "0", *options]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            match = re.search(r"listening on (http://127\.0\.0\.1:\d+)/v1", line)
            if match:
                break
        assert match, "".join(lines)
        yield match.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_policy_command_loads_a_model_directory(tiny_model_dir):
    with serve_policy("--model", str(tiny_model_dir), "--max-output-tokens", "8", "--return-token-ids") as url:
        data = httpx.post(
            f"{url}/v1/responses", json={"input": "Hi", "max_output_tokens": 100}, timeout=60
        ).json()
    assert data["model"] == str(tiny_model_dir)
    assert data["max_output_tokens"] == 8
    assert len(data["output"][-1]["generation_token_ids"]) == data["usage"]["output_tokens"] <= 8


def test_serve_policy_token_is_required_on_every_route_but_health(tiny_model_dir):
    with serve_policy("--model", str(tiny_model_dir), "--max-output-tokens", "4", "--token", "sekrit") as url:
        body = {"messages": [{"role": "user", "content": "Hi"}]}
        refused = [
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60),
            httpx.post(f"{url}/v1/responses", json={"input": "Hi"}, timeout=60),
            httpx.get(f"{url}/v1/models", timeout=60),
            httpx.post(f"{url}/v1/chat/completions", json=body, headers={"authorization": "Bearer wrong"}, timeout=60),
        ]
        assert httpx.get(f"{url}/health", timeout=60).status_code == 200
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sekrit", max_retries=0)
        assert client.chat.completions.create(model="m", messages=body["messages"]).choices[0].message is not None
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
    for answer in refused:
        assert answer.status_code == 401 and answer.json()["error"]["message"] == "missing or wrong bearer token"
