"""NeMo Gym 0.7.0's own Environment Server driving a gym-bridge resources server through the typed session protocol.

NeMo Gym's ``single_agent_turn_legacy`` Environment Server takes each task row, seeds our server with a
``ResourcesSeedSessionRequest`` (its own ``resources_session_id``), seeds NeMo Gym's ``simple_agent`` with a
direct-HTTP grant to our tools (the seed answer's cookie), runs the agent turn against a scripted model,
verifies with our ``/verify`` under that cookie and closes the session with ``/close_session``. Run it with
this checkout's Python; NeMo Gym 0.7.0 comes from ``--nemo-gym-venv`` (``bash ../shared/tools/nemo_gym/install.sh``
or ``scripts/nemo_gym_venv.sh``)::

    .venv/bin/python scripts/nemo_gym_environment_server.py --nemo-gym-venv /tmp/nemogym-dev/venv

The model is scripted (``tests/fake_model.py``): for each tool_use task it makes the task's reference or
expected calls, then says "Done."; for each math task it answers ``\\boxed{<expected_answer>}``. Every rollout
should score 1.0, and a second pass with a model that only says "Done." should score 0.0 (tool_use's rewards
come from the session's final store, so a lost or mixed-up session would show). Exit 0 when the rewards are
as expected and our server's ``/health`` shows each typed session seeded and closed. ``--server math``
or ``--server tool_use`` (default: both, one after the other).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fake_model import FakeModel, function_call  # noqa: E402

CONFIG = """\
config_paths:
  - environment_servers/single_agent_turn_legacy/configs/single_agent_turn_legacy.yaml
{server}_single_agent_turn:
  _inherit_from: single_agent_turn_legacy
  environment_servers:
    single_agent_turn_legacy:
      resources_server:
        type: resources_servers
        name: {server}
      agent_server:
        type: responses_api_agents
        name: {server}_simple_agent
      resources_tool_transports:
      - direct_http
"""


def oracle(server: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A script for FakeModel, per task prompt: tool_use, the task's calls first, then "Done."; math, the answer."""
    script: dict[str, Any] = {}
    for row in rows:
        prompt = row["responses_create_params"]["input"][-1]["content"]
        if server == "math":
            script[prompt] = f"The answer is \\boxed{{{row['expected_answer']}}}."
            continue
        meta = row["verifier_metadata"]
        calls = meta.get("reference_calls") or meta.get("expected_calls")

        def reply(request: dict[str, Any], n: int, calls: list[dict[str, Any]] = calls) -> Any:
            done = any(i.get("type") == "function_call_output" for i in request.get("input", []) if isinstance(i, dict))
            if done:
                return "Done."
            return [function_call(c["name"], c["arguments"], call_id=f"call_{i}") for i, c in enumerate(calls)]

        script[prompt] = reply
    return script


def wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"gym env start exited {proc.returncode}; see {path}")
        time.sleep(2)
    raise TimeoutError(f"'{text}' not in {path} after {timeout_s:.0f} s")


def health(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
        return json.loads(answer.read())


def our_url(server: str, log: Path) -> str:
    """Where NeMo Gym started our server (its entrypoint says so in the log)."""
    found = re.search(rf"gym-bridge {server} resources server listening on (http://[0-9.:]+)", log.read_text())
    if found is None:
        raise RuntimeError(f"our {server} server's address is not in {log}")
    return found.group(1)


def eval_run(server: str, gym: str, work: Path, rows_path: Path, out: Path) -> list[dict[str, Any]]:
    # Every flat row to our Environment Server (the config's own legacy_agent server fronts the same agent).
    cmd = [gym, "eval", "run", "--no-serve", "--agent", f"{server}_simple_agent", "--input", str(rows_path),
           "--output", str(out), "--disable-aggregation", "+environment_routing_mode=legacy",
           f"+environment_server_name={server}_single_agent_turn"]  # fmt: skip
    log = work / f"eval_{out.stem}.log"
    with open(log, "w") as f:
        code = subprocess.run(cmd, cwd=work, stdout=f, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"gym eval run exited {code}; see {log}")
    return [json.loads(line) for line in out.read_text().splitlines()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nemo-gym-venv", default=os.environ.get("NG_VENV", "/tmp/nemogym-dev/venv"))
    parser.add_argument("--server", choices=["math", "tool_use"], action="append")
    parser.add_argument("--limit", type=int, default=9, help="example tasks to run per server")
    args = parser.parse_args()
    failures = []
    for server in args.server or ["math", "tool_use"]:
        failures += check(server, Path(args.nemo_gym_venv), args.limit)
    for failure in failures:
        print(f"FAILED: {failure}")
    print("all passed" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


def check(server: str, ng: Path, limit: int) -> list[str]:
    """One server under NeMo Gym's Environment Server; what went wrong."""
    gym = str(ng / "bin" / "gym")
    rows = [json.loads(line) for line in (REPO / "resources_servers" / server / "data" / "example.jsonl").read_text().splitlines()]
    rows = rows[:limit]
    work = Path(tempfile.mkdtemp(prefix="ng_env_server_"))
    print(f"{server}: work dir {work}")
    rows_path = work / "tasks.jsonl"
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    venvs = work / "venvs"
    our_venv = Path(sys.executable).parents[1]
    links = {f"resources_servers/{server}": our_venv}
    for d in ("responses_api_agents/simple_agent", "responses_api_models/openai_model",
              "environment_servers/legacy_agent", "environment_servers/single_agent_turn_legacy"):  # fmt: skip
        links[d] = ng
    for d, target in links.items():
        (venvs / d).mkdir(parents=True, exist_ok=True)
        (venvs / d / ".venv").symlink_to(target)
    (work / "env_server.yaml").write_text(CONFIG.format(server=server))
    failures: list[str] = []
    with FakeModel(oracle(server, rows)) as model:
        cmd = [gym, "env", "start", "--search-dir", str(REPO), "--config", str(REPO / "resources_servers" / server / "configs" / f"{server}.yaml"),
               "--config", str(work / "env_server.yaml"), "--model-type", "openai_model", "--model-url", model.url,
               "--model", "scripted", "--model-api-key", "none", f"+uv_venv_dir={venvs}", "+skip_venv_if_present=true"]  # fmt: skip
        log = work / "env_start.log"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, cwd=work, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            wait_for(log, "servers ready!", proc)
            url = our_url(server, log)
            before = health(url)
            solved = eval_run(server, gym, work, rows_path, work / "solved.jsonl")
            rewards = [r.get("reward") for r in solved]
            print(f"  a model that does each task: {len(solved)} rollouts, rewards {rewards}")
            if rewards != [1.0] * len(rows):
                failures.append(f"{server}: expected every reward 1.0, got {rewards} (first: {json.dumps(solved[0])[:600]})")
            after = health(url)
            print(f"  our server's /health before: {before}\n                       after:  {after}")
            closed = after.get("closed_resources_sessions", 0) - before.get("closed_resources_sessions", 0)
            if closed < len(rows) or after.get("resources_sessions", 0) != 0:
                failures.append(f"{server}: expected {len(rows)} typed sessions closed and none open, /health says {after}")
            model.script = {}  # now a model that only talks: the stores stay as they started
            model.default = lambda request, n: "Done."
            idle = eval_run(server, gym, work, rows_path, work / "idle.jsonl")
            idle_rewards = [r.get("reward") for r in idle]
            print(f"  a model that only says 'Done.': rewards {idle_rewards}")
            if idle_rewards != [0.0] * len(rows):
                failures.append(f"{server}: expected every reward 0.0 from a model that does nothing, got {idle_rewards}")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
    return failures


if __name__ == "__main__":
    sys.exit(main())
