"""The tool-use environment: a stateful store the model shops in through tools, one store per session.

A task row carries the store's ``initial_state`` (``StoreState``), the tool schemas in
``responses_create_params.tools`` and, in ``verifier_metadata``, either

* ``reference_calls``: ``[{"name", "arguments"}]`` -- verified **by outcome**: the calls are replayed on
  a fresh copy of the initial state and the session's final state must equal the result (reward 1/0,
  the differences as ``failure_reason`` and ``state_diff``); or
* ``expected_calls`` (+ ``match``: ``strict`` | ``fraction`` | ``f1``) -- verified **by arguments**: the
  function calls in the response are compared with the expected ones, with a reason per mismatch.

A multi-turn task (a simulated user, :mod:`gym_bridge.rollout.user_sim`) adds ``user_holds``: what only the user
knows (an order number, a preference). The reward stays the outcome; ``reward_components`` reports it as
``outcome`` beside the shaped ``asked_before_acting`` (1 when every held fact was in a user message before
the first store-changing call, 0 otherwise), so a trainer may weigh asking first, and a report shows it.

``/seed_session`` (with the task row, or NeMo Gym 0.7.0's typed seed with the row as ``task_data``) gives
the session its own copy of the store; ``/close_session`` drops it. Bad calls (unknown tool, missing or
mistyped arguments, broken JSON) get a 4xx with a ``detail`` the agent passes back to the model; domain
failures (unknown product, not enough stock) are ordinary answers with an ``error`` field. With
``expose_tools_over_mcp`` the same tools are served over MCP at ``/mcp`` (docs/reference/protocol.md).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gym_bridge.records.schema import VERDICT_FIELDS, VerifyRequest, VerifyResponse, dump
from gym_bridge.rollout.user_sim import message_text
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session, tool
from resources_servers.tool_use.scoring import (
    Call,
    calls_from_output,
    compare_calls,
    normalise_arguments,
    state_diff,
)
from resources_servers.tool_use.store import (
    TOOLS,
    AddToCartArgs,
    ListProductsArgs,
    NoArgs,
    OrderArgs,
    ProductArgs,
    StoreState,
    apply_call,
)

__all__ = ["ToolUseConfig", "ToolUseServer", "ToolUseVerifyRequest"]

DEFAULT_CONFIG = Path(__file__).with_name("config.yaml")


class ToolUseConfig(BaseModel):
    """Settings of the tool-use server (``config.yaml`` next to this file holds the defaults)."""

    model_config = ConfigDict(extra="forbid")

    max_calls_per_session: int = Field(200, ge=1)
    """Tool calls one session may make; past it tools answer 403 (a runaway agent stops here: the model is told,
    and the rollout is scored on what it did)."""
    default_match: Literal["strict", "fraction", "f1"] = "strict"
    """Argument-check scoring when a task does not set ``verifier_metadata.match``."""

    @classmethod
    def from_yaml(cls, path: str | Path) -> ToolUseConfig:
        data = yaml.safe_load(Path(path).read_text()) or {}
        return cls.model_validate(data.get("tool_use", data))


class ToolCallSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] | str = {}


class ToolUseVerifierMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    reference_calls: list[ToolCallSpec] | None = None
    expected_calls: list[ToolCallSpec] | None = None
    match: Literal["strict", "fraction", "f1"] | None = None
    user_holds: list[str] | None = None
    """Facts only the simulated user holds and gives when asked (multi-turn tasks)."""

    @model_validator(mode="after")
    def _has_a_mode(self) -> ToolUseVerifierMetadata:
        if self.reference_calls is None and self.expected_calls is None:
            raise ValueError("needs reference_calls (outcome check) or expected_calls (argument check)")
        return self


class ToolUseVerifyRequest(VerifyRequest):
    verifier_metadata: ToolUseVerifierMetadata
    initial_state: dict[str, Any] | None = None


def _initial_state(row: dict[str, Any]) -> dict[str, Any]:
    raw = row.get("initial_state")
    if raw is None and isinstance(row.get("verifier_metadata"), dict):
        raw = row["verifier_metadata"].get("initial_state")
    if raw is None:
        raise HTTPException(422, "the task row has no initial_state (the store to start from)")
    try:
        return StoreState.model_validate(raw).model_dump()
    except ValidationError as e:
        first = e.errors()[0]
        where = "".join(f".{x}" for x in first["loc"])  # none: the store as a whole
        raise HTTPException(422, f"initial_state{where}: {first['msg']}") from None


VERDICT_KEYS = VERDICT_FIELDS | frozenset({  # every server's verdict, and this server's diagnostics:
    "verify_mode", "state_diff", "tool_calls_made", "tool_errors", "calls_expected", "calls_made", "calls_matched",
    "call_mismatches", "extra_reads",
})  # fmt: skip
"""Keys of the verify answer that are this server's to give: a task row that carries them (a rollout record fed
back as a task) has them dropped from the echo, so an earlier verdict never stands beside this one (a stale
``reward_components`` a trainer weighs, a ``mask_sample`` that drops the sample, a ``failure_kind`` on a pass)."""


class ToolUseServer(ResourcesServer):
    name = "tool_use"
    reverify_mode = "unsupported"  # /verify scores the session's final store
    verify_request_model = ToolUseVerifyRequest
    verdict_keys = VERDICT_KEYS

    def __init__(self, settings: ServerSettings | None = None, config: ToolUseConfig | None = None) -> None:
        super().__init__(settings)
        if config is None:
            config = ToolUseConfig.from_yaml(DEFAULT_CONFIG) if DEFAULT_CONFIG.exists() else ToolUseConfig()
        self.config = config

    async def seed_session(self, body: dict[str, Any], session: Session) -> dict[str, Any]:
        initial = _initial_state(body)
        session.state.clear()
        session.state.update(store=copy.deepcopy(initial), calls=[])
        return {"seeded": True, "products": len(initial["products"]), "tools": sorted(TOOLS)}

    def _run(self, session: Session, name: str, args: BaseModel) -> dict[str, Any]:
        store = session.state.get("store")
        if store is None:
            raise HTTPException(409, "this session has no store: POST /seed_session with the task row first")
        if len(session.state["calls"]) >= self.config.max_calls_per_session:
            # 403, not 429: the budget does not come back, and a client retries a 429 (the agent loop did, four
            # times, then failed the whole rollout unscored instead of handing the model this answer)
            raise HTTPException(
                403,
                f"this session has used its {self.config.max_calls_per_session} tool calls; no more tools can "
                "be called in it",
            )
        result = TOOLS[name].fn(store, args)
        # Whether it failed, not the error text: that echoes the model's arguments (a megabyte product id), and
        # the session's size is counted only when it is seeded.
        session.state["calls"].append({"name": name, "error": "error" in result})
        return result

    # ------------------------------------------------------------------ tools (docstrings are their summaries)

    @tool
    async def list_products(self, args: ListProductsArgs, session: Session) -> dict[str, Any]:
        """List the catalogue (optionally one category, optionally up to a price)."""
        return self._run(session, "list_products", args)

    @tool
    async def get_product(self, args: ProductArgs, session: Session) -> dict[str, Any]:
        """Details of one product."""
        return self._run(session, "get_product", args)

    @tool
    async def add_to_cart(self, args: AddToCartArgs, session: Session) -> dict[str, Any]:
        """Put units of a product in the cart."""
        return self._run(session, "add_to_cart", args)

    @tool
    async def remove_from_cart(self, args: ProductArgs, session: Session) -> dict[str, Any]:
        """Take a product out of the cart."""
        return self._run(session, "remove_from_cart", args)

    @tool
    async def view_cart(self, args: NoArgs, session: Session) -> dict[str, Any]:
        """What the cart holds."""
        return self._run(session, "view_cart", args)

    @tool
    async def place_order(self, args: NoArgs, session: Session) -> dict[str, Any]:
        """Order the cart."""
        return self._run(session, "place_order", args)

    @tool
    async def get_order(self, args: OrderArgs, session: Session) -> dict[str, Any]:
        """One order."""
        return self._run(session, "get_order", args)

    @tool
    async def list_orders(self, args: NoArgs, session: Session) -> dict[str, Any]:
        """Every order."""
        return self._run(session, "list_orders", args)

    @tool
    async def cancel_order(self, args: OrderArgs, session: Session) -> dict[str, Any]:
        """Cancel a placed order."""
        return self._run(session, "cancel_order", args)

    # ------------------------------------------------------------------ verification

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        assert isinstance(body, ToolUseVerifyRequest)
        meta = body.verifier_metadata
        row = {k: v for k, v in dump(body).items() if k not in VERDICT_KEYS}
        initial = _initial_state(row)
        final = session.state.get("store")
        if final is None and session.lost and meta.reference_calls is not None:
            raise HTTPException(
                409,
                "this rollout's session is gone (idle past session_ttl_s, or dropped past max_sessions / "
                "max_session_bytes): the store its tool calls changed is lost, so its outcome cannot be scored; "
                "run the rollout again",
            )
        if final is None:  # never seeded: no tool call can have run, so the store is as it started
            final = copy.deepcopy(initial)
        calls_log = session.state.get("calls", [])
        extras: dict[str, Any] = {
            "tool_calls_made": len(calls_log),
            "tool_errors": sum(bool(c["error"]) for c in calls_log),
        }
        if meta.reference_calls is not None:
            expected = _replay(initial, meta.reference_calls)
            diffs = state_diff(expected, final)
            reward = 0.0 if diffs else 1.0
            extras.update(verify_mode="outcome", state_diff=diffs)
            failure = ("wrong_outcome", "; ".join(diffs)) if diffs else None
        else:
            assert meta.expected_calls is not None
            wanted = [Call(c.name, normalise_arguments(c.arguments)) for c in meta.expected_calls]
            match = meta.match or self.config.default_match
            score = compare_calls(calls_from_output(body.response.output), wanted, match)
            reward = score.reward
            extras.update(
                verify_mode=f"arguments:{match}",
                calls_expected=score.expected,
                calls_made=score.made,
                calls_matched=score.matched,
                call_mismatches=score.reasons,
                extra_reads=score.extra_reads,
            )
            failure = ("wrong_calls", "; ".join(score.reasons)) if score.reasons else None
        fields = {**row, **extras, "reward": reward}
        if meta.user_holds is not None:
            fields["reward_components"] = {
                "outcome": reward,
                "asked_before_acting": asked_before_acting(body.response.output, meta.user_holds),
            }
        if failure is not None:
            fields["failure_kind"], fields["failure_reason"] = failure
        return VerifyResponse.model_validate(fields)


STORE_CHANGING = frozenset(name for name, spec in TOOLS.items() if spec.changes_state)


def _folded(text: str) -> str:
    return " ".join(text.casefold().split())


def asked_before_acting(output: list[Any], facts: list[str]) -> float:
    """1.0 when every fact was said in a user message of the output before its first store-changing call
    (or the conversation revealed them all and changed nothing), else 0.0. A fact is found in any case and
    spacing: an LLM user says "the picnic blanket" for the held "Picnic Blanket"."""
    missing = {_folded(f) for f in facts}
    for item in output:
        item = item if isinstance(item, dict) else dump(item)
        if item.get("type") == "function_call" and item.get("name") in STORE_CHANGING:
            return 0.0 if missing else 1.0
        if item.get("type", "message") == "message" and item.get("role") == "user":
            text = _folded(message_text(item))
            missing = {f for f in missing if f not in text}
    return 0.0 if missing else 1.0


def _replay(initial: dict[str, Any], calls: list[ToolCallSpec]) -> dict[str, Any]:
    """The state the reference calls lead to, from a fresh copy of the initial state.

    A reference call the store answers with an error (an unknown product or order, too little stock) is a task
    error (422): it changes nothing, so the expected state would be the store as it started and a rollout that
    did nothing would be paid 1.0."""
    state = copy.deepcopy(initial)
    for i, call in enumerate(calls, 1):
        arguments = normalise_arguments(call.arguments)
        if call.name not in TOOLS or arguments is None:
            raise HTTPException(422, f"verifier_metadata.reference_calls.{i}: unknown tool or bad arguments")
        try:
            result = apply_call(state, call.name, arguments)
        except ValidationError as e:
            raise HTTPException(
                422, f"verifier_metadata.reference_calls.{i} ({call.name}): {e.errors()[0]['msg']}"
            ) from None
        if "error" in result:
            raise HTTPException(
                422,
                f"verifier_metadata.reference_calls.{i} ({call.name}) fails on the task's store "
                f"({str(result['error'])[:200]}): the task is wrong",
            )
    return state
