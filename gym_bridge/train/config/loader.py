"""YAML recipes to a validated :class:`MasterConfig`: ``defaults:`` inheritance, ``${...}``
interpolation, dotted command-line overrides, and error messages naming each bad key's full path."""

from __future__ import annotations

import difflib
import re
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from gym_bridge.train.config.base import ConfigError
from gym_bridge.train.config.gym_guide_layout import translate_gym_guide_layout
from gym_bridge.train.config.schema import MasterConfig

__all__ = ["config_to_dict", "config_to_yaml", "load_config", "validate_config"]

# YAML loading, overrides, interpolation and error messages
# ----------------------------------------------------------------------------------------------

_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-8`` as a float (YAML 1.1 wants ``1.0e-8``)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _read_yaml(text: str, origin: str) -> Any:
    try:
        return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError([f"{origin}: not valid YAML: {exc}"]) from exc


def _merge(base: Any, over: Any) -> Any:
    """Merge ``over`` into ``base``: mappings key by key (unless ``_override_: true``), else replace."""
    if not isinstance(base, dict) or not isinstance(over, dict):
        return over
    if over.get("_override_") is True:
        return {k: v for k, v in over.items() if k != "_override_"}
    merged = dict(base)
    for key, value in over.items():
        merged[key] = _merge(base.get(key), value) if key in base else _strip_markers(value)
    return merged


def _strip_markers(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_markers(v) for k, v in value.items() if k != "_override_"}
    return value


# Keys holding file or directory paths: relative ones in a recipe mean relative to the recipe's folder.
_PATH_KEYS = {
    "data": ("data_path", "prompt_file", "system_prompt_file"),
    "checkpointing": ("checkpoint_dir",),
    "logger": ("log_dir",),
}


def _anchor(value: Any, folder: Path) -> Any:
    if not isinstance(value, str) or not value or "${" in value:
        return value
    path = Path(value).expanduser()
    return value if path.is_absolute() else str((folder / path).resolve())


def _anchor_paths(tree: dict[str, Any], folder: Path) -> None:
    """Make the recipe's relative data paths and output directories relative to ``folder`` (its own
    folder), so a recipe runs from any working directory. Command-line overrides stay CWD-relative."""
    for section in ("checkpointing", "logger"):
        node = tree.get(section)
        if isinstance(node, dict):
            for key in _PATH_KEYS[section]:
                if key in node:
                    node[key] = _anchor(node[key], folder)
    data = tree.get("data")
    if not isinstance(data, dict):
        return
    if "train_data_path" in data:  # NeMo Gym's guide layout (see gym_guide_layout)
        data["train_data_path"] = _anchor(data["train_data_path"], folder)
    for which in ("train", "validation", "default"):
        datasets = data.get(which)
        for dataset in datasets if isinstance(datasets, list) else [datasets]:
            if isinstance(dataset, dict):
                for key in _PATH_KEYS["data"]:
                    if key in dataset:
                        dataset[key] = _anchor(dataset[key], folder)


def _load_tree(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in chain:
        raise ConfigError([f"{path}: circular 'defaults' chain: {' -> '.join(map(str, chain + (path,)))}"])
    if not path.is_file():
        raise ConfigError([f"config file not found: {path}"])
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError([f"{path}: not UTF-8 text ({err.reason} at byte {err.start})"]) from None
    tree = _read_yaml(text, str(path))
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise ConfigError([f"{path}: the top level must be a mapping of sections"])
    _anchor_paths(tree, path.parent)
    parents = tree.pop("defaults", None)
    if parents is None:
        return _strip_markers(tree)
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise ConfigError([f"{path}: 'defaults' expects a file name or a list of file names"])
    base: dict[str, Any] = {}
    for parent in parents:
        base = _merge(base, _load_tree(path.parent / parent, chain + (path,)))
    return _merge(base, tree)


def _apply_override(tree: dict[str, Any], item: str) -> None:
    key, sep, raw = item.partition("=")
    key = key.strip().lstrip("+")
    if not sep or not key:
        raise ConfigError([f"override {item!r} must look like section.key=value"])
    value = _read_yaml(raw, f"override {item!r}") if raw.strip() else None
    parts = key.split(".")
    node: Any = tree
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    [f"override {item!r}: '{where}' is not an index of a {len(node)}-item list"]
                )
            index: Any = int(part)
        elif isinstance(node, dict):
            index = part
        else:
            raise ConfigError([f"override {item!r}: '{'.'.join(parts[:depth])}' is not a mapping"])
        if last:
            node[index] = value
        else:
            if isinstance(node, dict) and node.get(index) is None:
                node[index] = {}
            node = node[index]


def _resolve_interpolations(tree: dict[str, Any]) -> dict[str, Any]:
    """Replace ``${dotted.key}`` strings with the values they name (typed when the whole string)."""

    defaults = MasterConfig().model_dump(mode="json")  # refs may name keys the YAML leaves at default

    def find(root: Any, ref: str) -> tuple[bool, Any]:
        node = root
        for part in ref.split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return False, None
        return True, node

    def lookup(ref: str, where: str, stack: tuple[str, ...]) -> Any:
        if ref in stack:
            raise ConfigError([f"config key '{where}': circular interpolation ${{{ref}}}"])
        if not re.fullmatch(r"[\w.]+", ref):
            raise ConfigError(
                [f"config key '{where}': unsupported interpolation ${{{ref}}} (only ${{section.key}})"]
            )
        for root in (tree, defaults):
            found, node = find(root, ref)
            if found:
                return resolve(node, ref, stack + (ref,))
        raise ConfigError([f"config key '{where}' refers to unknown key '{ref}'"])

    def resolve(value: Any, where: str, stack: tuple[str, ...]) -> Any:
        if isinstance(value, dict):
            return {k: resolve(v, f"{where}.{k}" if where else k, stack) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v, f"{where}.{i}", stack) for i, v in enumerate(value)]
        if not isinstance(value, str) or "${" not in value:
            return value
        whole = _INTERPOLATION.fullmatch(value)
        if whole:
            return lookup(whole.group(1), where, stack)
        if "${" in _INTERPOLATION.sub("", value):
            raise ConfigError(
                [f"config key '{where}': unsupported interpolation in {value!r} (only ${{section.key}})"]
            )
        return _INTERPOLATION.sub(lambda m: str(lookup(m.group(1), where, stack)), value)

    return resolve(tree, "", ())


_EXPECTS = {
    "float_parsing": "a float",
    "float_type": "a float",
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "bool_parsing": "a boolean (true/false)",
    "bool_type": "a boolean (true/false)",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def _inner_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The section model inside an annotation, and whether a dict key comes first."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is dict:
        return _inner_model(args[1])[0], True
    if origin in (list, tuple, Union, types.UnionType):
        for arg in args:
            model, keyed = _inner_model(arg)
            if model is not None:
                return model, keyed
    return None, False


def _model_at(loc: Iterable[Any]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = MasterConfig
    expect_key = False
    for part in loc:
        if isinstance(part, int):
            continue
        if expect_key:
            expect_key = False
            continue
        field = model.model_fields.get(part) if model else None
        if field is None:
            return None
        model, expect_key = _inner_model(field.annotation)
    return model


def _all_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, field in model.model_fields.items():
        inner, keyed = _inner_model(field.annotation)
        if inner is None:
            paths.append(prefix + name)
        elif not keyed and get_origin(field.annotation) is None:
            paths.extend(_all_paths(inner, f"{prefix}{name}."))
    return paths


def _suggestion(loc: tuple[Any, ...], path: str) -> str:
    parent = _model_at(loc[:-1])
    key = str(loc[-1])
    if parent is not None:
        close = difflib.get_close_matches(key, list(parent.model_fields), n=1, cutoff=0.6)
        if close:
            return f" (did you mean '{path.rsplit('.', 1)[0] + '.' if '.' in path else ''}{close[0]}'?)"
    elsewhere = [p for p in _all_paths(MasterConfig) if p.rsplit(".", 1)[-1] == key]
    if elsewhere:
        return f" (did you mean '{elsewhere[0]}'?)"
    return ""


def _key_path(loc: tuple[Any, ...], raw: Any) -> str:
    """Dotted key path; list indices print as [i] unless the user wrote a single mapping."""
    out = ""
    node = raw
    for part in loc:
        if isinstance(part, int):
            if isinstance(node, list):
                out += f"[{part}]"
                node = node[part] if part < len(node) else None
            continue
        out += f".{part}" if out else str(part)
        node = node.get(part) if isinstance(node, dict) else None
    return out


def _describe(error: Any, raw: Any) -> list[str]:
    loc, kind = tuple(error["loc"]), error["type"]
    path = _key_path(loc, raw)
    got = error.get("input")
    if kind == "extra_forbidden":
        return [f"unknown config key '{path}'{_suggestion(loc, path)}"]
    if kind == "missing" and loc and isinstance(loc[-1], int):
        return [f"config key '{_key_path(loc[:-1], raw)}' has too few items"]
    if kind == "missing":
        return [f"config key '{path}' is required"]
    if kind in _EXPECTS:
        return [f"config key '{path}' expects {_EXPECTS[kind]}, got {got!r}"]
    if kind == "literal_error":
        return [f"config key '{path}' expects one of {error['ctx']['expected']}, got {got!r}"]
    message = error["msg"].removeprefix("Value error, ")
    if kind == "value_error":
        if message.startswith("expects"):
            return [f"config key '{path}' {message}"]
        lines = message.split("\n")
        return lines if not path or lines[0].startswith(path) else [f"{path}: {line}" for line in lines]
    return [f"config key '{path}': {message[0].lower() + message[1:]}, got {got!r}"]


def validate_config(tree: dict[str, Any]) -> MasterConfig:
    """Build a :class:`MasterConfig` from a plain mapping, or raise :class:`ConfigError`."""
    try:
        return MasterConfig.model_validate(tree)
    except ValidationError as exc:
        problems: list[str] = []
        for error in exc.errors():
            problems.extend(_describe(error, tree))
        raise ConfigError(problems) from None


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> MasterConfig:
    """Load a YAML recipe (with ``defaults:`` inheritance), apply ``a.b.c=value`` overrides and validate.

    ``path=None`` starts from the built-in defaults. Raises :class:`ConfigError` naming every bad key.
    """
    tree = _load_tree(Path(path)) if path is not None else {}
    for item in overrides:
        _apply_override(tree, item)
    tree = _resolve_interpolations(tree)
    notes = translate_gym_guide_layout(tree)
    if notes:
        print(f"config: NeMo Gym guide layout translated: {'; '.join(notes)}", file=sys.stderr)
    cfg = validate_config(tree)
    if not cfg.data.train:
        raise ConfigError(["data.train: no training dataset configured"])
    return cfg


def config_to_dict(cfg: MasterConfig) -> dict[str, Any]:
    """The resolved config as plain YAML/JSON-ready data; ``validate_config`` of it gives ``cfg`` back."""
    return cfg.model_dump(mode="json")


def config_to_yaml(cfg: MasterConfig) -> str:
    """The resolved config as YAML text, in section order (for checkpoints and logs)."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
