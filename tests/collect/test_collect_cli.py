"""The ``gym-bridge collect`` command: option parsing, plain errors, and no torch/transformers import."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap

import pytest
import typer
from collect_helpers import read_jsonl, write_rows
from fake_model import FakeModel, arithmetic_row
from typer.testing import CliRunner

from gym_bridge.cli import app
from gym_bridge.commands.collect import parse_params

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def test_parse_params_reads_json_values():
    assert parse_params(["temperature=0.2", 'stop=["x"]', "model=my-model", 'metadata={"a": 1}', "n="]) == {
        "temperature": 0.2,
        "stop": ["x"],
        "model": "my-model",
        "metadata": {"a": 1},
        "n": "",
    }
    with pytest.raises(typer.BadParameter):
        parse_params(["no-equals-sign"])


def test_cli_collects_with_overrides(tmp_path, boxed_env):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1), arithmetic_row(2, 3)])
    out = tmp_path / "r.jsonl"
    with FakeModel() as model:
        result = CliRunner().invoke(
            app,
            ["collect", str(tasks), "-o", str(out), "--env", boxed_env[0], "--model-url", model.url,
             "--num-repeats", "2", "--temperature", "0.7", "--top-p", "0.9", "--max-output-tokens", "32",
             "--param", "metadata={\"run\": \"t\"}", "--model", "m", "--seed", "3", "--no-progress"],
        )  # fmt: skip
        requests = list(model.requests)
    assert result.exit_code == 0, result.output
    assert len(read_jsonl(out)) == 4
    for r in requests:
        assert (r["temperature"], r["top_p"], r["max_output_tokens"], r["model"]) == (0.7, 0.9, 32, "m")
        assert r["metadata"] == {"run": "t"} and isinstance(r["seed"], int)
    assert "mean reward" in result.output and "r_metrics.json" in result.output


def test_cli_errors_name_the_file(tmp_path, boxed_env):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1)])
    out = tmp_path / "r.jsonl"
    out.write_text('{"x": 1}\n')
    result = CliRunner().invoke(
        app,
        [
            "collect",
            str(tasks),
            "-o",
            str(out),
            "--env",
            boxed_env[0],
            "--model-url",
            "http://127.0.0.1:9/v1",
        ],
    )
    assert result.exit_code == 2
    assert "r.jsonl already holds rollouts" in " ".join(result.output.split())
    missing = CliRunner().invoke(
        app, ["collect", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o.jsonl"), "--env", boxed_env[0],
              "--model-url", "http://127.0.0.1:9/v1"],
    )  # fmt: skip
    assert missing.exit_code == 2 and "task file not found" in missing.output
    both = CliRunner().invoke(
        app, ["collect", str(tasks), "-o", str(tmp_path / "o.jsonl"), "--env", boxed_env[0]]
    )
    assert both.exit_code == 2 and "exactly one of --model-url" in " ".join(both.output.split())


def test_collect_does_not_import_torch_or_transformers(tmp_path):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1)])
    out = tmp_path / "r.jsonl"
    code = textwrap.dedent(
        f"""
        import sys
        sys.path[:0] = [{HERE!r}, {os.path.dirname(HERE)!r}]
        import gym_bridge.cli
        from collect_helpers import BoxedAnswerEnv
        from fake_model import FakeModel
        from gym_bridge.serving.uvicorn_thread import start_in_thread
        with start_in_thread(BoxedAnswerEnv().build_app()) as env, FakeModel() as model:
            try:
                gym_bridge.cli.app(["collect", {str(tasks)!r}, "-o", {str(out)!r}, "--env", env.url,
                                    "--model-url", model.url, "--no-progress"])
            except SystemExit as e:
                assert e.code in (0, None), e.code
        heavy = [m for m in ("torch", "transformers") if m in sys.modules]
        assert not heavy, heavy
        print("clean")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "clean" in proc.stdout
    assert json.loads(out.read_text().splitlines()[0])["reward"] == 1.0

    help_run = subprocess.run(
        [sys.executable, "-c", "import sys, gym_bridge.cli as c\ntry:\n    c.app(['collect', '--help'])\n"
         "except SystemExit:\n    pass\nassert 'torch' not in sys.modules and 'transformers' not in sys.modules"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert help_run.returncode == 0, help_run.stderr
    assert "--num-repeats" in help_run.stdout


def test_collect_passes_the_api_key_to_a_policy_server_with_a_token(tmp_path, boxed_env):
    """``serve policy --token`` refuses requests without it; ``collect --api-key`` (or OPENAI_API_KEY) sends it."""
    from gym_bridge.generation.backend import GenerationBackend, GenerationResult
    from gym_bridge.models.tokenizer import build_tokenizer
    from gym_bridge.policy.server import build_policy_app
    from gym_bridge.serving.uvicorn_thread import start_in_thread

    class Answers(GenerationBackend):
        def __init__(self) -> None:
            self.tokenizer, self.model_name, self.max_context = build_tokenizer(), "boxed", 512

        def generate(self, requests):  # type: ignore[no-untyped-def]
            ids = self.tokenizer("\\boxed{2}", add_special_tokens=False)["input_ids"]
            return [GenerationResult(list(r.prompt_token_ids), ids, [-0.1] * len(ids), "stop", "\\boxed{2}") for r in requests]

    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1)])
    with start_in_thread(build_policy_app(Answers(), auth_token="sekrit")) as policy:
        base = ["collect", str(tasks), "--env", boxed_env[0], "--model-url", policy.url + "/v1", "--no-progress",
                "--max-retries", "0"]  # fmt: skip
        with_key = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "ok.jsonl"), "--api-key", "sekrit"])
        from_env = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "env.jsonl")], env={"OPENAI_API_KEY": "sekrit"})
        without = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "no.jsonl")], env={"OPENAI_API_KEY": ""})
    assert with_key.exit_code == from_env.exit_code == 0, with_key.output
    assert without.exit_code == 1 and "401" in without.output, without.output  # nothing succeeded: not a pass
    assert [r["reward"] for r in read_jsonl(tmp_path / "ok.jsonl")] == [1.0]
    assert [r["reward"] for r in read_jsonl(tmp_path / "env.jsonl")] == [1.0]
    assert not (tmp_path / "no.jsonl").exists() or not read_jsonl(tmp_path / "no.jsonl")
    (failure,) = read_jsonl(tmp_path / "no_failures.jsonl")
    assert "401" in json.dumps(failure) and "bearer token" in json.dumps(failure), failure


def test_collect_passes_the_env_api_key_to_an_env_server_with_a_token(tmp_path):
    """``serve <env> --token`` refuses requests without it; ``collect --env-api-key`` (or
    GYM_BRIDGE_ENV_API_KEY) sends it with every env request (session set-up and /verify)."""
    from collect_helpers import BoxedAnswerEnv

    from gym_bridge.serving.server import ServerSettings
    from gym_bridge.serving.uvicorn_thread import start_in_thread

    class GuardedEnv(BoxedAnswerEnv):
        def __init__(self) -> None:
            super().__init__()
            self.settings = ServerSettings(auth_token="env-sekrit")

    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1)])
    with FakeModel() as model, start_in_thread(GuardedEnv().build_app()) as env:
        base = ["collect", str(tasks), "--env", env.url, "--model-url", model.url, "--no-progress",
                "--max-retries", "0"]  # fmt: skip
        with_key = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "ok.jsonl"), "--env-api-key", "env-sekrit"])
        from_env = CliRunner().invoke(
            app, [*base, "-o", str(tmp_path / "env.jsonl")], env={"GYM_BRIDGE_ENV_API_KEY": "env-sekrit"}
        )
        without = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "no.jsonl")], env={"GYM_BRIDGE_ENV_API_KEY": ""})
    assert with_key.exit_code == from_env.exit_code == 0, with_key.output
    assert without.exit_code == 1 and "401" in without.output, without.output  # nothing succeeded: not a pass
    assert [r["reward"] for r in read_jsonl(tmp_path / "ok.jsonl")] == [1.0]
    assert [r["reward"] for r in read_jsonl(tmp_path / "env.jsonl")] == [1.0]
    assert not (tmp_path / "no.jsonl").exists() or not read_jsonl(tmp_path / "no.jsonl")
    (failure,) = read_jsonl(tmp_path / "no_failures.jsonl")
    assert "401" in json.dumps(failure), failure


def test_the_progress_bar_moves_at_most_ten_times_a_second_and_ends_on_the_full_count(monkeypatch):
    from rich.console import Console

    from gym_bridge.collect.summary import RunStats
    from gym_bridge.commands import collect as command

    clock = [100.0]
    monkeypatch.setattr(command.time, "monotonic", lambda: clock[0])
    bar = command._ProgressBar(Console(file=io.StringIO()), enabled=True)
    moves: list[int] = []
    with bar:
        bar.start(1000)
        update = bar.progress.update

        def counted(task, **fields):
            moves.append(fields["advance"])
            update(task, **fields)

        monkeypatch.setattr(bar.progress, "update", counted)
        advance = bar.progress.advance
        monkeypatch.setattr(bar.progress, "advance", lambda task, n: (moves.append(n), advance(task, n)))
        for _ in range(1000):
            clock[0] += 0.001  # a rollout a millisecond: a second in all
            bar.advance(RunStats(), 1)
        assert len(moves) <= 11 and sum(moves) < 1000  # rich hears of them ten times a second ...
    assert len(moves) <= 12 and bar.progress.tasks[0].completed == 1000  # ... and of the rest at the end
