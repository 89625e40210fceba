"""Honest programs written for ``python solution.py < input`` pass in the sandbox too (real HTTP).

A false negative is learned as surely as a false positive: a correct answer scored 0 teaches the policy to
avoid whatever idiom tripped the harness. Each program below is correct and idiomatic for a plain
interpreter (``exit()`` after printing, the FastIO template that reads ``sys.stdout.mode``, a worker thread
nobody joins, an ``atexit`` printer, an unflushed ``open(1, "w")``, ``multiprocessing`` pickling a
function of ``__main__``, a pool of eight threads under a 256 MB address-space limit,
``sys.stdin.buffer.readline`` on a large input) and each once scored 0.

The other side of the same exit path: a program that raised still fails whatever its exit-time code does,
and a program that ends between two CPU polls (or within one ``/proc`` tick) past its limit is a timeout.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.code.app import CodeConfig, CodeServer

SUM = {
    "responses_create_params": {"input": [{"role": "user", "content": "Print a + b."}]},
    "verifier_metadata": {"unit_tests": {"inputs": ["1 2\n", "40 2\n"], "outputs": ["3\n", "42\n"]}},
}
READ = "a, b = map(int, input().split())\n"

FASTIO = """
import os, sys
from io import BytesIO, IOBase
BUFSIZE = 8192
class FastIO(IOBase):
    newlines = 0
    def __init__(self, file):
        self._fd = file.fileno()
        self.buffer = BytesIO()
        self.writable = "x" in file.mode or "r" not in file.mode
        self.write = self.buffer.write if self.writable else None
    def readline(self):
        while self.newlines == 0:
            b = os.read(self._fd, max(os.fstat(self._fd).st_size, BUFSIZE))
            self.newlines = b.count(b"\\n") + (not b)
            ptr = self.buffer.tell()
            self.buffer.seek(0, 2), self.buffer.write(b), self.buffer.seek(ptr)
        self.newlines -= 1
        return self.buffer.readline()
    def flush(self):
        if self.writable:
            os.write(self._fd, self.buffer.getvalue())
            self.buffer.truncate(0), self.buffer.seek(0)
class IOWrapper(IOBase):
    def __init__(self, file):
        self.buffer = FastIO(file)
        self.flush = self.buffer.flush
        self.writable = self.buffer.writable
        self.write = lambda s: self.buffer.write(s.encode("ascii"))
        self.readline = lambda: self.buffer.readline().decode("ascii")
sys.stdin, sys.stdout = IOWrapper(sys.stdin), IOWrapper(sys.stdout)
input = lambda: sys.stdin.readline().rstrip("\\r\\n")
a, b = map(int, input().split())
print(a + b)
"""

HONEST: dict[str, str] = {
    "exit_builtin": READ + "print(a + b)\nexit()\nprint('unreachable')",
    "quit_builtin_in_a_branch": READ + "if a > 0:\n    print(a + b)\n    quit(0)\nprint(-1)",
    "fastio_template_reads_stream_modes": FASTIO,
    "std_streams_look_like_the_interpreters": (
        "import sys\nassert (sys.stdin.mode, sys.stdout.mode) == ('r', 'w'), 'modes'\n"
        "assert sys.stdin.name == '<stdin>' and sys.__stdout__ is sys.stdout, 'names'\n"
        "assert sys.stdin.buffer.peek is not None, 'buffered'\n" + READ + "print(a + b)"
    ),
    "thread_nobody_joins": (
        "import threading, time\ndef main():\n    time.sleep(0.05)\n" + "    " + READ + "    print(a + b)\n"
        "threading.stack_size(1 << 26)\nthreading.Thread(target=main).start()"
    ),
    "atexit_printer": "import atexit\n" + READ + "atexit.register(print, a + b)",
    "unflushed_file_on_fd_1": "import os\nout = os.fdopen(1, 'w')\n" + READ + "out.write(f'{a + b}\\n')",
    "stdout_replaced_after_printing": "import io, sys\n" + READ + "print(a + b)\nsys.stdout = io.StringIO()",
    "dunder_stdout": "import sys\n" + READ + "sys.__stdout__.write(f'{a + b}\\n')",
    "thread_pool_of_eight": (  # glibc reserved 64 MB of address space per thread's malloc arena
        "from concurrent.futures import ThreadPoolExecutor\ndef work(i):\n"
        "    return len([bytearray(200000) for _ in range(20)])\n"
        "with ThreadPoolExecutor(max_workers=8) as pool:\n    assert sum(pool.map(work, range(32))) == 640\n"
        + READ
        + "print(a + b)"
    ),
    # NeMo Gym 0.7.0 / LiveCodeBench run their import preamble first (LeetCode-style answers rely on it)
    "preamble_names_without_imports": (
        "g = defaultdict(list)\nq = deque([gcd(12, 18)])\nheappush(h := [], inf)\n"
        "a, b = map(int, stdin.readline().split())\nstdout.write(f'{a + b}\\n')"
    ),
    "recursion_20000_deep": (
        "def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\nassert depth(20000) == 20000\n"
        + READ
        + "print(a + b)"
    ),
    "multiprocessing_pickles_a_main_function": (
        "import multiprocessing as mp\ndef total(pair):\n    return sum(pair)\n"
        "if __name__ == '__main__':\n    " + READ.strip() + "\n    with mp.Pool(2) as pool:\n"
        "        print(pool.map(total, [(a, b)])[0])"
    ),
}

FAILS: dict[str, tuple[str, str]] = {
    # exit-time code of a program that raised does not turn the failure into a pass
    "atexit_os_exit_0_after_raising": (
        "import atexit, os\natexit.register(os._exit, 0)\n" + READ + "print(a + b)\nraise RuntimeError('x')",
        "runtime_error",
    ),
    "thread_prints_after_main_raised": (
        "import threading\n" + READ + "threading.Thread(target=print, args=(a + b,)).start()\n"
        "raise RuntimeError('x')",
        "runtime_error",
    ),
}


def answer(code: str) -> dict[str, Any]:
    text = f"```python\n{code}\n```"
    return {
        "output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
        ]
    }


def _serve(timeout_s: float) -> Iterator[str]:
    config = CodeConfig(
        timeout_s=timeout_s, wall_timeout_s=max(3.0, 2 * timeout_s + 1), task_timeout_s=60, memory_mb=256
    )
    server = CodeServer(config=config)
    with start_in_thread(server.build_app()) as running:
        yield running.url


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from _serve(2.0)


def verify(url: str, row: dict[str, Any], code: str, **extra: Any) -> dict[str, Any]:
    response = httpx.post(f"{url}/verify", json={**row, **extra, "response": answer(code)}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_interpreter_idioms_pass(url: str, name: str) -> None:
    out = verify(url, SUM, HONEST[name])
    assert out["reward"] == 1.0, (out.get("failure_reason"), out.get("stderr_tail"))


def test_leetcode_style_answer_without_imports_and_a_big_integer(url: str) -> None:
    """``Optional[...]`` without ``from typing import Optional`` (LeetCode's template; NeMo Gym's preamble
    defines it) and ``str`` of a 6,021-digit integer (past Python's default 4,300-digit limit)."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        big = str(2**20000)
    finally:
        sys.set_int_max_str_digits(limit)
    tests = {"inputs": [[3], [20000]], "outputs": [json.dumps("8"), json.dumps(big)], "fn_name": "power"}
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "Return 2 ** n as text."}]},
        "verifier_metadata": {"unit_tests": tests},
    }
    code = "class Solution:\n    def power(self, n: int) -> Optional[str]:\n        return str(2 ** n)"
    out = verify(url, row, code)
    assert out["reward"] == 1.0, (out.get("failure_reason"), out.get("stderr_tail"))


@pytest.mark.parametrize("name", sorted(FAILS))
def test_exit_time_code_does_not_hide_a_failure(url: str, name: str) -> None:
    code, kind = FAILS[name]
    out = verify(url, SUM, code)
    assert out["reward"] == 0.0 and out["failure_kind"] == kind, out.get("failure_reason")


def test_buffer_readline_is_not_slower_than_input(url: str) -> None:
    """``input = sys.stdin.buffer.readline`` is the fast idiom (0.24 s against ``input()``'s 0.40 s for 200,000
    lines under a plain python3.11); from an unbuffered stdin it read one byte per system call and timed out."""
    n = 100_000
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "Sum all pairs."}]},
        "verifier_metadata": {
            "unit_tests": {
                "inputs": [f"{n}\n" + "".join(f"{i} {i + 1}\n" for i in range(n))] * 2,
                "outputs": [f"{n * n}\n"] * 2,
            }
        },
    }
    body = "n = int(input())\ns = 0\nfor _ in range(n):\n    a, b = map(int, input().split())\n    s += a + b\nprint(s)"
    fast = verify(url, row, "import sys\ninput = sys.stdin.buffer.readline\n" + body)
    plain = verify(url, row, body)
    assert fast["reward"] == 1.0 and plain["reward"] == 1.0, (
        fast.get("failure_reason"),
        plain.get("failure_reason"),
    )
    fast_cpu = min(t["cpu_s"] for t in fast["tests"])
    plain_cpu = min(t["cpu_s"] for t in plain["tests"])
    assert fast_cpu < plain_cpu, (fast_cpu, plain_cpu)


def test_a_program_that_ends_just_past_its_cpu_limit_is_a_timeout() -> None:
    """0.3 s of CPU allowed, 0.308 s spent: ``/proc`` shows CPU in 10 ms ticks and the tree is polled every
    20 ms, so the poll never saw it over; the harness now checks the exact usage once the program ended."""
    for url in _serve(0.3):
        program = "import time\nwhile time.process_time() < 0.308:\n    pass\n" + READ + "print(a + b)"
        out = verify(url, SUM, program)
        assert out["reward"] == 0.0 and out["failure_kind"] == "timeout", out.get("failure_reason")
        assert out["tests"][0]["cpu_s"] > 0.3
        honest = verify(url, SUM, READ + "print(a + b)")
        assert honest["reward"] == 1.0, honest.get("failure_reason")


def test_the_preamble_runs_only_for_a_program_that_needs_it(url: str) -> None:
    """Its imports cost tens of milliseconds per task: a program that binds every global it reads starts
    from a plain interpreter's empty namespace, one that reads ``Counter`` without an import gets it."""
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "List your globals."}]},
        "verifier_metadata": {"unit_tests": {"inputs": [""], "outputs": ["[] 50000\n"]}},
    }
    plain = "import sys\nprint([k for k in globals() if not k.startswith('__') and k != 'sys'], sys.getrecursionlimit())"
    out = verify(url, row, plain)
    assert out["reward"] == 1.0, out.get("failure_reason")
    row["verifier_metadata"]["unit_tests"]["outputs"] = ["2\n"]
    out = verify(url, row, "print(Counter('aab')['a'])")
    assert out["reward"] == 1.0, out.get("failure_reason")


def test_debug_output_on_stderr_does_not_fail_a_correct_program(url: str) -> None:
    """1.9 MB of stderr (over the 1 MB output cap): stderr is a pipe the harness drains, keeping its tail;
    it was a file under the file-size limit, and the correct answer ended as ``output_limit``."""
    program = (
        "import sys\nfor i in range(30000):\n    print('debug', 'x' * 50, i, file=sys.stderr)\n"
        + READ
        + "print(a + b)"
    )
    out = verify(url, SUM, program)
    assert out["reward"] == 1.0, out.get("failure_reason")
    failed = verify(url, SUM, program.replace("print(a + b)", "print(a - b)"))
    assert failed["reward"] == 0.0 and "x 29999" in failed["tests"][0]["stderr_tail"], failed["tests"][0]


@pytest.mark.parametrize(
    ("fn_name", "code", "kind"),
    [
        (
            "gcd",
            "class Solution:\n    def gcd(self, a: int, b: int) -> Optional[int]:\n        return 0",
            "wrong_answer",
        ),
        ("gcd", "unused: List[int] = []", "runtime_error"),
        ("median", "def helper(values: List[int]) -> int:\n    return 0", "runtime_error"),
    ],
)
def test_a_preamble_function_is_never_taken_for_the_programs(
    url: str, fn_name: str, code: str, kind: str
) -> None:
    """The preamble's ``gcd`` (``math.gcd``) or ``median`` is not the program's answer: a wrong ``Solution.gcd``
    or no function at all scored 1.0 once a program read ``List`` (and so got the preamble)."""
    inputs, outputs = ([[12, 18], [7, 5]], [6, 1]) if fn_name == "gcd" else ([[[1, 2, 3]]], [2])
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": f"Write {fn_name}."}]},
        "verifier_metadata": {"unit_tests": {"inputs": inputs, "outputs": outputs, "fn_name": fn_name}},
    }
    out = verify(url, row, code)
    assert out["reward"] == 0.0 and out["failure_kind"] == kind, out.get("failure_reason")
    if fn_name == "gcd":  # a gcd of its own (a method using the preamble's, an import) is the program's
        for honest in (
            "class Solution:\n    def gcd(self, a: int, b: int) -> int:\n        return gcd(a, b)",
            "from math import gcd\nunused: List[int] = []",
            "def gcd(a: int, b: int) -> Optional[int]:\n    return a if b == 0 else gcd(b, a % b)",
        ):
            assert verify(url, row, honest)["reward"] == 1.0, honest
