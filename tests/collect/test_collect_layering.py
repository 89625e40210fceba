"""``gym_bridge.collect`` sits above the records, the HTTP layer and the agent (``records/``, ``serving/``,
``rollout/``, the root modules) and leans on their public names only: none of those imports the collect
package (function-local imports included, so the two never import each other), collect takes no private
name from another package, and no other package takes a private name from collect (issue 35)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gym_bridge"
BELOW = ("records", "serving", "rollout")
"""The packages collect stands on, beside the root modules."""


def imports(path: Path) -> Iterator[tuple[int, str, str | None]]:
    """``(line, module, name or None)`` of every absolute import in ``path``, at any depth."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                yield node.lineno, node.module, alias.name


def _in_collect(module: str, name: str | None) -> bool:
    return module == "gym_bridge.collect" or module.startswith("gym_bridge.collect.") or (
        module == "gym_bridge" and name == "collect"
    )


def layering_problems(package: Path) -> list[str]:
    """What breaks the rule in the module docstring, as ``path:line: why`` (each once)."""
    problems: dict[str, None] = {}
    collect = package / "collect"
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package.parent)
        in_collect = collect in path.parents
        for line, module, name in imports(path):
            if not module.startswith("gym_bridge"):
                continue
            below = path.parent == package or (path.parent.parent == package and path.parent.name in BELOW)
            if below and _in_collect(module, name):
                problems[f"{where}:{line}: a module below collect imports {module}"] = None
            private = name is not None and name.startswith("_") and not name.startswith("__")
            if private and in_collect and not _in_collect(module, name):
                problems[f"{where}:{line}: collect takes the private {module}.{name}"] = None
            if private and not in_collect and _in_collect(module, name):
                problems[f"{where}:{line}: takes collect's private {module}.{name}"] = None
    return list(problems)


def test_the_check_sees_a_root_module_importing_collect_and_private_names(tmp_path: Path) -> None:
    package = tmp_path / "gym_bridge"
    (package / "collect").mkdir(parents=True)
    (package / "rollout").mkdir()
    (package / "collect" / "run.py").write_text("from gym_bridge.rollout.agent import _check_verify\n")
    (package / "tool.py").write_text("def f():\n    from gym_bridge.collect import LazyWriter, _write_json\n")
    (package / "rollout" / "agent.py").write_text("import gym_bridge.collect.run\n")
    assert layering_problems(package) == [
        "gym_bridge/collect/run.py:1: collect takes the private gym_bridge.rollout.agent._check_verify",
        "gym_bridge/rollout/agent.py:1: a module below collect imports gym_bridge.collect.run",
        "gym_bridge/tool.py:2: a module below collect imports gym_bridge.collect",
        "gym_bridge/tool.py:2: takes collect's private gym_bridge.collect._write_json",
    ]


def test_collect_and_the_root_modules_do_not_lean_on_each_other() -> None:
    assert (PACKAGE / "collect" / "run.py").is_file()  # the scan reads the real package
    assert layering_problems(PACKAGE) == []
