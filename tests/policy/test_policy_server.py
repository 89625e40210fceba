"""The policy server over real HTTP: Responses and chat endpoints, training fields, batching, seeds, errors."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
import torch

from gym_bridge.generation.transformers_backend import TransformersBackend
from gym_bridge.policy.server import build_policy_app
from gym_bridge.records.chat import items_to_messages, tools_to_chat_tools
from gym_bridge.serving.uvicorn_thread import start_in_thread

from .conftest import CountingBackend, ScriptedBackend

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


@pytest.fixture(scope="module")
def counting(tiny_model, tokenizer) -> CountingBackend:
    return CountingBackend(TransformersBackend(tiny_model, tokenizer, model_name="tiny-test"))


@pytest.fixture(scope="module")
def url(counting):
    app = build_policy_app(counting, model_name="tiny-test", batch_wait_ms=50, max_output_tokens=48)
    with start_in_thread(app) as running:
        yield running.url


@pytest.fixture()
def client(url):
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def recompute_logprobs(model, prompt: list[int], generated: list[int]) -> list[float]:
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + generated])).logits[0].float(), dim=-1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(generated)]


def template_ids(tokenizer, messages, tools=None) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


# --------------------------------------------------------------------------- /v1/responses


def test_responses_with_training_fields_match_the_model(client, tiny_model, tokenizer):
    body = {
        "input": "What is 2 + 3?",
        "instructions": "Answer briefly.",
        "temperature": 1.0,
        "max_output_tokens": 16,
        "seed": 11,
        "return_token_ids": True,
    }
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "response" and data["model"] == "tiny-test"
    last = data["output"][-1]
    prompt, generated, logprobs = (
        last["prompt_token_ids"],
        last["generation_token_ids"],
        last["generation_log_probs"],
    )
    expected_prompt = template_ids(
        tokenizer,
        [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2 + 3?"}],
    )
    assert prompt == expected_prompt
    assert len(generated) == len(logprobs) == data["usage"]["output_tokens"] >= 1
    assert data["usage"]["input_tokens"] == len(prompt)
    assert data["usage"]["total_tokens"] == len(prompt) + len(generated)
    assert all(lp <= 0 for lp in logprobs)
    assert logprobs == pytest.approx(recompute_logprobs(tiny_model, prompt, generated), abs=1e-4)
    # Only the last output item carries the training fields (NeMo Gym's convention).
    assert all("generation_token_ids" not in item for item in data["output"][:-1])


def test_training_fields_only_on_request(client):
    plain = client.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 4}).json()
    assert all("prompt_token_ids" not in item for item in plain["output"])
    via_metadata = client.post(
        "/v1/responses",
        json={"input": "Hi", "max_output_tokens": 4, "metadata": {"return_token_ids": "true"}},
    ).json()
    assert "generation_log_probs" in via_metadata["output"][-1]
    assert via_metadata["metadata"] == {"return_token_ids": "true"}


def test_server_flag_returns_training_fields_for_every_request(tiny_model, tokenizer):
    backend = TransformersBackend(tiny_model, tokenizer)
    with start_in_thread(build_policy_app(backend, return_token_ids=True)) as running:
        data = httpx.post(
            f"{running.url}/v1/responses", json={"input": "Hi", "max_output_tokens": 3}, timeout=60
        ).json()
        assert len(data["output"][-1]["generation_token_ids"]) == data["usage"]["output_tokens"]
        opted_out = httpx.post(
            f"{running.url}/v1/responses",
            json={"input": "Hi", "max_output_tokens": 3, "return_token_ids": False},
            timeout=60,
        ).json()
        assert "generation_token_ids" not in opted_out["output"][-1]


def test_openai_client_responses(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    response = client.responses.create(
        model="tiny-test",
        input=[{"role": "user", "content": "What is 1 + 1?"}],
        max_output_tokens=6,
        temperature=0.0,
        extra_body={"return_token_ids": True},
    )
    assert response.object == "response"
    assert isinstance(response.output_text, str)
    assert 1 <= response.usage.output_tokens <= 6
    last = response.output[-1].model_dump()
    assert len(last["generation_token_ids"]) == response.usage.output_tokens
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-test"]


def test_temperature_zero_is_deterministic(client):
    body = {"input": "Tell me something", "temperature": 0, "max_output_tokens": 12, "return_token_ids": True}
    runs = [client.post("/v1/responses", json=body).json() for _ in range(2)]
    assert runs[0]["output"][-1]["generation_token_ids"] == runs[1]["output"][-1]["generation_token_ids"]
    assert runs[0]["output"] and runs[0]["output"][0]["type"] == "message"


def test_max_output_tokens_is_honoured_and_capped(client, tokenizer):
    data = client.post(
        "/v1/responses", json={"input": "Hi", "max_output_tokens": 3, "seed": 1, "return_token_ids": True}
    ).json()
    generated = data["output"][-1]["generation_token_ids"]
    assert len(generated) <= 3
    stopped = generated and generated[-1] == tokenizer.eos_token_id
    assert data["status"] == ("completed" if stopped else "incomplete")
    if not stopped:
        assert len(generated) == 3 and data["incomplete_details"] == {"reason": "max_output_tokens"}
    capped = client.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 10_000, "seed": 2}).json()
    assert capped["max_output_tokens"] == 48
    assert capped["usage"]["output_tokens"] <= 48


def test_multi_turn_tool_items_render_through_the_chat_template(client, tokenizer):
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": '{"weather": "cold"}'},
    ]
    data = client.post(
        "/v1/responses",
        json={"input": items, "tools": TOOLS, "max_output_tokens": 4, "return_token_ids": True},
    ).json()
    expected = template_ids(tokenizer, items_to_messages(items), tools_to_chat_tools(TOOLS))
    assert data["output"][-1]["prompt_token_ids"] == expected
    assert "<tool_response>" in tokenizer.decode(expected) and "get_weather" in tokenizer.decode(expected)
    assert data["tools"] == TOOLS


def test_generated_tool_calls_become_function_call_items(tokenizer):
    text = 'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    backend = ScriptedBackend(tokenizer, text)
    with start_in_thread(build_policy_app(backend)) as running:
        data = httpx.post(
            f"{running.url}/v1/responses",
            json={"input": "Weather?", "tools": TOOLS, "return_token_ids": True},
            timeout=30,
        ).json()
        assert [i["type"] for i in data["output"]] == ["message", "function_call"]
        call = data["output"][1]
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Oslo"}
        assert call["call_id"].startswith("call_")
        assert call["generation_token_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"]
        assert data["output"][0]["content"][0]["text"] == "Checking."

        chat = httpx.post(
            f"{running.url}/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "Weather?"}],
                "tools": [{"type": "function", "function": TOOLS[0]}],
            },
            timeout=30,
        ).json()
        choice = chat["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] == "Checking."
        assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


# --------------------------------------------------------------------------- batching and seeds


def test_concurrent_requests_are_batched_and_seeds_hold_inside_a_batch(url, counting):
    seeded = {"input": "What is 6 + 2?", "max_output_tokens": 10, "seed": 1234, "return_token_ids": True}
    counting.reset()
    alone = httpx.post(f"{url}/v1/responses", json=seeded, timeout=60).json()
    assert len(counting.batches) == 1

    async def burst() -> list[dict]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as ac:
            bodies = [{"input": f"Question number {i}", "max_output_tokens": 10, "seed": i} for i in range(7)]
            bodies.insert(3, seeded)
            replies = await asyncio.gather(*(ac.post("/v1/responses", json=b) for b in bodies))
            return [r.json() for r in replies]

    counting.reset()
    replies = asyncio.run(burst())
    assert len(replies) == 8 and all(r["status"] in ("completed", "incomplete") for r in replies)
    sizes = [len(b) for b in counting.batches]
    assert sum(sizes) == 8
    assert len(sizes) < 8, f"8 concurrent requests took {len(sizes)} generate calls"
    batched = replies[3]["output"][-1]["generation_token_ids"]
    assert batched == alone["output"][-1]["generation_token_ids"]
    same_batch = next(b for b in counting.batches if any(r.params.seed == 1234 for r in b))
    assert len(same_batch) > 1, "the seeded request should have shared its batch"
    health = httpx.get(f"{url}/health").json()
    assert health["batches"] >= 2 and health["requests"] >= 9


def test_a_full_batch_of_concurrent_requests_is_one_generate_call(tiny_model, tokenizer):
    backend = CountingBackend(TransformersBackend(tiny_model, tokenizer))

    async def burst(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as ac:
            bodies = [{"input": f"What is {i} + 1?", "max_output_tokens": 4, "seed": i} for i in range(8)]
            bodies[5] = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "seed": 5}
            paths = ["/v1/chat/completions" if "messages" in b else "/v1/responses" for b in bodies]
            return list(
                await asyncio.gather(*(ac.post(p, json=b) for p, b in zip(paths, bodies, strict=True)))
            )

    # a long wait: the batch is closed by reaching max_batch_size, not by the clock
    app = build_policy_app(backend, max_batch_size=8, batch_wait_ms=30_000)
    with start_in_thread(app) as running:
        replies = asyncio.run(burst(running.url))
    assert [r.status_code for r in replies] == [200] * 8
    assert [len(b) for b in backend.batches] == [8]
    assert app.service.batcher.stats.batch_sizes == [8]


def test_sampling_fields_reach_the_backend_and_shape_the_sample(url, counting):
    counting.reset()
    with httpx.Client(base_url=url, timeout=60) as c:
        body = {
            "input": "Hi",
            "max_output_tokens": 7,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 4,
            "seed": 11,
        }
        echoed = c.post("/v1/responses", json=body).json()
        chat = {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 5,
            "temperature": 0.4,
            "top_p": 0.8,
        }
        c.post("/v1/chat/completions", json={**chat, "seed": 21, "n": 2})
        sent = [r.params for batch in counting.batches for r in batch]
        greedy = c.post(
            "/v1/responses",
            json={"input": "Hi", "max_output_tokens": 8, "temperature": 0, "return_token_ids": True},
        ).json()
        nucleus = c.post(
            "/v1/responses",
            json={"input": "Hi", "max_output_tokens": 8, "top_p": 1e-6, "seed": 5, "return_token_ids": True},
        ).json()
    first = sent[0]
    assert (first.max_new_tokens, first.temperature, first.top_p, first.top_k, first.seed) == (
        7,
        0.7,
        0.9,
        4,
        11,
    )
    assert (echoed["temperature"], echoed["top_p"], echoed["max_output_tokens"]) == (0.7, 0.9, 7)
    assert sorted((p.max_new_tokens, p.temperature, p.top_p, p.seed) for p in sent[1:3]) == [
        (5, 0.4, 0.8, 21),
        (5, 0.4, 0.8, 22),
    ]
    # top_p this small leaves only the most likely token: the sample is the greedy completion
    tokens = [r["output"][-1]["generation_token_ids"] for r in (greedy, nucleus)]
    assert tokens[0] == tokens[1] and tokens[0]


def test_different_seeds_differ(client):
    outputs = {
        tuple(
            client.post(
                "/v1/responses",
                json={"input": "Hi", "max_output_tokens": 8, "seed": s, "return_token_ids": True},
            ).json()["output"][-1]["generation_token_ids"]
        )
        for s in range(3)
    }
    assert len(outputs) > 1


# --------------------------------------------------------------------------- /v1/chat/completions and /tokenize


def test_chat_completions_with_vllm_style_token_information(client, tiny_model, tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    r = client.post(
        "/v1/chat/completions",
        json={
            "messages": messages,
            "max_tokens": 10,
            "seed": 5,
            "logprobs": True,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        },
    )
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "chat.completion"
    choice = data["choices"][0]
    generated = [int(e["token"].removeprefix("token_id:")) for e in choice["logprobs"]["content"]]
    logprobs = [e["logprob"] for e in choice["logprobs"]["content"]]
    assert generated == choice["token_ids"] == choice["message"]["generation_token_ids"]
    assert (
        data["prompt_token_ids"] == template_ids(tokenizer, messages) == choice["message"]["prompt_token_ids"]
    )
    assert len(generated) == data["usage"]["completion_tokens"]
    assert logprobs == pytest.approx(
        recompute_logprobs(tiny_model, data["prompt_token_ids"], generated), abs=1e-4
    )

    tokenized = client.post("/tokenize", json={"model": "tiny-test", "messages": messages}).json()
    assert tokenized["tokens"] == data["prompt_token_ids"] and tokenized["count"] == len(tokenized["tokens"])


def test_chat_completions_with_the_openai_client(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    request = {
        "model": "tiny-test",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 5,
        "seed": 3,
        "n": 2,
        "temperature": 0.9,
    }
    completion = client.chat.completions.create(**request)
    assert len(completion.choices) == 2
    assert all(c.finish_reason in ("stop", "length") for c in completion.choices)
    assert completion.usage.completion_tokens <= 10
    again = client.chat.completions.create(**request)  # the same seeded request: the same choices
    assert [c.message.content for c in again.choices] == [c.message.content for c in completion.choices]


# --------------------------------------------------------------------------- bad requests


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/responses", {"input": "Hi", "temperature": -1}, "temperature"),
        ("/v1/responses", {"input": "Hi", "top_p": 1.5}, "top_p"),
        ("/v1/responses", {"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
        ("/v1/responses", {"input": "Hi", "seed": "abc"}, "seed"),
        ("/v1/responses", {"input": "Hi", "stream": "sometimes"}, "stream"),
        ("/v1/responses", {"input": "Hi", "top_logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 17}, "n"),
        ("/v1/completions", {"prompt": [1, 10**9]}, "prompt"),
        ("/v1/completions", {"prompt": ""}, "prompt"),
        ("/v1/responses", {"temperature": 0.5}, "input"),
        ("/v1/responses", {"input": 42}, "input"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": -3},
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 5},
            "top_logprobs",
        ),
        ("/v1/responses", {"input": [{"role": "user", "content": 5}]}, "input.0.content"),
        ("/v1/responses", {"input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
        (
            "/v1/responses",
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input.0.call_id",
        ),
        (
            "/v1/responses",
            {"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]},
            "input.0.output",
        ),
        (
            "/v1/responses",
            {
                "input": [
                    {"role": "user", "content": "x", "prompt_token_ids": ["a"], "generation_token_ids": [1]}
                ]
            },
            "input.0.prompt_token_ids",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"function": "f"}]}]},
            "messages.0.tool_calls.0.function",
        ),
    ],
)
def test_bad_requests_name_the_field(client, path, body, field):
    r = client.post(path, json=body)
    assert 400 <= r.status_code < 500, r.text
    data = r.json()
    assert field in data["detail"]
    assert data["error"]["message"] == data["detail"]


@pytest.mark.parametrize(
    ("path", "conversation", "param"),
    [("/v1/responses", "input", "input"), ("/v1/chat/completions", "messages", "messages")],
)
def test_token_ids_outside_the_vocabulary_are_a_400(client, path, conversation, param):
    earlier = {
        "role": "assistant",
        "content": "x",
        "prompt_token_ids": [1, 2],
        "generation_token_ids": [10**9],
    }
    r = client.post(path, json={conversation: [earlier, {"role": "user", "content": "y"}]})
    assert r.status_code == 400
    assert "outside the vocabulary" in r.json()["detail"]
    assert r.json()["error"]["param"] == param


def test_a_failing_request_does_not_fail_its_batch(tiny_model, tokenizer):
    class Picky(CountingBackend):
        def generate(self, requests):
            self.batches.append(list(requests))
            if any(r.params.seed == 666 for r in requests):
                raise ValueError("seed 666 is refused")
            return self.inner.generate(requests)

    backend = Picky(TransformersBackend(tiny_model, tokenizer))

    async def burst(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as ac:
            seeds = [1, 666, 2, 3]
            bodies = [{"input": "Hi", "max_output_tokens": 3, "seed": s} for s in seeds]
            return list(await asyncio.gather(*(ac.post("/v1/responses", json=b) for b in bodies)))

    with start_in_thread(build_policy_app(backend, batch_wait_ms=200)) as running:
        replies = asyncio.run(burst(running.url))
    assert [r.status_code for r in replies] == [200, 400, 200, 200]
    assert "seed 666" in replies[1].json()["detail"]
    assert max(len(b) for b in backend.batches) > 1, "the requests should have been batched first"


def test_a_backend_crash_is_a_json_500_and_the_server_keeps_serving(tokenizer):
    class Flaky(ScriptedBackend):
        def generate(self, requests):
            if any(r.params.seed == 13 for r in requests):
                raise RuntimeError("engine fell over")
            return super().generate(requests)

    with start_in_thread(build_policy_app(Flaky(tokenizer, "fine"))) as running:
        crashed = httpx.post(f"{running.url}/v1/responses", json={"input": "Hi", "seed": 13}, timeout=30)
        after = httpx.post(f"{running.url}/v1/responses", json={"input": "Hi", "seed": 14}, timeout=30)
    assert crashed.status_code == 500
    assert crashed.json()["error"]["type"] == "server_error"
    assert "engine fell over" in crashed.json()["detail"]
    assert after.status_code == 200 and after.json()["output"][0]["content"][0]["text"] == "fine"


def test_prompt_over_the_context_is_a_400(client):
    r = client.post("/v1/responses", json={"input": "1 " * 600})
    assert r.status_code == 400
    assert "input" in r.json()["detail"] and "context" in r.json()["detail"]


def test_malformed_json_body_is_a_4xx(client):
    r = client.post("/v1/responses", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
