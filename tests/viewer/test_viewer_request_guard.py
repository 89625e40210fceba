"""A web page cannot drive the local servers nor read the viewer (issue 33, finding 11), in a real browser.

* ``gym-bridge view`` (the real command) answers its own names and ``--allowed-host`` names, and 421 to any
  other ``Host`` name.
* DNS rebinding, for real: Chromium resolves ``rebind.example`` to 127.0.0.1 (``--host-resolver-rules``), so a
  page at ``http://rebind.example:PORT`` is same-origin with the viewer; the viewer answers it 421 and the
  page gets no rollout.
* A page's "simple" cross-origin ``fetch`` (``mode: 'no-cors'``, a text or ``Blob`` body) to a resources
  server's ``/verify`` is refused and the route never runs.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

from conftest import chromium_path, wait_ready
from viewer_records import run_a, write_jsonl

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.server import ResourcesServer, Session
from gym_bridge.serving.uvicorn_thread import start_in_thread

SECRET_WORD = "zebra"  # in run_a()'s prompts: the page must never get it


def get(port: int, path: str, host: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.putrequest("GET", path, skip_host=True)
        connection.putheader("host", host)
        connection.endheaders()
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def test_view_answers_its_names_and_refuses_others(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    served = serve(str(write_jsonl(tmp_path / "a.jsonl", run_a())), "--allowed-host", "viewer.lan")
    port = int(served.url.rsplit(":", 1)[1])
    for host in (
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        f"[::1]:{port}",
        f"viewer.lan:{port}",
        "localhost:9000",
    ):
        assert get(port, "/health", host)[0] == 200, host
    status, body = get(port, "/f/a/rollout/0.json", f"evil.example:{port}")
    assert status == 421 and SECRET_WORD not in body.decode()
    assert "evil.example" in json.loads(body)["detail"] and "--allowed-host" in json.loads(body)["detail"]


def test_a_rebinding_page_reads_nothing(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import sync_playwright

    served = serve(str(write_jsonl(tmp_path / "a.jsonl", run_a())))
    port = int(served.url.rsplit(":", 1)[1])
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium_path(),
            args=["--no-sandbox", "--host-resolver-rules=MAP rebind.example 127.0.0.1"],
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(90_000)
            wait_ready(page, served.url + "/f/a")  # indexed, and readable under the viewer's own address
            assert SECRET_WORD in page.content()
            answer = page.goto(f"http://rebind.example:{port}/f/a")
            assert answer is not None and answer.status == 421
            assert SECRET_WORD not in page.content()
            # the page's own script, same-origin after rebinding, reads nothing either
            status, text = page.evaluate("async () => { const r = await fetch('/f/a/rollout/0.json'); "
                                         "return [r.status, await r.text()]; }")  # fmt: skip
            assert status == 421 and SECRET_WORD not in text
        finally:
            browser.close()


class CountingServer(ResourcesServer):
    name = "counting"
    verified = 0

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        type(self).verified += 1
        return VerifyResponse.model_validate({**dump(body), "reward": 1.0})


def test_a_pages_no_cors_post_does_not_run_verify(other_site, page) -> None:  # type: ignore[no-untyped-def]
    body: dict[str, Any] = {"responses_create_params": {"input": "x"}, "response": {"output": []}}
    with start_in_thread(CountingServer().build_app()) as running:
        page.goto(other_site)  # any other origin: the page is not the resources server's
        sent = page.evaluate(
            """async ([url, body]) => {
                const text = await fetch(url, {method: 'POST', mode: 'no-cors', body: body});
                const blob = await fetch(url, {method: 'POST', mode: 'no-cors', body: new Blob([body])});
                const form = new URLSearchParams({a: body});
                const formed = await fetch(url, {method: 'POST', mode: 'no-cors', body: form});
                return [text.type, blob.type, formed.type];
            }""",
            [running.url + "/verify", json.dumps(body)],
        )
        assert sent == ["opaque", "opaque", "opaque"]  # the browser sent all three
        assert CountingServer.verified == 0
        page.evaluate(  # a preflighted JSON fetch is not even sent: these servers grant no CORS
            "async (url) => { try { await fetch(url, {method: 'POST', headers: {'content-type': 'application/json'},"
            " body: '{}'}); } catch (e) {} }",
            running.url + "/verify",
        )
        assert CountingServer.verified == 0
