"""NeMo Gym 0.7.0's own session conformance check, run live against each gym-bridge resources server.

Run it with the Python of an environment where NeMo Gym 0.7.0 is installed (it imports ``nemo_gym``);
the servers run from this checkout's environment (``--gym-bridge``, default ``.venv/bin/gym-bridge``)::

    /tmp/nemogym-dev/venv/bin/python scripts/nemo_gym_session_conformance.py

For each server (math, code, tool_use, reasoning_gym, equivalence_judge) it starts ``gym-bridge serve NAME``
as its own process on a free loopback port, then calls
``nemo_gym.testing.session_conformance.check_resources_session_contract`` on an ASGI app that forwards each
request to that process over HTTP (headers and cookies both ways), so NeMo Gym's check drives the real
server through its real HTTP interface: typed seed, repeated seed, close, repeated close, close of a
never-seeded id and, with ``keeps_state`` (tool_use), the refusal of a seed after close. Then, with NeMo
Gym's own models: a typed ``ResourcesVerifyRequest`` on a fresh session (a reward comes back), and for
tool_use one tool call between seed and verify (the session's store changed). With ``--mcp``, tool_use is
also started with ``--expose-tools-over-mcp`` and driven through NeMo Gym's own MCP tool access
(``nemo_gym.tool_access.MCPStreamableHTTPConnection``) from the metadata its seed answer gives.

Exit status 0 when every check passed; the failures are printed by server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SERVERS = ("math", "code", "tool_use", "reasoning_gym", "equivalence_judge")
KEEPS_STATE = {"tool_use"}


def start_server(gym_bridge: str, name: str, extra: list[str]) -> tuple[subprocess.Popen[str], str]:
    """``gym-bridge serve NAME --port 0`` in its own process; its URL once it says it listens."""
    cmd = [gym_bridge, "serve", name, "--port", "0", *extra]
    if name == "equivalence_judge":  # needs a judge to start; no check here reaches it
        cmd += ["--judge-url", "http://127.0.0.1:9/v1", "--judge-model", "unused"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    deadline = time.monotonic() + 180
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"listening on (http://[0-9.:]+)", line)
        if found:
            return proc, found.group(1)
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError(f"{name}: the server did not start: {' '.join(cmd)}")


def forwarding_app(base_url: str) -> Any:
    """An ASGI app that sends each request to ``base_url`` over HTTP and answers with what came back."""
    import httpx

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k.lower() != b"host"]
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
            answer = await client.request(scope["method"], scope["path"], content=body, headers=headers)
        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers.multi_items()
               if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")]  # fmt: skip
        await send({"type": "http.response.start", "status": answer.status_code, "headers": out})
        await send({"type": "http.response.body", "body": answer.content})

    return app


def task_row(name: str) -> dict[str, Any]:
    with open(REPO / "resources_servers" / name / "data" / "example.jsonl") as f:
        return json.loads(f.readline())


def seed_request(name: str, row: dict[str, Any]) -> Any:
    from nemo_gym.base_resources_server import ResourcesSeedSessionRequest
    from nemo_gym.episode_types import EpisodeId, TaskId

    return ResourcesSeedSessionRequest(
        resources_session_id=f"resources-session-{uuid.uuid4().hex}",
        episode_id=EpisodeId(rollout_id=f"rollout-{uuid.uuid4().hex[:12]}", attempt=0),
        task_id=TaskId(taskset=f"gym-bridge:{name}", task_id="0"),
        task_data={k: v for k, v in row.items() if k != "responses_create_params"},
    )


def typed_verify(name: str, url: str, row: dict[str, Any]) -> str:
    """Seed, (tool_use: one tool call), verify with NeMo Gym's ResourcesVerifyRequest, close; what happened."""
    import httpx
    from nemo_gym.base_resources_server import ResourcesCloseSessionRequest, ResourcesVerifyRequest

    seed = seed_request(name, row)
    text = f"\\boxed{{{row['expected_answer']}}}" if "expected_answer" in row else "no answer"  # math: the right one
    response = {"id": "resp_0", "created_at": 0.0, "model": "m", "object": "response", "parallel_tool_calls": True,
                "tool_choice": "auto", "tools": [], "output": [{"id": "msg_0", "type": "message", "role": "assistant",
                "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]}]}  # fmt: skip
    with httpx.Client(base_url=url, timeout=60) as client:
        seeded = client.post("/seed_session", json=seed.model_dump(mode="json"))
        assert seeded.status_code == 200, f"seed: {seeded.status_code} {seeded.text}"
        assert client.cookies, "the typed seed set no session cookie (NeMo Gym's Environment Server needs one)"
        note = ""
        if name == "tool_use":
            pid = sorted(row["initial_state"]["products"])[0]
            added = client.post("/add_to_cart", json={"product_id": pid, "quantity": 1})
            assert added.status_code == 200 and "error" not in added.json(), added.text
            cart = client.post("/view_cart", json={}).json()["cart"]["items"]
            assert [i["product_id"] for i in cart] == [pid], cart
            note = f", cart after add_to_cart: {[i['product_id'] for i in cart]}"
        body = ResourcesVerifyRequest[dict](
            episode_id=seed.episode_id, task_id=seed.task_id,
            verification_input={**seed.task_data, "responses_create_params": row["responses_create_params"],
                                "response": response},
        )  # fmt: skip
        verified = client.post("/verify", json=body.model_dump(mode="json"))
        assert verified.status_code == 200, f"typed verify: {verified.status_code} {verified.text}"
        verdict = verified.json()
        reward = f"{verdict['reward']}" + (f" ({verdict['failure_kind']})" if verdict.get("failure_kind") else "")
        other = body.model_copy(update={"task_id": seed.task_id.model_copy(update={"task_id": "another"})})
        wrong = client.post("/verify", json=other.model_dump(mode="json"))
        assert wrong.status_code == 409, f"a verify naming another task: {wrong.status_code} {wrong.text}"
        close = ResourcesCloseSessionRequest(resources_session_id=seed.resources_session_id, episode_id=seed.episode_id)
        closed = client.post("/close_session", json=close.model_dump(mode="json"))
        assert closed.status_code == 200, closed.text
    return f"typed verify: reward {reward}{note}; a verify naming another task: 409"


async def mcp_round(url: str, row: dict[str, Any]) -> str:
    """tool_use over MCP with NeMo Gym's own MCP tool access, from the metadata a typed seed answers with."""
    import httpx
    from nemo_gym.base_resources_server import ResourcesSeedSessionResponse
    from nemo_gym.tool_access import MCPStreamableHTTPConnection

    seed = seed_request("tool_use", row)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        seeded = await client.post("/seed_session", json=seed.model_dump(mode="json"))
        meta = ResourcesSeedSessionResponse.model_validate(seeded.json()).resources_tools
        assert meta is not None, f"no resources_tools in {seeded.text}"
        connection = MCPStreamableHTTPConnection(url=f"{url}/{meta.url_path.lstrip('/')}", headers=meta.headers)
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        async with (
            httpx.AsyncClient(headers=connection.headers, timeout=60) as http,
            streamable_http_client(str(connection.url), http_client=http) as (read, write, _),
        ):
            async with ClientSession(read, write) as mcp:
                await mcp.initialize()
                names = sorted(t.name for t in (await mcp.list_tools()).tools)
                pid = sorted(row["initial_state"]["products"])[0]
                added = await mcp.call_tool("add_to_cart", {"product_id": pid, "quantity": 1})
                assert not added.isError, added
        cart = (await client.post("/view_cart", json={})).json()["cart"]["items"]
        assert [i["product_id"] for i in cart] == [pid], cart
    return f"MCP: {len(names)} tools listed ({', '.join(names)}); add_to_cart over MCP shows in the HTTP cart"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gym-bridge", default=str(REPO / ".venv" / "bin" / "gym-bridge"))
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--mcp", action="store_true", help="also drive tool_use over MCP (NeMo Gym's MCP access)")
    args = parser.parse_args()
    from importlib.metadata import version

    from nemo_gym.testing.session_conformance import check_resources_session_contract

    print(f"NeMo Gym {version('nemo-gym')} check_resources_session_contract, live over HTTP")
    failures = 0
    for name in args.servers.split(","):
        row = task_row(name)
        extra = ["--expose-tools-over-mcp"] if (args.mcp and name == "tool_use") else []
        proc, url = start_server(args.gym_bridge, name, extra)
        try:
            check_resources_session_contract(forwarding_app(url), seed_request(name, row), keeps_state=name in KEEPS_STATE)
            notes = [f"contract passed (keeps_state={name in KEEPS_STATE})", typed_verify(name, url, row)]
            if extra:
                notes.append(asyncio.run(mcp_round(url, row)))
            print(f"  {name}: " + "; ".join(notes))
        except Exception as e:  # report every server, then fail
            failures += 1
            print(f"  {name}: FAILED: {type(e).__name__}: {e}")
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    print("all passed" if not failures else f"{failures} server(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
