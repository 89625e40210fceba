"""NeMo Gym 0.7.0's own tools on a `gym-bridge collect` file, and how our server stops under NeMo Gym.

Run where NeMo Gym is installed in its own venv (``NG_VENV``, default /tmp/nemogym-dev/venv), with the
project's Python::

    .venv/bin/python scripts/nemo_gym_live_check.py [--ng-venv DIR] [--tasks 20] [--skip-background-sigint] [--vendor]

One fake OpenAI model (tests/fake_model.py, in this process: right on most arithmetic tasks, wrong on
some) answers both sides. Steps, each printed with its figures:

1. ``gym-bridge collect --env math`` on the tasks, and NeMo Gym's ``gym eval run --no-serve --agent
   math_simple_agent`` on the same tasks against our math server started by ``gym env start`` from
   ``resources_servers/math/configs/math.yaml``: each line of ours equals NeMo Gym's, byte for byte, apart
   from the ids and times the model made up; rewards equal.
2. ``gym eval aggregate`` on our file (against the running ``gym env start``): exit 0, key metrics equal
   to the ones collect wrote.
3. SIGINT to ``gym env start``'s process group, as a terminal's Ctrl-C sends it: seconds to exit, exit
   status, which servers NeMo Gym had to kill, what is left.
4. ``gym eval reverify`` on our file with ``configs/math_reverify.yaml`` (our server alone) and with
   ``configs/math.yaml`` plus a model: exit status, rewards unchanged, server processes left behind.
5. NeMo Gym's own pydantic models re-dump every record of a ``collect --env tool_use`` run (tool calls)
   and of step 1 unchanged: the shape is NeMo Gym's.
6. (unless --skip-background-sigint) the same SIGINT when ``gym`` was started as a background job of a
   script (SIGINT ignored by ``gym`` itself), for our math server and for NeMo Gym's own string_match.

``--vendor`` rewrites tests/data/nemo_gym/math_rollout_of_our_server_0.7.0.json from step 1. Exit status 0
when steps 1, 2, 4 and 5 hold. Only processes this script started are signalled (by their session).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from fake_model import FakeModel, function_call, message, solve_arithmetic  # noqa: E402

USAGE = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 8,
         "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 18}  # fmt: skip
MODEL_NAME = "fake-model"


def answer(request: dict[str, Any], n: int) -> dict[str, Any]:
    """Right unless the right value is a multiple of 3 (then one more): a mix of rewards, the same each time."""
    text = solve_arithmetic(request, n)
    found = re.search(r"\\boxed\{(-?\d+)\}", text)
    if found and int(found.group(1)) % 3 == 0:
        text = text.replace(found.group(0), "\\boxed{" + str(int(found.group(1)) + 1) + "}")
    return {"output": [message(text)], "usage": USAGE, "metadata": {}}


def tool_then_answer(request: dict[str, Any], n: int) -> Any:
    return [function_call("list_products", {})] if n == 1 else "Done."


def made_up(line: str) -> str:
    """The line without what the model made up (ids, creation time)."""
    line = re.sub(r'"id":"(resp|msg|fc|rs)_[^"]*"', r'"id":"\1_*"', line)
    return re.sub(r'"created_at":[0-9.]+', '"created_at":0', line)


def by_key(path: Path) -> dict[tuple[int, int], str]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return {(json.loads(ln)["_ng_task_index"], json.loads(ln)["_ng_rollout_index"]): ln for ln in lines}


def rewards(path: Path) -> dict[tuple[int, int], float]:
    return {key: json.loads(line)["reward"] for key, line in by_key(path).items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_processes(sid: int) -> list[str]:
    """Live processes of session ``sid`` (the ``gym`` this script started, and what it started)."""
    out = subprocess.run(["ps", "-eo", "pid=,sid=,stat=,args="], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        pid, s, stat, args = line.split(None, 3)
        if int(s) == sid and not stat.startswith("Z"):
            found.append(f"{pid} {args[:100]}")
    return found


def kill_session(sid: int) -> None:
    for line in session_processes(sid):
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


class Gym:
    """NeMo Gym's CLI from its venv, each ``gym`` in a session of its own."""

    def __init__(self, ng_venv: Path, work: Path) -> None:
        self.gym = str(ng_venv / "bin" / "gym")
        self.work = work
        self.venvs = work / "venvs"
        ours = Path(sys.prefix)  # the project's venv
        links = {f"resources_servers/{s}": ours for s in ("math", "code", "tool_use")}
        links.update({d: ng_venv for d in ("responses_api_agents/simple_agent", "responses_api_models/openai_model",
                                           "environment_servers/legacy_agent", "resources_servers/string_match")})
        for where, venv in links.items():
            (self.venvs / where).mkdir(parents=True, exist_ok=True)
            if not (self.venvs / where / ".venv").exists():
                (self.venvs / where / ".venv").symlink_to(venv)
        # NeMo Gym's head server on a port of its own (not the default 11000 another NeMo Gym may hold)
        self.venv_args = [f"+uv_venv_dir={self.venvs}", "+skip_venv_if_present=true", f"++head_server.port={free_port()}"]
        # a Ray cluster of its own: ray.init() would join any other cluster running on the machine
        self.env = {**os.environ, "RAY_ADDRESS": "local"}

    def model_args(self, url: str) -> list[str]:
        return ["--model-type", "openai_model", "--model-url", url, "--model", MODEL_NAME, "--model-api-key", "none"]

    def run(self, args: list[str], log: str, timeout: float = 600) -> tuple[int, float, int]:
        """(exit status, seconds, session id) of ``gym ARGS``, its output in ``log``."""
        started = time.monotonic()
        with open(self.work / log, "w") as out:
            proc = subprocess.Popen([self.gym, *args], cwd=self.work, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, env=self.env)  # fmt: skip
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_session(proc.pid)
                code = -9
        return code, time.monotonic() - started, proc.pid

    def start_env(self, servers: list[str], model_url: str, log: str, ignore_sigint: bool = False) -> subprocess.Popen:
        """``gym env start`` with these resources servers, until all its servers answer."""
        args = ["env", "start", "--search-dir", str(REPO)]
        for name in servers:
            args += ["--resources-server", name]
        out = open(self.work / log, "w")
        proc = subprocess.Popen(
            [self.gym, *args, *self.model_args(model_url), *self.venv_args], cwd=self.work, stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=self.env,
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while "servers ready!" not in (self.work / log).read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                kill_session(proc.pid)
                raise SystemExit(f"gym env start did not come up; see {self.work / log}")
            time.sleep(2)
        time.sleep(2)
        return proc

    def sigint_group(self, proc: subprocess.Popen, log: str, wait_s: float = 240) -> dict[str, Any]:
        """SIGINT to the whole process group; how long until ``gym`` exits, and what it said and left."""
        text_before = len((self.work / log).read_text())
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            code = None
        seconds = time.monotonic() - started
        time.sleep(3)
        said = (self.work / log).read_text()[text_before:]
        left = session_processes(proc.pid)
        kill_session(proc.pid)
        killed = re.search(r"Some processes \(([^)]*)\) didn't shutdown", said)
        unexpected = re.search(r"Process `([^`]*)` finished unexpectedly", said)
        return {"exit": code, "seconds": round(seconds, 1), "killed_by_nemo_gym": killed.group(1) if killed else "",
                "finished_unexpectedly": unexpected.group(1) if unexpected else "", "left": left}  # fmt: skip


def key_metrics(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())[0]["key_metrics"]


def collect(tasks: Path, out: Path, env: str, model_url: str, repeats: int) -> None:
    command = [sys.executable, "-m", "gym_bridge.cli", "collect", str(tasks), "-o", str(out), "--env", env,
               "--model-url", model_url, "--model", MODEL_NAME, "--num-repeats", str(repeats), "--concurrency", "4",
               "--no-progress", "--overwrite"]  # fmt: skip
    subprocess.run(command, check=True, cwd=REPO, stdout=subprocess.DEVNULL)


NG_REDUMP = """
import json, sys
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
bad = 0
lines = [line for path in sys.argv[1:] for line in open(path) if line.strip()]
for line in lines:
    rec = json.loads(line)
    for key, model in (("response", NeMoGymResponse), ("responses_create_params", NeMoGymResponseCreateParamsNonStreaming)):
        theirs = json.dumps(model.model_validate(rec[key]).model_dump(mode="json"))
        if theirs != json.dumps(rec[key]):
            bad += 1
            print("differs:", key, rec["_ng_task_index"], file=sys.stderr)
print(json.dumps({"records": len(lines), "differing": bad}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ng-venv", type=Path, default=Path(os.environ.get("NG_VENV", "/tmp/nemogym-dev/venv")))
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--skip-background-sigint", action="store_true")
    parser.add_argument("--vendor", action="store_true")
    args = parser.parse_args()
    if not (args.ng_venv / "bin" / "gym").exists():
        raise SystemExit(f"NeMo Gym not found at {args.ng_venv} (install it: scripts/nemo_gym_venv.sh, or --ng-venv)")
    work = args.work or Path(tempfile.mkdtemp(prefix="nemo-gym-live-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work dir: {work}")
    gym = Gym(args.ng_venv, work)
    tasks = work / "tasks.jsonl"
    tasks.write_text("".join((REPO / "recipes/data/arith_val.jsonl").read_text().splitlines(True)[: args.tasks]))
    ok = True
    report: dict[str, Any] = {}

    with FakeModel(answer, model_name=MODEL_NAME) as model:
        # 1. both sides write the same records
        ours = work / "ours.jsonl"
        collect(tasks, ours, "math", model.url, args.repeats)
        env = gym.start_env(["math"], model.url, "env_start.log")
        code, seconds, _ = gym.run(["eval", "run", "--no-serve", "--agent", "math_simple_agent", "--input", str(tasks),
                                    "--output", str(work / "theirs.jsonl"), "--num-repeats", str(args.repeats),
                                    gym.venv_args[-1]],
                                   "eval_run.log")  # fmt: skip
        theirs = work / "theirs.jsonl"
        mine, their = by_key(ours), by_key(theirs) if theirs.exists() else {}
        same = sum(made_up(mine[k]) == made_up(their.get(k, "")) for k in mine)
        report["1 records"] = {"gym eval run exit": code, "ours": len(mine), "nemo_gym": len(their),
                               "equal apart from ids and times": same,
                               "rewards equal": rewards(ours) == rewards(theirs) if their else False,
                               "mean reward": sum(rewards(ours).values()) / max(len(mine), 1)}  # fmt: skip
        ok &= code == 0 and same == len(mine) == len(their) > 0

        # 2. gym eval aggregate on our file, against the running servers
        code, seconds, _ = gym.run(["eval", "aggregate", "-i", str(ours), "-o", str(work / "aggregated.jsonl"),
                                    gym.venv_args[-1]], "aggregate.log")  # fmt: skip
        agg = work / "aggregated_aggregate_metrics.json"
        ours_agg = key_metrics(work / "ours_aggregate_metrics.json")
        theirs_agg = key_metrics(agg) if agg.exists() else None
        report["2 gym eval aggregate"] = {"exit": code, "key metrics equal to collect's": theirs_agg == ours_agg,
                                          "key metrics": theirs_agg}  # fmt: skip
        ok &= code == 0 and theirs_agg == ours_agg

        # 3. Ctrl-C (SIGINT to the process group) of gym env start
        report["3 SIGINT to gym env start's group (terminal Ctrl-C)"] = gym.sigint_group(env, "env_start.log")

        # 4. gym eval reverify on our file
        for label, config, extra in (
            ("math_reverify.yaml", "math_reverify.yaml", []),
            ("math.yaml + a model", "math.yaml", ["--model-type", "openai_model", f"+policy_base_url={model.url}",
                                                  "+policy_api_key=none", f"+policy_model_name={MODEL_NAME}"]),
        ):
            out = work / f"reverified_{config.split('.')[0]}.jsonl"
            code, seconds, sid = gym.run(
                ["eval", "reverify", "--config", str(REPO / "resources_servers/math/configs" / config),
                 "--search-dir", str(REPO), *extra, *gym.venv_args, "--inputs", str(work / "ours_materialized_inputs.jsonl"),
                 "--rollouts", str(ours), "--output", str(out)], f"reverify_{config}.log")  # fmt: skip
            waited = 0.0  # our server stops by itself once its gym is gone; NeMo Gym's own servers do not
            while any("nemo_gym_app.py" in p for p in session_processes(sid)) and waited < 30:
                time.sleep(0.5)
                waited += 0.5
            left = session_processes(sid)
            kill_session(sid)
            same_rewards = out.exists() and rewards(out) == rewards(ours)
            report[f"4 gym eval reverify ({label})"] = {"exit": code, "seconds": round(seconds, 1),
                                                        "rewards unchanged": same_rewards, "processes left": left,
                                                        "seconds until our server was gone": waited}  # fmt: skip
            ok &= code == 0 and same_rewards
        ours_left = [p for key, value in report.items() if key.startswith("4") for p in value["processes left"]
                     if "nemo_gym_app.py" in p]  # fmt: skip
        ok &= not ours_left

    # 5. NeMo Gym's models re-dump our records unchanged (a tool_use run: function calls and outputs too)
    with FakeModel(tool_then_answer, model_name=MODEL_NAME) as model:
        tool_tasks = work / "tool_tasks.jsonl"
        tool_tasks.write_text("".join((REPO / "resources_servers/tool_use/data/example.jsonl").read_text().splitlines(True)[:4]))
        collect(tool_tasks, work / "tool_use.jsonl", "tool_use", model.url, 1)
    redump = subprocess.run([str(args.ng_venv / "bin" / "python"), "-c", NG_REDUMP, str(work / "tool_use.jsonl"), str(ours)],
                            capture_output=True, text=True)  # fmt: skip
    shape = json.loads(redump.stdout or "{}")
    report["5 NeMo Gym's models re-dump our records"] = shape or redump.stderr[-500:]
    ok &= bool(shape) and shape["differing"] == 0

    # 6. SIGINT to the group when gym ignores SIGINT (started as a background job of a script)
    if not args.skip_background_sigint:
        with FakeModel(answer, model_name=MODEL_NAME) as model:
            for server in ("math", "string_match"):
                env = gym.start_env([server], model.url, f"env_start_bg_{server}.log", ignore_sigint=True)
                report[f"6 SIGINT to the group, gym ignoring SIGINT ({server})"] = gym.sigint_group(
                    env, f"env_start_bg_{server}.log"
                )

    if args.vendor:
        key = min(mine)
        row = json.loads(tasks.read_text().splitlines()[key[0]])
        materialized = {
            (json.loads(ln)["_ng_task_index"], json.loads(ln)["_ng_rollout_index"]): ln
            for ln in (work / "theirs_materialized_inputs.jsonl").read_text().splitlines()
        }
        target = REPO / "tests/data/nemo_gym/math_rollout_of_our_server_0.7.0.json"
        doc = json.loads(target.read_text())
        doc.update(task_row=row, materialized_input=materialized[key], record=their[key],
                   model_answer=json.loads(their[key])["response"]["output"][-1]["content"][0]["text"])  # fmt: skip
        target.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"vendored {target}")

    print(json.dumps(report, indent=2))
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
