"""Multi-turn prompts reuse the previous turn's exact tokens (on-policy token ids for training)."""

from __future__ import annotations

import httpx
import pytest

from gym_bridge.generation.transformers_backend import TransformersBackend
from gym_bridge.policy.continuation import previous_turn_tokens, splice_previous_turn
from gym_bridge.policy.server import build_policy_app
from gym_bridge.serving.uvicorn_thread import start_in_thread

from .conftest import ScriptedBackend

EOS = 2


def test_splice_replaces_the_rerendered_turn_with_the_sampled_tokens():
    history = [1, 5, 6, 7, EOS, 9]  # ... assistant turn re-tokenized as 6 7, then EOS and a template newline
    full = history + [1, 8, 8, 1, 4]
    previous = [1, 5, 60, 61, EOS]  # what was really prompted + sampled
    assert splice_previous_turn(full, history, previous, {EOS}) == [1, 5, 60, 61, EOS, 9, 1, 8, 8, 1, 4]


def test_a_turn_cut_before_its_end_gets_the_end_token_from_the_template():
    history = [1, 5, 6, EOS, 9]
    assert splice_previous_turn(history + [3], history, [1, 5, 60], {EOS}) == [1, 5, 60, EOS, 9, 3]


def test_templates_that_rewrite_history_keep_the_plain_rendering():
    full = [1, 5, 0, EOS, 9, 3]
    assert splice_previous_turn(full, [1, 5, 6, EOS, 9], [1, 5, 60, EOS], {EOS}) == full
    assert splice_previous_turn([1, 4, 3], [1, 4], [1, 9], {EOS}) == [1, 4, 3]  # no end-of-turn token


def test_previous_turn_tokens_finds_the_last_carrier():
    entries = [
        {"role": "user", "content": "a"},
        {"type": "message", "prompt_token_ids": [1], "generation_token_ids": [2]},
        {"type": "function_call", "prompt_token_ids": [1, 2, 3], "generation_token_ids": [4, 5]},
        {"type": "function_call_output", "call_id": "c", "output": "x"},
    ]
    assert previous_turn_tokens(entries) == (2, [1, 2, 3, 4, 5])
    assert previous_turn_tokens(entries[:1]) is None


@pytest.fixture(scope="module")
def url(tiny_model, tokenizer):
    with start_in_thread(
        build_policy_app(TransformersBackend(tiny_model, tokenizer), return_token_ids=True)
    ) as s:
        yield s.url


def test_second_turn_prompt_extends_the_first_turn_tokens(url, tokenizer):
    first_input = [{"role": "user", "content": "Say something"}]
    first = httpx.post(
        f"{url}/v1/responses", json={"input": first_input, "max_output_tokens": 10, "seed": 3}, timeout=60
    ).json()
    carrier = first["output"][-1]
    sampled = carrier["prompt_token_ids"] + carrier["generation_token_ids"]
    follow_up = {"role": "user", "content": "And then?"}
    second = httpx.post(
        f"{url}/v1/responses",
        json={"input": first_input + first["output"] + [follow_up], "max_output_tokens": 4, "seed": 4},
        timeout=60,
    ).json()
    prompt = second["output"][-1]["prompt_token_ids"]
    assert prompt[: len(sampled)] == sampled
    tail = tokenizer.decode(prompt[len(sampled) :])
    assert tail.endswith("<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n")

    chat = httpx.post(
        f"{url}/v1/chat/completions",
        json={
            "messages": [
                *first_input,
                {
                    "role": "assistant",
                    "content": carrier["content"][0]["text"],
                    **{
                        k: carrier[k]
                        for k in ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
                    },
                },
                follow_up,
            ],
            "max_tokens": 4,
        },
        timeout=60,
    ).json()
    assert chat["choices"][0]["message"]["prompt_token_ids"] == prompt


def test_tool_call_turn_is_spliced_before_the_tool_result(tokenizer):
    text = '<tool_call>{"name": "get_weather", "arguments": {"city":"Oslo"}}</tool_call>'
    backend = ScriptedBackend(tokenizer, text)
    with start_in_thread(build_policy_app(backend, return_token_ids=True)) as s:
        first_input = [{"role": "user", "content": "Weather?"}]
        first = httpx.post(f"{s.url}/v1/responses", json={"input": first_input}, timeout=30).json()
        (call,) = first["output"]
        assert call["type"] == "function_call"
        result = {"type": "function_call_output", "call_id": call["call_id"], "output": "cold"}
        httpx.post(f"{s.url}/v1/responses", json={"input": first_input + [call, result]}, timeout=30)
    prompt = backend.requests[-1].prompt_token_ids
    sampled = call["prompt_token_ids"] + call["generation_token_ids"]
    # The sampled arguments had no space after the colon; a re-rendering would have re-serialised them.
    assert prompt[: len(sampled)] == sampled
    assert prompt[len(sampled)] == tokenizer.eos_token_id  # the scripted turn never emitted its end token
    assert tokenizer.decode(prompt[len(sampled) + 1 :]).startswith(
        "\n<|im_start|>user\n<tool_response>\ncold"
    )
