"""PolicyService called directly, without HTTP: each method's answer and each refusal."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gym_bridge.policy.api import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    ResponsesRequest,
    TokenizeRequest,
)
from gym_bridge.policy.service import PolicyService, PolicySettings
from gym_bridge.serving.json_http import EventStream

from .conftest import ScriptedBackend

TEXT = 'Sure. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'


def run(service: PolicyService, method: str, body: Any) -> Any:
    async def go() -> Any:
        await service.start()
        try:
            answer = await getattr(service, method)(body)
            if isinstance(answer, EventStream):
                return [event async for event in answer.events]
            return answer
        finally:
            await service.stop()

    return asyncio.run(go())


@pytest.fixture()
def service(tokenizer) -> PolicyService:
    return PolicyService(ScriptedBackend(tokenizer, TEXT), "scripted", PolicySettings(batch_wait_ms=0, max_n=4))


def test_responses_turns_the_completion_into_output_items(service):
    answer = run(service, "responses", ResponsesRequest(input="add 1", return_token_ids=True))
    message, call = answer["output"]
    assert message["content"][0]["text"] == "Sure." and call["name"] == "add" and call["arguments"] == '{"a": 1}'
    assert call["generation_token_ids"] and answer["usage"]["output_tokens"] == len(call["generation_token_ids"])
    assert answer["status"] == "completed" and answer["model"] == "scripted"


def test_chat_completions_gives_n_choices_with_logprobs(service):
    body = ChatCompletionRequest(messages=[{"role": "user", "content": "add"}], n=3, logprobs=True, seed=1)
    answer = run(service, "chat_completions", body)
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    for choice in answer["choices"]:
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Sure."
        assert [e["logprob"] for e in choice["logprobs"]["content"]] == [-0.5] * len(choice["logprobs"]["content"])
    seeds = [r.params.seed for r in service.batcher.backend.requests]
    assert seeds == [1, 2, 3]  # one seed per choice, as vLLM does


def test_completions_answers_a_raw_prompt(service, tokenizer):
    answer = run(service, "completions", CompletionRequest(prompt="2 + 2 =", max_tokens=4, logprobs=0))
    (choice,) = answer["choices"]
    assert choice["text"] == TEXT and answer["object"] == "text_completion"
    assert service.batcher.backend.requests[0].prompt_token_ids == tokenizer("2 + 2 =")["input_ids"]
    assert choice["logprobs"]["token_logprobs"] == [-0.5] * answer["usage"]["completion_tokens"]


def test_tokenize_messages_through_the_template_and_raw_prompts(service, tokenizer):
    messages = [{"role": "user", "content": "Hi"}]
    answer = run(service, "tokenize", TokenizeRequest(messages=messages))
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert answer["tokens"] == list(expected) and answer["count"] == len(expected)
    raw = run(service, "tokenize", TokenizeRequest(prompt="Hi there"))
    assert raw["tokens"] == tokenizer("Hi there", add_special_tokens=False)["input_ids"]


def test_streams_are_event_streams_in_openai_shapes(service):
    events = run(service, "responses", ResponsesRequest(input="add 1", stream=True))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    chunks = run(service, "chat_completions", ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], stream=True))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    ("method", "body", "param"),
    [
        ("responses", ResponsesRequest(input=[{"type": "reasoning", "summary": []}]), "input"),
        ("chat_completions", ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], n=5), "n"),
        ("chat_completions", ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], top_logprobs=2), "top_logprobs"),
        ("completions", CompletionRequest(prompt=[1, 99_999_999]), "prompt"),
        ("tokenize", TokenizeRequest(), "messages"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(service, method, body, param):
    with pytest.raises(ApiError) as refused:
        run(service, method, body)
    assert refused.value.param == param and 400 <= refused.value.status < 500


def test_text_that_cannot_fit_the_context_is_refused_before_it_is_tokenized(service):
    huge = "x" * (service.max_context * service.max_token_bytes + 1)
    for method, body in [
        ("chat_completions", ChatCompletionRequest(messages=[{"role": "user", "content": huge}])),
        ("responses", ResponsesRequest(input=huge)),
        ("completions", CompletionRequest(prompt=huge)),
        ("tokenize", TokenizeRequest(prompt=huge)),
    ]:
        with pytest.raises(ApiError, match="cannot fit the model's context"):
            run(service, method, body)
    assert service.render.misses == 0  # nothing was rendered


def test_a_request_holding_too_many_tokens_is_refused(tokenizer):
    settings = PolicySettings(batch_wait_ms=0, max_request_tokens=100, max_output_tokens=40)
    service = PolicyService(ScriptedBackend(tokenizer, "ok"), "scripted", settings)
    body = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], n=3)
    with pytest.raises(ApiError, match="would hold .* tokens"):
        run(service, "chat_completions", body)
    assert not service.batcher.backend.requests


def test_the_trainer_and_the_server_render_prompts_with_one_function(service, tokenizer):
    """The trainer's prompt-length filter counts tokens with the function the server generates from."""
    from gym_bridge.records import chat
    from gym_bridge.train.batches import rollouts

    assert rollouts.render_prompt is chat.render_prompt
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]
    served = run(service, "tokenize", TokenizeRequest(messages=messages))
    assert served["tokens"] == chat.render_prompt(tokenizer, messages)

    class NoTemplate:
        def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
            raise ValueError("this tokenizer has no chat template")

    with pytest.raises(chat.TemplateError, match="could not render the chat template: this tokenizer has no"):
        chat.render_prompt(NoTemplate(), messages)
