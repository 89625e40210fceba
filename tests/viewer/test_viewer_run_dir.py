"""A training run's directory in the browser: curves from metrics.jsonl refreshing while it grows, and
the per-step rollout samples the trainer logs (gym_bridge.train.bookkeeping.sample_log)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
from conftest import wait_ready
from viewer_records import rollout

from gym_bridge.train.bookkeeping.sample_log import write_rollout_samples


def _metrics_line(step: int, reward: float) -> str:
    return json.dumps({"step": step, "split": "train", "reward_mean": reward, "kl_penalty": 0.01 * step,
                       "approx_entropy": 1.0, "gen_length_mean": 10.0 + step, "time_step_s": 0.2}) + "\n"


def test_run_dir_curves_refresh_and_step_samples(serve, page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log_dir = tmp_path / "grpo_run"
    log_dir.mkdir()
    metrics = log_dir / "metrics.jsonl"
    metrics.write_text("".join(_metrics_line(s, 0.1 * s) for s in (1, 2, 3))
                       + json.dumps({"step": 3, "split": "val", "accuracy": 0.5}) + "\n")
    group = [rollout(7, r, float(r == 0), str(r)) for r in range(2)] + [rollout(8, 0, 0.0, "x")]
    write_rollout_samples(log_dir, 3, group, [0, 0, 1], advantages=[0.7, -0.7, 0.0], max_groups=1)

    served = serve(str(log_dir))
    page.goto(served.url + "/")
    assert page.url.endswith("/run")
    page.wait_for_function("() => document.querySelectorAll('#charts figure.chart').length === 6")
    assert "3 metric records" not in page.inner_text("#run-status")  # the script replaced the server's text
    page.wait_for_function("() => document.getElementById('run-status').textContent.includes('last step 3')")
    reward_chart = page.locator('figure.chart[data-title="reward (train)"]')
    assert "latest: reward_mean 0.3" in reward_chart.inner_text()
    assert reward_chart.locator("path.line").count() == 1
    assert "accuracy 0.5" in page.locator('figure.chart[data-title="validation accuracy"]').inner_text()
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)

    # the trainer goes on: two more steps and a torn line that must wait for its newline
    with open(metrics, "a") as f:
        f.write(_metrics_line(4, 0.4) + _metrics_line(5, 0.9) + '{"step": 6, "split": "tra')
    write_rollout_samples(log_dir, 5, group, [0, 0, 1], advantages=[1.0, -1.0, 0.0], max_groups=2)
    page.wait_for_function("() => document.getElementById('run-status').textContent.includes('last step 5')", timeout=60_000)
    assert "latest: reward_mean 0.9" in reward_chart.inner_text()
    page.wait_for_function("() => document.querySelectorAll('#steps a').length === 2")
    with open(metrics, "a") as f:
        f.write('in", "reward_mean": 0.95}\n')
    page.wait_for_function("() => document.getElementById('run-status').textContent.includes('last step 6')", timeout=60_000)

    page.click("#steps >> text=step 3")
    wait_ready(page, page.url)
    assert page.inner_text("#num-rollouts") == "2"  # one group of the step, kept whole
    page.click("a.task-link")
    columns = page.locator("article.rollout")
    assert columns.count() == 2
    assert "(logged 0.700)" in columns.nth(0).inner_text()
    # leave-one-out over two: the baseline is the sibling reward, whose std is undefined (0): unscaled
    assert columns.locator(".advantage").all_inner_texts() == ["1.000", "-1.000"]
    page.goto(served.url + "/f/step_000005")
    assert page.inner_text("#num-tasks") == "2"
    answer = httpx.get(served.url + "/api/run/metrics", params={"after": 4}).json()
    assert [r["step"] for r in answer["records"]] == [4, 5, 6] and answer["sample_steps"] == [3, 5]


def test_bearer_token_guards_every_page(serve, page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rollout(0, 0, 1.0, "0")) + "\n")
    served = serve(str(path), "--token", "s3cret")
    assert httpx.get(served.url + "/health").status_code == 200
    for url in ("/", "/f/a", "/f/a/task/0", "/f/a/rollout/0.json", "/static/viewer.css"):
        answer = httpx.get(served.url + url)
        assert answer.status_code == 401, url
        assert "bearer token" in answer.json()["detail"]
    assert httpx.get(served.url + "/f/a", headers={"Authorization": "Bearer wrong"}).status_code == 401
    for path in ("//evil.example/x", "/%2fevil.example/x", "///evil.example/x"):  # the redirect stays here
        moved = httpx.get(f"{served.url}{path}?token=s3cret&q=1", follow_redirects=False)
        assert moved.status_code == 303 and moved.headers["location"].startswith("/evil.example/x?q=1"), path
    deadline = time.monotonic() + 30
    while httpx.get(served.url + "/health").json()["files"]["a"] is not True and time.monotonic() < deadline:
        time.sleep(0.1)
    ok = httpx.get(served.url + "/f/a/rollout/0.json", headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and ok.json()["_ng_task_index"] == 0
    # a browser opens the printed URL once; the cookie it gets carries it through the rest
    page.goto(served.url + "/?token=s3cret")
    assert "token" not in page.url
    assert page.inner_text("#num-rollouts") == "1"
    page.click("a.task-link")
    assert page.locator("article.rollout").count() == 1
