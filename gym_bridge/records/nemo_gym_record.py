"""A rollout record as NeMo Gym 0.7.0 writes it: its names for the env, and its full record shape.

Names. NeMo Gym's config for an environment ``<name>`` (ours: ``resources_servers/<name>/configs/<name>.yaml``)
has the resources server ``<name>``, the agent ``<name>_simple_agent`` and the environment server
``<name>_environment_server``; a record is stamped ``agent_ref.name: <name>_simple_agent`` and
``_ng_environment_server: <name>_environment_server``, and NeMo Gym's ``gym eval aggregate`` /
``gym eval reverify`` find the servers by those names. ``collect`` names an env by its ``--env`` key
(``--env math`` is ``math``; a bare URL is ``default``); a row's own ``agent_ref`` is kept, and the
environment server is named after it as NeMo Gym names it (``legacy_environment_server_name``).

Shape. NeMo Gym writes a record as its pydantic models dump it: every declared field in declaration
order with its default (``parallel_tool_calls: true``, ``tools: []``, ``input[i].type: "message"``,
``phase: null``, ``logprobs: null``, ...), then the other fields in the order the env answered them.
:func:`nemo_gym_record` writes that from the table read off NeMo Gym's models
(:mod:`gym_bridge.records.nemo_gym_shapes`). Where NeMo Gym would drop or refuse a field its model does not
declare (an unknown input item key, a request field such as ``seed``), it is kept here, after the
declared ones: a record never loses what the run did.
"""

from __future__ import annotations

from typing import Any

from gym_bridge.records.nemo_gym_shapes import (
    NEMO_GYM_VERSION,
    REQUIRED,
    SHAPES,
    TRAINING_BASES,
    TRAINING_FIELDS,
)

__all__ = [
    "AGENT_SUFFIX",
    "DEFAULT_ENV_NAME",
    "ENVIRONMENT_SERVER_SUFFIX",
    "NEMO_GYM_VERSION",
    "agent_name_for",
    "environment_server_for",
    "nemo_gym_record",
    "request_params",
    "response_object",
]

AGENT_SUFFIX = "_simple_agent"
ENVIRONMENT_SERVER_SUFFIX = "_environment_server"
DEFAULT_ENV_NAME = "default"
"""The name of an env given as a bare URL (``--env http://...``; name it with ``--env NAME=URL``)."""
_AGENT_TYPE = "simple_agent"
_TOKEN_FIELDS = frozenset(key for key, default, _ in TRAINING_FIELDS if default is REQUIRED)
"""The token fields an item needs to be written as its ``*ForTraining`` variant (NeMo Gym's routing)."""
_TRAINABLE = frozenset(TRAINING_BASES.values())
_SIMPLE_ROLES = frozenset({"user", "system", "developer"})
_STATUSES = frozenset({"in_progress", "completed", "incomplete"})
_OUTPUT_PARTS = frozenset({"output_text", "refusal"})


def agent_name_for(env: str) -> str:
    """NeMo Gym's agent name for the env named ``env`` (a URL: the ``default`` env)."""
    return f"{DEFAULT_ENV_NAME if '://' in env else env}{AGENT_SUFFIX}"


def environment_server_for(agent: str) -> str:
    """NeMo Gym's environment server name for an agent (``global_config.legacy_environment_server_name``):
    ``math_simple_agent`` -> ``math_environment_server``; else a trailing ``_agent`` is dropped."""
    stem = agent.removesuffix(f"_{_AGENT_TYPE}").removesuffix(_AGENT_TYPE).rstrip("_")
    if stem == agent:
        stem = agent.removesuffix("_agent").rstrip("_")
    return f"{stem or _AGENT_TYPE}{ENVIRONMENT_SERVER_SUFFIX}"


# --------------------------------------------------------------------------- shapes


def _shaped(obj: dict[str, Any], tag: str) -> dict[str, Any]:
    """``obj`` with the declared fields of shape ``tag`` first, in order, defaults filled; the rest after."""
    out: dict[str, Any] = {}
    for key, default, is_float in SHAPES[tag]:
        if key in obj:
            value = obj[key]
            if is_float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)  # pydantic writes a float field's 1 as 1.0
        elif default is REQUIRED:
            continue  # NeMo Gym would refuse the object; nothing to invent
        else:
            value = list(default) if isinstance(default, list) else default
        out[key] = value
    for key, value in obj.items():
        out.setdefault(key, value)
    return out


def _first_part_type(content: Any) -> Any:
    if not isinstance(content, list) or not content or not isinstance(content[0], dict):
        return None
    return content[0].get("type") or ("refusal" if "refusal" in content[0] else None)


def _message_tag(item: dict[str, Any]) -> str:
    """NeMo Gym's ``_discriminate_message_item``."""
    content = item.get("content")
    if item.get("role") in _SIMPLE_ROLES:
        return "input_message" if isinstance(content, list) and item.get("status") in _STATUSES else "easy_message"
    if isinstance(content, list):
        if content and _first_part_type(content) in _OUTPUT_PARTS:
            return "output_message"
        if not content and isinstance(item.get("id"), str):
            return "output_message"
    return "easy_message"


def _untyped_tag(item: dict[str, Any]) -> str | None:
    """NeMo Gym's ``_discriminate_untyped_input_item``, for the item kinds a record carries."""
    content = item.get("content")
    if item.get("role") in (*_SIMPLE_ROLES, "assistant") and isinstance(content, str | list):
        tag = _message_tag(item)
        if tag == "output_message":
            return tag if isinstance(item.get("id"), str) else None
        return tag if _first_part_type(content) not in _OUTPUT_PARTS else None
    if "role" not in item and isinstance(item.get("id"), str) and isinstance(content, list):
        return "output_message"
    if "arguments" in item and "name" in item and "call_id" in item:
        return "function_call"
    if isinstance(item.get("call_id"), str) and "output" in item:
        return "function_call_output"
    if isinstance(item.get("id"), str) and isinstance(item.get("summary"), list):
        return "reasoning"
    return None


def _item(item: Any, *, output: bool) -> Any:
    """One input (``output=False``) or output item in NeMo Gym's shape; kinds it has no table for pass."""
    if not isinstance(item, dict):
        return item
    kind = item.get("type")
    if kind == "message":
        tag: str | None = _message_tag(item)
    elif kind == "function_call_output" and output:
        full = isinstance(item.get("id"), str) and item.get("status") in _STATUSES
        tag = "function_call_output" if full else "function_call_output_input"
    elif kind == "function_call_output":
        tag = "function_call_output_input"
    elif kind in ("function_call", "reasoning"):
        tag = kind
    elif kind is None and not output:
        tag = _untyped_tag(item)
        tag = "function_call_output_input" if tag == "function_call_output" else tag
    else:
        tag = None
    if tag is None:
        return item
    if tag in _TRAINABLE and _TOKEN_FIELDS <= set(item):
        tag += "__training"
    shaped = _shaped(item, tag)
    if tag.startswith("output_message") and isinstance(shaped.get("content"), list):
        shaped["content"] = [_part(part) for part in shaped["content"]]
    if tag.startswith("reasoning") and isinstance(shaped.get("summary"), list):
        shaped["summary"] = [_shaped(p, "summary_text") if isinstance(p, dict) else p for p in shaped["summary"]]
    return shaped


def _part(part: Any) -> Any:
    if isinstance(part, dict) and part.get("type") in _OUTPUT_PARTS:
        return _shaped(part, part["type"])
    return part


def _shape_tools(obj: dict[str, Any], tag: str) -> None:
    """``obj``'s function tools in NeMo Gym's key order (a request's as given, a response's with defaults)."""
    if isinstance(obj.get("tools"), list):
        obj["tools"] = [
            _shaped(tool, tag) if isinstance(tool, dict) and tool.get("type") == "function" else tool
            for tool in obj["tools"]
        ]


def request_params(params: dict[str, Any]) -> dict[str, Any]:
    """``responses_create_params`` as NeMo Gym writes it (``NeMoGymResponseCreateParamsNonStreaming``)."""
    shaped = _shaped(params, "responses_create_params")
    if isinstance(shaped.get("input"), list):
        shaped["input"] = [_item(item, output=False) for item in shaped["input"]]
    _shape_tools(shaped, "function_tool_param")
    return shaped


def response_object(response: dict[str, Any]) -> dict[str, Any]:
    """A model ``response`` as NeMo Gym writes it (``NeMoGymResponse``: its items and ``usage`` too)."""
    shaped = _shaped(response, "response")
    if isinstance(shaped.get("output"), list):
        shaped["output"] = [_item(item, output=True) for item in shaped["output"]]
    _shape_tools(shaped, "function_tool")
    usage = shaped.get("usage")
    if isinstance(usage, dict):
        usage = _shaped(usage, "usage")
        for key in ("input_tokens_details", "output_tokens_details"):
            if isinstance(usage.get(key), dict):
                usage[key] = _shaped(usage[key], key)
        shaped["usage"] = usage
    return shaped


def nemo_gym_record(
    answer: dict[str, Any],
    *,
    stamps: dict[str, Any],
    model: Any = None,
) -> dict[str, Any]:
    """The rollout record NeMo Gym writes from an env's ``/verify`` ``answer``.

    As NeMo Gym builds it: the answer read as its ``BaseVerifyResponse`` (declared fields first, the
    env's own after, in the env's order), then ``stamps`` set on it in order (``_ng_task_index``,
    ``_ng_rollout_index``, ``agent_ref``, ``_ng_environment_server``, ``_ng_result_type``): a key the
    answer echoed keeps its place, a new one goes last. ``model``: the request's ``model`` as the task
    row gave it (NeMo Gym's model server, not the record, names the model it serves: ``null``).
    """
    record = _shaped(answer, "verify_response")
    params = record.get("responses_create_params")
    if isinstance(params, dict):
        record["responses_create_params"] = request_params({**params, "model": model})
    if isinstance(record.get("response"), dict):
        record["response"] = response_object(record["response"])
    for key, value in stamps.items():
        record[key] = value
    return record
