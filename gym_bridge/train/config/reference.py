"""The config reference page, written from the config classes themselves: every key, its type, its
default and its docstring, so the documentation cannot drift from what the loader accepts.

``python scripts/config_reference.py`` writes ``docs/reference/config.md``; a test checks the committed
page equals :func:`render_reference`.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gym_bridge.train.config.schema import MasterConfig

__all__ = ["render_reference", "section_keys"]


def _section_of(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """The config section a field holds (and ``"{name}"`` for a dict of sections, ``""`` otherwise)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is dict and len(args) == 2:
        inner, _ = _section_of(args[1])
        return inner, "{name}" if inner is not None else ""
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            inner, suffix = _section_of(arg)
            if inner is not None:
                return inner, suffix
    return None, ""


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    return text.replace("NoneType", "None")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "(section)"
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def section_keys(model: type[BaseModel] = MasterConfig, prefix: str = "") -> list[tuple[str, FieldInfo]]:
    """Every key under ``model`` as ``(dotted.key, field)``, sections before their keys, in class order."""
    rows: list[tuple[str, FieldInfo]] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        inner, suffix = _section_of(field.annotation)
        rows.append((key, field))
        if inner is not None:
            rows += section_keys(inner, f"{key}.{suffix + '.' if suffix else ''}")
    return rows


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_reference() -> str:
    """The whole page, as markdown."""
    out = [
        "# Config reference",
        "",
        "Every key a training recipe (`gym-bridge train --config`) takes, generated from the config classes in",
        "`gym_bridge/train/config/` by `python scripts/config_reference.py` (a test keeps this page equal to",
        "them). Keys and layout follow NeMo RL's recipes; unknown keys are refused with a message naming them.",
        "",
    ]
    top = None
    for key, field in section_keys():
        section = key.split(".")[0]
        if section != top:
            top = section
            out += ["", f"## `{section}`", "", _cell(field.description or ""), "", "| key | type | default | meaning |",
                    "|---|---|---|---|"]  # fmt: skip
            continue
        out.append(
            f"| `{key}` | `{_cell(_type_name(field.annotation))}` | `{_cell(_default(field))}` | "
            f"{_cell(field.description or '')} |"
        )
    return "\n".join(out).strip() + "\n"
