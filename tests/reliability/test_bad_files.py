"""Bad input files for every command that reads one: a clear error naming file:line, nothing lost.

Each file-reading command is run through the real CLI: collect's task file, and the output it reads
back on --resume; every transform verb's input; train's data and its config; the model directory of
collect --policy, serve policy and train. Data files are truncated, in the wrong encoding (latin-1,
UTF-16 with a BOM), missing required fields, or hold a huge line. Checked: the message names the file
and the line; good rows still go through (a transform writes exactly what the good lines alone give)
or, with --strict, nothing is written; an output that already exists is not damaged; and no traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_model import FakeModel, arithmetic_row
from typer.testing import CliRunner

from gym_bridge.cli import app

HUGE = 24 * 1024 * 1024


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def output_of(result: Any) -> str:
    """stdout and stderr together, with rich's line wrapping undone."""
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    return re.sub(r"\s*\n\s*", " ", text)


Rows = list[dict[str, Any]]


# Each bad file: builder(path, rows) -> (1-based bad line numbers, the rows that stay usable).
def truncated(path: Path, rows: Rows) -> tuple[set[int], Rows]:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text + json.dumps(rows[0])[:37])  # a last line cut off mid-object, no newline
    return {len(rows) + 1}, rows


def latin1(path: Path, rows: Rows) -> tuple[set[int], Rows]:
    bad = dict(rows[1])
    bad["question"] = bad["input"] = "Quelle est la réponse ? ¿Qué?"
    lines = [json.dumps(r, ensure_ascii=False) for r in [rows[0], bad, *rows[2:]]]
    path.write_bytes("\n".join(lines).encode("latin-1") + b"\n")
    return {2}, [rows[0], *rows[2:]]


def utf16(path: Path, rows: Rows) -> tuple[set[int], Rows]:
    path.write_bytes("".join(json.dumps(r) + "\n" for r in rows).encode("utf-16"))  # with a BOM
    return set(range(1, len(rows) + 1)), []


def huge_line(path: Path, rows: Rows) -> tuple[set[int], Rows]:
    with open(path, "w") as f:
        f.write(json.dumps(rows[0]) + "\n")
        f.write('{"responses_create_params": {"input": "' + "x" * HUGE + "\n")  # 24 MiB, never closed
        for r in rows[1:]:
            f.write(json.dumps(r) + "\n")
    return {2}, rows


def write_rows(path: Path, rows: Rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


BAD_FILES: dict[str, tuple[Callable[[Path, Rows], tuple[set[int], Rows]], str]] = {
    "truncated": (truncated, "invalid JSON"),
    "latin-1": (latin1, "UTF-8"),
    "utf-16": (utf16, "UTF-8"),
    "huge-line": (huge_line, "invalid JSON"),
}


def assert_names_lines(text: str, path: Path, lines: set[int], reason: str) -> None:
    first = min(lines)
    assert f"{path.name}:{first}" in text, text[-2000:]
    assert reason in text, text[-2000:]


# --------------------------------------------------------------------------- collect


@pytest.fixture(scope="module")
def model_url():
    with FakeModel(record_requests=False) as model:
        yield model.url


@pytest.mark.parametrize("kind", [*BAD_FILES, "missing-field"])
def test_collect_reports_bad_task_rows_and_keeps_earlier_rollouts(tmp_path, kind, arithmetic_env, model_url):
    rows = [arithmetic_row(i, 1) for i in range(4)]
    tasks = tmp_path / "tasks.jsonl"
    if kind == "missing-field":
        tasks.write_text(
            "".join(json.dumps(r) + "\n" for r in [rows[0], {"question": "no params"}, *rows[1:]])
        )
        (bad, usable), reason = ({2}, 4), "'responses_create_params' is missing"
    else:
        build, reason = BAD_FILES[kind]
        bad, kept = build(tasks, rows)
        usable = len(kept)
    out = tmp_path / "rollouts.jsonl"
    earlier = {
        **rows[0],
        "reward": 1.0,
        "_ng_task_index": 999,
        "_ng_rollout_index": 0,
        "response": {"output": []},
    }
    out.write_text(json.dumps(earlier) + "\n")
    common = (
        "--env",
        arithmetic_env[0],
        "--model-url",
        model_url,
        "--no-progress",
        "--request-timeout",
        "30",
    )

    strict = invoke("collect", tasks, "-o", out, *common, "--strict", "--resume")
    assert strict.exit_code == 2
    assert_names_lines(output_of(strict), tasks, bad, reason)
    assert out.read_text() == json.dumps(earlier) + "\n"  # --strict stops before writing anything

    result = invoke("collect", tasks, "-o", out, *common, "--resume")
    assert result.exit_code == (0 if usable else 1), output_of(result)  # no row usable: nothing succeeded
    assert_names_lines(output_of(result), tasks, bad, reason)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[0] == earlier  # what was already there is still there
    assert len(records) == 1 + usable
    failures = [json.loads(line) for line in (tmp_path / "rollouts_failures.jsonl").read_text().splitlines()]
    assert {f["_ng_failure_class"] for f in failures} == {"bad_task"}
    assert any(f"{tasks.name}:{min(bad)}" in f["error"] for f in failures)


# --------------------------------------------------------------------------- transform


def rollout(i: int) -> dict[str, Any]:
    """Rollout ``i``: task i // 2, repeat i % 2, reward 1 then 0 (so dpo pairs, sft keeps half)."""
    row = arithmetic_row(i // 2, 2)
    row["response"] = {
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"\\boxed{{{i // 2 + 2 + i % 2}}}"}],
            }
        ]
    }
    row.update(reward=float(i % 2 == 0), _ng_task_index=i // 2, _ng_rollout_index=i % 2)
    return row


VERBS = ["grpo", "sft", "dpo", "ranked", "ranked-to-grpo"]


def transform_rows(verb: str, tmp_path: Path) -> tuple[Rows, str]:
    """Good input rows for ``verb`` and the key whose absence makes a row bad."""
    rollouts = [rollout(i) for i in range(8)]
    if verb != "ranked-to-grpo":
        return rollouts, "response"
    src, ranked = tmp_path / "for_ranking.jsonl", tmp_path / "ranked_input.jsonl"
    write_rows(src, rollouts)
    assert invoke("transform", "ranked", src, "-o", ranked).exit_code == 0
    return [json.loads(line) for line in ranked.read_text().splitlines()], "group"


@pytest.mark.parametrize("kind", [*BAD_FILES, "missing-field"])
@pytest.mark.parametrize("verb", VERBS)
def test_transform_reports_bad_lines_and_never_damages_the_output(tmp_path, verb, kind):
    """Bad lines are named and skipped: the output is what the good lines alone give (or, with
    --strict, nothing is written and an existing output stays as it was)."""
    rows, required = transform_rows(verb, tmp_path)
    src = tmp_path / "input.jsonl"
    if kind == "missing-field":
        broken = {k: v for k, v in rows[1].items() if k != required}
        write_rows(src, [rows[0], broken, *rows[2:]])
        (bad, kept), reason = ({2}, [rows[0], *rows[2:]]), required
    else:
        build, reason = BAD_FILES[kind]
        bad, kept = build(src, rows)
    clean, expected = tmp_path / "clean.jsonl", tmp_path / "expected.jsonl"
    write_rows(clean, kept)
    assert invoke("transform", verb, clean, "-o", expected).exit_code == (0 if kept else 1)
    out = tmp_path / "out.jsonl"
    out.write_text('{"earlier": "output"}\n')

    strict = invoke("transform", verb, src, "-o", out, "--strict")
    assert strict.exit_code == 1
    assert_names_lines(output_of(strict), src, bad, reason)
    assert out.read_text() == '{"earlier": "output"}\n'  # untouched by a failed run

    result = invoke("transform", verb, src, "-o", out)
    assert_names_lines(output_of(result), src, bad, reason)
    if not kept:  # no line usable (utf-16): a failed run, not an empty training file, and OUT as it was
        assert result.exit_code == 1, output_of(result)
        assert f"no usable record in {src}" in output_of(result)
        assert out.read_text() == '{"earlier": "output"}\n'
        return
    assert result.exit_code == 0, output_of(result)
    assert out.read_bytes() == expected.read_bytes()
    assert out.stat().st_size > 0  # the good lines really made records


# --------------------------------------------------------------------------- train


def scored(i: int) -> dict[str, Any]:
    return {"input": f"What is {i} + 1?", "output": f"\\boxed{{{i + 1}}}", "reward": 1.0}


@pytest.mark.parametrize("kind", [*BAD_FILES, "missing-field"])
def test_train_data_errors_name_file_and_line_before_any_training(tmp_path, kind, tiny_model_dir):
    rows = [scored(i) for i in range(4)]
    data = tmp_path / "scored.jsonl"
    if kind == "missing-field":
        data.write_text(
            "\n" + "".join(json.dumps(r) + "\n" for r in [rows[0], {"input": "no reward"}, *rows[1:]])
        )
        bad, reason = {3}, "reward"  # line 3: the blank first line counts
    else:
        build, reason = BAD_FILES[kind]
        bad, _ = build(data, rows)
    ckpt, logs = tmp_path / "ckpt", tmp_path / "logs"
    config = tmp_path / "train.yaml"
    config.write_text("grpo:\n  mode: offline\n")
    result = invoke(
        "train", "--config", config, "-q", f"data.train.data_path={data}", "grpo.val_period=0",
        f"checkpointing.checkpoint_dir={ckpt}", f"logger.log_dir={logs}", f"policy.model_name={tiny_model_dir}",
    )  # fmt: skip
    text = output_of(result)
    assert result.exit_code == 2, text[-2000:]
    assert "Traceback" not in text
    assert_names_lines(text, data, bad, reason)
    assert not ckpt.exists() or not any(ckpt.iterdir())


CONFIGS: dict[str, tuple[bytes, str]] = {
    # kind: (config file bytes, what the error must say besides the file's name)
    "not-yaml": (b"grpo:\n  mode: offline\n  max_num_steps: [\n", "not valid YAML"),
    "latin-1": ('grpo:\n  mode: offline\nlogger:\n  note: "réseau"\n'.encode("latin-1"), "UTF-8"),
    "utf-16": ("grpo:\n  mode: offline\n".encode("utf-16"), "UTF-8"),
    "not-a-mapping": (b"- grpo\n- offline\n", "mapping"),
}


@pytest.mark.parametrize(
    "kind",
    [
        "not-yaml",
        "latin-1",
        "utf-16",
        "not-a-mapping",
    ],
)
def test_train_config_errors_name_the_file_without_a_traceback(tmp_path, kind):
    content, reason = CONFIGS[kind]
    config = tmp_path / "train.yaml"
    config.write_bytes(content)
    ckpt = tmp_path / "ckpt"
    result = invoke("train", "--config", config, "-q", f"checkpointing.checkpoint_dir={ckpt}")
    text = output_of(result)
    assert "Traceback" not in text, text[-2000:]
    assert result.exit_code == 2, text[-2000:]
    assert config.name in text and reason in text, text[-2000:]
    assert not ckpt.exists()


# --------------------------------------------------------------------------- collect --resume


def test_collect_resume_over_a_damaged_output_redoes_exactly_the_lost_rollouts(
    tmp_path, arithmetic_env, model_url
):
    """An output damaged after the fact (torn tail, garbage, latin-1, a record without indices, a
    duplicate) is read line by line on --resume: each damaged line is named, and afterwards every
    (task, repeat) has exactly one good record."""
    rows = [arithmetic_row(i, 1) for i in range(6)]
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "rollouts.jsonl"
    write_rows(tasks, rows)
    common = ("--env", arithmetic_env[0], "--model-url", model_url, "--no-progress", "--num-repeats", "2")
    first = invoke("collect", tasks, "-o", out, *common)
    assert first.exit_code == 0, output_of(first)
    lines = out.read_bytes().splitlines(keepends=True)
    assert len(lines) == 12
    no_index = json.loads(lines[3])
    del no_index["_ng_task_index"]
    damaged = [
        lines[0],
        b'{"_ng_task_index": 1, "_ng_rollout_ind\n',  # line 2: garbage in place of a record
        json.dumps({**json.loads(lines[2]), "note": "café"}, ensure_ascii=False).encode("latin-1") + b"\n",
        json.dumps(no_index).encode() + b"\n",  # line 4
        *lines[4:11],
        lines[0],  # line 12: a duplicate
        lines[11][:40],  # a torn tail
    ]
    out.write_bytes(b"".join(damaged))
    lost = {
        json.loads(line)["_ng_task_index"] * 2 + json.loads(line)["_ng_rollout_index"]
        for line in lines[1:4] + lines[11:]
    }

    result = invoke("collect", tasks, "-o", out, *common, "--resume")
    text = output_of(result)
    assert result.exit_code == 0, text
    for line in (2, 3, 4, 12):
        assert f"{out.name}:{line}" in text, text
    assert "torn" in text
    good = []
    for raw in out.read_bytes().splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if "_ng_task_index" in record:
            good.append((record["_ng_task_index"], record["_ng_rollout_index"]))
    assert sorted(set(good)) == [(t, r) for t in range(6) for r in range(2)]
    assert len(good) == 12 + 1  # the duplicate stays (counted once); nothing else twice
    assert len(lost) == 4  # only the lost ones were collected again:
    assert re.search(rf"written this run\W+{len(lost)}\b", text), text


# --------------------------------------------------------------------------- model directories

def broken_model_dir(path: Path, kind: str) -> Path:
    path.mkdir()
    if kind == "truncated-config":
        (path / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    return path


@pytest.mark.parametrize("kind", ["truncated-config", "empty-dir"])
@pytest.mark.parametrize(
    "command",
    ["collect", "serve", "train"],
)
def test_a_broken_model_directory_is_a_plain_error(tmp_path, command, kind, arithmetic_env):
    model = broken_model_dir(tmp_path / "model", kind)
    if command == "collect":
        tasks = tmp_path / "tasks.jsonl"
        write_rows(tasks, [arithmetic_row(1, 1)])
        args = ["collect", tasks, "-o", tmp_path / "out.jsonl", "--env", arithmetic_env[0], "--policy", model]
    elif command == "serve":
        args = ["serve", "policy", "--model", model, "--port", "0"]
    else:
        data, config = tmp_path / "scored.jsonl", tmp_path / "train.yaml"
        write_rows(data, [scored(i) for i in range(4)])
        config.write_text("grpo:\n  mode: offline\n")
        args = ["train", "--config", config, "-q", f"data.train.data_path={data}", f"policy.model_name={model}",
                f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}", f"logger.log_dir={tmp_path / 'logs'}"]  # fmt: skip
    result = invoke(*args)
    text = output_of(result)
    assert result.exit_code == 2 and "Traceback" not in text, text[-2000:]
    assert "model" in text and str(model.name) in text, text[-2000:]
