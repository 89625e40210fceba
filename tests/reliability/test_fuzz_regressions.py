"""Bugs the reliability fuzzers found in the resources servers, pinned as plain tests: 4xx, never 5xx.

The ones not fixed yet are strict xfails (listed in test_fuzz_servers.KNOWN_BUGS too): when the fix
lands the xfail turns into a failure, and the marker and the KNOWN_BUGS entry go.
"""

from __future__ import annotations

import json

import httpx
import pytest

from . import bodies
from .conftest import REPO, landed_builtin_servers


def post_raw(url: str, path: str, doc: object, client: httpx.Client | None = None) -> httpx.Response:
    """POST ``doc`` written by Python's json (lone surrogates as \\udXXX escapes, as any Python client)."""
    content = json.dumps(doc).encode()
    headers = {"content-type": "application/json"}
    if client is not None:
        return client.post(path, content=content, headers=headers)
    return httpx.post(url + path, content=content, headers=headers, timeout=60)


def verify_body(name: str) -> dict:
    return {
        "math": lambda: bodies.math_seeds()["/verify"][0],
        "code": lambda: bodies.code_seeds()["/verify"][0],
        "tool_use": lambda: bodies.tool_use_seeds()["/verify"][0],
        "reasoning_gym": lambda: {**first_row("reasoning_gym"), "response": bodies.response_with(bodies.assistant_message("x"))},
        "equivalence_judge": lambda: {**first_row("equivalence_judge"), "response": bodies.response_with(bodies.assistant_message("x"))},
    }[name]()


def first_row(name: str) -> dict:
    """The first task row of a built-in server's ``data/example.jsonl``."""
    with (REPO / "resources_servers" / name / "data" / "example.jsonl").open() as rows:
        return json.loads(rows.readline())


@pytest.mark.parametrize("name", landed_builtin_servers())
def test_lone_surrogate_in_a_verify_body_is_a_client_error(name, builtin_url):
    body = verify_body(name)
    body["responses_create_params"]["input"] = "broken \ud800 text"
    response = post_raw(builtin_url(name), "/verify", body)
    assert 400 <= response.status_code < 500, response.text


def test_lone_surrogate_in_a_tool_argument_is_a_client_error(builtin_url):
    with httpx.Client(base_url=builtin_url("tool_use"), timeout=60) as client:
        assert client.post("/seed_session", json=bodies.tool_use_row()).status_code == 200
        response = post_raw("", "/get_product", {"product_id": "\ud800"}, client)
    assert 400 <= response.status_code < 500, response.text


@pytest.mark.parametrize("field", ["inputs", "outputs"])
def test_code_stdin_test_data_that_is_not_text_is_a_client_error(field, builtin_url):
    body = bodies.code_seeds()["/verify"][0]
    body["verifier_metadata"]["unit_tests"][field][0] = None
    response = httpx.post(builtin_url("code") + "/verify", json=body, timeout=60)
    assert response.status_code == 422, response.text


@pytest.mark.parametrize("name", [n for n in ("math", "code") if n in landed_builtin_servers()])
def test_seed_session_is_validated_as_verify_is(name, builtin_url):
    """Fields present in a /seed_session body are checked as /verify checks them (422 naming the field);
    none is required, as NeMo Gym's BaseSeedSessionRequest requires none (its agents seed with ``{}``)."""
    url = builtin_url(name)
    task_field = b'"expected_answer": NaN' if name == "math" else b'"verifier_metadata": {"unit_tests": NaN}'
    refused = {
        b"": "request body is empty",
        b"NaN": "request body must be a JSON object, not float",
        b"[]": "request body must be a JSON object, not list",
        b'{"responses_create_params": NaN}': "responses_create_params: Input should be",
        b'{"responses_create_params": null}': "responses_create_params: Input should be",
        b'{"responses_create_params": {"input": "q"}, ' + task_field + b"}": "Input should be",
        b"{" + task_field + b"}": "Input should be",
    }
    with httpx.Client(base_url=url, timeout=60) as client:
        for body, detail in refused.items():
            answer = client.post("/seed_session", content=body, headers={"content-type": "application/json"})
            assert answer.status_code == 422, (body, answer.text)
            assert detail in answer.json()["detail"], (body, answer.text)
        good = verify_body(name)
        good.pop("response")
        for accepted in (good, {"responses_create_params": {"input": "q"}}, {}, {"task_idx": 0}):
            answer = client.post("/seed_session", json=accepted)
            assert answer.status_code == 200 and answer.json() == {}, (accepted, answer.text)


@pytest.mark.parametrize("name", landed_builtin_servers())
@pytest.mark.parametrize("word", ["NaN", "-Infinity"])
def test_a_non_finite_number_the_answer_would_echo_is_a_422_naming_it(name, word, builtin_url):
    """Python's JSON reads NaN/Infinity; /verify echoes the request, and JSON cannot carry them back."""
    body = verify_body(name)
    body["response"]["created_at"] = "__here__"
    content = json.dumps(body).replace('"__here__"', word)
    answer = httpx.post(builtin_url(name) + "/verify", content=content, headers={"content-type": "application/json"}, timeout=60)
    assert answer.status_code == 422, answer.text
    assert "response.created_at" in answer.json()["detail"]
