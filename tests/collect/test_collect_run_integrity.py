"""Runs that lose no work and never pass silently: the data path's commands (collect, reverify,
transform) against the files around them, through the real CLI (a subprocess where a signal, a second
process or a resource limit is the point) with the real math env and tests/fake_model.py.

Each test here failed before its fix: a task file named as the output (or as a side file) was deleted or
read back as tasks without end; two runs on one output wrote every rollout twice; a full disk ended in a
traceback whose first error was hidden by a second; an empty task file, an input with no usable rollout
and a transform that wrote nothing exited 0; a UTF-8 byte-order mark cost the first task; ``--resume``
over a changed task file or changed request settings mixed two runs under one task index; one stored
rollout with a huge ``_ng_task_index`` made ``--resume`` ask for terabytes.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from collect_helpers import assert_written_exactly_once, read_jsonl, write_rows
from collect_helpers import rollout_pairs as pairs
from fake_model import FakeModel, arithmetic_row
from typer.testing import CliRunner

from gym_bridge.cli import app
from gym_bridge.collect import materialized_path_for

REPO = Path(__file__).resolve().parents[2]


def invoke(*args: Any) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def said(result: Any) -> str:
    """What a CliRunner run printed, stdout and stderr, with rich's wrapping undone."""
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    return re.sub(r"\s*\n\s*", " ", text)


def cli(
    *args: Any, limit_bytes: int | None = None, memory_bytes: int | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``gym-bridge ARGS`` as a child process; ``limit_bytes``: its file-size limit (RLIMIT_FSIZE), a full
    disk; ``memory_bytes``: its address space (RLIMIT_AS), so a runaway allocation fails fast."""

    def limit() -> None:
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
        if memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    command = [sys.executable, "-m", "gym_bridge.cli", *map(str, args)]
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env, preexec_fn=limit)


@pytest.fixture(scope="module")
def model():
    with FakeModel(record_requests=False) as served:
        yield served


def rows(n: int) -> list[dict[str, Any]]:
    return [arithmetic_row(i, 1) for i in range(n)]


def collect_args(tasks: Path, out: Path, model: FakeModel, *extra: Any) -> tuple[Any, ...]:
    return ("collect", tasks, "-o", out, "--env", "math", "--model-url", model.url, "--no-progress", *extra)


# --------------------------------------------------------------------------- the input is the output


@pytest.mark.parametrize(
    ("output_of", "flags"),
    [
        (lambda tasks: tasks, ["--overwrite"]),  # was: the task file deleted, the run "done" with 0 rows, exit 0
        (lambda tasks: tasks, ["--resume"]),  # was: its own rollouts read back as tasks, growing without end
        (lambda tasks: tasks.with_name("run.jsonl"), []),  # TASKS is run_materialized_inputs.jsonl: was deleted
    ],
    ids=["overwrite-itself", "resume-into-itself", "tasks-are-a-side-file"],
)
def test_a_task_file_the_run_would_write_is_refused_and_kept(tmp_path, model, output_of, flags):
    tasks = write_rows(tmp_path / "tasks.jsonl", rows(3))
    if not flags:
        tasks = tasks.rename(materialized_path_for(tmp_path / "run.jsonl"))
    before = tasks.read_bytes()
    result = invoke(*collect_args(tasks, output_of(tasks), model, *flags))
    assert result.exit_code == 2, said(result)
    assert f"TASKS {tasks}" in said(result) and "give -o another name" in said(result)
    assert tasks.read_bytes() == before


def test_reverify_refuses_an_input_named_as_its_failures_file(tmp_path, model):
    """``reverify run_failures.jsonl -o run.jsonl`` deleted its input (the failures file is cleared first)."""
    out = tmp_path / "run.jsonl"
    assert invoke(*collect_args(write_rows(tmp_path / "t.jsonl", rows(2)), out, model)).exit_code == 0
    stored = out.rename(tmp_path / "run_failures.jsonl")
    before = stored.read_bytes()
    result = invoke("reverify", stored, "-o", out, "--env", "math")
    assert result.exit_code == 2, said(result)
    assert "ROLLOUTS" in said(result) and stored.read_bytes() == before


# --------------------------------------------------------------------------- two runs, one output


def test_a_second_run_on_an_output_being_written_is_refused(tmp_path):
    """Two collects on one -o (a --resume started twice) each wrote the same rollouts: 8 of 40 twice."""
    tasks = write_rows(tmp_path / "tasks.jsonl", rows(30))
    out = tmp_path / "rollouts.jsonl"
    with FakeModel(latency=0.1, record_requests=False) as slow:
        args = collect_args(tasks, out, slow, "--concurrency", "2")
        command = [sys.executable, "-m", "gym_bridge.cli", *map(str, args)]
        first = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while (not out.exists() or out.read_bytes().count(b"\n") < 2) and time.monotonic() < deadline:
                assert first.poll() is None, first.communicate()
                time.sleep(0.05)
            second = invoke(*collect_args(tasks, out, slow, "--resume"))
            assert first.poll() is None, "the first run ended before the second was tried"
            stdout, stderr = first.communicate(timeout=120)
        finally:
            first.kill()
            first.wait()
    assert second.exit_code == 2, said(second)
    assert f"{out} is being written by another run" in said(second)
    assert first.returncode == 0, stderr
    assert_written_exactly_once(out, 30, 1, [])
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".lock")] == []  # the lock went with the run


# --------------------------------------------------------------------------- a full disk


def test_a_full_disk_exits_1_naming_the_file_and_resume_finishes(tmp_path, model):
    """RLIMIT_FSIZE stands in for a full disk: the write fails with EFBIG, as ENOSPC would. Before: exit 1
    with a traceback from closing the file (its flush failed again, hiding the first error)."""
    tasks = write_rows(tmp_path / "tasks.jsonl", rows(40))
    out = tmp_path / "rollouts.jsonl"
    args = collect_args(tasks, out, model, "--max-retries", "0")
    full = cli(*args, limit_bytes=24 * 1024)
    text = " ".join((full.stdout + full.stderr).split())
    assert full.returncode == 1, text
    assert f"cannot write {out}: File too large" in text, text
    assert "rerun with --resume" in text and "Traceback" not in text, text
    written = out.read_bytes()
    assert 0 < written.count(b"\n") < 40 and not written.endswith(b"\n")  # a torn last line, no more

    done = cli(*args, "--resume")
    assert done.returncode == 0, done.stderr
    assert "torn last line" in done.stdout + done.stderr
    assert_written_exactly_once(out, 40, 1, pairs_of(written.splitlines()[:-1]))


def test_a_metrics_file_that_cannot_be_written_is_a_named_error_and_resume_completes_it(tmp_path, model):
    """The end-of-run files fail as the lines do (before: a traceback from ``write_json``)."""
    tasks = write_rows(tmp_path / "tasks.jsonl", rows(3))
    out = tmp_path / "rollouts.jsonl"
    blocked = tmp_path / "rollouts_metrics.json"
    blocked.mkdir()  # stands in for a disk that fills at the very end
    result = invoke(*collect_args(tasks, out, model))
    assert result.exit_code == 1, said(result)
    assert f"cannot write {blocked}" in said(result) and "rerun with --resume" in said(result)
    assert sorted(pairs(out)) == [(0, 0), (1, 0), (2, 0)]  # the rollouts are kept
    blocked.rmdir()
    again = invoke(*collect_args(tasks, out, model, "--resume"))
    assert again.exit_code == 0, said(again)
    assert json.loads(blocked.read_text())["num_rollouts"] == 3


def pairs_of(lines: list[bytes]) -> list[tuple[int, int]]:
    return [(json.loads(line)["_ng_task_index"], json.loads(line)["_ng_rollout_index"]) for line in lines]


def test_a_full_disk_fails_a_transform_cleanly_and_keeps_the_output(tmp_path, model):
    out = tmp_path / "rollouts.jsonl"
    assert invoke(*collect_args(write_rows(tmp_path / "t.jsonl", rows(40)), out, model)).exit_code == 0
    sft = tmp_path / "sft.jsonl"
    sft.write_text('{"earlier": "data"}\n')
    result = cli("transform", "sft", out, "-o", sft, limit_bytes=4 * 1024)
    text = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1 and "File too large" in text and "Traceback" not in text, text
    assert sft.read_text() == '{"earlier": "data"}\n'
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".sft")] == []  # no temp file left


# --------------------------------------------------------------------------- nothing to do is no success


def test_a_negative_max_steps_is_refused_naming_it(tmp_path, model):
    """``--max-steps -1`` ran each rollout one model call (as a limit of 1) and exited 0."""
    tasks = write_rows(tmp_path / "tasks.jsonl", rows(1))
    result = invoke(*collect_args(tasks, tmp_path / "out.jsonl", model, "--max-steps", "-1"))
    assert result.exit_code == 2, said(result)
    assert "--max-steps must be 0 (no limit) or more" in said(result)


def test_reverify_refuses_a_request_timeout_of_0_naming_it(tmp_path):
    stored = write_rows(tmp_path / "rollouts.jsonl", [{**rows(1)[0], "_ng_task_index": 0, "_ng_rollout_index": 0,
                                                       "response": {"output": []}, "reward": 0.0}])  # fmt: skip
    result = invoke("reverify", stored, "-o", tmp_path / "re.jsonl", "--env", "math", "--request-timeout", "0")
    assert result.exit_code == 2, said(result)
    assert "--request-timeout must be a positive number of seconds" in said(result)
    assert not (tmp_path / "re.jsonl").exists()


def test_an_empty_task_file_exits_1(tmp_path, model):
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n \n\r\n")):
        tasks = tmp_path / name
        tasks.write_text(text)
        result = invoke(*collect_args(tasks, tmp_path / f"out-{name}", model))
        assert result.exit_code == 1, said(result)
        assert f"no task rows to run in {tasks}" in said(result)


def test_reverify_with_no_rollout_in_its_input_exits_1(tmp_path):
    tasks = write_rows(tmp_path / "tasks.jsonl", rows(2))  # task rows, not rollouts
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for stored in (tasks, empty):
        result = invoke("reverify", stored, "-o", tmp_path / f"re-{stored.name}", "--env", "math")
        assert result.exit_code == 1, said(result)
        assert f"{stored} holds no rollout to re-verify" in said(result)


def test_a_transform_that_writes_nothing_exits_1_and_keeps_the_output(tmp_path, model):
    """A failures file, a metrics file, an empty file, or every record filtered out: exit 1, OUT as it was
    (before: exit 0 and OUT replaced by an empty file, a training set of nothing)."""
    out = tmp_path / "run.jsonl"
    assert invoke(*collect_args(write_rows(tmp_path / "t.jsonl", rows(2)), out, model)).exit_code == 0
    failures = write_rows(tmp_path / "run_failures.jsonl", [{"_ng_task_index": 0, "_ng_rollout_index": 0, "error": "x"}])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    target = tmp_path / "train.jsonl"
    target.write_text('{"earlier": "data"}\n')
    cases = [
        (("grpo", failures), "no usable record in"),
        (("grpo", tmp_path / "run_metrics.json"), "no usable record in"),
        (("dpo", empty), "no usable record in"),
        (("sft", out, "--min-reward", "2"), "all 2 records of"),
        (("dpo", out), "all 2 tasks of"),  # one rollout a task: no pair
    ]
    for (verb, src, *flags), why in cases:
        result = invoke("transform", verb, src, "-o", target, *flags)
        assert result.exit_code == 1, (verb, said(result))
        assert why in said(result) and f"nothing to write to {target}" in said(result), said(result)
        assert target.read_text() == '{"earlier": "data"}\n'


# --------------------------------------------------------------------------- task files as editors write them


def test_a_byte_order_mark_does_not_cost_the_first_task(tmp_path, model):
    """A task file saved with a UTF-8 BOM (Notepad, PowerShell): its first row was a bad row."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows(3)).encode())
    out = tmp_path / "rollouts.jsonl"
    result = invoke(*collect_args(tasks, out, model))
    assert result.exit_code == 0, said(result)
    assert sorted(pairs(out)) == [(0, 0), (1, 0), (2, 0)]
    assert all(r["reward"] == 1.0 for r in read_jsonl(out))


@pytest.mark.parametrize("kind", ["crlf", "blank-lines", "torn-last-row", "duplicate-rows"])
def test_task_files_that_held(tmp_path, model, kind):
    """Attacks that held (regression guards): CRLF line ends and blank lines are read as the rows they
    are; a torn last row is a bad row named by line; the same row twice is two tasks."""
    lines = [json.dumps(r) for r in rows(3)]
    tasks = tmp_path / "tasks.jsonl"
    expected = [(0, 0), (1, 0), (2, 0)]
    if kind == "crlf":
        tasks.write_bytes("".join(line + "\r\n" for line in lines).encode())
    elif kind == "blank-lines":
        tasks.write_text("\n" + "\n\n".join(lines) + "\n\n")
    elif kind == "torn-last-row":
        tasks.write_text("\n".join(lines) + "\n" + lines[0][:30])
    else:
        tasks.write_text("\n".join([*lines, lines[0]]) + "\n")
        expected.append((3, 0))
    out = tmp_path / "rollouts.jsonl"
    result = invoke(*collect_args(tasks, out, model))
    assert result.exit_code == 0, said(result)
    assert sorted(pairs(out)) == expected
    if kind == "torn-last-row":
        assert f"{tasks}:4: invalid JSON" in said(result)


def test_a_lone_surrogate_in_a_model_answer_fails_that_rollout_only(tmp_path):
    """Held (a regression guard): an answer no UTF-8 file can hold is that rollout's failure, not the run's."""

    def garbled(request: Any, n: int) -> str:
        return "\\boxed{1} \ud800"

    tasks = write_rows(tmp_path / "tasks.jsonl", rows(3))
    out = tmp_path / "rollouts.jsonl"
    with FakeModel({"What is 0 + 1": garbled}, record_requests=False) as odd:
        result = invoke(*collect_args(tasks, out, odd))
    assert result.exit_code == 0, said(result)
    assert sorted(pairs(out)) == [(1, 0), (2, 0)]
    assert [f["_ng_task_index"] for f in read_jsonl(tmp_path / "rollouts_failures.jsonl")] == [0]


# --------------------------------------------------------------------------- a verify answer's reward

ODD_REWARDS = {"nan": "NaN", "string": '"1"', "bool": "true", "null": "null", "inf": "1e999", "object": '{"a": 1}'}


def raw_verify_env() -> Any:
    """An env that answers ``/verify`` with the row's ``kind`` of reward, as raw JSON text (an env given by
    URL is any server: a foreign one, a broken one, or one whose answer a policy's output shaped)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def empty(request: Any) -> Response:
        return JSONResponse({})

    async def verify(request: Any) -> Response:
        body = await request.json()
        reward = ODD_REWARDS.get(body["kind"], body["kind"])  # else the kind is the reward itself
        return Response(json.dumps(body)[:-1] + f', "reward": {reward}}}', media_type="application/json")

    routes = [Route("/seed_session", empty, methods=["POST"]), Route("/verify", verify, methods=["POST"]),
              Route("/aggregate_metrics", empty, methods=["POST"])]  # fmt: skip
    app = Starlette(routes=routes)
    return app


def test_a_verify_reward_that_is_not_a_finite_number_fails_that_rollout(tmp_path, model):
    """Before: NaN, "1", true, null and 1e999 were written as successful rollouts with that reward (NaN
    poisons a mean and a GRPO advantage; "1" and true were counted as 1), and an object ended the run in a
    traceback. Finite rewards outside [0, 1] are an env's own scale and stay."""
    from gym_bridge.serving.uvicorn_thread import start_in_thread

    kinds = [*ODD_REWARDS, "5.0", "-3.0"]
    tasks = write_rows(tmp_path / "tasks.jsonl", [{**arithmetic_row(1, 1), "kind": k} for k in kinds])
    out = tmp_path / "rollouts.jsonl"
    with start_in_thread(raw_verify_env()) as env:
        result = invoke("collect", tasks, "-o", out, "--env", env.url, "--model-url", model.url, "--no-progress",
                        "--max-retries", "0")  # fmt: skip
    assert result.exit_code == 0, said(result)
    assert sorted(r["reward"] for r in read_jsonl(out)) == [-3.0, 5.0]
    failures = {f["_ng_task_index"]: f for f in read_jsonl(tmp_path / "rollouts_failures.jsonl")}
    assert sorted(failures) == list(range(len(ODD_REWARDS)))
    for i, shown in enumerate(["NaN", '"1"', "true", "null", "Infinity", '{"a": 1}']):
        assert f"'reward' must be a finite number, got {shown}" in failures[i]["error"], failures[i]
        assert failures[i]["_ng_failure_class"] == "env_bad_response"


def test_resume_over_a_stored_reward_that_is_not_a_number_keeps_it_uncounted(tmp_path, model):
    """A damaged or foreign stored line whose reward is an object ended ``--resume`` in a TypeError."""
    tasks = write_rows(tmp_path / "tasks.jsonl", rows(2))
    out = tmp_path / "rollouts.jsonl"
    odd = {**rows(1)[0], "_ng_task_index": 0, "_ng_rollout_index": 0, "reward": {"a": 1}, "response": {"output": []}}
    write_rows(out, [odd])
    result = invoke(*collect_args(tasks, out, model, "--resume"))
    assert result.exit_code == 0, said(result)
    assert "has reward {\"a\":1}, not a finite number; kept, not counted in the metrics" in said(result)
    assert pairs(out) == [(0, 0), (1, 0)]
    metrics = json.loads((tmp_path / "rollouts_metrics.json").read_text())
    assert metrics["mean_reward"] == 1.0


# --------------------------------------------------------------------------- --resume continues the same run


@pytest.fixture
def half_run(tmp_path, model):
    """A run of 4 tasks x 2 repeats cut after its first 4 rollouts; the task file and the common flags."""
    tasks = write_rows(tmp_path / "tasks.jsonl", rows(4))
    out = tmp_path / "rollouts.jsonl"
    assert invoke(*collect_args(tasks, out, model, "--num-repeats", "2", "--seed", "7")).exit_code == 0
    kept = out.read_bytes().splitlines(keepends=True)[:4]
    out.write_bytes(b"".join(kept))
    return tasks, out, pairs_of(kept)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("reordered", "responses_create_params.input[0].content"),
        ("edited", "expected_answer"),
        ("shortened", "the task file has only 2 lines"),
        ("temperature", "responses_create_params.temperature: (not set) -> 0.9"),
        ("seed", "responses_create_params.seed"),
    ],
)
def test_resume_refuses_a_changed_task_file_or_request(half_run, model, change, named):
    """Before: each of these resumed, exit 0, and wrote the new rows' rollouts under the old rows' task
    indices (a group of two prompts, a reward for the wrong answer key)."""
    tasks, out, kept = half_run
    flags = ["--num-repeats", "2", "--seed", "7"]
    changed = rows(4)
    if change == "reordered":
        changed.reverse()
    elif change == "edited":
        changed[1]["expected_answer"] = "999"
    elif change == "shortened":
        changed = changed[:2]
    elif change == "temperature":
        flags += ["--temperature", "0.9"]
    else:
        flags[-1] = "8"
    write_rows(tasks, changed)
    before = out.read_bytes()
    result = invoke(*collect_args(tasks, out, model, "--resume", *flags))
    assert result.exit_code == 2, said(result)
    assert named in said(result), said(result)
    assert out.read_bytes() == before


def test_resume_takes_rows_added_at_the_end_and_more_repeats(half_run, model):
    tasks, out, kept = half_run
    write_rows(tasks, rows(5))
    result = invoke(*collect_args(tasks, out, model, "--resume", "--num-repeats", "3", "--seed", "7"))
    assert result.exit_code == 0, said(result)
    assert_written_exactly_once(out, 5, 3, kept)


def test_resume_over_a_huge_task_index_keeps_the_line_and_runs(tmp_path, model):
    """One stored rollout with ``_ng_task_index`` 10**12 made --resume grow its bitmap to 125 GB (MemoryError)."""
    tasks = write_rows(tmp_path / "tasks.jsonl", rows(2))
    out = tmp_path / "rollouts.jsonl"
    stray = {**arithmetic_row(9, 9), "_ng_task_index": 10**12, "_ng_rollout_index": 0, "reward": 0.0, "response": {"output": []}}
    write_rows(out, [stray])
    result = cli(*collect_args(tasks, out, model, "--resume"), memory_bytes=4 << 30, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "past the task file's 2 lines; kept as it is" in " ".join((result.stdout + result.stderr).split())
    assert pairs(out) == [(10**12, 0), *sorted(pairs(out)[1:])] and sorted(pairs(out)[1:]) == [(0, 0), (1, 0)]


def test_audit_refuses_a_json_path_it_cannot_write_before_attacking(tmp_path):
    """Before: every attack ran, then writing --json ended in a traceback whose exit 1 reads as findings."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = invoke("audit", "http://127.0.0.1:9", "--env", "math", "--json", blocker / "report.json")
    assert result.exit_code == 2, said(result)
    assert f"--json {blocker / 'report.json'}: cannot make its directory" in said(result)


def test_a_row_print_ignores_key_order_and_the_routing_stamps():
    """What --resume compares: the row and its request as run, not where it was routed (a bare URL env on
    a new port) nor the order its keys were written in."""
    from gym_bridge.collect.resume_index import first_difference, row_print

    row = {"responses_create_params": {"input": "q", "temperature": 0.5}, "expected_answer": "2",
           "agent_ref": {"name": "http://127.0.0.1:1_simple_agent"}, "_ng_environment_server": "a"}  # fmt: skip
    moved = {"_ng_environment_server": "b", "agent_ref": {"name": "http://127.0.0.1:2_simple_agent"},
             "expected_answer": "2", "responses_create_params": {"temperature": 0.5, "input": "q"}}  # fmt: skip
    assert row_print(row) == row_print(moved)
    changed = {**row, "responses_create_params": {"input": "q", "temperature": 0.9}}
    assert row_print(row) != row_print(changed)
    assert first_difference(row, changed) == "responses_create_params.temperature: 0.5 -> 0.9"
