"""Deeply nested JSON on every POST route of every server: a 400 naming the nesting limit, never a 500.

Depths 10,000 and 100,000 (past Python's recursion limit: ``json.loads`` itself raises RecursionError)
and 300 inside an otherwise good body (parses, but is past ``MAX_JSON_DEPTH``), over real HTTP.
"""

from __future__ import annotations

import httpx
import pytest

from gym_bridge.serving.json_body import MAX_JSON_DEPTH

from .conftest import landed_builtin_servers
from .fuzz import post_paths


def nested(depth: int, opener: bytes = b"[", closer: bytes = b"]") -> bytes:
    return opener * depth + b"1" + closer * depth


BODIES = {
    "array 10,000": nested(10_000),
    "object 100,000": nested(100_000, b'{"a":', b"}"),
    "inside a field, 300": b'{"input": "hi", "messages": [], "verify_responses": [], "x": ' + nested(300) + b"}",
}


def assert_refused_naming_the_limit(url: str, paths: list[str]) -> None:
    assert paths
    with httpx.Client(base_url=url, timeout=60) as client:
        for path in paths:
            for label, body in BODIES.items():
                answer = client.post(path, content=body, headers={"content-type": "application/json"})
                assert answer.status_code == 400, f"{path} {label}: {answer.status_code} {answer.text[:300]}"
                assert f"nested deeper than the limit of {MAX_JSON_DEPTH} levels" in answer.json()["detail"]
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize("name", landed_builtin_servers())
def test_builtin_servers_refuse_deep_nesting(name, builtin_url):
    url = builtin_url(name)
    assert_refused_naming_the_limit(url, post_paths(url))


def test_a_tool_server_refuses_deep_nesting_on_every_route(arithmetic_env):
    url, _ = arithmetic_env
    assert_refused_naming_the_limit(url, post_paths(url))


def test_the_policy_server_refuses_deep_nesting(tiny_policy_url):
    paths = post_paths(tiny_policy_url)
    assert {"/v1/responses", "/v1/chat/completions", "/v1/completions", "/tokenize"} <= set(paths)
    assert_refused_naming_the_limit(tiny_policy_url, paths)
