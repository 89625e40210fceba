"""Known-good request bodies for every server the reliability suite drives: the load test's /verify
calls, and the seeds the mutation fuzzer changes one spot at a time (tests/reliability/fuzz.py).

A body is "good" when the server answers it 200; each seed reaches past validation into the server's
own work (the math verifier, the code sandbox, the tool-use store, the model), so a mutation of it
tests that work rather than the schema check in front of it.
"""

from __future__ import annotations

import json
from typing import Any

from .conftest import REPO


def response_with(*items: dict[str, Any], i: int = 0) -> dict[str, Any]:
    """A Responses API object whose output is ``items``."""
    return {
        "id": f"resp_{i}",
        "created_at": 0.0,
        "model": "m",
        "object": "response",
        "output": list(items),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def assistant_message(text: str, i: int = 0) -> dict[str, Any]:
    return {
        "id": f"msg_{i}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call(name: str, arguments: dict[str, Any] | str, i: int = 0) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": f"fc_{i}",
        "call_id": f"call_{i}",
        "type": "function_call",
        "name": name,
        "arguments": args,
        "status": "completed",
    }


def user_params(text: str, **extra: Any) -> dict[str, Any]:
    return {"input": [{"role": "user", "content": text}], **extra}


# --------------------------------------------------------------------------- math


def math_call(i: int) -> tuple[dict[str, Any], float]:
    """A math /verify body with a quick answer (plain integer or fraction) and the reward it must get."""
    a, b = i % 50, i // 50
    right = i % 3 != 0
    answer = a + b if right else a + b + 1
    text = [
        f"The answer is \\boxed{{{answer}}}.",
        f"So the answer is {answer}.",
        f"\\boxed{{{2 * answer}/2}}",
    ][i % 3]
    body = {
        "responses_create_params": user_params(f"What is {a} + {b}?"),
        "response": response_with(assistant_message(text, i), i=i),
        "expected_answer": str(a + b),
    }
    if i % 3 == 1:
        body["extraction"] = "boxed_or_final"  # the phrase answer is opt-in (the default is NeMo Gym's rule)
    return body, 1.0 if right else 0.0


def aggregate_body(verify_body: dict[str, Any], reward: float) -> dict[str, Any]:
    return {"verify_responses": [{**verify_body, "reward": reward}]}


def math_seeds() -> dict[str, list[Any]]:
    verify = [math_call(i)[0] for i in (1, 2)]
    hard = math_call(4)[0]
    hard["response"]["output"][0]["content"][0]["text"] = "So \\boxed{\\frac{\\sqrt{16}}{2} + 1}"
    hard["expected_answer"] = "3"  # needs the symbolic verifier, not the fast path
    return {
        "/verify": [*verify, hard],
        "/seed_session": [verify[0]],
        "/aggregate_metrics": [aggregate_body(verify[0], 1.0)],
    }


# --------------------------------------------------------------------------- code

SUM_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)"
CLASS_PROGRAM = "class Solution:\n    def add(self, a, b):\n        return a + b"


def code_body(program: str, unit_tests: dict[str, Any], **extra: Any) -> dict[str, Any]:
    text = f"Here it is:\n```python\n{program}\n```"
    return {
        "responses_create_params": user_params("Add two integers."),
        "response": response_with(assistant_message(text)),
        "verifier_metadata": {"unit_tests": unit_tests},
        **extra,
    }


def code_seeds() -> dict[str, list[Any]]:
    stdin = code_body(SUM_PROGRAM, {"inputs": ["1 2\n", "10 -3\n"], "outputs": ["3\n", "7\n"]})
    call = code_body(
        CLASS_PROGRAM,
        {"inputs": [[1, 2], [10, -3]], "outputs": [3, 7], "fn_name": "add"},
        full_results=True,
        reward_mode="fraction",
    )
    return {
        "/verify": [stdin, call],
        "/seed_session": [stdin],
        "/aggregate_metrics": [aggregate_body(stdin, 1.0)],
    }


# --------------------------------------------------------------------------- tool_use


def tool_use_row() -> dict[str, Any]:
    """A tool_use task whose store has ids fuzzers generate on their own ("", "0"), so generated tool
    calls find real products and orders instead of stopping at "unknown product"."""
    example = json.loads((REPO / "resources_servers/tool_use/data/example.jsonl").read_text().splitlines()[0])
    product = {"name": "Mug", "category": "kitchen", "price": 12.5, "stock": 5}
    state = {
        "products": {
            "": product,
            "0": {**product, "name": "Pen", "price": 0.0},
            "P1": {**product, "stock": 0},
        },
        "cart": {"0": 1},
        "orders": {
            "0": {"items": {"": 1}, "total": 12.5, "status": "placed"},
            "": {"items": {"0": 2}, "total": 0.0, "status": "cancelled"},
        },
        "next_order_number": 1,
    }
    return {
        "responses_create_params": {**example["responses_create_params"], "input": "Buy a mug."},
        "initial_state": state,
        "verifier_metadata": {
            "reference_calls": [{"name": "add_to_cart", "arguments": {"product_id": "", "quantity": 2}}]
        },
    }


def tool_use_seeds() -> dict[str, list[Any]]:
    row = tool_use_row()
    by_outcome = {
        **row,
        "response": response_with(
            function_call("add_to_cart", {"product_id": "", "quantity": 2}),
            assistant_message("Done.", 1),
        ),
    }
    by_arguments = {
        **row,
        "verifier_metadata": {
            "expected_calls": [
                {"name": "get_product", "arguments": {"product_id": "0"}},
                {"name": "place_order", "arguments": "{}"},
            ],
            "match": "f1",
        },
        "response": response_with(
            function_call("get_product", '{"product_id": "0"}'),
            function_call("place_order", {}, i=1),
        ),
    }
    tools: dict[str, list[Any]] = {
        "/list_products": [{"category": "kitchen", "max_price": 20.0}, {"category": None, "max_price": None}],
        "/get_product": [{"product_id": "0"}],
        "/add_to_cart": [{"product_id": "", "quantity": 2}],
        "/remove_from_cart": [{"product_id": "0"}],
        "/view_cart": [{}],
        "/place_order": [{}],
        "/get_order": [{"order_id": "0"}],
        "/list_orders": [{}],
        "/cancel_order": [{"order_id": "0"}],
    }
    return {
        "/seed_session": [row],
        "/verify": [by_outcome, by_arguments],
        "/aggregate_metrics": [aggregate_body(by_outcome, 1.0)],
        **tools,
    }


def reasoning_gym_seeds() -> dict[str, list[Any]]:
    """Two real reasoning-gym rows (generated, seed 0) answered right in NeMo Gym's ``<answer>`` form."""
    from resources_servers.reasoning_gym.generate import task_rows

    verify = [
        {**row, "response": response_with(assistant_message(f"<answer>{row['answer']}</answer>", i), i=i)}
        for i, row in enumerate(task_rows(["basic_arithmetic", "knights_knaves"], 2, seed=0))
    ]
    return {"/verify": verify, "/seed_session": [verify[0]], "/aggregate_metrics": [aggregate_body(verify[0], 1.0)]}


def seed_tool_use_session(post: Any, path: str) -> None:
    """Give the fuzzer's session a fresh store before each request (its ``prepare`` hook), so tool calls
    reach the store; requests to /seed_session itself are left to do what they do."""
    if path != "/seed_session":
        assert post("/seed_session", tool_use_row()) == 200


# --------------------------------------------------------------------------- the base server's tools


def arithmetic_seeds() -> dict[str, list[Any]]:
    verify = {
        "responses_create_params": user_params("What is 2 + 3?"),
        "response": response_with(assistant_message("\\boxed{5}")),
        "expected_answer": "5",
    }
    return {
        "/add": [{"a": 2, "b": 3}],
        "/note": [{"text": "remember this"}],
        "/verify": [verify],
        "/seed_session": [verify],
        "/aggregate_metrics": [aggregate_body(verify, 1.0), [{**verify, "reward": 0.0}]],
    }


# --------------------------------------------------------------------------- policy

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def policy_seeds() -> dict[str, list[Any]]:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    return {
        "/v1/responses": [
            {
                "input": [{"role": "user", "content": "Hi"}],
                "instructions": "Be brief.",
                "tools": [WEATHER_TOOL],
                "max_output_tokens": 3,
                "temperature": 0.7,
                "top_p": 0.9,
                "seed": 1,
            },
            {
                "input": [
                    {"role": "user", "content": "Weather in Paris?"},
                    function_call("get_weather", {"city": "Paris"}),
                    {"type": "function_call_output", "call_id": "call_0", "output": "sunny"},
                ],
                "max_output_tokens": 2,
                "return_token_ids": True,
            },
        ],
        "/v1/chat/completions": [
            {"messages": messages, "max_tokens": 3, "n": 2, "logprobs": True, "stop": ["\n"], "seed": 2},
        ],
        "/tokenize": [{"prompt": "Hi there"}, {"messages": messages, "add_generation_prompt": True}],
    }
