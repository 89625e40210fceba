"""The resources-server base: NeMo Gym's HTTP protocol in a class a new environment subclasses.

An environment defines ``verify`` and, if it has tools, methods marked with :func:`tool`::

    class Weather(ResourcesServer):
        name = "weather"

        @tool
        async def get_weather(self, args: GetWeatherArgs, session: Session) -> dict:
            return {"city": args.city, "weather_description": "cold"}

        async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
            ...

The base serves ``POST /seed_session``, ``POST /verify``, ``POST /close_session``,
``POST /aggregate_metrics``, ``GET /reverify_mode``, one ``POST /<tool>`` per tool, ``GET /health`` and
FastAPI's OpenAPI docs. State is per session, keyed by a session cookie that the server sets on first
contact and NeMo Gym's agent (and ours) sends back (:mod:`gym_bridge.serving.cookie_sessions`).

Two ways to seed: an agent's legacy ``/seed_session`` with the task row, and NeMo Gym 0.7.0's
Environment Server seed (``ResourcesSeedSessionRequest``: a caller-assigned ``resources_session_id`` with
the row as ``task_data``), which is idempotent, closed by ``/close_session`` and verified by a
``ResourcesVerifyRequest`` or the flat body (see :mod:`gym_bridge.serving.resources_sessions`). With
``expose_tools_over_mcp`` the tools are also served over MCP at ``/mcp`` (:mod:`gym_bridge.serving.mcp_tools`).
Bad input never crashes the server: it is answered with a 4xx whose ``detail`` names the problem.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, get_type_hints

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model, field_validator
from pydantic.fields import FieldInfo
from starlette.exceptions import HTTPException

from gym_bridge.records.aggregate import AggregateRequestError, nemo_gym_aggregate, parse_aggregate_request
from gym_bridge.records.jsonl import compact_json
from gym_bridge.records.schema import (
    VERDICT_FIELDS,
    ResourcesCloseSessionRequest,
    ResourcesCloseSessionResponse,
    ResourcesSeedSessionRequest,
    ResourcesVerifyRequest,
    VerifyRequest,
    VerifyResponse,
    dump,
)
from gym_bridge.serving.answers import Answer, InvalidBody, json_answer
from gym_bridge.serving.cookie_sessions import Session, SessionStore, set_cookie
from gym_bridge.serving.json_http import THREAD_BODY_BYTES, JsonApp, Route, off_loop  # noqa: F401  (THREAD_BODY_BYTES: was defined here)
from gym_bridge.serving.mcp_tools import check_tool_names, normalized_calls, restore_names
from gym_bridge.serving.request_guard import check_host_names
from gym_bridge.serving.resources_sessions import Binding, ResourcesSessions

__all__ = ["ResourcesServer", "ServerSettings", "Session", "ToolFn", "tool"]
"""What an environment imports; :class:`Session` lives in :mod:`gym_bridge.serving.cookie_sessions` and is
re-exported here, the documented import path (``docs/guides/servers.md``)."""

logger = logging.getLogger(__name__)


class ServerSettings(BaseModel):
    """Network and safety settings shared by every resources server."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = 0
    auth_token: str | None = None
    """When set, every request but ``/health`` needs ``Authorization: Bearer <token>``."""
    allowed_hosts: list[str] = []
    """``Host`` names answered besides IP addresses, ``localhost``, this machine's name and ``host``; others
    get 421 (DNS rebinding: :mod:`gym_bridge.serving.request_guard`); ``*`` answers any."""
    max_body_bytes: int = 16 * 1024 * 1024
    """Largest request body, except ``/aggregate_metrics``: it carries every rollout of a run (NeMo Gym's
    collector sends them in one request; 20,000 rollouts take ~17 MB) and may be up to ``max_held_body_bytes``."""
    max_held_body_bytes: int = 256 * 1024 * 1024
    """Bytes of request bodies all requests may hold at once, counted as they arrive; past it, 503 with
    ``Retry-After`` (:mod:`gym_bridge.serving.body_budget`)."""
    body_timeout_s: float = 60.0
    """A request body must arrive whole within this many seconds of its headers (else 408)."""
    session_ttl_s: float = 3600.0
    """Sessions untouched for this long are dropped."""
    max_sessions: int = 200_000
    """Least recently used sessions are dropped beyond this many, so memory stays bounded; sessions that hold
    nothing yet (each cookie-less request opens one, ~400 bytes) are bounded apart, by as many again, so they
    never push out sessions that hold something (:class:`~gym_bridge.serving.cookie_sessions.SessionStore`)."""
    max_session_bytes: int = 64 * 1024 * 1024
    """Total size of all sessions' state, counted as the JSON size of what ``/seed_session`` stored
    (Python objects take a few times that in memory); past it the least recently used sessions are
    dropped. One seeding larger than this alone is refused (413)."""
    expose_tools_over_mcp: bool = False
    """Also serve the tools over MCP at ``/mcp`` (NeMo Gym 0.7.0's key of the same name): each seed's
    answer carries the session's MCP token (:mod:`gym_bridge.serving.mcp_tools`)."""

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts_are_names(cls, value: list[str]) -> list[str]:
        return check_host_names(value)


ToolFn = Callable[[Any, BaseModel, Session], Awaitable[Any]]


def tool(fn: ToolFn | None = None, *, name: str | None = None) -> Any:
    """Mark an async method ``(self, args: SomeModel, session: Session)`` as the tool ``POST /<name>``."""

    def mark(f: ToolFn) -> ToolFn:
        f.__gym_tool__ = name or f.__name__  # type: ignore[attr-defined]
        return f

    return mark(fn) if fn is not None else mark


class ResourcesServer:
    """Base class of every environment; see the module docstring for how to write one."""

    name: ClassVar[str] = "resources_server"
    verify_request_model: ClassVar[type[VerifyRequest]] = VerifyRequest
    """Subclasses may narrow this to require task fields (e.g. ``expected_answer``)."""
    seed_request_model: ClassVar[type[BaseModel] | None] = None
    """When set, the fields of a ``/seed_session`` body are validated against it (422 naming the field)
    before :meth:`seed_session` gets them as a dict. No field is required, whatever the model says: NeMo
    Gym's ``BaseSeedSessionRequest`` declares none and its agents seed with ``{}`` or ``{"task_idx": 0}``,
    so only fields that are present are checked. None: any JSON object (an empty body is ``{}``)."""

    verdict_keys: ClassVar[frozenset[str]] = VERDICT_FIELDS
    """Keys of the ``/verify`` answer that are this server's to give: dropped from the request (a rollout fed
    back as a task carries an earlier verdict), so an answer never echoes a stale one beside its own (a
    ``reward_components`` a trainer weighs, a ``mask_sample`` that drops the sample). The fields the answer
    model of :meth:`verify`'s return annotation adds to ``verify_request_model`` are added to these; a server
    whose answer is a plain ``VerifyResponse`` with diagnostics names them here."""

    def __init__(self, settings: ServerSettings | None = None) -> None:
        self.settings = settings or ServerSettings()
        self.resources = ResourcesSessions(self.settings.session_ttl_s, self.settings.max_sessions)
        """Environment Server sessions: caller-assigned ids, and the ids closed."""
        self.sessions = SessionStore(
            self.settings.session_ttl_s, self.settings.max_sessions, self.settings.max_session_bytes,
            on_drop=self._dropped,
        )  # fmt: skip
        self._releasing: set[asyncio.Task[None]] = set()
        self._seed_reads_body = type(self).seed_session is not ResourcesServer.seed_session
        self._seed_adapter = TypeAdapter(_fields_optional(self.seed_request_model)) if self.seed_request_model else None
        self._verify_adapter = TypeAdapter(self.verify_request_model)
        self._verdict_keys = self.verdict_keys | _answer_only_fields(type(self).verify, self.verify_request_model)
        self.tools: dict[str, ToolFn] = {}
        for attr in dir(type(self)):
            fn = getattr(type(self), attr, None)
            tool_name = getattr(fn, "__gym_tool__", None)
            if tool_name:
                self.tools[tool_name] = getattr(self, attr)
        check_tool_names(self.name, list(self.tools), self.settings.expose_tools_over_mcp)
        self.tool_models: dict[str, type[BaseModel]] = {n: _tool_args_model(n, fn) for n, fn in self.tools.items()}
        self.mcp: Any = None
        """The ``/mcp`` surface (:class:`~gym_bridge.serving.mcp_tools.McpSurface`) once :meth:`build_app` made one."""

    # ------------------------------------------------------------------ what environments override

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        """Set up the session's initial state from the task row; the default keeps nothing."""
        return {}

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        raise NotImplementedError

    async def close_resources_session(self, session: Session) -> None:
        """Release what an Environment Server's session holds beyond its state, on ``/close_session``.
        Raise when releasing fails: the session then stays, and the caller's close can be retried."""

    def mcp_allowed_tools_for_session(self, task_row: dict[str, Any]) -> list[str] | None:
        """The tools this task's MCP token may list and call; None (the default): all of them."""
        return None

    reverify_mode: str = "unknown"
    """NeMo Gym's ``ReverifyMode`` for ``GET /reverify_mode``: ``stateless`` when ``/verify`` needs only the
    stored record (re-scoring a file is sound), ``unsupported`` when it needs the rollout's session state."""

    def aggregate_metrics(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """The environment's own summary (mean reward, pass@k, ...), put into ``agent_metrics`` of the answer."""
        from gym_bridge.records.metrics import aggregate_rewards

        return aggregate_rewards(records)

    def health(self) -> dict[str, Any]:
        """The ``GET /health`` answer; environments may add the state of their resources."""
        return {"status": "ok", "server": self.name, "sessions": len(self.sessions), "session_bytes": self.sessions.nbytes,
                **self.resources.describe()}  # fmt: skip

    async def startup(self) -> None:
        """Acquire resources (worker pools, sandboxes) when the server starts."""

    async def shutdown(self) -> None:
        """Release what :meth:`startup` acquired."""

    # ------------------------------------------------------------------ the HTTP app

    def build_app(self) -> JsonApp:
        """The ASGI app: this server's routes (:meth:`routes`) served by :class:`~gym_bridge.serving.json_http.JsonApp`
        with the settings' limits and token, and the session of each request's cookie as context."""
        startup, shutdown, mounts = self.startup, self.shutdown, {}
        if self.settings.expose_tools_over_mcp:
            from gym_bridge.serving.mcp_tools import MCP_URL_PATH, McpSurface

            surface = self.mcp = McpSurface(self)
            mounts[MCP_URL_PATH] = surface

            async def startup() -> None:
                await surface.start()
                await self.startup()

            async def shutdown() -> None:
                try:
                    await self.shutdown()
                finally:
                    await surface.stop()

        return JsonApp(
            self.routes(),
            title=f"gym-bridge resources server: {self.name}",
            max_body_bytes=self.settings.max_body_bytes,
            max_held_body_bytes=self.settings.max_held_body_bytes,
            body_timeout_s=self.settings.body_timeout_s,
            auth_token=self.settings.auth_token,
            context=self.sessions.of_cookies,
            not_found=self._unknown_tool,
            startup=startup,
            shutdown=shutdown,
            mounts=mounts,
            allowed_hosts=[self.settings.host, *self.settings.allowed_hosts],
            owner=self,
        )

    def routes(self) -> list[Route]:
        """``GET /health``, ``POST /seed_session``, ``/verify``, ``/aggregate_metrics`` and one per tool."""

        async def health(_: None, __: Any) -> dict[str, Any]:
            return self.health()

        async def aggregate(body: Any, _: Any) -> Any:
            try:
                records = await off_loop(parse_aggregate_request, body)
            except AggregateRequestError as e:
                raise HTTPException(422, str(e)) from None
            try:
                return await asyncio.to_thread(nemo_gym_aggregate, records, self.aggregate_metrics)
            except OverflowError as e:  # finite numbers whose sum passes the largest float (~1.8e308)
                raise HTTPException(422, f"verify_responses: numbers too large to aggregate ({e})") from None

        async def reverify_mode(_: None, __: Any) -> str:
            return self.reverify_mode

        legacy_seed = _fields_optional(self.seed_request_model)
        routes = [
            Route("GET", "/health", health, open=True, raw_json=True, summary="Liveness and session count"),
            # Validated in the handler (one body, two protocols): the route only checks for a JSON object.
            Route("POST", "/seed_session", self._seed, body=ResourcesSeedSessionRequest | legacy_seed, adapter=_OBJECT,
                  default=None if self.seed_request_model else dict, summary="Start a rollout's session from its task row"),
            Route("POST", "/verify", self._verify_content, body=ResourcesVerifyRequest | self.verify_request_model,
                  adapter=_OBJECT, raw_json=True, fresh_json=True, summary="Score a rollout"),  # a dump each time
            Route("POST", "/close_session", self._close, body=ResourcesCloseSessionRequest, with_context=False,
                  summary="End an Environment Server's session (idempotent; the id is never seeded again)"),
            Route("POST", "/aggregate_metrics", aggregate, body=Any, summary="Metrics over verified rollouts",
                  max_body_bytes=max(self.settings.max_body_bytes, self.settings.max_held_body_bytes)),
            Route("GET", "/reverify_mode", reverify_mode, open=True, summary="NeMo Gym's ReverifyMode of /verify"),
        ]  # fmt: skip
        for tool_name, fn in self.tools.items():
            summary = (fn.__doc__ or tool_name).strip().splitlines()[0]
            routes.append(Route("POST", f"/{tool_name}", fn, body=self.tool_models[tool_name], summary=summary))
        return routes

    def _unknown_tool(self, method: str, path: str) -> Answer | None:
        if method != "POST" or path.count("/") != 1:
            return None
        known = ", ".join(sorted(self.tools)) or "none"
        return json_answer(404, {"detail": f"unknown tool '{path[1:]}' (this server's tools: {known})"})

    async def _seed(self, body: dict[str, Any], session: Session) -> Any:
        if "resources_session_id" in _json_object(body):  # NeMo Gym 0.7.0's Environment Server
            return await self._seed_resources(body, session)
        self._refuse_reseed(session)
        row = await off_loop(self._task_row, body, ("body",))
        self._refuse_reseed(session)  # seeded by another request while a large body was validated
        answer = await self._seed_row(row, session)
        if self.mcp is not None and isinstance(answer, dict) and "mcp" not in answer:
            answer = {**answer, "mcp": self.mcp.metadata(session, body)}  # the row as sent (``row`` may be {})
        return answer

    @staticmethod
    def _refuse_reseed(session: Session) -> None:
        if session.state or session.binding is not None:
            # NeMo Gym's simple_agent posts any function call the model makes to /<its name>, with the
            # rollout's cookie: a call named seed_session would replace the state the reward is read from.
            raise HTTPException(409, "this session is already seeded, and a rollout's session is seeded once "
                                     "(its state is not replaced mid-rollout); seed a new rollout without the "
                                     "session cookie")  # fmt: skip

    def _task_row(self, body: dict[str, Any], loc: tuple[str, ...]) -> dict[str, Any]:
        """The task row as ``seed_session`` gets it, checked against ``seed_request_model`` (422 naming the field)."""
        if self._seed_adapter is None:
            return body
        try:
            row = self._seed_adapter.validate_python(body, from_attributes=True)
        except ValidationError as e:
            raise InvalidBody([{**err, "loc": (*loc, *err["loc"])} for err in e.errors(include_url=False)]) from None
        # Turned back into a dict only for an environment whose seed_session reads it (the base one keeps
        # nothing; the dump was ~28k instructions).
        return row.model_dump(exclude_unset=True) if self._seed_reads_body else {}

    async def _seed_row(self, row: dict[str, Any], session: Session) -> Any:
        answer = await self.seed_session(row, session)
        kept = session.binding.nbytes if session.binding is not None else 0  # a caller's ids: any length
        if session.state or kept:
            try:
                self.sessions.charge(session, kept + (_state_bytes(session.state) if session.state else 0))
            except HTTPException:
                session.state.clear()
                self.sessions.charge(session, 0)
                raise
        return answer

    async def _seed_resources(self, body: dict[str, Any], session: Session) -> Answer:
        """An Environment Server's seed: the session of its id (a repeat), else a new one bound to the id.

        The answer always sets the cookie of that session: the Environment Server reaches it by the
        cookie (tools, ``/verify``), also after a retried seed whose first answer it lost.
        """
        request, row = await off_loop(self._seed_request, body)
        rid = request.resources_session_id
        self.resources.refuse_if_closed(rid)
        binding = Binding.of(request)
        bound = self.resources.session_id(rid)
        existing = self.sessions.get(bound) if bound is not None else None
        if existing is None and bound is not None:
            self.resources.refuse_if_closed(rid)  # the lookup found it idle past the TTL, and dropped it
        if existing is not None:
            assert existing.binding is not None
            conflict = existing.binding.conflict(binding)
            if conflict is not None:
                raise HTTPException(409, conflict)
            if existing.seeding is not None:  # its first seed is still running: answer as it ends
                await existing.seeding.wait()
                return await self._seed_resources(body, session)  # seeded now, or failed and gone: look again
            if existing is not session and session.binding is None and not session.state:
                self.sessions.discard(session.id)  # the cookie-less retry's fresh session: unused
            return self._seeded(existing, request.task_data)
        if isinstance(row, InvalidBody):  # a repeat's task row is not checked: the first seed's was
            raise row
        if session.binding is not None or session.state:  # the caller's cookie names a session in use
            # Refused, not a new session beside it: an agent adopts the cookie a tool call's answer sets
            # (NeMo Gym's simple_agent does), so a model's call named seed_session would move the rollout
            # (its later calls and /verify) into a session it seeded itself.
            raise HTTPException(409, "this request carries the cookie of a session in use; a new resources session "
                                     "is seeded without it")  # fmt: skip
        session.binding = binding
        self.sessions.keep(session)  # bound: out of the fresh tier, which cookie-less requests churn
        self.resources.bind(binding, session.id)
        session.seeding = done = asyncio.Event()
        try:
            await self._seed_row(row, session)
            self.resources.refuse_if_closed(rid)  # closed while it was seeding: it stays closed
        except BaseException:
            self.resources.unbind(rid, session.id)
            session.binding = None
            self.sessions.discard(session.id)
            raise
        finally:
            session.seeding = None
            done.set()
        return self._seeded(session, request.task_data)

    def _seed_request(self, body: dict[str, Any]) -> tuple[ResourcesSeedSessionRequest, dict[str, Any] | InvalidBody]:
        """The typed seed request (422 naming the field) and its task row checked (:meth:`_task_row`), or the
        422 that row gets: validated at once (in a worker thread when large), so no await splits the seed's
        lookups and its binding."""
        request = _validated(ResourcesSeedSessionRequest, body, ("body",))
        try:
            return request, self._task_row(request.task_data, ("body", "task_data"))
        except InvalidBody as invalid:
            return request, invalid

    def _seeded(self, session: Session, task_row: dict[str, Any]) -> Answer:
        assert session.binding is not None
        tools = self.mcp.metadata(session, task_row) if self.mcp is not None else None
        content = {"resources_session_id": session.binding.resources_session_id, "resources_tools": tools,
                   "sandbox_access": None}  # fmt: skip
        return Answer(200, compact_json(content).encode(), (set_cookie(session),))

    async def _close(self, body: ResourcesCloseSessionRequest, _: None) -> ResourcesCloseSessionResponse:
        """Close an Environment Server's session: idempotent; a never-seeded id is closed too (kept out)."""
        rid = body.resources_session_id
        bound = self.resources.session_id(rid)
        session = self.sessions.get(bound) if bound is not None else None
        if session is not None and session.binding is not None and session.binding.episode_id != body.episode_id:
            raise HTTPException(409, f"resources session '{rid}' was seeded for another episode_id")
        self.resources.mark_closed(rid)  # first: a seed racing this close is refused from now on
        if session is not None:
            await self._release(session)
            self.sessions.discard(session.id)
            self.resources.unbind(rid, session.id)
        return ResourcesCloseSessionResponse(resources_session_id=rid)

    def _dropped(self, session: Session) -> None:
        """An Environment Server's session left the store: its id is let go, and a session no close released
        (idle past ``session_ttl_s``, pushed out past ``max_sessions``/``max_session_bytes``) is released in
        the background: it can never be reached again, and what it held (a sandbox) was kept for good."""
        assert session.binding is not None
        rid = session.binding.resources_session_id
        self.resources.unbind(rid, session.id)
        if session.released or session.closing is not None:
            return  # a close released it, or is releasing it (dropped while seeding: released once the seed ends)
        releases = type(self).close_resources_session is not ResourcesServer.close_resources_session
        if session.state or releases:  # it held something: a repeat of its seed must not get a fresh session
            self.resources.mark_lost(rid)
        if not releases:
            return
        try:
            task = asyncio.get_running_loop().create_task(self._release_dropped(session))
        except RuntimeError:  # not on the server's loop (a caller poking the store directly)
            return
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release_dropped(self, session: Session) -> None:
        try:
            await self._release(session)
        except Exception:
            logger.exception("%s: releasing a session dropped from the store failed", self.name)

    async def _release(self, session: Session) -> None:
        """``close_resources_session`` once per session: after its seed (a close that comes while the seed
        runs would release before the seed made anything, and the seed, refused as closed, drops the session
        with what it made), and once for closes that come together (the others wait for it). Raising: the
        session stays unreleased, and the close can be retried."""
        if session.seeding is not None:
            await session.seeding.wait()
        while session.closing is not None:
            await session.closing.wait()
        if session.released:
            return
        session.closing = done = asyncio.Event()
        try:
            await self.close_resources_session(session)
            session.released = True
        finally:
            session.closing = None
            done.set()

    async def _verify_content(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        # A large body is validated (and its answer dumped) in a worker thread: a 13 MB transcript held the event
        # loop, so every other session's requests waited, for seconds.
        typed, request = await off_loop(self._verify_request, body)
        if typed is not None:
            bound = session.binding
            if bound is None and not session.state and self.reverify_mode == "unsupported":
                raise HTTPException(409, "no Environment Server session for this episode: /verify needs the session's "
                                         "state; send the cookie its /seed_session answer set")  # fmt: skip
            if bound is not None and (bound.episode_id != typed.episode_id or bound.task_id != typed.task_id):
                raise HTTPException(409, f"this session was seeded for another episode_id or task_id "
                                         f"(resources session '{bound.resources_session_id}')")  # fmt: skip
        normalized = await off_loop(normalized_calls, request, self.name) if self.mcp is not None else None
        if normalized is None:
            return await off_loop(dump, await self.verify(request, session))
        bare, emitted = normalized
        answer = await self.verify(bare, session)
        return await off_loop(lambda: restore_names(dump(answer), emitted))  # type: ignore[arg-type]

    def _verify_request(self, body: Any) -> tuple[ResourcesVerifyRequest | None, VerifyRequest]:
        """The typed request (None for a flat body) and the verify request, validated (422 naming the field)."""
        if "verification_input" in _json_object(body):  # NeMo Gym 0.7.0's ResourcesVerifyRequest
            typed = _validated(ResourcesVerifyRequest, body, ("body",))
            flat = self._without_verdict(typed.verification_input)
            return typed, _validated(self._verify_adapter, flat, ("body", "verification_input"))
        return None, _validated(self._verify_adapter, self._without_verdict(body), ("body",))

    def _without_verdict(self, row: Any) -> Any:
        """``row`` without the keys that are this server's to answer (:attr:`verdict_keys`); not an object: as it is
        (validation says what is wrong with it)."""
        if type(row) is not dict or self._verdict_keys.isdisjoint(row):
            return row
        return {k: v for k, v in row.items() if k not in self._verdict_keys}


class _AsParsed:
    """A route "adapter" that hands the parsed JSON over as it is: ``/seed_session`` and ``/verify`` validate
    their body themselves (two protocols each); a ``dict[str, Any]`` adapter cost ~3 us a request."""

    def validate_python(self, value: Any, from_attributes: bool = False) -> Any:
        return value


_OBJECT: Any = _AsParsed()


def _json_object(body: Any) -> dict[str, Any]:
    """``body`` when it is a JSON object, else the 422 a ``dict`` body type gives."""
    if type(body) is not dict:
        raise InvalidBody([{"type": "dict_type", "loc": ("body",), "msg": "Input should be a valid dictionary",
                            "input": body}])  # fmt: skip
    return body


def _validated(model: Any, value: Any, loc: tuple[str, ...]) -> Any:
    """``value`` validated as ``model`` (a pydantic model or TypeAdapter); a 422 naming the fields under ``loc``."""
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(value, from_attributes=True)
        return model.model_validate(value)
    except ValidationError as e:
        raise InvalidBody([{**err, "loc": (*loc, *err["loc"])} for err in e.errors(include_url=False)]) from None


def _fields_optional(model: type[BaseModel] | None) -> Any:
    """``model`` with each required field made optional (absent: not set; present, even null: validated as
    ``model`` says); why: see
    :attr:`ResourcesServer.seed_request_model`. None gives any JSON object."""
    if model is None:
        return dict[str, Any]
    required = {name: info for name, info in model.model_fields.items() if info.is_required()}
    if not required:
        return model
    fields: dict[str, Any] = {
        name: (info.annotation, FieldInfo.merge_field_infos(info, default=None)) for name, info in required.items()
    }
    return create_model(model.__name__, __base__=model, __doc__=model.__doc__, **fields)


def _answer_only_fields(verify: Any, request_model: type[BaseModel]) -> frozenset[str]:
    """The fields (and aliases) of ``verify``'s annotated answer model that its request model lacks; none when the
    annotation is not a ``VerifyResponse`` model."""
    try:
        answer = get_type_hints(verify).get("return")
    except Exception:  # an annotation that does not resolve: the declared verdict_keys alone
        return frozenset()
    if not (isinstance(answer, type) and issubclass(answer, VerifyResponse)):
        return frozenset()
    names = {n for name, info in answer.model_fields.items() for n in (name, info.alias) if n}
    return frozenset(names - set(request_model.model_fields))


def _state_bytes(state: dict[str, Any]) -> int:
    """Size of a session's state as JSON (what the bound counts; unknown objects count as their repr)."""
    return len(json.dumps(state, default=repr, ensure_ascii=False).encode())


def _tool_args_model(tool_name: str, fn: ToolFn) -> type[BaseModel]:
    """The pydantic model a tool's first parameter is annotated with (its request body)."""
    hints = get_type_hints(fn)
    params = [p for p in inspect.signature(fn).parameters if p not in ("session",)]
    args_model = hints.get(params[0]) if params else None
    if not (isinstance(args_model, type) and issubclass(args_model, BaseModel)):
        raise TypeError(f"tool {tool_name}: first parameter must be annotated with a pydantic model")
    return args_model
