"""The embedded policy server: :class:`~gym_bridge.policy.service.PolicyService` bound to HTTP routes.

Endpoints: ``POST /v1/responses`` (what NeMo Gym agents call), ``POST /v1/chat/completions`` (what
NeMo Gym's ``vllm_model`` server calls, including vLLM's ``logprobs`` + ``return_tokens_as_token_ids``
and ``return_token_ids`` extensions), ``POST /v1/completions``, ``POST /tokenize`` (vLLM's, used by that
same server), ``GET /v1/models`` and ``GET /health``; ``stream: true`` answers as server-sent events.
For RL, the training fields NeMo Gym defines (``prompt_token_ids``, ``generation_token_ids``,
``generation_log_probs``) are attached to the last output item when the server runs with
``return_token_ids=True`` or a request asks with ``"return_token_ids": true`` (or
``metadata: {"return_token_ids": "true"}``). Log-probabilities are under the raw model distribution (see
:mod:`gym_bridge.generation.backend`).
"""

from __future__ import annotations

from typing import Any

from gym_bridge.generation.backend import GenerationBackend
from gym_bridge.policy.api import (
    ChatCompletionRequest,
    CompletionRequest,
    PolicyErrors,
    ResponsesRequest,
    TokenizeRequest,
)
from gym_bridge.policy.service import PolicyService, PolicySettings
from gym_bridge.serving.json_http import JsonApp, Route

__all__ = ["PolicyApp", "PolicySettings", "build_policy_app", "policy_routes"]


def policy_routes(service: PolicyService) -> list[Route]:
    """The server's route table: each route calls one method of ``service``."""

    async def health(_: None, __: Any) -> dict[str, Any]:
        return service.health()

    async def models(_: None, __: Any) -> dict[str, Any]:
        return service.models()

    def call(method: Any) -> Any:
        async def route(body: Any, _: Any) -> Any:
            return await method(body)

        return route

    return [
        Route("GET", "/health", health, open=True, raw_json=True, summary="Liveness and batching counters"),
        Route("GET", "/v1/models", models, raw_json=True, summary="The served model"),
        Route("POST", "/v1/responses", call(service.responses), body=ResponsesRequest, raw_json=True,
              summary="Responses API"),
        Route("POST", "/v1/chat/completions", call(service.chat_completions), body=ChatCompletionRequest,
              raw_json=True, summary="Chat completions API"),
        Route("POST", "/v1/completions", call(service.completions), body=CompletionRequest, raw_json=True,
              summary="Completions API (raw prompt)"),
        Route("POST", "/tokenize", call(service.tokenize), body=TokenizeRequest, raw_json=True,
              summary="vLLM's tokenize"),
    ]  # fmt: skip


class PolicyApp(JsonApp):
    """The policy server's ASGI app; ``service`` is the :class:`PolicyService` behind it."""

    def __init__(self, service: PolicyService) -> None:
        self.service = service
        settings = service.settings
        super().__init__(
            policy_routes(service),
            title=f"gym-bridge policy server: {service.model_name}",
            errors=PolicyErrors(),
            max_body_bytes=settings.max_body_bytes,
            max_held_body_bytes=settings.max_held_body_bytes,
            body_timeout_s=settings.body_timeout_s,
            auth_token=settings.auth_token,
            allowed_hosts=settings.allowed_hosts,
            startup=service.start,
            shutdown=service.stop,
        )


def build_policy_app(
    backend: GenerationBackend, model_name: str | None = None, settings: PolicySettings | None = None, **overrides: Any
) -> PolicyApp:
    """The ASGI app serving ``backend``; ``overrides`` are :class:`PolicySettings` fields."""
    settings = PolicySettings.model_validate({**(settings or PolicySettings()).model_dump(), **overrides})
    return PolicyApp(PolicyService(backend, model_name, settings))
