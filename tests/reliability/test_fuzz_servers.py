"""Fuzz every HTTP endpoint of every resources server and of the policy server.

Three fuzzers per server (tests/reliability/fuzz.py): schema-driven requests from its OpenAPI schema,
raw bytes under assorted content types, and one-spot mutations of known-good bodies
(tests/reliability/bodies.py) that get past validation into the server's own work: the math verifier,
the code sandbox, the tool-use store (each tool request runs on a freshly seeded store), the model.

Rules checked over real loopback HTTP: no 5xx, no request hangs past its timeout, no dropped connection,
and afterwards the server still answers ``GET /health`` and still serves every good body. Each fuzzer also has to reach the server's
work (some 200s), or it tested nothing. Example counts are bounded and derandomized, so the run is
fast and repeatable.

Bugs found in servers owned elsewhere are listed in ``KNOWN_BUGS`` (a signature in the problem text)
and pinned as strict xfail tests in test_fuzz_regressions.py; when one is fixed its xfail fails, and
both entries go.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gym_bridge.rollout.envs import load_server_class
from gym_bridge.serving.server import ServerSettings

from . import bodies
from .conftest import landed_builtin_servers
from .fuzz import FuzzReport, assert_alive, fuzz_json_mutations, fuzz_openapi, fuzz_raw_bodies, post_paths

EXAMPLES = 15
RAW_EXAMPLES = 20
MUTATIONS = 15
GENERATING = 10
"""Examples per policy operation that runs the model (each one generates a few tokens)."""

KNOWN_BUGS = {
}

SEEDS: dict[str, tuple[Callable[[], dict[str, list[Any]]], Any]] = {
    "math": (bodies.math_seeds, None),
    "code": (bodies.code_seeds, None),
    "tool_use": (bodies.tool_use_seeds, bodies.seed_tool_use_session),
    "reasoning_gym": (bodies.reasoning_gym_seeds, None),
}
"""Mutation seeds and the ``prepare`` hook per built-in server (a server not listed here still gets
the schema and raw-body fuzzing)."""


def still_serves(url: str, seeds: dict[str, list[Any]], prepare: Any = None) -> None:
    """After the fuzzing, every path still does its work: its first good body is answered 200."""
    with httpx.Client(base_url=url, timeout=60) as client:
        for path, good in seeds.items():
            client.cookies.clear()  # each path a new rollout: a seeded session is never seeded again
            if prepare is not None:
                prepare(lambda p, b: client.post(p, json=b).status_code, path)
            response = client.post(path, json=good[0])
            assert response.status_code == 200, f"{path}: {response.status_code} {response.text[:300]}"


def check(report: FuzzReport, min_operations: int) -> None:
    unexpected = report.unexpected(KNOWN_BUGS)
    assert not unexpected, report.describe() + f"\n({len(unexpected)} not explained by KNOWN_BUGS)"
    assert len(report.per_operation) >= min_operations, dict(report.per_operation)
    assert report.statuses[200] > 0, report.statuses  # some requests were good enough to be served


def test_base_server_with_tools(arithmetic_env):
    url, env = arithmetic_env
    report = fuzz_openapi(url, max_examples=EXAMPLES)
    report.merge(fuzz_raw_bodies(url, post_paths(url, fill={"tool_name": "add"}), max_examples=RAW_EXAMPLES))
    # health, seed_session, verify, aggregate_metrics, add, note
    check(report, min_operations=6)
    assert report.statuses[422] > 0
    unknown = httpx.post(f"{url}/no_such_tool", json={})  # not a documented operation: answered 404
    assert unknown.status_code == 404 and "add" in unknown.json()["detail"]

    mutations = fuzz_json_mutations(url, bodies.arithmetic_seeds(), max_examples=MUTATIONS)
    check(mutations, min_operations=5)
    assert assert_alive(url)["sessions"] == len(env.sessions)
    still_serves(url, bodies.arithmetic_seeds())


@pytest.mark.parametrize("name", landed_builtin_servers())
def test_builtin_server(name, builtin_url):
    url = builtin_url(name)
    seeds, prepare = SEEDS.get(name, (dict, None))
    report = fuzz_openapi(url, max_examples=EXAMPLES, prepare=prepare)
    if name == "tool_use":  # on a seeded store, generated calls reach every tool
        tools = {f"POST /{t}" for t in load_server_class(name)(ServerSettings()).tools}
        assert tools <= set(report.served), sorted(report.served)
    report.merge(fuzz_raw_bodies(url, post_paths(url), max_examples=RAW_EXAMPLES))
    check(report, min_operations=4)

    if name in SEEDS:
        mutations = fuzz_json_mutations(url, seeds(), max_examples=MUTATIONS, prepare=prepare)
        check(mutations, min_operations=3)
        # the good bodies' work was really done: more than a few mutations were still served
        assert mutations.statuses[200] >= len(mutations.per_operation), mutations.statuses
    assert_alive(url)
    still_serves(url, seeds(), prepare)


def test_policy_server(tiny_policy_url):
    url = tiny_policy_url
    report = fuzz_openapi(
        url,
        max_examples=EXAMPLES,
        max_examples_for={"POST /v1/chat/completions": GENERATING, "POST /v1/responses": GENERATING},
    )
    report.merge(fuzz_raw_bodies(url, post_paths(url), max_examples=RAW_EXAMPLES))
    # health, models, tokenize, responses, chat/completions
    check(report, min_operations=5)

    mutations = fuzz_json_mutations(url, bodies.policy_seeds(), max_examples=GENERATING)
    check(mutations, min_operations=3)
    assert assert_alive(url)["status"] == "ok"
    still_serves(url, bodies.policy_seeds())
