"""The agent loop: one task row in, one verified rollout out (``collect`` and online training share it).

It does what NeMo Gym's ``simple_agent`` does, over HTTP to any resources server and any OpenAI
Responses endpoint:

1. ``POST {env}/seed_session`` with the task row; the env's cookies are kept in a jar of this rollout
   alone and sent on every later env call (that is how an env keeps per-rollout state). An env with
   several replicas is a :class:`~gym_bridge.rollout.env_router.SessionRouter`: the session opens on the
   replica it picks (another one if that one does not answer) and every later env call goes there.
2. ``POST {model}/responses`` with the row's ``responses_create_params`` (plus overrides) and
   ``input`` = the original input + every output item so far.
3. Each ``function_call`` item becomes ``POST {env}/{name}`` with the parsed arguments as the JSON body;
   the answer's body text (a 4xx error's too, so the model can correct itself) goes back as a
   ``function_call_output`` item. Arguments that are not valid JSON go back as an error text, and the
   env is not called.
4. Repeat until a response has no function calls, is cut off by ``max_output_tokens``, or ``max_steps``
   model calls were made. In a conversation (a row with a user, :mod:`gym_bridge.rollout.user_sim`), a response
   with no function calls is followed by the user's next message (an ``{"role": "user", "type":
   "message"}`` output item, as NeMo Gym's conversational records hold it) and the loop goes on, until
   the user ends the conversation, ``max_user_turns`` user messages, or the ``max_conversation_tokens``
   budget (:class:`~gym_bridge.rollout.user_sim.UserSimConfig`).
5. ``POST {env}/verify`` with the row and the final ``response``: the last model response whose
   ``output`` is the whole trajectory (every turn's items, function calls and their outputs included).
   The verify answer is the rollout record, in NeMo Gym's format.

The env steps (1, 3 and 5) are :func:`seed_session`, :func:`post_tool` and :func:`verify_rollout` over an
:class:`EnvSession` (the session's URL, retry policy, headers and cookie jar): the one implementation of
the env side of the protocol, which the TRL bridge (:mod:`gym_bridge.integrations.trl`) calls too.

Output items are carried through untouched, so token ids and log-probs a policy server attaches to them
reach the trainer. Timings and summed token usage are returned beside the record
(:class:`RolloutMetrics`), never written into it, so records stay exactly NeMo Gym's.
"""

from __future__ import annotations

import functools
import json
import re
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.cookiejar import CookieJar
from typing import TYPE_CHECKING, Any

import aiohttp

from gym_bridge.records.schema import input_items, is_finite_number, reward_components_problem
from gym_bridge.rollout.env_router import Replica, SessionRouter
from gym_bridge.rollout.user_sim import UserSimConfig, user_for, user_message
from gym_bridge.serving.deadlines import within
from gym_bridge.serving.retry import Client, HttpResult, RequestFailed, RetryPolicy, post_json

if TYPE_CHECKING:
    import httpx

__all__ = [
    "AgentConfig",
    "EnvSession",
    "Rollout",
    "RolloutFailure",
    "RolloutMetrics",
    "is_tool_name",
    "make_client",
    "make_session",
    "post_tool",
    "run_rollout",
    "seed_session",
    "task_as_run",
    "verify_rollout",
]

RESERVED_ENV_PATHS = frozenset(
    {"seed_session", "verify", "aggregate_metrics", "health", "docs", "openapi.json"}
)
_COOKIE_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
"""An RFC 7230 token: what a cookie name may be."""
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


def is_tool_name(name: str) -> bool:
    """Whether ``POST {env}/{name}`` may be sent as a tool call: a plain route name, not a protocol route."""
    return bool(_TOOL_NAME.match(name)) and name not in RESERVED_ENV_PATHS


@dataclass(frozen=True)
class AgentConfig:
    """Where the model is and how a rollout runs."""

    model_url: str
    """Base URL of an OpenAI-compatible API (``.../v1``); requests go to ``{model_url}/responses``."""
    max_steps: int | None = 32
    """Most model calls per rollout (None: until the model stops calling tools)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Merged over every row's ``responses_create_params`` (temperature, model, ...), as NeMo Gym does."""
    model_retry: RetryPolicy = field(default_factory=RetryPolicy)
    env_retry: RetryPolicy = field(default_factory=RetryPolicy)
    model_headers: dict[str, str] = field(default_factory=dict)
    """E.g. ``{"authorization": "Bearer ..."}`` for a hosted API."""
    env_headers: dict[str, str] = field(default_factory=dict)
    rollout_timeout_s: float | None = None
    """Deadline for the whole rollout: session set-up, every model and tool call, /verify, their retries
    and backoff waits. Past it the rollout is cut off as a ``rollout_timeout`` failure, so one request
    that never returns costs at most this, not each attempt's timeout times the attempts. None: only
    the per-request retry policies bound it."""
    user: UserSimConfig | None = None
    """The user side of multi-turn rows (an LLM user's endpoint, turn and token limits); None: rows with a
    ``user_script`` still get a scripted user, with :class:`~gym_bridge.rollout.user_sim.UserSimConfig`'s defaults."""


@dataclass
class RolloutMetrics:
    """What a rollout cost, for the run's metrics (kept out of the record)."""

    model_latencies_s: list[float] = field(default_factory=list)
    """Wall time of each model call, retries included."""
    tool_latencies_s: list[float] = field(default_factory=list)
    total_s: float = 0.0
    model_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    """Summed over the rollout's model calls (the record's ``response.usage`` is the last call's)."""
    output_tokens: int = 0
    retries: int = 0
    """HTTP attempts beyond the first, over all of the rollout's requests."""
    timeouts: int = 0
    """HTTP attempts that ran out of their retry policy's ``request_timeout`` (most were sent again)."""
    user_turns: int = 0
    """User messages the simulated user added after the task prompt."""
    conversation_end: str | None = None
    """Why a conversation ended: ``user`` (it said so), ``max_user_turns``, ``max_conversation_tokens``,
    ``max_steps`` or ``max_output_tokens``; None for a row without a user."""


@dataclass
class RolloutFailure:
    """Why a rollout has no record: a class from :mod:`gym_bridge.serving.retry`, ``agent_error``, or
    ``rollout_timeout`` (it ran past ``AgentConfig.rollout_timeout_s``)."""

    failure_class: str
    message: str
    attempts: int
    stage: str
    """``seed_session``, ``model``, ``tool``, ``user``, ``verify`` or ``agent``."""


@dataclass
class Rollout:
    """The outcome of :func:`run_rollout`: a record, or a failure; metrics either way."""

    record: dict[str, Any] | None
    failure: RolloutFailure | None
    metrics: RolloutMetrics
    partial_output: list[dict[str, Any]] | None = None
    """A rollout cut off at its deadline: the output items it had (model turns, tool outputs), if any."""

    @property
    def ok(self) -> bool:
        return self.failure is None


class _RefuseAllCookies(CookieJar):
    """The shared client's jar: keeps nothing, and skips urllib's cookie parsing (~8% of a request's CPU)."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def set_cookie(self, cookie: Any) -> None:
        return None


@functools.lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every client (building one reads the CA bundle: ~15 ms each)."""
    import httpx

    return httpx.create_ssl_context()


def make_client(max_connections: int = 100, timeout: float | None = None) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` fit for sharing between rollouts.

    Its own cookie jar refuses every cookie: cookies belong to one rollout (see :func:`run_rollout`),
    and a shared jar would leak one rollout's session into another.
    """
    import httpx

    return httpx.AsyncClient(
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        timeout=httpx.Timeout(timeout),
        cookies=_RefuseAllCookies(),
        verify=_ssl_context(),
        trust_env=False,
    )


def make_session(max_connections: int = 100, max_per_host: int = 0) -> aiohttp.ClientSession:
    """An ``aiohttp.ClientSession`` fit for sharing between rollouts: what ``collect`` and training use.

    On loopback it costs about a fifth of the CPU per request of an ``httpx.AsyncClient``, and its
    pool stays cheap with thousands of connections. Like :func:`make_client`, it keeps no cookies
    (see :func:`run_rollout`) and sets no timeout of its own (the retry policy bounds every request).
    Create it inside the event loop that uses it.

    ``max_connections`` caps the connections in use; idle ones are kept besides, up to the most ever
    in use per host, so only ``max_per_host`` (0: no cap) bounds the connections open to each host.
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max_connections, limit_per_host=max_per_host),
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=None),
        skip_auto_headers=("User-Agent",),
    )


class _CookieJar:
    """The cookies one env has set for one rollout (name -> value), sent back as one ``Cookie`` header."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}

    def update(self, result: HttpResult) -> None:
        """Keep each ``Set-Cookie``'s name and value, parsed as RFC 6265 (5.2) tells user agents to.

        The value is kept as sent (quotes included) and attributes are ignored: the jar lives for one
        rollout, against one env. (``http.cookies`` took ~5% of a rollout's client CPU for the same.)
        """
        for raw in result.header_values("set-cookie"):
            name, sep, value = raw.split(";", 1)[0].partition("=")
            name = name.strip()
            if sep and name and _COOKIE_NAME.match(name):
                self._values[name] = value.strip()

    def header(self) -> dict[str, str]:
        if not self._values:
            return {}
        return {"cookie": "; ".join(f"{k}={v}" for k, v in self._values.items())}


def _check_response(data: Any) -> str | None:
    """Why a model answer is not a Responses ``response`` object, or None if it is usable."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    if data.get("error"):
        return f"the response reports an error: {json.dumps(data['error'])[:300]}"
    output = data.get("output")
    if not isinstance(output, list) or not all(isinstance(item, dict) for item in output):
        return "'output' is missing or not a list of items"
    return None


def _check_verify(data: Any) -> str | None:
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    if "reward" not in data:
        return "no 'reward' in the verify answer"
    if not is_finite_number(data["reward"]):  # NaN, null, "1", true or an object was written as a success
        return f"'reward' must be a finite number, got {json.dumps(data['reward'], default=str)[:60]}"
    components = data.get("reward_components")
    if components is not None and (problem := reward_components_problem(components)) is not None:
        return f"reward_components: {problem}"
    return None


def _check_object(data: Any) -> str | None:
    return None if isinstance(data, dict) else f"expected a JSON object, got {type(data).__name__}"


def _add_usage(metrics: RolloutMetrics, usage: Any) -> None:
    if isinstance(usage, dict):
        metrics.input_tokens += int(usage.get("input_tokens") or 0)
        metrics.output_tokens += int(usage.get("output_tokens") or 0)


def _function_call_output(call_id: Any, text: str) -> dict[str, Any]:
    """The item that carries a tool's answer back, shaped as NeMo Gym writes it."""
    return {"call_id": call_id, "output": text, "type": "function_call_output", "id": None, "status": None}


def _bad_arguments_text(name: str, error: json.JSONDecodeError) -> str:
    return (
        f"Error: the arguments of the call to '{name}' are not valid JSON "
        f"({error.msg} at line {error.lineno} column {error.colno}); the tool was not called."
    )


@dataclass
class EnvSession:
    """One rollout's session with one env: what every env step of the protocol sends with.

    The env's cookies (set at ``/seed_session`` or by a tool) are kept in ``jar`` and sent on every later
    call of the session; each step counts its attempts and timeouts in ``metrics`` (a request that still
    fails raises :class:`~gym_bridge.serving.retry.RequestFailed`, which the caller counts).
    """

    url: str
    """The env's base URL (for a routed env, the replica the session opened on)."""
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    headers: Mapping[str, str] = field(default_factory=dict)
    metrics: RolloutMetrics = field(default_factory=RolloutMetrics)
    jar: _CookieJar = field(default_factory=_CookieJar)

    async def post(self, client: Client, route: str, body: Any, **options: Any) -> HttpResult:
        """``POST {url}/{route}`` in this session: its policy and headers with its cookies, the cookies
        the answer sets kept, attempts and timeouts counted. ``options``: :func:`~gym_bridge.serving.retry.post_json`'s."""
        result = await post_json(
            client,
            f"{self.url}/{route}",
            body,
            target="env",
            policy=self.policy,
            headers={**self.headers, **self.jar.header()},
            **options,
        )
        _count(self.metrics, result.attempts, result.timeouts)
        self.jar.update(result)
        return result


async def seed_session(client: Client, env: EnvSession, task: dict[str, Any]) -> HttpResult:
    """``POST {env}/seed_session`` with the task row; the cookies it sets open the session."""
    return await env.post(client, "seed_session", task, expect_json=False)


async def post_tool(client: Client, env: EnvSession, name: str, arguments: Any) -> HttpResult:
    """``POST {env}/{name}`` with the call's arguments in the session. A 4xx answer is handed back, not
    raised: its text goes to the model, which can correct itself. ``name`` must pass :func:`is_tool_name`.
    Sent once, unless it surely did not run (``idempotent=False``): a tool may change the env's state, and a
    call applied twice (an ``add_to_cart`` whose answer was lost) leaves a state the model did not make; the
    rollout fails unscored instead."""
    if not is_tool_name(name):
        raise ValueError(f"{name!r} is not a tool route")
    started = time.perf_counter()
    result = await env.post(client, name, arguments, expect_json=False, return_client_errors=True, idempotent=False)
    env.metrics.tool_latencies_s.append(time.perf_counter() - started)
    return result


async def verify_rollout(
    client: Client, env: EnvSession, task: dict[str, Any], response: dict[str, Any]
) -> dict[str, Any]:
    """``POST {env}/verify`` with the row and the final ``response`` in the session: the env's answer
    (the rollout record), checked to hold a ``reward`` and well-formed ``reward_components``."""
    verified = await env.post(client, "verify", {**task, "response": response}, validate=_check_verify)
    return verified.data


async def _call_tool(client: Client, env: EnvSession, call: dict[str, Any]) -> str:
    """Run one of the model's function calls against the env; return the text the model sees as its output."""
    name = str(call.get("name") or "")
    if not is_tool_name(name):
        return f"Error: there is no tool named {name!r}."
    arguments = call.get("arguments")
    if isinstance(arguments, str):
        try:
            body = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return _bad_arguments_text(name, e)
    else:
        body = arguments if arguments is not None else {}
    return (await post_tool(client, env, name, body)).text


def task_as_run(row: dict[str, Any], config: AgentConfig, extra_params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The row as the rollout runs it: ``config.overrides`` then ``extra_params`` merged over its request."""
    params = dict(row.get("responses_create_params") or {})
    params.update(config.overrides)
    if extra_params:
        params.update(extra_params)
    return {**row, "responses_create_params": params}


_UNREACHABLE = frozenset({"env_connection_error", "env_timeout"})
"""How a replica that is gone shows at session set-up (then the session opens on another one)."""


async def _seed_on_a_replica(
    client: Client, router: SessionRouter, env: EnvSession, task: dict[str, Any]
) -> Replica:
    """Open the session on the replica the router picks; one that does not answer is marked lost and
    the next is tried (nothing of the session exists yet), until none is left."""
    while True:
        replica = router.open_session()
        env.url = replica.url
        try:
            await seed_session(client, env, task)
            return replica
        except RequestFailed as e:
            router.end_session(replica)
            if e.failure_class not in _UNREACHABLE:
                raise
            env.metrics.retries += e.attempts
            env.metrics.timeouts += e.timeouts
            router.mark_lost(replica, e.message)


async def run_rollout(
    client: Client,
    row: dict[str, Any],
    env_url: str | SessionRouter,
    config: AgentConfig,
    *,
    extra_params: dict[str, Any] | None = None,
) -> Rollout:
    """Run one task row to a verified rollout; never raises for HTTP trouble (see :class:`Rollout`).

    ``env_url``: the env's base URL, or the router of its replicas (the session's replica is chosen
    when it opens, and every env request of the rollout goes there). ``extra_params`` are merged over
    ``config.overrides`` for this rollout only (e.g. its ``seed``). The returned record is the env's
    verify answer: the row (with the merged ``responses_create_params``) plus ``response`` and
    ``reward`` and whatever the env adds. With ``config.rollout_timeout_s`` the whole rollout (every
    request and retry) must end within it, else it is cut off as a ``rollout_timeout`` failure that
    keeps what the model generated so far (:attr:`Rollout.partial_output`). Cancellation propagates.
    """
    metrics = RolloutMetrics()
    progress = _Progress()
    started = time.perf_counter()
    timeout = config.rollout_timeout_s
    running = _run(client, row, env_url, config, extra_params, metrics, progress)
    try:
        rollout = await (running if timeout is None else within(timeout, running))
    except TimeoutError:  # the rollout's own deadline (a request's own ends as RequestFailed inside)
        waiting = f" waiting for {progress.waiting_on}" if progress.waiting_on else ""
        failure = RolloutFailure(
            "rollout_timeout",
            f"the rollout was cut off at its {timeout:.3g} s deadline in {progress.stage}{waiting}",
            1,
            progress.stage,
        )
        metrics.total_s = time.perf_counter() - started
        return Rollout(None, failure, metrics, partial_output=list(progress.outputs) or None)
    metrics.total_s = time.perf_counter() - started
    return rollout


@dataclass
class _Progress:
    """How far a rollout got: what a deadline that cuts it off reports and keeps."""

    stage: str = "seed_session"
    waiting_on: str = ""
    """The request in flight (``POST <url>``)."""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """Every output item so far (model items, function call outputs)."""


def _conversation_limit(
    metrics: RolloutMetrics, last: dict[str, Any], max_user_turns: int, limits: UserSimConfig, max_steps: int | None
) -> str | None:
    """Which limit ends the conversation before the user would speak again, or None."""
    if metrics.user_turns >= max_user_turns:
        return "max_user_turns"
    usage = last.get("usage") if isinstance(last.get("usage"), dict) else {}
    used = int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
    if limits.max_conversation_tokens is not None and used >= limits.max_conversation_tokens:
        return "max_conversation_tokens"
    if max_steps and metrics.model_calls >= max_steps:
        return "max_steps"
    return None


def _count(metrics: RolloutMetrics, attempts: int, timeouts: int) -> None:
    metrics.retries += max(attempts - 1, 0)
    metrics.timeouts += timeouts


async def _run(
    client: Client,
    row: dict[str, Any],
    env_url: str | SessionRouter,
    config: AgentConfig,
    extra_params: dict[str, Any] | None,
    metrics: RolloutMetrics,
    progress: _Progress,
) -> Rollout:
    """The rollout itself (:func:`run_rollout` puts the deadline around it)."""
    router = env_url if isinstance(env_url, SessionRouter) else None
    replica: Replica | None = None
    model_url = config.model_url.rstrip("/")
    task = task_as_run(row, config, extra_params)
    params = task["responses_create_params"]
    env = EnvSession("", config.env_retry, config.env_headers, metrics)
    try:
        user = user_for(task, config.user)
        limits = config.user or UserSimConfig()
        max_user_turns = limits.max_user_turns
        if user is not None and user.max_turns is not None:
            max_user_turns = min(max_user_turns, user.max_turns)
        if router is None:
            env.url = str(env_url).rstrip("/")
            progress.waiting_on = f"POST {env.url}/seed_session"
            await seed_session(client, env, task)
        else:
            progress.waiting_on = f"POST <a replica of env {router.name!r}>/seed_session"
            replica = await _seed_on_a_replica(client, router, env, task)
        base = env.url

        original_input = input_items(params)
        outputs = progress.outputs
        last: dict[str, Any] = {}
        while True:
            progress.stage, progress.waiting_on = "model", f"POST {model_url}/responses"
            request = {**params, "input": original_input + outputs}
            call_started = time.perf_counter()
            answer = await post_json(
                client,
                f"{model_url}/responses",
                request,
                target="model",
                policy=config.model_retry,
                headers=config.model_headers,
                validate=_check_response,
            )
            metrics.model_latencies_s.append(time.perf_counter() - call_started)
            metrics.model_calls += 1
            _count(metrics, answer.attempts, answer.timeouts)
            last = answer.data
            _add_usage(metrics, last.get("usage"))
            items: list[dict[str, Any]] = last["output"]
            outputs.extend(items)
            if (last.get("incomplete_details") or {}).get("reason") == "max_output_tokens":
                metrics.conversation_end = "max_output_tokens" if user is not None else None
                break
            calls = [item for item in items if item.get("type") == "function_call"]
            if not calls:
                if user is None:
                    break
                end = _conversation_limit(metrics, last, max_user_turns, limits, config.max_steps)
                if end is None:
                    progress.stage = "user"
                    progress.waiting_on = "the user's next message"
                    said = await user.reply(client, outputs)
                    end = "user" if said is None else None
                if end is not None:
                    metrics.conversation_end = end
                    break
                outputs.append(user_message(said))
                metrics.user_turns += 1
                continue
            progress.stage = "tool"
            for call in calls:
                metrics.tool_calls += 1
                progress.waiting_on = f"POST {base}/{call.get('name')}"
                text = await _call_tool(client, env, call)
                outputs.append(_function_call_output(call.get("call_id"), text))
            if config.max_steps and metrics.model_calls >= config.max_steps:
                metrics.conversation_end = "max_steps" if user is not None else None
                break

        progress.stage, progress.waiting_on = "verify", f"POST {base}/verify"
        record = await verify_rollout(client, env, task, {**last, "output": outputs})
        return Rollout(record, None, metrics)
    except RequestFailed as e:
        _count(metrics, e.attempts, e.timeouts)
        failure = RolloutFailure(e.failure_class, e.message, e.attempts, progress.stage)
        if router is not None and replica is not None and e.failure_class == "env_connection_error":
            router.mark_lost(replica, e.message)  # the replica went away mid-session
    except Exception as e:  # a bug or an unforeseen answer must not end a run of thousands of rollouts
        failure = RolloutFailure("agent_error", f"{type(e).__name__}: {e}", 1, progress.stage)
    finally:
        if router is not None and replica is not None:
            router.end_session(replica)
    return Rollout(None, failure, metrics)
