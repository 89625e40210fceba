"""The policy server with OpenAI's own Python SDK as the client, over loopback.

What vLLM's OpenAI server (which users swap in and out with ours) serves: ``models.list``,
``responses.create`` (with tools, streamed, with top log-probs), ``chat.completions.create`` (``n=2``,
log-probs, top log-probs, streamed) and ``completions.create`` (streamed too). The SDK parses every
answer into its own types, so a wrong shape fails here. Top log-probs are checked against the model's
own distribution (the same forward pass as the sampled token's log-prob).
"""

from __future__ import annotations

import json
import math

import openai
import pytest
import torch

from gym_bridge.generation.transformers_backend import TransformersBackend
from gym_bridge.policy.server import build_policy_app
from gym_bridge.serving.uvicorn_thread import start_in_thread

from .conftest import ScriptedBackend

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
CALL_TEXT = 'Let me look. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.fixture(scope="module")
def tiny_url(tiny_model, tokenizer):
    backend = TransformersBackend(tiny_model, tokenizer, model_name="tiny-sdk")
    with start_in_thread(build_policy_app(backend, model_name="tiny-sdk", max_output_tokens=12)) as running:
        yield running.url


@pytest.fixture(scope="module")
def tiny(tiny_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def scripted(tokenizer) -> openai.OpenAI:
    with start_in_thread(build_policy_app(ScriptedBackend(tokenizer, CALL_TEXT), model_name="scripted")) as running:
        yield openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0)


def model_logprobs(model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """log p(. | prefix) at each generated position, under the raw model distribution."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : len(prompt) - 1 + len(generated)]


def test_models_list(tiny):
    (card,) = tiny.models.list().data
    assert card.id == "tiny-sdk" and card.object == "model"


def test_responses_create_with_tools_returns_a_function_call(scripted):
    response = scripted.responses.create(model="scripted", input="Weather in Paris?", tools=TOOLS)
    message, call = response.output
    assert message.type == "message" and message.content[0].text == "Let me look."
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert response.usage.output_tokens > 0


def test_chat_completions_n2_with_logprobs_and_top_logprobs_from_the_same_pass(tiny, tiny_url, tiny_model, tokenizer):
    completion = tiny.chat.completions.create(
        model="tiny-sdk", messages=[{"role": "user", "content": "Hi"}], n=2, logprobs=True, top_logprobs=3,
        seed=5, max_tokens=6, extra_body={"return_token_ids": True},
    )  # fmt: skip
    assert [c.index for c in completion.choices] == [0, 1]
    prompt = completion.model_extra["prompt_token_ids"]
    for choice in completion.choices:
        generated = choice.model_extra["token_ids"]
        entries = choice.logprobs.content
        assert len(entries) == len(generated)
        reference = model_logprobs(tiny_model, prompt, generated)
        for i, entry in enumerate(entries):
            assert len(entry.top_logprobs) == 3
            best = torch.topk(reference[i], 3)
            assert [t.logprob for t in entry.top_logprobs] == pytest.approx(best.values.tolist(), abs=1e-4)
            assert [t.token for t in entry.top_logprobs] == [tokenizer.decode([t]) for t in best.indices.tolist()]
            assert entry.logprob == pytest.approx(reference[i, generated[i]].item(), abs=1e-4)
            assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6


def test_responses_top_logprobs_on_the_output_text(tiny, tiny_model):
    response = tiny.responses.create(
        model="tiny-sdk", input="Hi", top_logprobs=2, temperature=0, max_output_tokens=5,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    message = next(item for item in response.output if item.type == "message")
    logprobs = message.content[0].logprobs
    generated = message.model_extra["generation_token_ids"]
    assert len(logprobs) == len(generated) and response.top_logprobs == 2
    reference = model_logprobs(tiny_model, message.model_extra["prompt_token_ids"], generated)
    for i, entry in enumerate(logprobs):
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(torch.topk(reference[i], 2).values.tolist(), abs=1e-4)
        # greedy: the chosen token is the most likely one
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-6)


def test_chat_completions_stream(tiny):
    kwargs = dict(model="tiny-sdk", messages=[{"role": "user", "content": "Hi"}], seed=3, max_tokens=8)
    whole = tiny.chat.completions.create(**kwargs, logprobs=True)
    chunks = list(tiny.chat.completions.create(**kwargs, logprobs=True, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    content_chunks = [c for c in chunks if c.choices]
    assert content_chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in content_chunks)
    assert text == (whole.choices[0].message.content or "")
    streamed_logprobs = [e.logprob for c in content_chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed_logprobs == pytest.approx([e.logprob for e in whole.choices[0].logprobs.content])
    assert content_chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_completions_stream_with_a_tool_call(scripted):
    chunks = list(scripted.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "Weather?"}], tools=[{"type": "function", "function": TOOLS[0] | {}}],
        stream=True,
    ))  # fmt: skip
    calls = [call for c in chunks for call in (c.choices[0].delta.tool_calls or [])]
    assert [c.function.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_responses_stream_events_in_order(scripted):
    events = list(scripted.responses.create(model="scripted", input="Weather in Paris?", tools=TOOLS, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for expected in ("response.output_item.added", "response.content_part.added", "response.output_text.delta",
                     "response.output_text.done", "response.function_call_arguments.done", "response.output_item.done"):
        assert expected in kinds, expected
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == final.output[0].content[0].text == "Let me look."
    assert final.output[1].name == "get_weather" and final.status == "completed"


def test_responses_stream_text_matches_the_unstreamed_answer(tiny):
    kwargs = dict(model="tiny-sdk", input="Hi", temperature=0, max_output_tokens=6)
    whole = tiny.responses.create(**kwargs)
    with tiny.responses.stream(**kwargs) as stream:  # the SDK's helper accumulates the events itself
        events = list(stream)
    assert events[-1].type == f"response.{whole.status}"  # 6 tokens of a random model: usually incomplete
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == whole.output_text == events[-1].response.output_text


def test_completions_create_and_stream(tiny, tokenizer):
    whole = tiny.completions.create(model="tiny-sdk", prompt="Once upon", max_tokens=5, seed=1, logprobs=2)
    (choice,) = whole.choices
    assert whole.object == "text_completion" and choice.finish_reason in ("stop", "length")
    assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs) == whole.usage.completion_tokens
    assert all(len(top) <= 2 and max(top.values()) >= lp - 1e-6
               for top, lp in zip(choice.logprobs.top_logprobs, choice.logprobs.token_logprobs, strict=True))  # fmt: skip
    assert all(math.isfinite(lp) for lp in choice.logprobs.token_logprobs)
    chunks = list(tiny.completions.create(model="tiny-sdk", prompt="Once upon", max_tokens=5, seed=1, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason
    ids = tokenizer("Once upon")["input_ids"]
    by_ids = tiny.completions.create(model="tiny-sdk", prompt=ids, max_tokens=5, seed=1)
    assert by_ids.choices[0].text == choice.text  # a prompt of token ids is the same prompt
