"""Hostile answers over real HTTP: no answer runs as code, reads the expected answer, changes a later
reward or holds a worker past its deadline (issue 33, finding 1); and the guards themselves.

Some reasoning-gym scorers ``eval`` the answer (spiral_matrix, string_insertion, binary_matrix, n_queens)
or hand it to ``sympy.parse_expr`` (countdown, puzzle24, polynomial_multiplication, the integration
families). Before the scorer workers, each attack below worked against the server, as root.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import reasoning_gym
from reasoning_gym.factory import DATASETS

from gym_bridge.rollout.envs import running_env
from resources_servers.reasoning_gym import guards
from resources_servers.reasoning_gym.generate import task_rows
from resources_servers.reasoning_gym.tests.helpers import answered

EVALING = ["spiral_matrix", "string_insertion", "binary_matrix", "n_queens"]
PARSING = ["countdown", "puzzle24", "polynomial_multiplication", "simple_integration", "intermediate_integration"]
FAMILIES = [f for f in EVALING + PARSING if f in DATASETS]
REPO = Path(__file__).resolve().parents[3]

RUN = "import os; os.system('id > {marker}')"
READ = (
    "import sys\nf = sys._getframe()\nwhile f is not None and 'entry' not in f.f_locals:\n    f = f.f_back\n"
    "open('{marker}', 'w').write(repr(f.f_locals['entry']))"
)  # the scorer's frame holds the expected answer; an eval'd answer sees it, a parsed one walks up to it
TAKEOVER = (
    "import sys\nfor m in list(sys.modules.values()):\n    try:\n        if getattr(m, '_scorer', None) is not None:\n"
    "            m._scorer = lambda family: (lambda answer, entry: 1.0)\n    except Exception:\n        pass"
)  # every later /verify of every family scored 1.0 after this one


@pytest.fixture(scope="module")
def client():
    with running_env("reasoning_gym", pool_size=2, worker_memory_mb=1536) as url:
        with httpx.Client(base_url=url, timeout=60) as c:
            yield c


@pytest.fixture(scope="module")
def marker_dir():
    """World-writable, so a marker would appear even if the code ran under the workers' own uid."""
    path = Path(tempfile.mkdtemp(prefix="rg-isolation-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def live_pids(client, n: int) -> list[int]:
    """The workers' pids once ``n`` are up (a retired worker's replacement takes a moment)."""
    deadline = time.monotonic() + 60
    while len(pids := client.get("/health").json()["scorer_pool"]["pids"]) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def package_score(family, answer, row):
    entry = {"question": row["question"], "answer": row["answer"], "metadata": row["metadata"]}
    return float(reasoning_gym.get_score_answer_fn(family)(answer=answer, entry=entry))


def attacks(marker_dir: Path, family: str) -> dict[str, tuple[str, Path]]:
    made = {}
    for name, code in {"run": RUN, "read": READ}.items():
        marker = marker_dir / f"{family}-{name}"
        made[name] = (f"exec({code.format(marker=marker)!r}) or []", marker)
    marker = marker_dir / f"{family}-import"
    made["import"] = (f"__import__('os').system('id > {marker}') or []", marker)  # the issue's own answer
    return made


def test_every_evaluating_family_of_the_issue_is_installed():
    assert FAMILIES == EVALING + PARSING


@pytest.mark.parametrize("family", FAMILIES)
def test_code_in_an_answer_neither_runs_nor_reads_the_expected_answer(client, marker_dir, family):
    (row,) = task_rows([family], 1, seed=0)
    garbage = package_score(family, "certainly not this", row)
    for name, (text, marker) in attacks(marker_dir, family).items():
        out = client.post("/verify", json=answered(row, f"<answer>{text}</answer>"))
        assert out.status_code == 200, out.text
        body = out.json()
        assert not marker.exists(), f"{family}/{name}: the answer ran: {marker.read_text()[:200]!r}"
        assert "uid=" not in json.dumps(body)
        assert body["reward"] == garbage, (family, name, body["reward"])  # scored as any unparsable answer
        assert body["failure_kind"] == "answer_refused" and body["failure_reason"].startswith("refused"), body
    right = client.post("/verify", json=answered(row, f"<answer>{row['answer']}</answer>")).json()
    assert right["reward"] == 1.0 and right["failure_kind"] is None


def test_reading_the_expected_answer_no_longer_scores(client):
    """Answers built from the expected answer: on the old server these scored 1.0 (a parsed answer that
    walks up to the scorer's frame) and 0.1 (spiral_matrix's partial credit for an eval'd list)."""
    walk = "__import__('sympy').sympify(__import__('sys')._getframe(3).f_locals['entry']['answer'])"
    (poly,) = task_rows(["polynomial_multiplication"], 1, seed=0)
    out = client.post("/verify", json=answered(poly, f"<answer>{walk}</answer>")).json()
    assert out["reward"] == 0.0 and out["failure_kind"] == "answer_refused"
    (spiral,) = task_rows(["spiral_matrix"], 1, seed=0)
    out = client.post("/verify", json=answered(spiral, "<answer>entry['answer'].split()</answer>")).json()
    assert out["reward"] == 0.0 and out["failure_kind"] == "answer_refused"


@pytest.mark.parametrize("family", [f for f in ("simple_integration", "intermediate_integration") if f in DATASETS])
def test_restating_the_integral_is_not_an_answer(client, family):
    """``Integral(f, x)`` (or ``integrate(f, x)``) differentiates back to ``f``: the package pays it 1.0."""
    (row,) = task_rows([family], 1, seed=0)
    integrand, variable = row["metadata"]["integrand"], row["metadata"].get("variable", "x")
    for text in (f"Integral({integrand}, {variable})", f"integrate({integrand}, {variable})"):
        assert package_score(family, text, row) == 1.0
        out = client.post("/verify", json=answered(row, f"<answer>{text}</answer>")).json()
        assert out["reward"] == 0.0 and out["failure_kind"] == "answer_refused", out


@pytest.mark.parametrize("family", FAMILIES)
def test_an_answer_cannot_change_later_rewards(client, family):
    (row,) = task_rows([family], 1, seed=1)
    (arith,) = task_rows(["basic_arithmetic"], 1, seed=1)
    client.post("/verify", json=answered(row, f"<answer>exec({TAKEOVER!r}) or []</answer>"))
    for _ in range(3):  # whichever worker takes them
        banana = client.post("/verify", json=answered(arith, "<answer>banana</answer>")).json()
        assert banana["reward"] == 0.0, family
        right = client.post("/verify", json=answered(arith, f"<answer>{arith['answer']}</answer>")).json()
        assert right["reward"] == 1.0, family
    again = client.post("/verify", json=answered(row, "<answer>banana</answer>")).json()
    assert again["reward"] == package_score(family, "banana", row) < 1.0


def test_scorer_workers_run_without_privileges(client):
    assert len(live_pids(client, 2)) == 2
    pool = client.get("/health").json()["scorer_pool"]
    assert pool["size"] == 2 and pool["live_workers"] == len(pool["pids"]) == 2  # pool_size
    server_pid = os.getpid()  # running_env serves in this process
    for pid in pool["pids"]:
        assert pid != server_pid
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        uids = {int(u) for u in status["Uid"].split()}
        assert status["NoNewPrivs"].strip() == "1"
        limits = Path(f"/proc/{pid}/limits").read_text()
        assert f"Max address space         {1536 << 20}" in limits  # worker_memory_mb
        assert "Max file size             0" in limits
        if os.geteuid() == 0:
            assert 0 not in uids and len(uids) == 1, status["Uid"]
            assert status["Groups"].strip() == ""
        else:
            assert uids == {os.geteuid()}


def test_only_a_check_that_evaluated_text_retires_its_worker(client):
    (arith,) = task_rows(["basic_arithmetic"], 1, seed=2)
    (spiral,) = task_rows(["spiral_matrix"], 1, seed=2)
    live_pids(client, 2)
    before = client.get("/health").json()["scorer_pool"]
    for _ in range(5):
        client.post("/verify", json=answered(arith, f"<answer>{arith['answer']}</answer>"))
    plain = client.get("/health").json()["scorer_pool"]
    assert plain["retired"] == before["retired"] and plain["pids"] == before["pids"]
    listed = "[" + ", ".join(spiral["answer"].split()) + "]"
    out = client.post("/verify", json=answered(spiral, f"<answer>{listed}</answer>")).json()
    assert out["reward"] == 0.1 == package_score("spiral_matrix", listed, spiral)  # a list literal still scores
    after = client.get("/health").json()["scorer_pool"]
    assert after["retired"] == plain["retired"] + 1


def test_a_scorer_that_hangs_is_cut_by_the_timeout():
    with running_env("reasoning_gym", pool_size=1, timeout_s=2.0) as url, httpx.Client(base_url=url, timeout=30) as c:
        for family in ("spiral_matrix", "countdown"):  # Python's ** via eval; SymPy's via parse_expr
            (row,) = task_rows([family], 1, seed=0)
            assert c.post("/verify", json=answered(row, f"<answer>{row['answer']}</answer>")).json()["reward"] == 1.0
            pids = live_pids(c, 1)
            assert len(pids) == 1  # pool_size
            started = time.monotonic()
            out = c.post("/verify", json=answered(row, "<answer>9**9**9**9</answer>")).json()
            took = time.monotonic() - started
            assert out["reward"] == 0.0 and out["failure_kind"] == "scorer_timeout", out
            assert "2 s budget" in out["failure_reason"] and "killed and replaced" in out["failure_reason"]
            assert 2.0 <= took < 15.0, took  # the budget, plus a loaded machine's slack
            right = c.post("/verify", json=answered(row, f"<answer>{row['answer']}</answer>")).json()
            assert right["reward"] == 1.0
            assert live_pids(c, 1) != pids  # the stuck worker was replaced


def test_a_worker_that_dies_mid_check_gives_zero_and_is_replaced():
    with running_env("reasoning_gym", pool_size=1, timeout_s=60.0) as url, httpx.Client(base_url=url, timeout=90) as c:
        (row,) = task_rows(["spiral_matrix"], 1, seed=0)
        (pid,) = live_pids(c, 1)
        checks = c.get("/health").json()["scorer_pool"]["checks"]
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(c.post, "/verify", json=answered(row, "<answer>9**9**9**9</answer>"))
            deadline = time.monotonic() + 30
            while c.get("/health").json()["scorer_pool"]["checks"] == checks and time.monotonic() < deadline:
                time.sleep(0.02)  # until the check is in the worker
            os.kill(pid, signal.SIGKILL)
            out = pending.result().json()
        assert out["reward"] == 0.0 and out["failure_kind"] == "scorer_crashed", out
        assert "failed during the check (it exited)" in out["failure_reason"]
        assert live_pids(c, 1) != [pid]
        right = c.post("/verify", json=answered(row, f"<answer>{row['answer']}</answer>")).json()
        assert right["reward"] == 1.0


# ---------------------------------------------------------------------------------------------- the guards


@pytest.mark.parametrize(
    ("text", "value"),
    [("[[1, 0], [0, 1]]", [[1, 0], [0, 1]]), ("['Q', '_']", ["Q", "_"]), ("((0x3a + 0x1f) << 2) >> 1", 178),
     (" -1.5", -1.5), ("{'a': (1, 2)}", {"a": (1, 2)})],
)  # fmt: skip
def test_literal_eval_keeps_what_the_scorers_evaluate(text, value):
    assert guards.literal_eval(text) == value


@pytest.mark.parametrize(
    "text",
    ["__import__('os')", "entry['answer']", "[x for x in 'ab']", "(lambda: 1)()", "len", "().__class__", "f'{1}'"],
)
def test_literal_eval_refuses_anything_else(text):
    with pytest.raises(guards.RefusedAnswer):
        guards.literal_eval(text)
    with pytest.raises(guards.RefusedAnswer):
        guards.literal_eval(compile("1", "<x>", "eval"))


def _sympy_code(text: str, local_dict=None):
    import builtins
    import types

    from sympy.parsing.sympy_parser import standard_transformations, stringify_expr

    global_dict: dict = {}
    exec("from sympy import *", global_dict)
    global_dict.update({k: v for k, v in vars(builtins).items() if isinstance(v, types.BuiltinFunctionType)})
    local_dict = local_dict or {}
    return stringify_expr(text, local_dict, global_dict, standard_transformations), local_dict, global_dict


@pytest.mark.parametrize(
    "text", ["25*4 + 3 - 1", "x**3/3 + C", "-cos(x) + sqrt(2)*pi + log(Abs(x))", "(1 + 2)*(3 + 4)", "x < 2", "E**x/2"]
)
def test_sympy_guard_lets_math_through(text):
    guards.check_sympy_code(*_sympy_code(text, {"x": object(), "C": object()}))


@pytest.mark.parametrize(
    "text",
    ["exec('1')", "__import__('os')", "Symbol.__new__", "lambdify(x, 'y')", "x.subs(x, 1)", "(lambda: 1)()",
     "integrate(x**2, x)", "Integral(x**2, x)", "Derivative(x**3, x)", "Symbol('x', real=True)",
     "open('/etc/passwd')", "x['a']", "'text'"],
)  # fmt: skip
def test_sympy_guard_refuses_code(text):
    with pytest.raises(guards.RefusedAnswer):
        guards.check_sympy_code(*_sympy_code(text))


def test_sympy_guard_refuses_builtins_left_unconverted():
    """Without SymPy's ``auto_symbol`` (a scorer's own transformations) a builtin name would reach eval."""
    for code in ("type(1)", "object", "memoryview(1)"):
        with pytest.raises(guards.RefusedAnswer):
            guards.check_sympy_code(code, {}, {})
    guards.check_sympy_code("undefined_name + 1", {}, {})  # a NameError later, not code


def test_the_audit_hook_refuses_what_a_guard_bypass_would_try(tmp_path):
    """The second line: were an answer to run despite the guards, an armed check refuses process creation,
    writes, sockets and ctypes (in a fresh interpreter: an audit hook cannot be removed)."""
    probe = f"""
import os, socket, subprocess, sys
from resources_servers.reasoning_gym import guards
guards.install_audit_hook()
guards.state.reset(armed=True)
tries = {{
    "system": lambda: os.system("true"),
    "popen": lambda: subprocess.run(["true"]),
    "fork": os.fork,
    "write": lambda: open({str(tmp_path / "w")!r}, "w"),
    "os_open": lambda: os.open({str(tmp_path / "o")!r}, os.O_WRONLY | os.O_CREAT),
    "socket": lambda: socket.socket(),
    "ctypes": lambda: __import__("ctypes").CDLL(None),
    "kill": lambda: os.kill(os.getpid(), 0),
}}
refused = []
for name, attempt in tries.items():
    try:
        attempt()
    except guards.RefusedAnswer:
        refused.append(name)
guards.state.armed = False
compiled = guards.state.evaluated
guards.state.reset(armed=True)
eval("1 + 1")
guards.state.armed = False
print(sorted(refused), compiled, guards.state.evaluated, open({str(tmp_path / "r")!r}, "w") is not None)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    everything = ["system", "popen", "fork", "write", "os_open", "socket", "ctypes", "kill"]
    assert done.stdout.split("]")[0] + "]" == str(sorted(everything))
    # refusals alone do not mark the check, evaluating text does; disarmed, the hook lets writes through
    assert done.stdout.split("]")[1].split() == ["False", "True", "True"]
    assert not (tmp_path / "w").exists() and not (tmp_path / "o").exists()
