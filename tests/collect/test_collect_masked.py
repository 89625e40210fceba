"""A collection whose env masked its rollouts (``mask_sample: true``: a judge down) says so, and exits 1
when every rollout written was masked; so does ``reverify`` when every answer it got back was masked.

Real processes: ``gym-bridge collect`` as a subprocess, tests/fake_model.py answering correctly, and either
``gym-bridge serve equivalence_judge`` whose judge URL is a loopback port nothing listens on (every
``/verify`` answers ``judge_error``, ``mask_sample: true``) or a small env on loopback masking the rows
that ask for it. Before, such a run printed ``mean reward 0`` and exited 0: the correct answers' rewards
of 0 were the judge's failure, not a score.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from collect_helpers import read_jsonl, write_rows
from fake_model import FakeModel

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, dump
from gym_bridge.serving.server import ResourcesServer, Session
from gym_bridge.serving.uvicorn_thread import start_in_thread
from tests.reliability.procs import kill9, start, wait_for_line

REPO = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collect(tasks: Path, out: Path, env_url: str, model_url: str, *extra: str) -> tuple[int, str]:
    command = [
        sys.executable, "-m", "gym_bridge.cli", "collect", str(tasks), "-o", str(out), "--env", env_url,
        "--model-url", model_url, "--no-progress", *extra,
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"}
    )
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def _question(i: int, **extra: object) -> dict:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"Capital {i}?"}]},
        "question": f"Capital {i}?",
        "expected_answer": "Paris",
        **extra,
    }


def test_every_rollout_masked_by_a_judge_down_exits_1_naming_it_and_keeps_the_rollouts(tmp_path: Path) -> None:
    tasks = write_rows(tmp_path / "tasks.jsonl", [_question(i) for i in range(3)])
    out = tmp_path / "rollouts.jsonl"
    judge = f"http://127.0.0.1:{_closed_port()}/v1"
    proc = start([sys.executable, "-m", "gym_bridge.cli", "serve", "equivalence_judge", "--port", "0",
                  "--judge-url", judge])  # fmt: skip
    try:
        env_url = next(w for w in wait_for_line(proc, "listening on", timeout=60).split() if w.startswith("http://"))
        with FakeModel({"Capital": "\\boxed{Paris}"}) as model:  # every answer right
            code, console = _collect(tasks, out, env_url, model.url, "--num-repeats", "2")
        # reverify while the judge is still down: every answer masked again, which is no re-scoring
        rescored = _reverify(out, tmp_path / "again.jsonl", env_url)
        assert rescored.returncode == 1, rescored
        text = " ".join((rescored.stdout + rescored.stderr).split())  # before: "0 rewards changed", exit 0
        assert "error: 6 of the 6 rollouts re-verified this run were masked by the env" in text, text
    finally:
        kill9(proc)
    assert code == 1, console
    assert "masked by their env" in console and "6 x judge_error" in console, console
    assert "no rollout was scored" in console and "gym-bridge reverify" in console, console
    assert "Traceback" not in console
    records = read_jsonl(out)  # the rollouts stay, for reverify once the judge is back
    assert len(records) == 6 and all(r["mask_sample"] is True and r["failure_kind"] == "judge_error" for r in records)
    run = json.loads((tmp_path / "rollouts_metrics.json").read_text())["run"]
    assert run["rollouts_masked"] == 6 and run["masked_by_kind"] == {"judge_error": 6}
    with start_in_thread(MaskOnRequest().build_app()) as judging:  # a verifier that can judge: the remedy works
        rescored = _reverify(out, tmp_path / "rescored.jsonl", judging.url)
    assert rescored.returncode == 0 and "6 rewards changed (6 up, 0 down)" in rescored.stdout, rescored
    assert "masked by the env" not in rescored.stdout + rescored.stderr


def _reverify(rollouts: Path, out: Path, env_url: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gym_bridge.cli", "reverify", str(rollouts), "-o", str(out), "--env", env_url]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip


class MaskOnRequest(ResourcesServer):
    """Reward 1, except rows with ``"mask": true``: answered as a judge that timed out (reward 0,
    ``failure_kind: judge_timeout``, ``mask_sample: true``)."""

    name = "mask_on_request"

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        if getattr(body, "mask", False):
            return VerifyResponse(**dump(body), reward=0.0, failure_kind="judge_timeout",
                                  failure_reason="the judge timed out", mask_sample=True)  # fmt: skip
        return VerifyResponse(**dump(body), reward=1.0)


def test_some_rollouts_masked_warn_and_count_toward_max_failed_fraction(tmp_path: Path) -> None:
    tasks = write_rows(tmp_path / "tasks.jsonl", [_question(i, mask=i == 0) for i in range(4)])
    with start_in_thread(MaskOnRequest().build_app()) as env, FakeModel({"Capital": "\\boxed{Paris}"}) as model:
        code, console = _collect(tasks, tmp_path / "a.jsonl", env.url, model.url)
        assert code == 0, console  # 1 of 4 masked: said, but the default threshold (1.0) passes
        assert "warning: 1 of 4 rollouts written this run were masked by their env (1 x judge_timeout)" in console
        assert "masked this run (mask_sample)" in console, console  # a row of the summary table
        run = json.loads((tmp_path / "a_metrics.json").read_text())["run"]
        assert run["rollouts_masked"] == 1 and run["rollouts_failed"] == 0

        code, console = _collect(tasks, tmp_path / "b.jsonl", env.url, model.url, "--max-failed-fraction", "0.2")
        assert code == 1, console  # masked count with failed ones toward the threshold, as in training
        assert "0 of 4 rollouts failed and 1 was masked (25.0%), more than --max-failed-fraction 0.2" in console

    with start_in_thread(MaskOnRequest().build_app()) as env, FakeModel({"Capital": "\\boxed{Paris}"}) as model:
        clean = write_rows(tmp_path / "clean.jsonl", [_question(i) for i in range(2)])
        code, console = _collect(clean, tmp_path / "c.jsonl", env.url, model.url, "--max-failed-fraction", "0")
        assert code == 0 and "masked by" not in console and "masked this run" not in console, console
