"""Live check: NeMo Gym 0.7.0's own HTTP client passes our servers' request guard (gym_bridge/serving/request_guard.py).

Starts our tool_use server, then, in NeMo Gym's venv, sends ``/seed_session``, ``/verify`` and ``/health`` through
``nemo_gym.server_utils.request`` (the aiohttp client every NeMo Gym agent and collector uses) under the
server's ``127.0.0.1`` and ``localhost`` names; every answer must be 200. Usage:

    .venv/bin/python scripts/check_nemo_gym_client_guard.py --ng-python /tmp/nemogym-dev/venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.tool_use.app import ToolUseServer

ROW = Path(__file__).resolve().parents[1] / "resources_servers/tool_use/data/example.jsonl"
NEMO_GYM_SIDE = """
import asyncio, json, os, sys
from nemo_gym.server_utils import request

async def main(url, row):
    statuses = {}
    for name, method, path, body in [("seed_session", "POST", "/seed_session", row),
                                     ("verify", "POST", "/verify", {**row, "response": {"output": []}}),
                                     ("health", "GET", "/health", None)]:
        answer = await request(method, url + path, **({"json": body} if body is not None else {}))
        statuses[name] = [answer.status, (await answer.text())[:200]]
    print(json.dumps(statuses))

asyncio.run(main(os.environ["CHECK_URL"], json.loads(sys.stdin.read())))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ng-python", required=True, help="The Python of a venv with nemo-gym 0.7.0 installed.")
    args = parser.parse_args()
    row = ROW.read_text().splitlines()[0]
    failed = False
    with start_in_thread(ToolUseServer().build_app()) as running:
        for url in (running.url, running.url.replace("127.0.0.1", "localhost")):
            done = subprocess.run(
                [args.ng_python, "-c", NEMO_GYM_SIDE], input=row, capture_output=True, text=True, timeout=300,
                cwd="/", env={**os.environ, "CHECK_URL": url},
            )  # fmt: skip  # cwd: not the repository, whose resources_servers would shadow NeMo Gym's
            if done.returncode != 0:
                raise SystemExit(f"NeMo Gym side failed:\n{done.stderr[-2000:]}")
            statuses = json.loads(done.stdout.strip().splitlines()[-1])
            print(url, {name: status for name, (status, _) in statuses.items()})
            failed |= any(status != 200 for status, _ in statuses.values())
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
