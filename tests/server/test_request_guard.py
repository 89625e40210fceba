"""What a web page could send to a local resources server is refused, over real HTTP (issue 33, finding 11).

A ``POST`` a page can send without a CORS preflight (``text/plain``, a form type, or no type at all) gets 415
naming the header, and the route never runs; a ``Host`` name that is not the server's (DNS rebinding) gets
421 on every route. Requests are written with ``http.client`` so every header is exactly as given.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.request_guard import ALLOWED_HOSTS_ENV, RequestGuard, host_name, is_json_content_type
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session
from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.code.app import CodeConfig, CodeServer
from tests.raw_http import send

VERIFY = {
    "responses_create_params": {"input": [{"role": "user", "content": "Print a + b."}]},
    "response": {"output": []},
}


class CountingServer(ResourcesServer):
    """Counts the /verify calls that ran (a refused request must not run its route)."""

    name = "counting"

    def __init__(self, settings: ServerSettings | None = None) -> None:
        super().__init__(settings)
        self.verified = 0

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        self.verified += 1
        return VerifyResponse.model_validate({**dump(body), "reward": 1.0})


@pytest.fixture(scope="module")
def counting() -> Iterator[tuple[CountingServer, int]]:
    server = CountingServer(ServerSettings(allowed_hosts=["gpu-box.internal"]))
    with start_in_thread(server.build_app()) as running:
        yield server, int(running.url.rsplit(":", 1)[1])


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
     None],
)  # fmt: skip
def test_a_post_a_web_page_can_send_is_refused_before_the_route_runs(
    counting: tuple[CountingServer, int], content_type: str | None
) -> None:
    server, port = counting
    before = server.verified
    headers = {"content_type": content_type} if content_type else {}
    status, answer = send(port, "POST", "/verify", json.dumps(VERIFY).encode(), **headers)
    assert status == 415, answer
    assert (content_type or "no Content-Type header") in answer["detail"]
    assert "Content-Type: application/json" in answer["detail"]
    assert server.verified == before


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"]
)
def test_json_posts_are_answered(counting: tuple[CountingServer, int], content_type: str) -> None:
    server, port = counting
    before = server.verified
    status, answer = send(port, "POST", "/verify", json.dumps(VERIFY).encode(), content_type=content_type)
    assert status == 200 and answer["reward"] == 1.0
    assert server.verified == before + 1


def test_a_post_without_a_body_needs_no_content_type(counting: tuple[CountingServer, int]) -> None:
    """NeMo Gym's clients send no body (and so no type) when there is nothing to send: e.g. a bare seed."""
    _, port = counting
    assert send(port, "POST", "/seed_session", content_length="0")[0] == 200


@pytest.mark.parametrize(
    "host",
    ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}", "localhost.evil.example", "[::1",
     "gpu-box.internal.evil.example:{port}"],
)  # fmt: skip
def test_a_foreign_host_name_is_refused_on_every_route(
    counting: tuple[CountingServer, int], host: str
) -> None:
    server, port = counting
    before = server.verified
    host = host.format(port=port)
    status, answer = send(port, "GET", "/health", host=host)
    assert status == 421, answer
    assert (
        host in answer["detail"]
        and "--allowed-host" in answer["detail"]
        and ALLOWED_HOSTS_ENV in answer["detail"]
    )
    body = json.dumps(VERIFY).encode()
    assert send(port, "POST", "/verify", body, host=host, content_type="application/json")[0] == 421
    assert server.verified == before


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST:{port}", "[::1]:{port}", "localhost", "gpu-box.internal:{port}",
     "gpu-box.internal.", "10.1.2.3:9000", "app.localhost:{port}", socket.gethostname()],
)  # fmt: skip
def test_the_servers_own_names_are_answered(counting: tuple[CountingServer, int], host: str) -> None:
    _, port = counting
    status, answer = send(port, "GET", "/health", host=host.format(port=port))
    assert status == 200 and answer["status"] == "ok", (host, answer)


def test_names_from_the_environment_and_the_wildcard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_HOSTS_ENV, "rebind-ok.example, other.example")
    with start_in_thread(CountingServer().build_app()) as running:
        port = int(running.url.rsplit(":", 1)[1])
        assert send(port, "GET", "/health", host="rebind-ok.example:1")[0] == 200
        assert send(port, "GET", "/health", host="other.example")[0] == 200
        assert send(port, "GET", "/health", host="third.example")[0] == 421
    monkeypatch.setenv(ALLOWED_HOSTS_ENV, "*")
    with start_in_thread(CountingServer().build_app()) as running:
        assert send(int(running.url.rsplit(":", 1)[1]), "GET", "/health", host="anything.example")[0] == 200


def test_the_bound_host_name_is_answered() -> None:
    server = CountingServer(ServerSettings(host="localhost"))
    with start_in_thread(server.build_app(), host="localhost") as running:
        port = int(running.url.rsplit(":", 1)[1])
        assert send(port, "GET", "/health", host=f"localhost:{port}")[0] == 200


def test_the_code_server_does_not_run_a_text_plain_verify() -> None:
    """The issue's case: a page POSTs a task and a program as text/plain; before, the program ran (reward 1)."""
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "Print a + b."}]},
        "verifier_metadata": {"unit_tests": {"inputs": ["1 2\n"], "outputs": ["3\n"]}},
        "response": {"output": [{"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "```python\na, b = map(int, input().split())\nprint(a + b)\n```"}]}]},
    }  # fmt: skip
    with start_in_thread(CodeServer(config=CodeConfig(timeout_s=2.0)).build_app()) as running:
        port = int(running.url.rsplit(":", 1)[1])
        status, answer = send(port, "POST", "/verify", json.dumps(row).encode(), content_type="text/plain")
        assert status == 415 and "reward" not in answer
        with httpx.Client(base_url=running.url, timeout=60) as client:  # our own client: JSON, answered
            assert client.post("/verify", json=row).json()["reward"] == 1.0


def test_host_and_content_type_parsing() -> None:
    assert host_name("Example.COM:8080") == "example.com"
    assert host_name("[::1]:8000") == "::1" and host_name("[::1]") == "::1"
    assert host_name("[::1]x") is None and host_name("a:b") is None and host_name("") is None
    assert host_name("example.com.") == "example.com"
    assert is_json_content_type("application/json;charset=utf-8") and is_json_content_type(
        "application/problem+json"
    )
    assert not is_json_content_type("text/json+plain") and not is_json_content_type("text/plain")
    guard = RequestGuard(["0.0.0.0", "box"])
    assert guard.allows_host("box") and guard.allows_host("192.168.1.5") and not guard.allows_host("box.evil")
    assert guard.allows_host("x.in-process", local="x.in-process")  # the in-process client's own name
    assert RequestGuard.content_type_refusal("GET", b"text/plain", True) is None
    assert RequestGuard.content_type_refusal("DELETE", None, True) is None


def test_serve_allowed_host_flag_adds_a_name_and_a_bad_one_is_refused() -> None:
    """``gym-bridge serve tool_use --allowed-host box.lan`` (the real command) answers box.lan, refuses others."""
    from tests.reliability.procs import cli, run_cli, serving

    with serving(cli("serve", "tool_use", "--port", "0", "--allowed-host", "box.lan")) as url:
        port = int(url.rsplit(":", 1)[1])
        assert send(port, "GET", "/health", host="box.lan:8003")[0] == 200
        assert send(port, "GET", "/health", host="other.lan:8003")[0] == 421
    refused = run_cli(["serve", "tool_use", "--port", "0", "--allowed-host", "http://box.lan"])
    assert refused.returncode == 2 and "--allowed-host: 'http://box.lan' is not a host name" in refused.stderr


def test_bad_names_in_settings_or_the_environment_are_refused_naming_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from gym_bridge.policy.service import PolicySettings

    with pytest.raises(ValueError, match="allowed_hosts: 'box/path' is not a host name"):
        ServerSettings(allowed_hosts=["box/path"])
    with pytest.raises(ValueError, match="allowed_hosts: 'http://x' is not a host name"):
        PolicySettings(allowed_hosts=["http://x"])
    assert ServerSettings(host="::", allowed_hosts=["a.lan,b.lan:9", "*"]).allowed_hosts == ["a.lan,b.lan:9", "*"]
    monkeypatch.setenv(ALLOWED_HOSTS_ENV, "ok.lan, not a name")
    with pytest.raises(ValueError, match=f"{ALLOWED_HOSTS_ENV}: 'not a name' is not a host name"):
        CountingServer().build_app()
