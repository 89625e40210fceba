"""SIGKILL of collect, transform and train at seeded random moments, then resume: as if never stopped.

Each command runs as a real subprocess started here and is killed by PID (its process group) with a
real SIGKILL. A kill moment is "after the command has visibly made progress" (lines in its output, a temp
file, a logged step) plus a seeded random delay, so kills land mid-work rather than during start-up.

* collect: after the kills, ``--resume`` runs leave the same set of rollouts as an uninterrupted run,
  each once, every line whole; over the real tool_use server, a multi-turn rollout cut off mid-session
  is redone whole in a fresh session (its store ends as its reference calls leave it).
* transform: after any kill the output is absent (or the previous file, untouched) or complete, never
  half written; a rerun makes it complete. Kills land at a seeded share of the output already in the
  temp file, so they fall mid-write however fast the machine is.
* train: resumed runs log the same steps with the same losses as an uninterrupted run, and every
  checkpoint on disk loads.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fake_model import FakeModel, arithmetic_row, function_call, tool_outputs

from gym_bridge.records.schema import last_user_text

from .conftest import REPO
from .procs import cli, kill9, serving, start

SEED = 5


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_killed(
    args: list[str], progressed: Callable[[], bool], delay: float, timeout: float = 120, poll: float = 0.01
) -> bool:
    """Start ``args``; once ``progressed()`` holds, wait ``delay`` s and SIGKILL it. True if it was killed.

    ``timeout`` only bounds a hang (a command that never makes progress); it is not a speed check.
    """
    proc = start(args)
    deadline = time.monotonic() + timeout
    try:
        while not progressed():
            if proc.poll() is not None:
                return False  # finished (or failed) before the moment came
            assert time.monotonic() < deadline, f"{args} made no progress within {timeout} s"
            time.sleep(poll)
        time.sleep(delay)
        killed = proc.poll() is None
    finally:
        kill9(proc)
    return killed


def run_to_end(args: list[str], timeout: float = 180) -> str:
    proc = start(args)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        kill9(proc)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{out}\n{err}"
    return out


# --------------------------------------------------------------------------- collect


@pytest.fixture(scope="module")
def env_and_model() -> Iterator[tuple[str, str]]:
    """The env and a slow-ish fake model, each in its own process, so killing collect leaves them up."""
    with serving([sys.executable, "tests/reliability/serve_env.py"]) as env_url:
        with serving([sys.executable, "tests/fake_model.py", "--latency", "0.03"]) as model_url:
            yield env_url, model_url + "/v1"


def line_count(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def rollout_view(record: dict[str, Any]) -> tuple[Any, ...]:
    """What must match between runs (ids and timestamps of the fake model's answers may differ)."""
    text = record["response"]["output"][-1]["content"][0]["text"]
    return (
        record["_ng_task_index"],
        record["_ng_rollout_index"],
        record["reward"],
        record["extracted_answer"],
        text,
    )


def test_collect_killed_repeatedly_then_resumed_equals_an_uninterrupted_run(tmp_path, env_and_model):
    env_url, model_url = env_and_model
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(arithmetic_row(i % 10, i)) + "\n" for i in range(60)))
    repeats, total = 4, 240

    def args(out: Path) -> list[str]:
        return cli(
            "collect", str(tasks), "-o", str(out), "--env", env_url, "--model-url", model_url,
            "--num-repeats", str(repeats), "--concurrency", "8", "--seed", "1", "--resume", "--no-progress",
        )  # fmt: skip

    reference, killed_out = tmp_path / "reference.jsonl", tmp_path / "killed.jsonl"
    rng = random.Random(SEED)
    with ThreadPoolExecutor(1) as pool:
        straight = pool.submit(run_to_end, args(reference))
        kills = 0
        for _ in range(3):
            target = line_count(killed_out) + rng.randint(5, 40)
            kills += run_killed(
                args(killed_out), lambda t=target: line_count(killed_out) >= t, rng.uniform(0, 0.3)
            )
        run_to_end(args(killed_out))
        straight.result()
    assert kills >= 2  # the run really was cut short (a kill can come after the last rollout)

    records = read_jsonl(killed_out)  # every line parses: no torn line is left behind
    keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in records]
    assert len(keys) == len(set(keys)) == total
    assert sorted(map(rollout_view, records)) == sorted(map(rollout_view, read_jsonl(reference)))
    assert not (tmp_path / "killed_failures.jsonl").exists()


def shopping_tasks(path: Path, count: int) -> int:
    """``count`` tool_use tasks (the committed examples verified by outcome, cycled), each prompt ending
    in its reference calls as JSON so the scripted shopper can make them; returns the most calls a task
    needs."""
    examples = [json.loads(line) for line in (REPO / "resources_servers/tool_use/data/example.jsonl").open()]
    by_outcome = [r for r in examples if "reference_calls" in r["verifier_metadata"]]
    with open(path, "w") as f:
        for i in range(count):
            row = json.loads(json.dumps(by_outcome[i % len(by_outcome)]))
            calls = row["verifier_metadata"]["reference_calls"]
            row["responses_create_params"]["input"][-1]["content"] += " CALLS: " + json.dumps(calls)
            f.write(json.dumps(row) + "\n")
    return max(len(r["verifier_metadata"]["reference_calls"]) for r in by_outcome)


def shopper(request: dict[str, Any], n: int) -> Any:
    """A model that makes the calls listed after CALLS: in the prompt, one per turn, then says it is done."""
    calls = json.loads(last_user_text(request).split("CALLS: ", 1)[1])
    made = len(tool_outputs(request))
    if made < len(calls):
        return [function_call(calls[made]["name"], calls[made]["arguments"])]
    return "Done: your order is in."


def test_collect_over_tool_sessions_killed_then_resumed_redoes_whole_rollouts(tmp_path, builtin_url):
    """Multi-turn tool rollouts on the real tool_use server: a rollout cut off mid-session is redone from
    a fresh session on resume, so every rollout's store ends exactly as its reference calls leave it
    (reward 1) with each call made once, as in an uninterrupted run."""
    tasks = tmp_path / "tasks.jsonl"
    most_calls = shopping_tasks(tasks, 30)
    repeats, total = 2, 60
    rng = random.Random(SEED)
    with FakeModel(shopper, latency=0.02, record_requests=False) as model:

        def args(out: Path) -> list[str]:
            return cli(
                "collect", str(tasks), "-o", str(out), "--env", builtin_url("tool_use"),
                "--model-url", model.url, "--num-repeats", str(repeats), "--concurrency", "4",
                "--max-steps", str(most_calls + 2), "--resume", "--no-progress",
            )  # fmt: skip

        reference, killed_out = tmp_path / "reference.jsonl", tmp_path / "killed.jsonl"
        with ThreadPoolExecutor(1) as pool:
            straight = pool.submit(run_to_end, args(reference))
            target = rng.randint(3, 20)
            killed = run_killed(
                args(killed_out), lambda: line_count(killed_out) >= target, rng.uniform(0, 0.05)
            )
            assert killed and line_count(killed_out) < total  # cut short mid-run
            run_to_end(args(killed_out))
            straight.result()

    records = read_jsonl(killed_out)
    keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in records]
    assert len(keys) == len(set(keys)) == total
    assert all(r["reward"] == 1.0 and not r.get("state_diff") for r in records), [
        (r["_ng_task_index"], r.get("failure_reason")) for r in records if r["reward"] != 1.0
    ][:5]
    assert [
        r["tool_calls_made"]
        for r in sorted(records, key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
    ] == [
        r["tool_calls_made"]
        for r in sorted(read_jsonl(reference), key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
    ]


# --------------------------------------------------------------------------- transform


def write_rollouts(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            task = i // 4  # its 4 repeats share the row's prompt, as a collect run's do
            row = arithmetic_row(task % 50, task // 50)
            text = f"Let me think step by step about rollout {i}. " * 8 + f"\\boxed{{{task % 50 + task // 50 + i % 2}}}"
            row["response"] = {
                "id": f"resp_{i}",
                "output": [
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": text}],
                    }
                ],
            }
            row.update(reward=float(i % 3 == 0), _ng_task_index=i // 4, _ng_rollout_index=i % 4)
            f.write(json.dumps(row) + "\n")


def temp_files(out: Path) -> list[Path]:
    """The temp files a transform writes ``out`` through (renamed to ``out`` when complete)."""
    return [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp")]


@pytest.mark.parametrize("verb", ["grpo", "dpo"])
def test_transform_output_is_complete_or_absent_after_sigkill(tmp_path, verb):
    rollouts = tmp_path / "rollouts.jsonl"
    write_rollouts(rollouts, 12_000)  # kills are placed by bytes written, so a small file still has a middle
    reference = tmp_path / "reference.jsonl"
    run_to_end(cli("transform", verb, str(rollouts), "-o", str(reference)))
    expected = reference.read_bytes()
    assert expected.count(b"\n") > 1000

    out = tmp_path / "out.jsonl"
    rng = random.Random(SEED)
    outcomes = []
    for attempt in range(4):
        previous = b'{"old": "output of an earlier run"}\n' if attempt % 2 else None
        out.unlink(missing_ok=True)
        if previous is not None:
            out.write_bytes(previous)
        share = rng.uniform(0.05, 0.8)
        stale = set(temp_files(out))  # left by earlier kills: not this run's progress

        def written_share(share: float = share, stale: set[Path] = stale) -> bool:
            size = sum(p.stat().st_size for p in temp_files(out) if p not in stale and p.exists())
            return size >= share * len(expected)

        killed = run_killed(
            cli("transform", verb, str(rollouts), "-o", str(out)), written_share, delay=0, poll=0.001
        )
        now = out.read_bytes() if out.exists() else None
        assert now in (previous, expected), (
            f"attempt {attempt}: a half-written output ({len(now or b'')} bytes)"
        )
        outcomes.append((killed, now == expected))
    assert any(killed and not complete for killed, complete in outcomes)  # some kill landed mid-write

    run_to_end(cli("transform", verb, str(rollouts), "-o", str(out)))
    assert out.read_bytes() == expected


# --------------------------------------------------------------------------- train


def write_scored(path: Path, prompts: int = 16, per_prompt: int = 4) -> Path:
    rng = random.Random(SEED)
    with open(path, "w") as f:
        for _ in range(prompts):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            for _ in range(per_prompt):
                answer = a + b + rng.choice([0, 0, 1, -1])
                f.write(
                    json.dumps(
                        {
                            "input": f"What is {a} + {b}?",
                            "output": f"\\boxed{{{answer}}}",
                            "reward": float(answer == a + b),
                        }
                    )
                    + "\n"
                )
    return path


STEPS = 6


def train_args(config: Path, run: Path, model_dir: Path, data: Path) -> list[str]:
    return cli(
        "train", "--config", str(config), "-q",
        "grpo.mode=offline", "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4",
        f"grpo.max_num_steps={STEPS}", "grpo.max_num_epochs=10", "grpo.val_period=0", "grpo.seed=3",
        f"policy.model_name={model_dir}", "policy.train_global_batch_size=16", "policy.train_micro_batch_size=8",
        "policy.logprob_batch_size=16", "policy.max_total_sequence_length=64", "policy.generation.max_new_tokens=16",
        "policy.optimizer.kwargs.lr=1e-3",
        f"data.train.data_path={data}", f"checkpointing.checkpoint_dir={run / 'ckpt'}",
        "checkpointing.save_period=1", f"logger.log_dir={run / 'logs'}",
    )  # fmt: skip


def train_lines(run: Path) -> list[dict[str, Any]]:
    from gym_bridge.train.bookkeeping.logging import read_metrics
    from tests.train.helpers import TIMING_KEYS

    return [
        {k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)}
        for r in read_metrics(run / "logs")
        if r["split"] == "train"
    ]


@pytest.mark.timeout(400)
def test_train_killed_repeatedly_then_resumed_logs_the_same_run(tmp_path, tiny_model_dir):
    import torch
    from safetensors.torch import load_file

    from gym_bridge.train.bookkeeping.checkpoint import CheckpointManager

    data = write_scored(tmp_path / "scored.jsonl")
    config = tmp_path / "train.yaml"
    config.write_text("grpo:\n  mode: offline\n")
    straight_run, killed_run = tmp_path / "straight", tmp_path / "killed"
    rng = random.Random(SEED)
    with ThreadPoolExecutor(1) as pool:
        straight = pool.submit(run_to_end, train_args(config, straight_run, tiny_model_dir, data), 300)
        kills = 0
        for _ in range(1):  # each start costs seconds of torch import: one kill mid-run is enough here
            # right after step 1 or 2 is logged (plus a few ms): at least 4 steps are still to come
            target = len(train_lines(killed_run)) + rng.randint(1, 2)
            kills += run_killed(
                train_args(config, killed_run, tiny_model_dir, data),
                lambda t=target: len(train_lines(killed_run)) >= t,
                rng.uniform(0, 0.03),
                timeout=300,
            )
            assert len(train_lines(killed_run)) < STEPS  # the kill really cut the run short
        run_to_end(train_args(config, killed_run, tiny_model_dir, data), 300)
        straight.result()
    assert kills >= 1

    got, expected = train_lines(killed_run), train_lines(straight_run)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))  # the log reads as one run
    assert got == expected  # same losses, gradients and data order as if never killed

    checkpoints = CheckpointManager(killed_run / "ckpt").checkpoints()
    assert checkpoints and checkpoints[-1].step == STEPS
    reference = load_file(CheckpointManager(straight_run / "ckpt").latest().weights_dir / "model.safetensors")
    for ckpt in checkpoints:  # every checkpoint left on disk loads whole
        weights = load_file(ckpt.weights_dir / "model.safetensors")
        assert weights.keys() == reference.keys()
        assert ckpt.info["step"] == ckpt.step
        torch.load(ckpt.path / "policy" / "optimizer.pt", map_location="cpu", weights_only=False)
    final = load_file(checkpoints[-1].weights_dir / "model.safetensors")
    assert all(torch.equal(final[k], reference[k]) for k in reference)
