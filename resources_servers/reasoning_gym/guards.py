"""What keeps an answer from running as code inside a scorer worker (installed only in the worker).

Why: several reasoning-gym scorers hand the model's answer to Python's ``eval`` (spiral_matrix,
string_insertion, binary_matrix, n_queens) or to ``sympy.parse_expr`` (countdown, puzzle24,
polynomial_multiplication, the integration families), and both run arbitrary code: an answer could run
a shell command, read the expected answer out of the scorer's frame, or rewrite the scorer. Process
isolation (:mod:`resources_servers.reasoning_gym.worker`) limits what such code could reach; these
guards keep it from running at all:

* ``eval`` in every reasoning-gym module is :func:`literal_eval`: literals (numbers, strings, lists,
  tuples, sets, dicts) combined by operators, nothing that names, calls or looks anything up; so
  ``[[1, 2], [3, 4]]`` still scores as before and ``__import__('os')...`` is refused. ``exec`` there
  is refused.
* SymPy's string parser (``parse_expr`` and ``sympify`` of a string, whoever calls it) first checks the
  Python it generated (:func:`check_sympy_code`): arithmetic on numbers, symbols and SymPy's own
  functions and classes only; no attributes, subscripts, lambdas, keyword arguments, builtins other
  than ``abs``/``pow``, strings other than a symbol's or number's name.
* An audit hook (:func:`install_audit_hook`), armed during a check, refuses process creation, writes,
  sockets, ``ctypes`` and signals, and notes any compilation of text, so the pool can retire a worker
  that evaluated anything (see :data:`state`).

A refused answer raises :class:`RefusedAnswer` (a ``ValueError``), which the scorers treat as any
unparsable answer (reward 0, or the family's small format credit).
"""

from __future__ import annotations

import ast
import builtins
import os
import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "RefusedAnswer",
    "check_sympy_code",
    "install",
    "install_audit_hook",
    "literal_eval",
    "state",
]


class RefusedAnswer(ValueError):
    """An answer a scorer would have run as code; refused before it ran."""


@dataclass
class CheckState:
    """What happened during the current check (reset by the worker before each)."""

    armed: bool = False
    evaluated: bool = False
    """Text was compiled or evaluated during the check: the worker is retired after it."""
    refused: list[str] = field(default_factory=list)

    def reset(self, armed: bool) -> None:
        self.armed, self.evaluated, self.refused = armed, False, []

    def refuse(self, why: str) -> RefusedAnswer:
        self.refused.append(why)
        return RefusedAnswer(why)


state = CheckState()

_LITERAL_NODES = (
    ast.Expression, ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp,
    ast.unaryop, ast.operator, ast.Load,
)  # fmt: skip


def literal_eval(source: Any, globals: Any = None, locals: Any = None) -> Any:
    """``eval`` for reasoning-gym's modules: the value of a literal expression, or :class:`RefusedAnswer`.

    Literals may be combined with operators (``0x3a << 2``, ``-1.5``, ``[0] * 3``), as the package's own
    uses need; anything that names, calls, indexes or looks up an attribute is refused.
    """
    state.evaluated = True
    if not isinstance(source, str):
        raise state.refuse(f"refused to evaluate a {type(source).__name__}: only literal text is evaluated")
    try:
        tree = ast.parse(source.lstrip(" \t"), mode="eval")
    except (SyntaxError, ValueError) as e:
        raise SyntaxError(f"not a Python literal: {e}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _LITERAL_NODES):
            raise state.refuse(
                f"refused to evaluate the answer: {type(node).__name__} is not part of a literal"
            )
    return builtins.eval(compile(tree, "<answer>", "eval"), {"__builtins__": {}}, {})


def _refuse_exec(*args: Any, **kwargs: Any) -> None:
    state.evaluated = True
    raise state.refuse("refused to exec text in a scorer")


_SYMPY_STRUCTURE = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.Load, ast.Tuple, ast.List,
    ast.Compare, ast.cmpop,
)  # fmt: skip
_NAME_TAKERS = frozenset({"Symbol", "Function", "Integer", "Float", "Rational", "Number"})
"""Callables that SymPy's own transformations hand a string (a symbol's name, a number's digits)."""
_PLAIN_FUNCTIONS = frozenset({"sqrt", "cbrt", "root", "real_root", "abs", "pow"})
"""Callables that are neither SymPy classes nor objects but plain math (``sqrt`` is a function)."""
_RESTATING = frozenset({"Integral", "Derivative", "Limit", "Sum", "Product", "Subs"})
"""SymPy classes that hold an operation unevaluated: ``Integral(f, x)`` restates an integration task
instead of solving it, yet differentiates back to ``f`` (the integration scorers paid it 1.0)."""


def check_sympy_code(code: str, local_dict: dict[str, Any], global_dict: dict[str, Any]) -> None:
    """Raise :class:`RefusedAnswer` unless ``code`` (what ``stringify_expr`` made of an answer) is math.

    Allowed: numbers, operators, comparisons, tuples and lists; names the caller put in ``local_dict``;
    SymPy classes (``sin``, ``Symbol``, ``Integer``, ``Add``...) but :data:`_RESTATING`, SymPy objects
    (``pi``, ``E``) and :data:`_PLAIN_FUNCTIONS`; calls of such names without keywords; string constants only as the
    arguments of :data:`_NAME_TAKERS`. Names that are neither local nor global stay (they are a
    ``NameError`` at evaluation) unless they name a builtin (SymPy's own transformations turn such names
    into symbols; a scorer's custom transformations might not).
    """
    from sympy import Basic

    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError as e:  # not Python: SymPy's own eval would fail the same way
        raise SyntaxError(f"the answer does not parse as an expression: {e.msg}") from None
    named_strings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, _SYMPY_STRUCTURE):
            continue
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.keywords:
                raise state.refuse(
                    "refused to parse the answer: only calls of named functions, without keywords"
                )
            if node.func.id in _NAME_TAKERS:
                named_strings.update(id(a) for a in node.args if isinstance(a, ast.Constant))
            continue
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str | bytes) and id(node) not in named_strings:
                raise state.refuse("refused to parse the answer: a string where math was expected")
            continue
        if isinstance(node, ast.Name):
            name = node.id
            if name.startswith("_"):
                raise state.refuse(f"refused to parse the answer: the name {name!r}")
            if name in local_dict or name in _PLAIN_FUNCTIONS:
                continue
            if name not in global_dict:
                if hasattr(builtins, name):  # evaluation would find it in the builtins (type, object...)
                    raise state.refuse(f"refused to parse the answer: the builtin {name!r}")
                continue  # a NameError at evaluation
            if name in _RESTATING:
                raise state.refuse(f"refused to parse the answer: {name!r} restates the task instead of solving it")
            obj = global_dict[name]
            if isinstance(obj, Basic) or (isinstance(obj, type) and issubclass(obj, Basic)):
                continue
            raise state.refuse(f"refused to parse the answer: {name!r} is not a SymPy function or constant")
        raise state.refuse(f"refused to parse the answer: {type(node).__name__} is not math")


def _guard_sympy_parser() -> None:
    """Check what SymPy's parser generated before it is evaluated (parse_expr, sympify of text)."""
    from sympy.parsing import sympy_parser

    original = sympy_parser.stringify_expr
    if getattr(original, "_gym_bridge_guarded", False):
        return

    def stringify_expr(s: str, local_dict: Any, global_dict: Any, transformations: Any) -> str:
        state.evaluated = True
        code = original(s, local_dict, global_dict, transformations)
        check_sympy_code(code, local_dict, global_dict)
        return code

    stringify_expr._gym_bridge_guarded = True  # type: ignore[attr-defined]
    sympy_parser.stringify_expr = stringify_expr


def _guard_reasoning_gym_modules() -> None:
    """Shadow the builtins ``eval``/``exec`` in every loaded reasoning-gym module."""
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "reasoning_gym" or name.startswith("reasoning_gym.")):
            module.eval = literal_eval  # type: ignore[attr-defined]
            module.exec = _refuse_exec  # type: ignore[attr-defined]


_REFUSED_EVENTS = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "subprocess.Popen", "pty.spawn", "socket.__new__", "socket.connect", "socket.bind", "socket.sendto",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata", "ctypes.call_function",
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink",
    "os.truncate", "os.putenv", "os.unsetenv", "shutil.rmtree", "sys.addaudithook", "sys.setprofile",
    "sys.settrace", "os.chdir", "os.chroot", "resource.setrlimit", "resource.prlimit", "signal.pthread_kill",
})  # fmt: skip
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not state.armed:
        return
    if event == "compile":  # text about to become code (an import from a .pyc raises only "exec")
        state.evaluated = True
    elif event in _REFUSED_EVENTS:
        raise state.refuse(f"refused during scoring: {event}")
    elif event == "open":
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS
        ):
            raise state.refuse("refused during scoring: opening a file for writing")


def install_audit_hook() -> None:
    """Add the hook (it cannot be removed; it only acts while :data:`state` is armed)."""
    sys.addaudithook(_audit)


def guard_reasoning_gym() -> None:
    """Shadow ``eval``/``exec`` in every reasoning-gym module (the worker module does it at import, in
    the fork server, so that each forked worker does not touch ~300 module dicts again)."""
    import reasoning_gym  # noqa: F401  (loads every family's module)

    _guard_reasoning_gym_modules()


def install() -> None:
    """The guards that are per process, in the worker: SymPy's parser and the audit hook."""
    if getattr(sys.modules.get("reasoning_gym.algorithmic.spiral_matrix"), "eval", None) is not literal_eval:
        guard_reasoning_gym()  # not done at import (a worker started another way)
    _guard_sympy_parser()
    install_audit_hook()
