"""Schema-driven HTTP fuzzing: every operation of a live server's OpenAPI schema, valid and invalid input.

Three generators, all Hypothesis-driven and derandomized (the same examples every run):

* :func:`fuzz_openapi` asks schemathesis for requests that follow each operation's schema (``positive``)
  and requests that break it (``negative``), and sends them over real HTTP;
* :func:`fuzz_raw_bodies` sends arbitrary bytes under assorted content types to every POST path, which
  no schema describes (truncated JSON, invalid UTF-8, form data, nothing at all);
* :func:`fuzz_json_mutations` starts from known-good bodies and changes one spot to a value that JSON
  (as Python writes it) can carry but schemas rarely anticipate: NaN, Infinity, lone UTF-16 surrogates,
  NUL bytes, 64-bit overflows, wrong types, missing or extra keys. Schema-generated requests mostly stop
  at validation; these get past it into the environment's own logic (the sandbox, the store, the model).

Neither stops at the first bad answer: they return a :class:`FuzzReport` with every 5xx, every request
that hung past its timeout and every dropped connection, so one test run shows all problems at once.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

_SETTINGS = dict(
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],
    print_blob=False,
)

CONTENT_TYPES = [
    None,
    "application/json",
    "application/json; charset=latin-1",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=xyz",
    "application/octet-stream",
]


@dataclass
class FuzzReport:
    """What a fuzz run sent and every answer that broke the rules."""

    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    per_operation: Counter[str] = field(default_factory=Counter)
    served: Counter[str] = field(default_factory=Counter)
    """200 answers per operation: how far past validation the fuzzing got."""
    problems: list[str] = field(default_factory=list)

    last_status: int | None = None

    def record(self, label: str, status: int | None, problem: str | None = None) -> None:
        self.requests += 1
        self.per_operation[label] += 1
        if status is not None:
            self.statuses[status] += 1
        if status == 200:
            self.served[label] += 1
        if problem is not None:
            self.problems.append(problem)
        self.last_status = status

    def send(self, label: str, where: str, timeout: float, call: Callable[[], Any]) -> None:
        """Make one request with ``call()`` (an httpx or requests response) and record how it went.

        A connection dropped right after a 5xx is reported with that 5xx: servers that re-raise after
        answering a crash close the keep-alive connection, and the next request on it is the one that
        sees the reset.
        """
        try:
            response = call()
        except (httpx.TimeoutException, requests.Timeout):
            self.record(label, None, f"HANG (> {timeout} s): {where}")
            return
        except (httpx.TransportError, requests.ConnectionError) as e:
            after = self.problems[-1] if self.last_status is not None and self.last_status >= 500 else None
            cause = f" right after [{after}]" if after else ""
            self.record(label, None, f"CONNECTION DROPPED ({type(e).__name__}){cause}: {where}")
            return
        problem = None
        if response.status_code >= 500:
            problem = f"HTTP {response.status_code} {_short(response.text, 300)}: {where}"
        self.record(label, response.status_code, problem)

    def unexpected(self, known: dict[str, str]) -> list[str]:
        """The problems none of the ``known`` bugs' signatures (``{name: text in the problem}``) explain."""
        return [p for p in self.problems if not any(sig in p for sig in known.values())]

    def merge(self, other: FuzzReport) -> FuzzReport:
        self.requests += other.requests
        self.statuses.update(other.statuses)
        self.per_operation.update(other.per_operation)
        self.served.update(other.served)
        self.problems.extend(other.problems)
        return self

    def describe(self, limit: int = 8) -> str:
        shown = "\n".join(self.problems[:limit])
        more = f"\n... and {len(self.problems) - limit} more" if len(self.problems) > limit else ""
        return f"{len(self.problems)} problem(s) in {self.requests} requests:\n{shown}{more}"


def _short(value: Any, limit: int = 400) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


Post = Callable[[str, Any], int]
"""``post(path, json_body) -> status``: a POST through the fuzzer's own client (same session cookie)."""
Prepare = Callable[[Post, str], None]
"""``prepare(post, path)``: runs before each request to ``path``, e.g. to seed the session a tool needs (in a
new session: the fuzzers drop their cookie first, as they do before each request to ``/seed_session``)."""


def fuzz_openapi(
    base_url: str,
    *,
    max_examples: int,
    timeout: float = 20.0,
    max_examples_for: dict[str, int] | None = None,
    prepare: Prepare | None = None,
) -> FuzzReport:
    """Fuzz every operation in ``{base_url}/openapi.json`` with schema-valid and schema-breaking requests.

    ``max_examples_for`` lowers the count for costly operations (keyed by label, e.g. ``POST /verify``);
    ``prepare`` runs before every request.
    """
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", timeout=timeout)
    report = FuzzReport()
    with requests.Session() as session:
        for result in schema.get_all_operations():
            operation = result.ok()
            count = (max_examples_for or {}).get(operation.label, max_examples)
            _fuzz_operation(
                report,
                operation,
                schemathesis.GenerationMode.POSITIVE,
                base_url,
                session,
                count,
                timeout,
                prepare,
            )
            if _breakable(operation.definition.raw):
                try:
                    _fuzz_operation(
                        report,
                        operation,
                        schemathesis.GenerationMode.NEGATIVE,
                        base_url,
                        session,
                        count,
                        timeout,
                        prepare,
                    )
                except Unsatisfiable:
                    pass  # every input the schema allows is valid after all
    return report


def _fuzz_operation(
    report: FuzzReport,
    operation: Any,
    mode: schemathesis.GenerationMode,
    base_url: str,
    session: requests.Session,
    count: int,
    timeout: float,
    prepare: Prepare | None,
) -> None:
    label = operation.label

    @settings(max_examples=count, **_SETTINGS)
    @given(case=operation.as_strategy(generation_mode=mode))
    def send(case: Any) -> None:
        where = f"{label} [{mode.value}] body={_short(case.body)} query={_short(case.query)}"
        if prepare is not None or operation.path == "/seed_session":
            session.cookies.clear()  # a new rollout: a seeded session is never seeded again (409)
        if prepare is not None:
            prepare(
                lambda p, b: session.post(base_url + p, json=b, timeout=timeout).status_code, operation.path
            )
        report.send(
            label, where, timeout, lambda: case.call(base_url=base_url, session=session, timeout=timeout)
        )

    send()


def _breakable(definition: dict[str, Any]) -> bool:
    """Whether schema-breaking input exists: a typed body or a non-string parameter.

    Asking for negative cases of an ``Any`` body or a plain string path parameter makes Hypothesis try
    hundreds of inputs before giving up, which costs seconds and tests nothing.
    """
    for content in (definition.get("requestBody") or {}).get("content", {}).values():
        schema = content.get("schema") or {}
        if set(schema) & {"$ref", "type", "properties", "required", "anyOf", "oneOf", "allOf"}:
            return True
    return any(
        (p.get("schema") or {}).get("type") not in (None, "string") for p in definition.get("parameters", [])
    )


@st.composite
def _raw_body(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "text", "json_prefix", "nested", "empty"]))
    if kind == "bytes":
        return draw(st.binary(max_size=512))
    if kind == "text":
        return draw(st.text(max_size=256)).encode("utf-8", "surrogatepass")
    if kind == "json_prefix":
        doc = b'{"responses_create_params": {"input": [{"role": "user", "content": "hi"}]}, "response": {}}'
        return doc[: draw(st.integers(0, len(doc)))]
    if kind == "nested":  # arrays and objects, up to 100,000 deep, closed or not
        depth = draw(st.sampled_from([1, 255, 257, 1000, 10_000, 100_000]) | st.integers(1, 3000))
        opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}"), (b'[{"a":', b"}]")]))
        return opener * depth + b"0" + closer * draw(st.sampled_from([depth, 0]) | st.integers(0, depth))
    return b""


def fuzz_raw_bodies(
    base_url: str, paths: list[str], *, max_examples: int, timeout: float = 20.0
) -> FuzzReport:
    """POST arbitrary bytes under assorted content types to each of ``paths``; collect 5xx and hangs."""
    report = FuzzReport()
    with httpx.Client(base_url=base_url, timeout=timeout) as client:
        for path in paths:
            _fuzz_path(report, client, path, max_examples, timeout)
    return report


def _fuzz_path(report: FuzzReport, client: httpx.Client, path: str, count: int, timeout: float) -> None:
    @settings(max_examples=count, **_SETTINGS)
    @given(body=_raw_body(), content_type=st.sampled_from(CONTENT_TYPES))
    def send(body: bytes, content_type: str | None) -> None:
        headers = {"content-type": content_type} if content_type else {}
        where = f"POST {path} content-type={content_type} body={_short(body, 200)}"
        report.send(path, where, timeout, lambda: client.post(path, content=body, headers=headers))

    send()


ODD_VALUES: list[Any] = [
    float("nan"),
    float("inf"),
    float("-inf"),
    -0.0,
    1e308,
    2**63,
    -(2**63) - 1,
    2**64 + 1,
    "\ud800",  # a lone surrogate: legal as a JSON escape, not encodable as UTF-8
    "ok \udfff tail",
    "nul \x00 inside",
    "",
    "x" * 100_000,
    "é 😀 \u202e",
    None,
    True,
    [],
    {},
    [None, 1, "a", {"k": []}],
    {"": {"": [[]]}},
    [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
]


def _spots(doc: Any, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON document (as a key path), the document itself included."""
    yield here
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _spots(value, (*here, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _spots(value, (*here, i))


def _mutate(doc: Any, spot: tuple[Any, ...], action: str, odd: Any) -> Any:
    """``doc`` with the value at ``spot`` replaced by ``odd``, deleted, or given an extra ``odd`` member."""
    if not spot:
        return odd if action == "replace" else doc
    parent = doc
    for key in spot[:-1]:
        parent = parent[key]
    last = spot[-1]
    if action == "delete":
        del parent[last]
    elif action == "extend" and isinstance(parent[last], dict):
        parent[last]["zz_fuzz"] = odd
    elif action == "extend" and isinstance(parent[last], list):
        parent[last].append(odd)
    else:
        parent[last] = odd
    return doc


@st.composite
def _mutated_body(draw: st.DrawFn, seeds: list[Any]) -> tuple[bytes, str]:
    doc = copy.deepcopy(draw(st.sampled_from(seeds)))
    spot = draw(st.sampled_from(list(_spots(doc))))
    action = draw(st.sampled_from(["replace", "replace", "replace", "delete", "extend"]))
    odd = copy.deepcopy(draw(st.sampled_from(ODD_VALUES)))
    depth = draw(st.sampled_from([0, 0, 0, 300, 10_000, 100_000]))
    if depth:  # a deeply nested value at that spot (spliced into the text: json.dumps would recurse)
        odd = _DEEP
    doc = _mutate(doc, spot, action, odd)
    label = f"{action} {'.'.join(map(str, spot)) or '<body>'} <- {_short(odd, 60)}"
    text = json.dumps(doc, allow_nan=True).encode()  # ensure_ascii keeps surrogates as \\udXXX
    if depth:
        text = text.replace(json.dumps(_DEEP).encode(), b"[" * depth + b"1" + b"]" * depth)
        label += f" (nested {depth} deep)"
    return text, label


_DEEP = "<deeply nested value>"


def fuzz_json_mutations(
    base_url: str,
    seeds: dict[str, list[Any]],
    *,
    max_examples: int,
    timeout: float = 20.0,
    prepare: Prepare | None = None,
) -> FuzzReport:
    """POST each path's known-good bodies with one spot changed to an odd value; collect 5xx and hangs.

    ``seeds`` maps a path to good bodies for it. Each request changes one place: replaced by a value
    from :data:`ODD_VALUES`, deleted, or given an extra member. Bodies are written as Python's ``json``
    writes them (NaN and Infinity as bare words, lone surrogates as ``\\ud800`` escapes).
    """
    report = FuzzReport()
    with httpx.Client(base_url=base_url, timeout=timeout) as client:
        for path, bodies in seeds.items():
            _mutate_path(report, client, path, bodies, max_examples, timeout, prepare)
    return report


def _mutate_path(
    report: FuzzReport,
    client: httpx.Client,
    path: str,
    bodies: list[Any],
    count: int,
    timeout: float,
    prepare: Prepare | None,
) -> None:
    @settings(max_examples=count, **_SETTINGS)
    @given(mutated=_mutated_body(bodies))
    def send(mutated: tuple[bytes, str]) -> None:
        body, label = mutated
        where = f"POST {path} [{label}]"
        if prepare is not None or path == "/seed_session":
            client.cookies.clear()  # a new rollout: a seeded session is never seeded again (409)
        if prepare is not None:
            prepare(lambda p, b: client.post(p, json=b).status_code, path)
        headers = {"content-type": "application/json"}
        report.send(path, where, timeout, lambda: client.post(path, content=body, headers=headers))

    send()


def post_paths(base_url: str, *, fill: dict[str, str] | None = None) -> list[str]:
    """The POST paths of a server's OpenAPI schema; ``{param}`` parts filled from ``fill`` or ``x``."""
    spec = httpx.get(f"{base_url}/openapi.json", timeout=20).json()
    out = []
    for path, methods in spec["paths"].items():
        if "post" in methods:
            for name, value in (fill or {}).items():
                path = path.replace("{" + name + "}", value)
            while "{" in path:
                start, end = path.index("{"), path.index("}")
                path = path[:start] + "x" + path[end + 1 :]
            out.append(path)
    return out


def assert_alive(base_url: str) -> dict[str, Any]:
    """The server still answers ``GET /health`` with 200 after the fuzzing; return its body."""
    response = httpx.get(f"{base_url}/health", timeout=20)
    assert response.status_code == 200, response.text
    return response.json()
