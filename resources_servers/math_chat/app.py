"""The ``math_chat`` resources server: a math answer in a conversation is the reply to the user's last message.

The ``math`` server reads every assistant message of a response joined together, as NeMo Gym's
``math_with_judge`` does, so a conversation in which the assistant answered once, heard a correction
("Sorry, I meant 3 + 4.") and answered again hands math-verify two boxes, which it reads as the set
``{10, 7}``: never right. Here only the assistant text after the last user message in the response's
``output`` is checked (all of it when the user never spoke), with the math server's rules and settings
(``extraction``, the fast path, the verifier pool). The record keeps the whole conversation and says
which reply was scored (``scored_after_user_turns``: user messages in ``output`` before it).

``verifier_metadata.min_user_turns: k``: a conversation in which the user spoke fewer than ``k`` times
scores 0 (``failure_kind: too_few_user_turns``): a task whose answer only exists after the user's
message (a correction, a detail they hold) is never scored on a reply given before it, e.g. when a
reply cut off at ``max_output_tokens`` ended the conversation first.

A shaped component, for small models whose answers start far off: a row with
``verifier_metadata.near_scale: k`` (integer answers) gets ``reward_components`` ``{"correct": reward,
"near": max(0, 1 - |answer - expected| / k)}``, reported beside the reward and never folded into it
(train on it with ``grpo.reward_weights``). An answer that is not a plain integer (:func:`near`) is ``near`` 0.

Run it as ``env.<name>.server: resources_servers.math_chat.app:MathChatServer`` (training) or
``--env resources_servers.math_chat.app:MathChatServer`` (collect).
"""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException

from gym_bridge.records.schema import OutputMessage, VerifyRequest, item_dict
from gym_bridge.serving.server import Session
from resources_servers.math.app import MathServer, MathVerifyRequest, MathVerifyResponse, _answer
from resources_servers.math.fastpath import plain_rational


class MathChatVerifyResponse(MathVerifyResponse):
    """The math server's answer, plus which reply of the conversation it scored."""

    scored_after_user_turns: int = 0
    """User messages in the response's ``output`` before the scored reply (0: the first reply)."""


def near(extracted: str | None, expected: str, scale: int) -> float:
    """``1 - |extracted - expected| / scale``, at least 0; 0 unless both are plain integers.

    Plain as the fast path reads them (:func:`~resources_servers.math.fastpath.plain_rational`: ASCII
    digits, at most 200 characters), so near never pays for digits math-verify does not read (``٧``,
    ``７``: reward 0) nor reads a cut-off rendering, and it is exact: a 400-digit answer made the
    division overflow a float (a 500), a 5,000-digit one ``int()``'s digit limit.
    """
    answer = plain_rational(extracted) if extracted is not None else None
    gold = plain_rational(expected)
    if not isinstance(answer, int) or not isinstance(gold, int):
        return 0.0
    distance = abs(answer - gold)
    return 0.0 if distance >= scale else 1.0 - distance / scale


def _metadata_int(body: VerifyRequest, key: str, least: int) -> int | None:
    """``verifier_metadata[key]``, an integer of at least ``least``, or None; else a 422 naming it."""
    meta = getattr(body, "verifier_metadata", None)
    value = meta.get(key) if isinstance(meta, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise HTTPException(422, f"verifier_metadata.{key}: expected an integer >= {least}, got {value!r}")
    return value


def _is_user_message(item: Any) -> bool:
    if type(item) is OutputMessage:
        # Read in place, as its dump would say it (as assistant_text reads it): dumping every item of a long
        # conversation cost the event loop seconds.
        fields = item.model_fields_set
        return "role" in fields and item.role == "user" and ("type" not in fields or item.type == "message")
    d = item_dict(item)
    return d is not None and d.get("type", "message") == "message" and d.get("role") == "user"


class MathChatServer(MathServer):
    """Math answers checked on the assistant's reply to the user's last message."""

    name = "math_chat"

    async def verify(self, body: VerifyRequest, session: Session) -> MathChatVerifyResponse:
        assert isinstance(body, MathVerifyRequest)
        scale = _metadata_int(body, "near_scale", 1)
        min_user_turns = _metadata_int(body, "min_user_turns", 0) or 0
        output = body.response.output
        users = [i for i, item in enumerate(output) if _is_user_message(item)]
        if len(users) < min_user_turns:
            reason = f"the user spoke {len(users)} times; the answer is due after message {min_user_turns}"
            verdict = _answer(body, failure=("too_few_user_turns", reason))
        else:
            last_reply = output[users[-1] + 1 :] if users else output
            tail = body.model_copy(update={"response": body.response.model_copy(update={"output": last_reply})})
            verdict = await super().verify(tail, session)
        # The verdict's own values (its models as they are: not dumped and validated again, which cost seconds
        # of the event loop for a long conversation), the whole conversation in place of the reply.
        record = {name: value for name, value in verdict if name in verdict.model_fields_set}
        record.update(response=body.response, scored_after_user_turns=len(users))
        if scale is not None:
            closeness = near(verdict.extracted_answer, verdict.expected_answer, scale)
            record["reward_components"] = {"correct": verdict.reward, "near": closeness}
        return MathChatVerifyResponse.model_validate(record)
