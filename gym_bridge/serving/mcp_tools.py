"""A resources server's tools over MCP: NeMo Gym 0.7.0's ``expose_tools_over_mcp``, on the ``mcp`` SDK.

With the setting on, the server answers MCP's streamable-HTTP transport at ``POST /mcp`` (stateless, JSON
answers, as NeMo Gym's ``nemo_gym.mcp_auto_exposure``): ``tools/list`` advertises every tool route under
its bare name with its arguments model's JSON schema, and ``tools/call`` runs the same tool method an
HTTP ``POST /<tool>`` runs, on the same session. Which session: each ``/seed_session`` answer carries a
token (``resources_tools.headers`` for NeMo Gym's typed seed, ``mcp.headers`` for the legacy one) that
the MCP client sends back as ``X-NeMo-Gym-Session-Token``. The token is the session id, sealed (Fernet:
the id is the session's cookie, and a token's holder gets MCP's tools, not every HTTP route), signed with
``itsdangerous`` under NeMo Gym's salt and a random secret of this server process, so a token names one
session of one server: it cannot be made up, edited to name another session, or replayed on another
server. A tool call without a valid token is an error; ``tools/list`` needs none.

MCP clients namespace tool names per server (``mcp__<server>__<tool>``, what Claude Code records);
``/verify`` scores a response with those names as if they were bare (:func:`normalize_tool_name`) and
echoes the names as the model emitted them, as NeMo Gym's ``_wrap_verify`` does.
"""

from __future__ import annotations

import inspect
import re
import secrets
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from gym_bridge.records.schema import MCPServerMetadata
from gym_bridge.serving.answers import format_validation_errors
from gym_bridge.serving.json_http import off_loop, replaying_receive

if TYPE_CHECKING:
    from gym_bridge.serving.server import ResourcesServer, Session

__all__ = [
    "MCP_URL_PATH",
    "RESERVED_MCP_TOOL_NAMES",
    "TOKEN_HEADER",
    "McpSurface",
    "check_tool_names",
    "normalize_tool_name",
]

TOKEN_HEADER = "X-NeMo-Gym-Session-Token"
"""NeMo Gym's header for the per-session MCP token (``NEMO_GYM_MCP_SESSION_TOKEN_HEADER``)."""
TOKEN_SALT = "nemo-gym-mcp-session-token"
"""NeMo Gym's salt for signing the token (``_MCP_TOKEN_SALT``): a token of another signer sharing the
secret does not verify here."""
MCP_URL_PATH = "/mcp"
RESERVED_MCP_TOOL_NAMES = frozenset({"verify", "seed_session", "close_session", "aggregate_metrics", "mcp"})
"""Names a tool may not have: the server's own endpoints (NeMo Gym's ``RESERVED_MCP_TOOL_NAMES``)."""
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]+")


def normalize_tool_name(name: str, server_name: str | None = None) -> str:
    """A tool-call name as the server knows it: ``mcp__<server>__<tool>`` -> ``<tool>``; others unchanged.

    With ``server_name``, only that server's prefix is taken off (a tool name may itself hold ``__``).
    The same rule as NeMo Gym 0.7.0's ``normalize_tool_name``.
    """
    if not name.startswith("mcp__"):
        return name
    if server_name is not None:
        prefix = f"mcp__{server_name}__"
        return name[len(prefix) :] if name.startswith(prefix) else name
    _, sep, tool = name[len("mcp__") :].partition("__")
    return tool if sep else name


def check_tool_names(server_name: str, names: list[str], over_mcp: bool) -> None:
    """Refuse (ValueError naming it) a tool named like one of the server's endpoints, and, when the tools
    are served over MCP, one whose name MCP clients reject (outside ``[A-Za-z0-9_-]``)."""
    for name in names:
        if name in RESERVED_MCP_TOOL_NAMES:
            raise ValueError(
                f"{server_name}: tool '{name}' has a reserved name ({', '.join(sorted(RESERVED_MCP_TOOL_NAMES))}); rename it"
            )
        if over_mcp and not _TOOL_NAME.fullmatch(name):
            raise ValueError(
                f"{server_name}: tool '{name}' cannot be served over MCP (expose_tools_over_mcp): MCP tool names "
                "are [A-Za-z0-9_-]+"
            )


class McpSurface:
    """The ``/mcp`` endpoint of one resources server (an ASGI app), and the tokens it accepts."""

    def __init__(self, server: ResourcesServer) -> None:
        from itsdangerous import URLSafeSerializer
        from mcp.server.lowlevel import Server
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
        from mcp.server.transport_security import TransportSecuritySettings

        self.server = server
        from cryptography.fernet import Fernet  # comes with mcp (its pyjwt[crypto])

        self._tokens = URLSafeSerializer(secrets.token_urlsafe(32), salt=TOKEN_SALT)
        self._sids = Fernet(Fernet.generate_key())
        """Seals the session id a token names: a token is signed, not encrypted, and the id is the session's
        cookie, which reaches every HTTP route of the session (a token is for its MCP tools only)."""
        self._mcp: Server[Any, Any] = Server(server.name)
        self._register(self._mcp)
        # As NeMo Gym: stateless (no MCP session to keep; the token names ours), JSON answers, and no
        # Host/Origin allow-list of the SDK's (agents reach the server by whatever address it has).
        # The body's bound is max_body_bytes, enforced before the SDK reads it (JsonApp); the SDK's own
        # (mcp 1.30: 4 MiB, whatever the setting) is set to the same, where it has one.
        bound: dict[str, Any] = {}
        if "max_request_body_size" in inspect.signature(StreamableHTTPSessionManager).parameters:
            bound["max_request_body_size"] = server.settings.max_body_bytes
        self._manager = StreamableHTTPSessionManager(
            app=self._mcp,
            json_response=True,
            stateless=True,
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            **bound,
        )
        self._running: AsyncExitStack | None = None

    async def start(self) -> None:
        """Start the SDK's session manager (its task group); on the server's start-up."""
        stack = AsyncExitStack()
        await stack.enter_async_context(self._manager.run())
        self._running = stack

    async def stop(self) -> None:
        if self._running is not None:
            await self._running.aclose()
            self._running = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Serve one request. Only POST: a stateless server sends nothing unasked, so the SDK's ``GET`` stream
        would never carry a message nor end (the spec's other answer is 405). The body comes whole, read
        and checked by :class:`~gym_bridge.serving.json_http.JsonApp` as every route's (deadline, size,
        JSON rules); a ``tools/call`` whose params are not the SDK's shape is answered here, naming the field."""
        if scope["method"] != "POST":
            error = {"code": -32600, "message": f"{scope['method']} {MCP_URL_PATH}: this stateless MCP server "
                                                "answers POST only (no server-sent events stream)"}  # fmt: skip
            await _send_json(send, 405, {"jsonrpc": "2.0", "id": None, "error": error}, ((b"allow", b"POST"),))
            return
        message = await receive()
        raw = message.get("body", b"")
        refusal = await off_loop(_call_refusal, raw)
        if refusal is not None:
            await _send_json(send, 200, refusal)  # as the SDK answers a request it cannot validate
            return
        await self._manager.handle_request(scope, replaying_receive(raw, receive), send)

    def metadata(self, session: Session, task_row: dict[str, Any]) -> dict[str, Any]:
        """The MCP access to give with a seeded session: its signed token (and tool allow-list, if the server
        narrows it for this task: :meth:`~gym_bridge.serving.server.ResourcesServer.mcp_allowed_tools_for_session`)."""
        allowed = self.server.mcp_allowed_tools_for_session(task_row)
        token = self._tokens.dumps({"sid": self._sids.encrypt(session.id.encode()).decode(), "tools": allowed})
        return MCPServerMetadata(
            server_name=self.server.name, url_path=MCP_URL_PATH, transport="http", headers={TOKEN_HEADER: token}
        ).model_dump()

    def _claims(self, required: bool) -> tuple[str | None, frozenset[str] | None]:
        """The session id and tool allow-list of the current MCP request's token."""
        from itsdangerous import BadSignature

        request = self._mcp.request_context.request
        token = request.headers.get(TOKEN_HEADER) if request is not None else None
        if not token:
            if required:
                raise ValueError(f"Missing {TOKEN_HEADER} for an MCP tool call: use the headers /seed_session gave")
            return None, None
        try:
            payload = self._tokens.loads(token)
        except BadSignature:
            if required:
                raise ValueError(f"Invalid {TOKEN_HEADER}: not a session token of this server") from None
            return None, None
        allowed = payload.get("tools")
        return self._sids.decrypt(payload["sid"].encode()).decode(), None if allowed is None else frozenset(allowed)

    def _register(self, mcp: Any) -> None:
        import mcp.types as types

        server = self.server

        @mcp.list_tools()  # type: ignore[misc]
        async def list_tools() -> list[types.Tool]:
            _, allowed = self._claims(required=False)
            return [
                types.Tool(name=name, description=_description(fn), inputSchema=server.tool_models[name].model_json_schema())
                for name, fn in server.tools.items()
                if allowed is None or name in allowed
            ]

        @mcp.call_tool(validate_input=False)  # type: ignore[misc]
        async def call_tool(name: str, arguments: dict[str, Any]) -> Any:
            fn = server.tools.get(name)
            if fn is None:  # models make names up: an error result, not an exception
                known = sorted(server.tools)
                text = f"Unknown tool: {name!r}. Available tools: {known}"
                return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=True)
            session_id, allowed = self._claims(required=True)
            if allowed is not None and name not in allowed:
                raise ValueError(f"Tool {name!r} is not allowed for this session.")
            session = server.sessions.get(session_id) if session_id else None
            if session is None:
                raise ValueError(f"HTTP 409 from POST /{name}: this token's session is closed or expired; seed a new one")
            args = await off_loop(_arguments, server.tool_models[name], name, arguments)
            try:
                result = await fn(args, session)
            except HTTPException as e:
                raise ValueError(f"HTTP {e.status_code} from POST /{name}: {e.detail}") from None
            return await off_loop(_answer, result)  # a large call's answer: in a worker thread


def _call_refusal(raw: bytes) -> dict[str, Any] | None:
    """The JSON-RPC error for a ``tools/call`` request whose params are not ``CallToolRequest``'s (arguments
    that are not an object, a name that is not a string) or whose arguments hold a NaN or Infinity, naming
    the field; None for any other body (the SDK answers it). Why here: the SDK's answer to the first is
    ``Invalid request parameters``, naming nothing, and it turns the second into null (its params pass
    through a JSON dump), so a tool ran another call than the one sent (``max_price: NaN`` listed
    everything; over HTTP the same call is a 422)."""
    import json

    import mcp.types as types

    from gym_bridge.serving.json_body import non_finite

    try:
        message = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None
    request_id = message.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        return None  # not a request the SDK would answer: it refuses it itself
    try:
        types.CallToolRequest.model_validate(message)
    except ValidationError as e:
        detail = format_validation_errors(list(e.errors()))
    else:
        where = non_finite(message["params"].get("arguments"))
        if where is None:
            return None
        field = ".".join(map(str, ("params", "arguments", *where)))
        detail = f"{field}: Input should be a finite number (JSON has no NaN or Infinity)"
    error = {"code": types.INVALID_PARAMS, "message": f"tools/call: {detail}"}
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


async def _send_json(send: Any, status: int, payload: Any, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    from gym_bridge.records.jsonl import compact_json

    body = compact_json(payload).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


def _description(fn: Any) -> str | None:
    return (inspect.getdoc(fn) or "").strip() or None


def _arguments(model: type[BaseModel], name: str, arguments: dict[str, Any] | None) -> BaseModel:
    """A tool call's arguments validated; a ValueError naming the fields (what the SDK answers as an error result)."""
    try:
        return model.model_validate(arguments or {})
    except ValidationError as e:
        raise ValueError(f"HTTP 422 from POST /{name}: {format_validation_errors(list(e.errors()))}") from None


def _answer(result: Any) -> Any:
    """A tool's answer as MCP's result (:func:`_to_result`), a model dumped first."""
    return _to_result(result.model_dump(mode="json") if isinstance(result, BaseModel) else result)


def _to_result(payload: Any) -> Any:
    """``(content, structuredContent)`` for a JSON object, text content otherwise (NeMo Gym's ``_to_result``)."""
    import mcp.types as types

    from gym_bridge.records.jsonl import compact_json

    text = payload if isinstance(payload, str) else compact_json(payload)
    content = [types.TextContent(type="text", text=text)]
    return (content, payload) if isinstance(payload, dict) else content


def normalized_calls(body: BaseModel, server_name: str) -> tuple[BaseModel, dict[int, tuple[str, str]]] | None:
    """``body`` with its response's ``mcp__<server>__<tool>`` function-call names made bare, and by output
    position each such call's ``(emitted, bare)`` name; None when no name needs it (the body is scored as it came).

    By position, not ``call_id`` (NeMo Gym's ``_wrap_verify`` keys them by ``call_id``): two calls sharing an id
    (a broken or hostile client's record) were echoed both with the first one's name."""
    response = getattr(body, "response", None)
    output = getattr(response, "output", None) or []
    prefix = f"mcp__{server_name}__"
    if not any(_call_name(item).startswith(prefix) for item in output):
        return None
    emitted: dict[int, tuple[str, str]] = {}
    copied = body.model_copy(deep=True)
    for i, item in enumerate(copied.response.output):  # type: ignore[attr-defined]
        name = _call_name(item)
        if name.startswith(prefix):
            bare = normalize_tool_name(name, server_name)
            emitted[i] = (name, bare)
            if isinstance(item, dict):
                item["name"] = bare
            else:
                item.name = bare
    return copied, emitted


def restore_names(answer: dict[str, Any], emitted: dict[int, tuple[str, str]]) -> dict[str, Any]:
    """The verify answer with its function calls named as the model emitted them: each call at a position
    :func:`normalized_calls` renamed, if it is still that call there (a verify that reorders its echo keeps it)."""
    output = (answer.get("response") or {}).get("output")
    if not isinstance(output, list):
        return answer
    restored = list(output)
    for i, (name, bare) in emitted.items():
        item = restored[i] if i < len(restored) else None
        if isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") == bare:
            restored[i] = {**item, "name": name}
    return {**answer, "response": {**answer["response"], "output": restored}}


def _call_name(item: Any) -> str:
    if isinstance(item, dict):
        return str(item.get("name", "")) if item.get("type") == "function_call" else ""
    return str(getattr(item, "name", "")) if getattr(item, "type", None) == "function_call" else ""
