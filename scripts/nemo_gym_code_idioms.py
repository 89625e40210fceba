"""NeMo Gym 0.7.0's verdicts on the honest programs of ``test_code_interpreter_parity.py`` (live cross-check).

Our code server runs a program as ``python solution.py < input`` would (plus NeMo Gym's import preamble), so
``exit()``, FastIO templates, unjoined threads, ``atexit`` printers and unflushed files on fd 1 pass; NeMo
Gym's ``code_gen`` grader (its copy of LiveCodeBench's ``testing_util``) runs the program inside its own
process with stdout captured, where several of them score 0. This prints NeMo Gym's verdict on each, so
the documented differences (docs/reference/security.md, "The code sandbox") can be re-checked. Usage
(NeMo Gym installed in its own venv, e.g. by ``../shared/tools/nemo_gym/install.sh``):

    /tmp/nemogym-dev/venv/bin/python scripts/nemo_gym_code_idioms.py
"""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "resources_servers/code/tests/test_code_interpreter_parity.py"
ROW = {"inputs": ["1 2\n", "40 2\n"], "outputs": ["3\n", "42\n"]}


def honest_programs() -> dict[str, str]:
    """The ``HONEST`` table of the parity test, read without importing pytest or the project."""
    source = TESTS.read_text()
    table = source[source.index("READ = ") : source.index("FAILS: dict")]
    scope: dict[str, object] = {}
    exec("from typing import Any\n" + table, scope)
    return scope["HONEST"]  # type: ignore[return-value]


def _grade(code: str, answer: multiprocessing.Queue) -> None:
    from resources_servers.code_gen.lcb_integration.testing_util import run_test

    results, meta = run_test(ROW, test=code, timeout=6)
    answer.put((results, meta.get("error_message") if isinstance(meta, dict) else None))


def main() -> None:
    for name, code in sorted(honest_programs().items()):
        answer: multiprocessing.Queue = multiprocessing.Queue()
        worker = multiprocessing.Process(target=_grade, args=(code, answer))  # it patches builtins and os
        worker.start()
        worker.join(60)
        results, message = (
            answer.get() if not answer.empty() else (None, f"no verdict (exit {worker.exitcode})")
        )
        verdict = "pass" if results and all(r is True for r in results) else f"fail ({message})"
        print(f"{name:45} {verdict}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
