"""The code server over HTTP: NeMo Gym task rows in, rewards and per-test diagnostics out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gym_bridge.records.schema import VerifyResponse
from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.code.app import CodeConfig, CodeServer

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "data" / "example.jsonl"
REFERENCE = HERE.parents[2] / "tests" / "data" / "nemo_gym" / "code_tasks.example.jsonl"  # vendored

SOLUTIONS = {  # correct answers to data/example.jsonl, in order
    0: "a, b = map(int, input().split())\nprint(a + b)",
    1: "print(' '.join(reversed(input().split())))",
    2: "import sys\nd = sys.stdin.read().split()\nN = 10**5\ns = bytearray([1]) * (N + 1)\ns[0] = s[1] = 0\n"
    "for i in range(2, int(N**0.5) + 1):\n    if s[i]: s[i*i::i] = bytearray(len(s[i*i::i]))\n"
    "import itertools\npre = list(itertools.accumulate(s))\nprint('\\n'.join(str(pre[int(x)]) for x in d[1:]))",
    3: "def is_palindrome(s):\n    return s == s[::-1]",
    4: "from typing import List\nclass Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
    "        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n"
    "                return [seen[target - x], i]\n            seen[x] = i",
}


def answer(text: str) -> dict[str, Any]:
    return {
        "output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
        ]
    }


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


def stdio_task(inputs: list[str], outputs: list[str]) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "solve"}]},
        "verifier_metadata": {"unit_tests": {"inputs": inputs, "outputs": outputs}},
    }


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[CodeServer, httpx.Client]]:
    code_server = CodeServer(config=CodeConfig(timeout_s=2.0))
    with (
        start_in_thread(code_server.build_app()) as running,
        httpx.Client(base_url=running.url, timeout=120) as client,
    ):
        yield code_server, client


def verify(client: httpx.Client, row: dict[str, Any], text: str, **extra: Any) -> dict[str, Any]:
    response = client.post("/verify", json={**row, "response": answer(text), **extra})
    assert response.status_code == 200, response.text
    return response.json()


def test_sandbox_backend_is_reported(server: tuple[CodeServer, httpx.Client]) -> None:
    code_server, _ = server
    assert code_server.sandbox.backend in ("bwrap", "unshare")


@pytest.mark.parametrize("index", sorted(SOLUTIONS))
def test_example_tasks_pass_with_correct_solutions(
    server: tuple[CodeServer, httpx.Client], index: int
) -> None:
    _, client = server
    row = rows(EXAMPLES)[index]
    out = verify(client, row, fenced(SOLUTIONS[index]))
    assert out["reward"] == 1.0, out.get("failure_reason")
    assert out["num_passed"] == out["num_tests"] == len(row["verifier_metadata"]["unit_tests"]["inputs"])
    assert "failure_kind" not in out
    VerifyResponse.model_validate(out)
    assert out["verifier_metadata"] == row["verifier_metadata"]  # the row travels through untouched


def test_wrong_answer_stops_at_first_failure_with_a_reason(server: tuple[CodeServer, httpx.Client]) -> None:
    _, client = server
    row = rows(EXAMPLES)[0]
    out = verify(client, row, fenced("a, b = map(int, input().split())\nprint(a + b if a < 5 else a - b)"))
    assert out["reward"] == 0.0
    assert out["failure_kind"] == "wrong_answer"
    assert [t["outcome"] for t in out["tests"]] == ["pass", "fail"]  # stopped after test 2 of 4
    assert out["num_tests"] == 4 and out["num_passed"] == 1
    assert "test 2 of 4" in out["failure_reason"] and "expected" in out["failure_reason"]


def test_full_results_and_fraction_mode(server: tuple[CodeServer, httpx.Client]) -> None:
    _, client = server
    row = rows(EXAMPLES)[0]
    wrong = fenced("a, b = map(int, input().split())\nprint(a + b if a < 5 else a - b)")
    full = verify(client, row, wrong, full_results=True)
    assert [t["outcome"] for t in full["tests"]] == ["pass", "fail", "fail", "pass"]
    assert full["reward"] == 0.0
    assert full["reward_components"] == {"tests_passed_fraction": 0.5}
    fraction = verify(client, row, wrong, reward_mode="fraction")
    assert fraction["reward"] == 0.5 and fraction["num_passed"] == 2


def test_no_code_and_syntax_error(server: tuple[CodeServer, httpx.Client]) -> None:
    _, client = server
    row = rows(EXAMPLES)[0]
    out = verify(client, row, "I think the answer is to add them.")
    assert (out["reward"], out["failure_kind"]) == (0.0, "no_code")
    out = verify(client, row, fenced("def broken(:\n    pass"))
    assert (out["reward"], out["failure_kind"]) == (0.0, "syntax_error")
    assert "SyntaxError" in out["failure_reason"]


def test_runtime_error_reports_exception_and_stderr_tail(server: tuple[CodeServer, httpx.Client]) -> None:
    _, client = server
    out = verify(client, rows(EXAMPLES)[0], fenced("x = int(input().split()[0])\nprint(1 // (x - x))"))
    assert (out["reward"], out["failure_kind"]) == (0.0, "runtime_error")
    assert out["tests"][0]["exception"] == "ZeroDivisionError"
    assert "ZeroDivisionError" in out["stderr_tail"]


def test_nonzero_exit_is_a_runtime_error_and_exit_zero_is_not(
    server: tuple[CodeServer, httpx.Client],
) -> None:
    _, client = server
    row = rows(EXAMPLES)[0]
    out = verify(
        client, row, fenced("import sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit(3)")
    )
    assert out["failure_kind"] == "runtime_error" and out["tests"][0]["exit_code"] == 3
    out = verify(
        client, row, fenced("import sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit(0)")
    )
    assert out["reward"] == 1.0


def test_function_task_missing_function_and_wrong_return(server: tuple[CodeServer, httpx.Client]) -> None:
    _, client = server
    row = rows(EXAMPLES)[3]
    out = verify(client, row, fenced("def palindrome(s):\n    return True"))
    assert out["failure_kind"] == "runtime_error" and out["tests"][0]["exception"] == "NameError"
    out = verify(client, row, fenced("def is_palindrome(s):\n    return True"))
    assert out["failure_kind"] == "wrong_answer" and out["num_passed"] == 1


def test_time_limit(server: tuple[CodeServer, httpx.Client]) -> None:
    _, client = server
    out = verify(client, rows(EXAMPLES)[0], fenced("import time\ntime.sleep(60)"))
    assert (out["reward"], out["failure_kind"]) == (0.0, "timeout")
    assert out["timeouts"] == 1 and out["tests"][0]["outcome"] == "timeout"


def test_state_does_not_leak_between_tests(server: tuple[CodeServer, httpx.Client]) -> None:
    _, client = server
    program = (
        "import os\nfirst = not os.path.exists('seen')\nopen('seen', 'w').write('1')\n"
        "a, b = map(int, input().split())\nprint(a + b if first else 0)"
    )
    out = verify(client, rows(EXAMPLES)[0], fenced(program))
    assert out["reward"] == 1.0  # each test starts with an empty working directory


def test_nemo_gym_reference_tasks(server: tuple[CodeServer, httpx.Client]) -> None:
    _, client = server
    reference = rows(REFERENCE)
    mikhail = (
        "q = int(input())\nfor _ in range(q):\n    n, m, k = map(int, input().split())\n    n, m = abs(n), abs(m)\n"
        "    if max(n, m) > k:\n        print(-1)\n    elif (n + m) % 2 == 1:\n        print(k - 1)\n"
        "    elif (k - max(n, m)) % 2 == 1:\n        print(k - 2)\n    else:\n        print(k)"
    )
    out = verify(client, reference[1], fenced(mikhail))
    assert out["reward"] == 1.0 and out["num_tests"] == 97
    out = verify(client, reference[1], fenced(mikhail.replace("print(k - 2)", "print(k - 3)")))
    assert out["reward"] == 0.0 and out["failure_kind"] == "wrong_answer"
    out = verify(client, reference[0], fenced("print(-1)"))
    assert out["reward"] == 0.0 and out["hash_id"] == reference[0]["hash_id"]


def test_bad_task_rows_are_422_not_crashes(server: tuple[CodeServer, httpx.Client]) -> None:
    _, client = server
    missing = {"responses_create_params": {"input": "x"}, "response": answer(fenced("print(1)"))}
    response = client.post("/verify", json=missing)
    assert response.status_code == 422 and "verifier_metadata" in response.json()["detail"]
    uneven = {**stdio_task(["1"], ["1", "2"]), "response": answer(fenced("print(1)"))}
    response = client.post("/verify", json=uneven)
    assert response.status_code == 422 and "1 inputs but 2 outputs" in response.json()["detail"]
    assert client.get("/health").json()["status"] == "ok"


def test_config_yaml_is_the_default() -> None:
    config = CodeConfig.from_yaml(HERE.parent / "config.yaml")
    assert CodeServer().config == config
    assert config.reward_mode == "all" and config.sandbox == "auto"


def test_harness_refuses_to_run_outside_the_sandbox() -> None:
    """Its clean-up kills every process it can signal, so it must only ever run in its own PID namespace."""
    import subprocess
    import sys

    harness = HERE.parent / "harness.py"
    config = (
        b'{"code": "print(1)", "fn_name": null, "timeout_s": 1, "wall_timeout_s": 2, "output_bytes": 100}\n'
    )
    done = subprocess.run([sys.executable, str(harness)], input=config, capture_output=True, timeout=30)
    assert done.returncode == 2 and b"refusing" in done.stderr and done.stdout == b""


def test_unshare_fallback_runs_the_harness_too() -> None:
    import asyncio

    from gym_bridge.sandbox import Sandbox
    from resources_servers.code.runner import CodeLimits, TestCase, run_code_tests

    sandbox = Sandbox("unshare", max_concurrency=1)
    tests = [TestCase(input="2 3\n", expected="5\n"), TestCase(input="4 4\n", expected="8\n")]
    leaver = (
        "import os\nif os.fork() == 0:\n    os.setsid()\n    import time; time.sleep(60)\n" + SOLUTIONS[0]
    )
    result = asyncio.run(run_code_tests(sandbox, leaver, tests, limits=CodeLimits(timeout_s=2)))
    assert result.all_passed, result.failure_reason
    wrong = asyncio.run(run_code_tests(sandbox, "print(5)", tests, limits=CodeLimits(timeout_s=2)))
    assert wrong.failure_kind == "wrong_answer" and wrong.num_passed == 1


def test_start_up_says_which_sandbox_is_in_force(capfd: pytest.CaptureFixture[str]) -> None:
    code_server = CodeServer(config=CodeConfig(sandbox="bwrap"))
    with start_in_thread(code_server.build_app()):
        pass
    err = capfd.readouterr().err
    assert "code server: sandbox bwrap (" in err and code_server.sandbox.backend == "bwrap"


@pytest.mark.parametrize("field", ["inputs", "outputs"])
@pytest.mark.parametrize("value", [None, 3, {"a": 1}, ["line", 2]])
def test_stdin_test_data_must_be_text(
    server: tuple[CodeServer, httpx.Client], field: str, value: Any
) -> None:
    _, client = server
    row = stdio_task(["1 2\n"], ["3\n"])
    row["verifier_metadata"]["unit_tests"][field][0] = value
    response = client.post("/verify", json={**row, "response": answer(fenced("print(3)"))})
    assert response.status_code == 422 and f"{field}[0] must be text" in response.json()["detail"]
    lines = stdio_task([["1 2"]], [["3"]])  # lists of lines are text too
    assert verify(client, lines, fenced("a, b = map(int, input().split())\nprint(a + b)"))["reward"] == 1.0


def test_near_miss_integer_programs_score_zero(server: tuple[CodeServer, httpx.Client]) -> None:
    """Over HTTP: printing a+b+1 against answers 2000000000 and 1000000007 scores 0; a+b scores 1."""
    _, client = server
    row = stdio_task(["1000000000 1000000000\n", "1000000000 7\n"], ["2000000000\n", "1000000007\n"])
    wrong = verify(client, row, fenced("a, b = map(int, input().split())\nprint(a + b + 1)"))
    assert wrong["reward"] == 0.0 and wrong["failure_kind"] == "wrong_answer"
    right = verify(client, row, fenced("a, b = map(int, input().split())\nprint(a + b)"))
    assert right["reward"] == 1.0


def test_near_miss_and_huge_return_values_score_zero(server: tuple[CodeServer, httpx.Client]) -> None:
    _, client = server
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "solve"}]},
        "verifier_metadata": {"unit_tests": {"inputs": [["1000000000", "7"]], "outputs": [1000000007], "fn_name": "f"}},
    }
    near = verify(client, row, fenced("def f(a, b):\n    return int(a) + int(b) + 1"))
    assert near["reward"] == 0.0
    huge = verify(client, row, fenced("def f(a, b):\n    return 10**400"))
    assert huge["reward"] == 0.0  # was an HTTP 500 (OverflowError)
    right = verify(client, row, fenced("def f(a, b):\n    return int(a) + int(b)"))
    assert right["reward"] == 1.0
