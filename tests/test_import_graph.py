"""gym_bridge's import graph (issues 10 and 35): no module circle, and packages stacked in layers.

Two checks over the source, read with :mod:`ast` (nothing is imported):

* **Modules** (issue 10): module-level imports form a DAG. Function-local imports are left out here (they
  cannot deadlock an import); an import of a parent package from its own submodule is too (the package
  is already being imported).
* **Packages** (issue 35): every ``import`` / ``from ... import`` anywhere in a module counts, inside
  functions included, since a function-local import is still a dependency, only a deferred one. The
  units are: each subpackage ``gym_bridge/<pkg>/`` as one (its subpackages included), each module
  still loose in ``gym_bridge/`` as one of its own (only ``cli``, the entry point, and ``console``),
  the package root ``gym_bridge`` (its ``__init__``: the version), and the sibling package
  ``transforms`` (gym_bridge imports it, so a circle through it must be seen). Only static imports
  count: a module named in a string (``importlib.import_module``, registry entries) is not followed.

  Two rules over those units:

  1. **No circle** between units.
  2. **Layers**: a unit imports only units of its own layer or a lower one in :data:`LAYERS` (bottom
     first), and every unit is placed on exactly one layer, so a new package or module must be placed
     before it can land.

  ``if TYPE_CHECKING:`` imports count for the layers (a type in a signature is a dependency a reader has
  to follow, so it may not point up) but not for circles: they never execute, and two modules of one
  layer may name each other's types (the resources server and its MCP tools do).
* **The trainer's rooms**: the same two rules one level down, inside ``gym_bridge/train/``: each of its
  subpackages and each module at its top is a unit, placed on a floor of :data:`TRAIN_FLOORS`.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gym_bridge"
SCANNED = ("gym_bridge", "transforms")

LAYERS: list[tuple[str, set[str]]] = [
    (
        "records: the formats everything reads and writes",
        {"gym_bridge", "gym_bridge.records", "gym_bridge.data", "transforms"},
    ),
    (
        "substrate: HTTP, deadlines and retries, the consoles, the sandbox, Ray",
        {"gym_bridge.serving", "gym_bridge.console", "gym_bridge.sandbox", "gym_bridge.distributed"},
    ),
    ("models: loading, log-probs and the forward passes over them", {"gym_bridge.models"}),
    ("generation: sampling backends", {"gym_bridge.generation"}),
    ("policy: the OpenAI-compatible server over a backend", {"gym_bridge.policy"}),
    ("environments and the agent", {"gym_bridge.rollout"}),
    ("evaluation: a model scored on stored data", {"gym_bridge.evaluation"}),
    (
        "runs: collect, train, audit, the TRL bridge",
        {"gym_bridge.collect", "gym_bridge.train", "gym_bridge.audit", "gym_bridge.integrations"},
    ),
    ("viewer: rollout files and training runs as a web page", {"gym_bridge.viewer"}),
    ("commands: the CLI", {"gym_bridge.commands", "gym_bridge.cli"}),
]
"""The floor plan, bottom first (summarised in ``gym_bridge/__init__.py``'s docstring)."""

TRAIN_FLOORS: list[tuple[str, set[str]]] = [
    ("names: the variants a config may name", {"gym_bridge.train", "gym_bridge.train.registry"}),
    ("config: the typed run configuration", {"gym_bridge.train.config"}),
    ("batches: a step's samples as tensors", {"gym_bridge.train.batches"}),
    ("algorithm: advantages, rewards, the loss", {"gym_bridge.train.algorithm"}),
    ("samples and the update", {"gym_bridge.train.samplers", "gym_bridge.train.learner"}),
    ("bookkeeping: checks, metrics, logs, checkpoints", {"gym_bridge.train.bookkeeping"}),
    (
        "assembly: set-up, data-parallel workers, the loop",
        {"gym_bridge.train.setup", "gym_bridge.train.data_parallel", "gym_bridge.train.loop"},
    ),
]
"""The trainer's floor plan, bottom first (summarised in ``gym_bridge/train/__init__.py``'s docstring)."""


def _modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for top in SCANNED:
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) block."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).split(".")[-1] == "TYPE_CHECKING":
            for child in node.body:
                found.update(id(n) for n in ast.walk(child))
    return found


def _imports(tree: ast.AST, everywhere: bool) -> list[tuple[ast.stmt, list[str]]]:
    """Each import statement with the dotted names it may bind (``from a import b``: ``a`` and ``a.b``)."""
    nodes = ast.walk(tree) if everywhere else iter(getattr(tree, "body", []))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found.append((node, [alias.name for alias in node.names]))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node, [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]))
    return found


def _resolve(target: str, modules: dict[str, Path]) -> str:
    """The scanned module ``target`` names (its longest known prefix), or "" outside the scan."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target


def _module_graph() -> dict[str, set[str]]:
    modules = {name: path for name, path in _modules().items() if name.split(".")[0] == "gym_bridge"}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for _, targets in _imports(ast.parse(path.read_text()), everywhere=False):
            for target in targets:
                target = _resolve(target, modules)
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def unit_of(module: str) -> str:
    """The package-level unit of a dotted module name (see the module docstring)."""
    parts = module.split(".")
    if parts[0] != "gym_bridge":
        return parts[0]
    if len(parts) == 1 or not (PACKAGE / parts[1]).is_dir():
        return ".".join(parts[:2])
    return f"gym_bridge.{parts[1]}"


def train_unit_of(module: str) -> str:
    """The unit of a module in ``gym_bridge.train`` (its subpackage, or itself at train's top), else ""."""
    parts = module.split(".")
    if parts[:2] != ["gym_bridge", "train"]:
        return ""
    return ".".join(parts[:3])


@functools.cache
def _package_imports() -> list[tuple[str, str, str, bool]]:
    """Every import between two units: (importing unit, imported unit, ``module:line``, under TYPE_CHECKING)."""
    return _unit_imports(unit_of)


@functools.cache
def _train_imports() -> list[tuple[str, str, str, bool]]:
    """:func:`_package_imports` between the trainer's units (:func:`train_unit_of`)."""
    return _unit_imports(train_unit_of)


def _unit_imports(unit: Callable[[str], str]) -> list[tuple[str, str, str, bool]]:
    modules = _modules()
    found = set()
    for name, path in sorted(modules.items()):
        if not unit(name):
            continue
        tree = ast.parse(path.read_text())
        typing_only = _type_checking_nodes(tree)
        for node, targets in _imports(tree, everywhere=True):
            for target in targets:
                target = _resolve(target, modules)
                if target and unit(target) and unit(target) != unit(name):
                    found.add((unit(name), unit(target), f"{name}:{node.lineno}", id(node) in typing_only))
    return sorted(found)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _layer_of(layers: list[tuple[str, set[str]]] = LAYERS) -> dict[str, int]:
    layer: dict[str, int] = {}
    for number, (_, units) in enumerate(layers):
        for unit in units:
            assert unit not in layer, f"{unit} is on two layers"
            layer[unit] = number
    return layer


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_in_gym_bridge() -> None:
    graph = _module_graph()
    assert "gym_bridge.train.loop" in graph and graph["gym_bridge.train.loop"]  # the scan sees real edges
    assert _cycles(graph) == []


def test_the_package_scan_sees_function_local_and_type_checking_imports() -> None:
    found = _package_imports()
    # commands/eval.py imports the trainer's checkpoint loader inside its command function
    assert any(a == "gym_bridge.commands" and b == "gym_bridge.train" for a, b, _, _ in found)
    # train/bookkeeping/metrics.py imports evaluation only inside functions
    assert any(
        a == "gym_bridge.train"
        and b == "gym_bridge.evaluation"
        and w.startswith("gym_bridge.train.bookkeeping.metrics:")
        for a, b, w, _ in found
    )
    # collect names the in-process client's type under TYPE_CHECKING
    assert ("gym_bridge.collect", "gym_bridge.serving") in {(a, b) for a, b, _, typing in found if typing}
    assert unit_of("gym_bridge.train.config.schema") == "gym_bridge.train"
    assert unit_of("gym_bridge.rollout.agent") == "gym_bridge.rollout"
    assert unit_of("gym_bridge.console") == "gym_bridge.console"
    assert unit_of("transforms.ranked") == "transforms"


def test_no_import_circle_between_packages() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for importer, imported, _, typing_only in _package_imports():
        if not typing_only:
            graph[importer].add(imported)
    assert _cycles(graph) == []


def test_every_unit_is_on_one_layer() -> None:
    units = {unit_of(name) for name in _modules()}
    layer = _layer_of()
    assert sorted(units - set(layer)) == [], "place these on a layer of LAYERS"
    assert sorted(set(layer) - units) == [], "these are on a layer but no longer exist"


def _upward(
    found: list[tuple[str, str, str, bool]], layers: list[tuple[str, set[str]]] = LAYERS
) -> list[str]:
    """The imports of ``found`` that point to a higher layer, as ``module:line (unit, layer) imports ...``."""
    layer = _layer_of(layers)

    def named(unit: str) -> str:
        return f"{unit} ({layers[layer[unit]][0].split(':')[0]})"

    return sorted(
        f"{where} {named(importer)} imports {named(imported)}"
        for importer, imported, where, _ in found
        if layer[imported] > layer[importer]
    )


def test_packages_import_only_their_own_layer_or_lower() -> None:
    assert _upward(_package_imports()) == []


def test_the_layer_check_refuses_an_upward_import() -> None:
    """Issue 35's first circle, generation importing the trainer's log-probs, is an upward import."""
    found = [
        ("gym_bridge.generation", "gym_bridge.train", "gym_bridge.generation.transformers_backend:31", False),
        ("gym_bridge.train", "gym_bridge.generation", "gym_bridge.train.setup:28", False),
        ("gym_bridge.train", "gym_bridge.train", "gym_bridge.train.loop:1", False),
    ]
    assert _upward(found) == [
        "gym_bridge.generation.transformers_backend:31 gym_bridge.generation (generation) imports "
        "gym_bridge.train (runs)"
    ]
    assert _cycles({a: {b} for a, b, _, _ in found[:2]}) == [["gym_bridge.generation", "gym_bridge.train"]]


def test_the_trainers_units_form_no_circle() -> None:
    found = _train_imports()
    # the scan sees the trainer's real edges, function-local ones included (data_parallel's workers build
    # their learner through setup inside a function)
    assert ("gym_bridge.train.loop", "gym_bridge.train.setup") in {(a, b) for a, b, _, _ in found}
    assert any(
        a == "gym_bridge.train.data_parallel" and b == "gym_bridge.train.setup" for a, b, _, _ in found
    )
    graph: dict[str, set[str]] = defaultdict(set)
    for importer, imported, _, typing_only in found:
        if not typing_only:
            graph[importer].add(imported)
    assert _cycles(graph) == []


def test_every_trainer_unit_is_on_one_floor() -> None:
    units = {train_unit_of(name) for name in _modules()} - {""}
    floor = _layer_of(TRAIN_FLOORS)
    assert sorted(units - set(floor)) == [], "place these on a floor of TRAIN_FLOORS"
    assert sorted(set(floor) - units) == [], "these are on a floor but no longer exist"


def test_the_trainers_units_import_only_their_own_floor_or_lower() -> None:
    assert _upward(_train_imports(), TRAIN_FLOORS) == []
    # and the check refuses an upward one: the loss reading the sampler
    upward = [
        (
            "gym_bridge.train.algorithm",
            "gym_bridge.train.samplers",
            "gym_bridge.train.algorithm.loss:1",
            False,
        )
    ]
    assert _upward(upward, TRAIN_FLOORS) == [
        "gym_bridge.train.algorithm.loss:1 gym_bridge.train.algorithm (algorithm) imports "
        "gym_bridge.train.samplers (samples and the update)"
    ]
