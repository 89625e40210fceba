"""The record shapes the viewer reads, and what it shows of each: summary columns and readable turns.

Three shapes, told apart by their keys (:func:`record_kind`):

* ``nemo_gym``: a rollout as ``gym-bridge collect`` and NeMo Gym write it (``responses_create_params``,
  ``response.output`` items, ``reward``, ``_ng_task_index``...). Token ids and log-probs, when the policy
  returned them, sit on output items (``prompt_token_ids``/``generation_token_ids``/``generation_log_probs``).
* ``grpo`` / ``chat``: ``gym-bridge transform grpo`` rows (``{"input","output","reward"}``, or ``messages``).
* ``nemo_rl_tokens``: a line of NeMo RL's ``train_data_step{N}.jsonl`` (``token_ids``, ``token_loss_mask``,
  ``generation_logprobs``, ``prev_logprobs``, ``advantages``, ``rewards``, ``content``), whose text is
  empty for NeMo Gym rollouts; it is decoded with a tokenizer when the viewer has one.

The summary (:func:`summarize`) is what the index keeps per line; everything else is read on demand.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec

from gym_bridge.records.schema import content_text, input_items

__all__ = [
    "DecodeError",
    "RecordSummary",
    "TURN_TEXT_LIMIT",
    "Turn",
    "answer_text",
    "clip_middle",
    "clip_turns",
    "display_json",
    "prompt_text",
    "record_kind",
    "stored_advantage",
    "summarize",
    "turns",
]


def record_kind(rec: dict[str, Any]) -> str:
    """``nemo_gym``, ``nemo_rl_tokens``, ``chat``, ``grpo`` or ``unknown``."""
    if "responses_create_params" in rec or "response" in rec:
        return "nemo_gym"
    if "token_ids" in rec and ("token_loss_mask" in rec or "generation_logprobs" in rec):
        return "nemo_rl_tokens"
    if isinstance(rec.get("messages"), list):
        return "chat"
    if "input" in rec and "output" in rec:
        return "grpo"
    return "unknown"


class RecordSummary(NamedTuple):
    """The per-line columns the index keeps (hashes stand in for strings: equality is all it needs)."""

    group_key: int
    """Rollouts of one task share it: ``_gb_group`` (sample logs), else ``_ng_task_index``, else the prompt
    (as :mod:`gym_bridge.records.metrics` groups)."""
    prompt_key: int
    """Hash of the prompt alone, to match a task across two runs."""
    task_index: int
    """``_ng_task_index`` (or -1)."""
    reward: float
    """NaN when the record has none."""
    failure_kind: str | None
    env: str
    answer: str | None
    """``extracted_answer`` as the verifier reported it (majority voting uses it, as metrics does)."""
    input_tokens: int
    output_tokens: int


def _float(value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return math.nan


def _count(value: Any) -> int:
    number = _float(value)
    return int(number) if math.isfinite(number) and number > 0 else 0


def _prompt_token_ids(rec: dict[str, Any]) -> list[int]:
    ids = rec.get("token_ids") if isinstance(rec.get("token_ids"), list) else []
    mask = rec.get("token_loss_mask") if isinstance(rec.get("token_loss_mask"), list) else []
    for i, m in enumerate(mask):
        if m:
            return list(ids[:i])
    lengths = rec.get("input_lengths")
    return list(ids[:lengths]) if isinstance(lengths, int) else list(ids)


def _list(value: Any) -> list[Any]:
    """A field the protocol makes a list, as a list whatever a writer put there (None: empty)."""
    if isinstance(value, list):
        return value
    return [] if value is None else [value]


def display_json(value: Any, indent: int | None = None) -> str:
    """JSON text of a decoded value; a note instead where it nests past what the encoder recurses into."""
    try:
        return json.dumps(value, indent=indent, ensure_ascii=False)
    except RecursionError:
        return "(nested too deeply to draw here: open the raw file line)"


def _text(content: Any) -> str:
    """:func:`content_text` of any JSON value: a string, a list of parts, else the value as JSON.

    Every field of a record is written by someone the viewer cannot trust (a policy, a tool's web page,
    a broken writer): a wrong type is shown as it is rather than failing the page."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    return content_text(content) if isinstance(content, list) else display_json(content)


def _input_items(params: dict[str, Any]) -> list[Any]:
    """The request's input items (a bare string is one user message, any other value one item)."""
    raw = params.get("input")
    return input_items(params) if raw is None or isinstance(raw, str) else _list(raw)


def _output_items(rec: dict[str, Any]) -> list[dict[str, Any]]:
    response = rec.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    return [item for item in output if isinstance(item, dict)] if isinstance(output, list) else []


class _Params(msgspec.Struct):
    input: msgspec.Raw = msgspec.Raw(b"null")


class _OutputItem(msgspec.Struct):
    generation_token_ids: Any = None


class _Usage(msgspec.Struct):
    input_tokens: Any = None
    output_tokens: Any = None


class _Response(msgspec.Struct):
    usage: _Usage | None = None
    output: msgspec.Raw = msgspec.Raw(b"[]")
    """Kept raw: decoded (by :data:`_OUTPUT_DECODER`) only when ``usage`` gives no output token count."""


class _Line(msgspec.Struct):
    """The fields :func:`summarize` needs; the decoder skips the rest of a line without building it."""

    responses_create_params: _Params | None | msgspec.UnsetType = msgspec.UNSET
    response: _Response | None | msgspec.UnsetType = msgspec.UNSET
    reward: Any = None
    rewards: Any = None
    failure_kind: Any = None
    extracted_answer: Any = None
    agent_ref: Any = None
    env: Any = None
    task_name: Any = None
    dataset_names: Any = None
    _ng_task_index: Any = None
    _gb_group: Any = None
    token_ids: Any = None
    token_loss_mask: Any = None
    generation_logprobs: Any = None
    input_lengths: Any = None
    input: msgspec.Raw = msgspec.Raw(b"")
    output: msgspec.Raw = msgspec.Raw(b"")
    messages: Any = None


_LINE_DECODER = msgspec.json.Decoder(_Line)
_OUTPUT_DECODER = msgspec.json.Decoder(list[_OutputItem | list[Any] | str | int | float | bool | None])
"""Output items; NeMo Gym's files hold some that are not objects (aviary), which pass through."""
DecodeError = msgspec.DecodeError
"""Raised by :func:`summarize` for a line that is not a JSON object of a known shape (says where)."""


def _generated_tokens(output: msgspec.Raw) -> int:
    """Generated token ids over a response's output items (0 when ``output`` is not a list)."""
    try:
        items = _OUTPUT_DECODER.decode(output)
    except msgspec.DecodeError:
        return 0
    return sum(
        len(i.generation_token_ids)
        for i in items
        if i.__class__ is _OutputItem and isinstance(i.generation_token_ids, list)
    )


def _line_kind(line: _Line) -> str:
    """:func:`record_kind` of a decoded summary line."""
    if line.responses_create_params is not msgspec.UNSET or line.response is not msgspec.UNSET:
        return "nemo_gym"
    if line.token_ids is not None and (line.token_loss_mask is not None or line.generation_logprobs is not None):
        return "nemo_rl_tokens"
    if isinstance(line.messages, list):
        return "chat"
    if len(line.input) and len(line.output):
        return "grpo"
    return "unknown"


def _prompt_key(line: _Line, kind: str) -> int:
    if kind == "nemo_gym":
        params = line.responses_create_params
        return hash(bytes(params.input) if isinstance(params, _Params) else b"")
    if kind == "grpo":
        return hash(bytes(line.input))
    if kind == "chat":
        msgs = [m for m in line.messages if not (isinstance(m, dict) and m.get("role") == "assistant")]
        return hash(json.dumps(msgs[:1], sort_keys=True))
    if kind == "nemo_rl_tokens":
        fields = {"token_ids": line.token_ids, "token_loss_mask": line.token_loss_mask,
                  "input_lengths": line.input_lengths}
        return hash(tuple(_prompt_token_ids(fields)))
    return 0


def summarize(raw: bytes) -> RecordSummary:
    """The index columns of one JSONL line; :data:`DecodeError` (a ``ValueError``) for a bad line.

    Decodes only the fields it needs (msgspec), a few times faster than ``json.loads`` of the whole
    line, which is most of the cost of opening a large file. Prompts are compared as written (the raw
    JSON of ``responses_create_params.input``), which is how one collector writes one prompt.
    """
    line = _LINE_DECODER.decode(raw)
    kind = _line_kind(line)
    prompt_key = _prompt_key(line, kind)
    task_index = line._ng_task_index
    if task_index.__class__ is not int or task_index < 0:
        task_index = -1
    if line._gb_group.__class__ is int:  # a training step's sample log: its GRPO group
        group_key = hash(("group", line._gb_group))
    else:
        group_key = hash(("task", task_index)) if task_index >= 0 else prompt_key
    reward = _float(line.rewards if kind == "nemo_rl_tokens" else line.reward)
    failure = line.failure_kind
    agent = line.agent_ref
    if agent.__class__ is dict and agent.get("name").__class__ is str:
        env = agent["name"]
    else:
        env = next((v for v in (line.env, line.task_name, line.dataset_names) if isinstance(v, str)), "")
    input_tokens = output_tokens = 0
    response = line.response
    if response.__class__ is _Response:
        usage = response.usage  # type: ignore[union-attr]
        if usage is not None:
            input_tokens, output_tokens = _count(usage.input_tokens), _count(usage.output_tokens)
        if not output_tokens:
            output_tokens = _generated_tokens(response.output)  # type: ignore[union-attr]
    elif kind == "nemo_rl_tokens" and isinstance(line.token_loss_mask, list):
        output_tokens = sum(1 for m in line.token_loss_mask if m)
        input_tokens = len(line.token_loss_mask) - output_tokens
    answer = line.extracted_answer
    return RecordSummary(
        group_key,
        prompt_key,
        task_index,
        reward,
        failure if failure.__class__ is str and failure else None,
        env,
        None if answer is None else answer if answer.__class__ is str else str(answer),
        input_tokens,
        output_tokens,
    )


def stored_advantage(rec: dict[str, Any]) -> float | None:
    """The advantage the trainer used, when the record carries it (our sample log, NeMo RL's lines)."""
    if isinstance(rec.get("advantage"), (int, float)):
        return float(rec["advantage"])
    values = rec.get("advantages")
    mask = rec.get("token_loss_mask") or []
    if isinstance(values, list):
        for value, m in zip(values, mask or [1] * len(values), strict=False):
            if m and isinstance(value, (int, float)):
                return float(value)
    return None


def prompt_text(rec: dict[str, Any], decode: Any = None) -> str:
    """The task's prompt as text: the last user message (or the decoded prompt tokens)."""
    kind = record_kind(rec)
    if kind == "nemo_gym":
        params = rec.get("responses_create_params")
        if not isinstance(params, dict):
            return ""
        for item in reversed(_input_items(params)):
            if isinstance(item, dict) and item.get("role") == "user":
                return _text(item.get("content"))
        return ""
    if kind == "grpo":
        raw = rec.get("input")
        return raw if isinstance(raw, str) else display_json(raw)
    if kind == "chat":
        for m in rec["messages"]:
            if isinstance(m, dict) and m.get("role") == "user":
                return _text(m.get("content"))
        return ""
    if kind == "nemo_rl_tokens":
        text = _content(rec)
        if text:
            return text
        return decode(_prompt_token_ids(rec)) if decode is not None else ""
    return ""


def _content(rec: dict[str, Any]) -> str:
    content = rec.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(c if isinstance(c, str) else _text(c.get("content")) if isinstance(c, dict) else ""
                       for c in content)
    return ""


def answer_text(rec: dict[str, Any]) -> str:
    """What the model answered: the last assistant text (the verifier's extraction is shown beside it)."""
    kind = record_kind(rec)
    if kind == "nemo_gym":
        texts = [_text(i.get("content")) for i in _output_items(rec) if i.get("type") == "message"]
        return texts[-1] if texts else ""
    if kind == "grpo":
        out = rec.get("output")
        return out if isinstance(out, str) else display_json(out)
    if kind == "chat":
        texts = [_text(m.get("content")) for m in rec["messages"]
                 if isinstance(m, dict) and m.get("role") == "assistant"]
        return texts[-1] if texts else ""
    return ""


@dataclass
class Turn:
    """One readable piece of a trajectory."""

    kind: str
    """system, user, assistant, function_call, function_call_output, reasoning, tool, other."""
    title: str
    text: str
    code: bool = False
    """Pre-formatted (JSON arguments and outputs) rather than prose."""


def _pretty_json(text: Any) -> tuple[str, bool]:
    if isinstance(text, str):
        try:
            return json.dumps(json.loads(text), indent=2, ensure_ascii=False), True
        except (ValueError, TypeError, RecursionError):  # not JSON, or nested past the parser: as written
            return text, False
    return display_json(text, indent=2), True


def _item_turns(item: Any, default_role: str) -> list[Turn]:
    if not isinstance(item, dict):
        return [Turn("other", "item", display_json(item), True)]
    kind = item.get("type") or ("message" if "role" in item else "other")
    if kind == "message":
        role = str(item.get("role") or default_role)
        return [Turn(role if role in ("system", "developer", "user", "assistant") else "other", role,
                     _text(item.get("content")))]
    if kind == "function_call":
        args, is_json = _pretty_json(item.get("arguments", ""))
        return [Turn("function_call", f"call {item.get('name', '?')}", args, is_json)]
    if kind == "function_call_output":
        output = item.get("output")
        text, is_json = _pretty_json(output if isinstance(output, str) else output)
        return [Turn("function_call_output", f"output of {item.get('call_id', '?')}", text, is_json)]
    if kind == "reasoning":
        parts = [_text([p]) for p in _list(item.get("summary")) + _list(item.get("content"))]
        text = "\n".join(p for p in parts if p) or ("(encrypted)" if item.get("encrypted_content") else "")
        return [Turn("reasoning", "reasoning", text)]
    return [Turn("other", str(kind), display_json(item, indent=2), True)]


def _chat_turns(messages: list[Any]) -> list[Turn]:
    out: list[Turn] = []
    for m in messages:
        if not isinstance(m, dict):
            out.append(Turn("other", "item", display_json(m), True))
            continue
        role = str(m.get("role") or "other")
        text = _text(m.get("content"))
        if m.get("reasoning_content"):
            out.append(Turn("reasoning", "reasoning", _text(m["reasoning_content"])))
        if text or not m.get("tool_calls"):
            kind = role if role in ("system", "developer", "user", "assistant", "tool") else "other"
            title = role if role != "tool" else f"tool output {m.get('tool_call_id', '')}".strip()
            out.append(Turn("function_call_output" if role == "tool" else kind, title, text))
        for call in _list(m.get("tool_calls")):
            fn = call.get("function") if isinstance(call, dict) else None
            fn = fn if isinstance(fn, dict) else {}
            args, is_json = _pretty_json(fn.get("arguments", ""))
            out.append(Turn("function_call", f"call {fn.get('name', '?')}", args, is_json))
    return out


def turns(rec: dict[str, Any], decode: Any = None) -> list[Turn]:
    """The whole trajectory as readable turns: prompt, then every output item in order."""
    kind = record_kind(rec)
    if kind == "nemo_gym":
        params = rec.get("responses_create_params")
        out: list[Turn] = []
        if isinstance(params, dict):
            if isinstance(params.get("instructions"), str):
                out.append(Turn("system", "instructions", params["instructions"]))
            for item in _input_items(params):
                out.extend(_item_turns(item, "user"))
        for item in _output_items(rec):
            out.extend(_item_turns(item, "assistant"))
        return out
    if kind == "grpo":
        return [Turn("user", "input", prompt_text(rec)), Turn("assistant", "output", answer_text(rec))]
    if kind == "chat":
        return _chat_turns(rec["messages"])
    if kind == "nemo_rl_tokens":
        text = _content(rec)
        if text:
            return [Turn("other", "content", text)]
        if decode is None:
            return [Turn("other", "token ids only", "this record has token ids and no text; "
                         "start the viewer with --tokenizer tiny|DIR to decode it")]
        ids = rec.get("token_ids") or []
        prompt = _prompt_token_ids(rec)
        return [Turn("user", "prompt (decoded)", decode(prompt)),
                Turn("assistant", "generation (decoded)", decode(ids[len(prompt):]))]
    return [Turn("other", "record", display_json(rec, indent=2)[:20000], True)]


TURN_TEXT_LIMIT = 100_000
"""Characters of one turn, prompt or response a page draws; the middle of a longer one is left out."""


def clip_middle(text: str, limit: int = TURN_TEXT_LIMIT) -> str:
    """``text`` cut to about ``limit`` characters by leaving out its middle, and saying how much.

    The start and the end stay (a final answer is at the end); a page that drew a tool's whole web page
    or a run-away generation would be tens of megabytes per rollout."""
    if len(text) <= limit:
        return text
    head = max(limit // 2, 1)
    tail = max(limit - head, 1)
    hidden = len(text) - head - tail
    return (f"{text[:head]}\n[… {hidden:,} characters not shown here: the raw file line has them all …]\n"
            f"{text[-tail:]}")


def clip_turns(items: list[Turn], turn_limit: int, total_limit: int) -> list[Turn]:
    """Each turn's text to at most ``turn_limit`` characters and, when together they are longer than
    ``total_limit``, to an equal share of it (never under 2,000), by :func:`clip_middle`."""
    if sum(len(t.text) for t in items) > total_limit:
        turn_limit = min(turn_limit, max(total_limit // max(len(items), 1), 2000))
    for t in items:
        t.text = clip_middle(t.text, turn_limit)
    return items
