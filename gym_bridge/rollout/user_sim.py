"""The user's side of a multi-turn conversation: who speaks after an assistant turn with no tool call.

:func:`gym_bridge.rollout.agent.run_rollout` asks :func:`user_for` whether a row has a user to talk with; if it
does, after every assistant turn that ends without a function call the user answers with one message
(appended to the rollout's output as ``{"role": "user", "type": "message", "content": ...}``, the shape
NeMo Gym's ``conversational_tool_use_simulation`` records carry), or ends the conversation.

Two users:

* :class:`ScriptedUser`, from the task row's ``user_script`` (deterministic)::

      "user_script": {"reveal": [{"when": ["order number", "which order"], "say": "It is O4398."}],
                      "max_turns": 4}

  After each assistant turn, the first ``reveal`` entry not yet said whose ``when`` phrases include one
  found (case-insensitively) in the assistant's last message is said; when none matches the user ends the
  conversation. So information the user holds comes only when the assistant asks for it.
* :class:`LLMUser`, any OpenAI-compatible Responses endpoint (the embedded policy server included),
  with its own ``responses_create_params`` (NeMo Gym's ``user_responses_create_params``). It plays rows that
  carry ``user_instructions`` (ours), ``customer_scenario`` (NeMo Gym's) or a ``user_script`` (its facts
  become the instructions). It sees the conversation with the roles swapped (the assistant's messages as
  ``user`` input, its own as ``assistant``), without tool calls; a reply holding ``###STOP###`` (NeMo Gym's
  ``TRAJECTORY_COMPLETE_INDICATOR``) or an empty one ends the conversation.

Either way the conversation also ends at ``max_user_turns`` user messages, or once the policy's context
(the last model call's input + output tokens) reaches ``max_conversation_tokens`` (:class:`UserSimConfig`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gym_bridge.records.schema import content_text, input_items
from gym_bridge.serving.retry import Client, RetryPolicy, post_json

__all__ = [
    "USER_STOP",
    "LLMUser",
    "ScriptedUser",
    "User",
    "UserScript",
    "UserSimConfig",
    "message_text",
    "user_for",
    "user_message",
]

USER_STOP = "###STOP###"
"""What an LLM user writes to end the conversation (NeMo Gym's conversational simulation uses the same)."""

DEFAULT_USER_PROMPT = (
    "You are a customer talking with a store's assistant. Follow your instructions below. Answer the "
    "assistant's questions briefly, giving a piece of information only when the assistant asks for it. "
    f"When your request is done, or the assistant cannot help, reply with only {USER_STOP}."
)


class Reveal(BaseModel):
    """One thing a scripted user says, when the assistant's message contains one of ``when``."""

    model_config = ConfigDict(extra="forbid")

    when: list[str] = Field(min_length=1)
    """Phrases (matched case-insensitively as substrings of the assistant's last message)."""
    say: str = Field(min_length=1)


class UserScript(BaseModel):
    """A row's ``user_script``: what a scripted user reveals when, and how many turns it talks at most."""

    model_config = ConfigDict(extra="forbid")

    reveal: list[Reveal] = Field(default_factory=list)
    max_turns: int | None = Field(None, ge=0)
    """Most user messages in this conversation (overrides :attr:`UserSimConfig.max_user_turns` when lower)."""


@dataclass(frozen=True)
class UserSimConfig:
    """How the user side of a conversation runs (``AgentConfig.user``)."""

    model_url: str | None = None
    """An LLM user's OpenAI-compatible base URL (``.../v1``); None: rows with a ``user_script`` get a
    scripted user, other rows none."""
    responses_create_params: dict[str, Any] = field(default_factory=dict)
    """The LLM user's request settings (``model``, ``temperature``, ``max_output_tokens``, ...), NeMo Gym's
    ``user_responses_create_params``."""
    headers: dict[str, str] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    prompt: str = DEFAULT_USER_PROMPT
    """The LLM user's system prompt; the row's instructions follow it."""
    max_user_turns: int = 8
    """Most user messages after the task prompt; then the conversation ends (at the next turn without calls)."""
    max_conversation_tokens: int | None = None
    """End the conversation once the policy's last call used this many tokens (input + output); None: no cap."""


def message_text(item: dict[str, Any]) -> str:
    """The text of a message item (a string ``content`` or its text parts)."""
    return content_text(item.get("content"))


def user_message(text: str) -> dict[str, Any]:
    """A user turn as an output item, shaped as NeMo Gym's conversational records have it."""
    return {"content": text, "role": "user", "type": "message"}


def _last_assistant_text(outputs: list[dict[str, Any]]) -> str:
    for item in reversed(outputs):
        if item.get("type") == "message" and item.get("role") == "assistant":
            return message_text(item)
    return ""


class User(Protocol):
    max_turns: int | None

    async def reply(self, client: Client, outputs: list[dict[str, Any]]) -> str | None:
        """The user's next message after ``outputs`` (the rollout's output so far), or None to end."""
        ...


class ScriptedUser:
    """Says each ``reveal`` entry once, when asked for it; ends the conversation when nothing is asked."""

    def __init__(self, script: UserScript) -> None:
        self.script = script
        self.max_turns = script.max_turns

    async def reply(self, client: Client, outputs: list[dict[str, Any]]) -> str | None:
        said = {message_text(i) for i in outputs if i.get("type") == "message" and i.get("role") == "user"}
        asked = _last_assistant_text(outputs).lower()
        for entry in self.script.reveal:
            if entry.say not in said and any(phrase.lower() in asked for phrase in entry.when):
                return entry.say
        return None


def _instructions(row: dict[str, Any]) -> str | None:
    """What the LLM user is told about itself, from the row; None: the row has no user to play."""
    if isinstance(row.get("user_instructions"), str):
        return row["user_instructions"]
    if row.get("customer_scenario") is not None:
        return json.dumps(row["customer_scenario"], indent=1, sort_keys=True)
    script = row.get("user_script")
    if isinstance(script, dict):
        facts = [str(r.get("say")) for r in script.get("reveal") or [] if isinstance(r, dict)]
        return "You know these facts; give each only when asked for it:\n" + "\n".join(f"- {f}" for f in facts)
    return None


def _check_response(data: Any) -> str | None:
    if not isinstance(data, dict) or not isinstance(data.get("output"), list):
        return "expected a Responses object with an 'output' list"
    return None


class LLMUser:
    """A user played by a model behind an OpenAI-compatible Responses endpoint."""

    def __init__(self, config: UserSimConfig, row: dict[str, Any], instructions: str) -> None:
        assert config.model_url is not None
        self.config = config
        self.url = config.model_url.rstrip("/") + "/responses"
        self.system = f"{config.prompt}\n\n{instructions}"
        self.opening = [
            i for i in input_items(row.get("responses_create_params") or {})
            if isinstance(i, dict) and i.get("role") == "user"
        ]
        script = row.get("user_script")
        turns = script.get("max_turns") if isinstance(script, dict) else None
        self.max_turns = turns if isinstance(turns, int) and not isinstance(turns, bool) and turns >= 0 else None
        """A row's ``user_script.max_turns`` bounds the LLM user's turns too."""
        self.calls = 0
        """Requests made to the user model (for tests and metrics)."""

    def _conversation(self, outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation as the user model sees it: roles swapped, tool traffic left out."""
        swap = {"user": "assistant", "assistant": "user"}
        turns = [{"role": "system", "content": self.system, "type": "message"}]
        for item in [*self.opening, *outputs]:
            role = item.get("role")
            if item.get("type", "message") == "message" and role in swap and (text := message_text(item)):
                turns.append({"role": swap[role], "content": text, "type": "message"})
        return turns

    async def reply(self, client: Client, outputs: list[dict[str, Any]]) -> str | None:
        request = {**self.config.responses_create_params, "input": self._conversation(outputs)}
        request.pop("tools", None)
        answer = await post_json(
            client, self.url, request, target="model", policy=self.config.retry,
            headers=self.config.headers, validate=_check_response,
        )  # fmt: skip
        self.calls += 1
        text = "".join(
            message_text(i) for i in answer.data["output"] if isinstance(i, dict) and i.get("type") == "message"
        ).strip()
        if not text or USER_STOP in text:
            return None
        return text


def user_for(row: dict[str, Any], config: UserSimConfig | None) -> User | None:
    """The user of this row's conversation, or None (a single-turn task).

    An LLM user (``config.model_url`` set) plays every row with instructions for one; otherwise a row's
    ``user_script`` makes a scripted user. A malformed ``user_script`` raises ``ValueError`` naming it.
    """
    if config is not None and config.model_url and (instructions := _instructions(row)) is not None:
        return LLMUser(config, row, instructions)
    raw = row.get("user_script")
    if raw is None:
        return None
    try:
        return ScriptedUser(UserScript.model_validate(raw))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ValueError(f"user_script{'.' + where if where else ''}: {first['msg']}") from None
