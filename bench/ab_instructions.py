"""A/B of ``gym-bridge collect``'s work per rollout between checkouts, counted in instructions (callgrind).

CPU seconds on a shared machine swing by a third between identical runs (a busy sibling hyperthread
halves a core's speed), which hides a 10 % change in CPU per rollout. Instructions do not depend on the
load. Each checkout's ``collect`` (the no-op verifier of ``bench/bench_collect.py`` or the built-in math
server, started in-process by collect as usual) runs under ``valgrind --tool=callgrind`` against one fake
model (the first checkout's ``tests/fake_model.py``, in its own process, not counted), on a task file of
two sizes; the difference in instructions over the difference in rollouts is the marginal cost of a
rollout (its requests, both ends of each, the loop, the output files and its share of the end-of-run
``/aggregate_metrics``), free of start-up. Checkouts take turns (A B, then B A, ...) round by round.

The count is not exactly repeatable: the collect process's threads (its loop and, in a checkout that
serves its envs over loopback HTTP, the env server's) interleave differently from run to run, and
rollouts finish in another order, which moves the marginal cost by about 1-2 %; take the median of a
few rounds (``--rounds``) and read differences under ~3 % as noise. Since collect calls the envs it
starts itself in-process (its ``--env-transport`` default), this compares each checkout's default path.

    nice -n 19 .venv/bin/python bench/ab_instructions.py /tmp/before . --env noop math --concurrency 16 256

Needs valgrind. A run takes about 50 times its normal CPU time: with the default sizes (50 and 550 task
rows, 2 repeats each) ~2 and ~6 minutes per checkout, env and concurrency on one free core. Only
loopback addresses are used; every file lives in a temporary directory.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ENVS = {"noop": "bench_collect:NoopServer", "math": "math"}
"""``--env`` names -> what collect's ``--env`` is given (the no-op server lives in each checkout's bench/)."""


def write_tasks(path: Path, rows: int) -> None:
    """``rows`` arithmetic tasks (the fake model answers them right, the math server checks them)."""
    with open(path, "w") as f:
        for i in range(rows):
            a, b = i % 10, (i // 10) % 10
            prompt = f"What is {a} + {b}? Put the answer in \\boxed{{}}."
            row = {
                "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
                "question": f"What is {a} + {b}?",
                "expected_answer": str(a + b),
            }
            f.write(json.dumps(row) + "\n")


def checkout_env(checkout: Path) -> dict[str, str]:
    """Environment variables that make the shared interpreter import ``checkout``'s code."""
    return {**os.environ, "PYTHONPATH": f"{checkout}{os.pathsep}{checkout / 'bench'}"}


def check_imports(checkout: Path) -> None:
    """Refuse a checkout whose gym_bridge would not be the one imported (an installed copy shadowing it)."""
    found = subprocess.run(
        [sys.executable, "-c", "import gym_bridge; print(gym_bridge.__file__)"],
        cwd=checkout,
        env=checkout_env(checkout),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(checkout):
        raise SystemExit(f"{checkout}: PYTHONPATH does not win, gym_bridge comes from {found}")


def instructions(
    checkout: Path, tasks: Path, work: Path, model_url: str, env: str, concurrency: int, repeats: int
) -> tuple[int, int]:
    """``(instructions, rollouts written)`` of one ``collect`` run of ``checkout`` under callgrind."""
    out = work / "rollouts.jsonl"
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={work / 'callgrind.%p'}",
        "--dump-instr=no",
        sys.executable,
        "-m",
        "gym_bridge.cli",
        "collect",
        str(tasks),
        "-o",
        str(out),
        "--overwrite",
        "--env",
        ENVS[env],
        "--model-url",
        model_url,
        "--concurrency",
        str(concurrency),
        "--num-repeats",
        str(repeats),
        "--no-progress",
        "--request-timeout",
        "600",
    ]
    run = subprocess.run(cmd, cwd=checkout, env=checkout_env(checkout), capture_output=True, text=True)
    for leftover in work.glob("callgrind.*"):
        leftover.unlink()
    found = re.findall(r"Collected : ([\d,]+)", run.stderr)
    if run.returncode != 0 or not found:
        raise RuntimeError(
            f"{checkout}: collect under callgrind failed ({run.returncode}): {run.stderr[-2000:]}"
        )
    metrics = json.loads(out.with_name(out.stem + "_metrics.json").read_text())
    return int(found[-1].replace(",", "")), metrics["run"]["rollouts_written"]


def start_fake_model(checkout: Path) -> tuple[subprocess.Popen[str], str]:
    """The checkout's scripted fake model in a process of its own; its base URL (on 127.0.0.1)."""
    fake = subprocess.Popen(
        [sys.executable, str(checkout / "tests" / "fake_model.py")],
        cwd=checkout,
        env=checkout_env(checkout),
        stdout=subprocess.PIPE,
        text=True,
    )
    url = fake.stdout.readline().strip() if fake.stdout is not None else ""
    if not url.startswith("http://127.0.0.1:"):
        fake.kill()
        raise SystemExit(f"the fake model did not start on loopback (it said {url!r})")
    return fake, url


def per_rollout(
    checkout: Path, work: Path, sizes: tuple[int, int], url: str, env: str, concurrency: int, repeats: int
) -> dict[str, Any]:
    """One measurement: ``checkout``'s collect at both sizes, and the marginal instructions per rollout."""
    counts = [
        instructions(checkout, work / f"tasks_{rows}.jsonl", work, url, env, concurrency, repeats)
        for rows in sizes
    ]
    (ir_small, n_small), (ir_large, n_large) = counts
    if n_large <= n_small or n_large != sizes[1] * repeats:
        print(f"  warning: {checkout}: {n_small} and {n_large} rollouts written", flush=True)
    return {
        "instructions": [ir_small, ir_large],
        "rollouts": [n_small, n_large],
        "per_rollout": (ir_large - ir_small) / (n_large - n_small),
    }


def print_table(
    checkouts: list[Path], runs: dict[tuple[str, int], dict[Path, list[float]]], rounds: int
) -> None:
    """Per env and concurrency: each checkout's median (and range) and its ratio to the baseline's."""
    print("\n" + "\n".join(f"[{i}] {c}" + (" (baseline)" if i == 0 else "") for i, c in enumerate(checkouts)))
    print(f"\nmarginal instructions per rollout, millions: median of {rounds} (range); ratio to [0]")
    print(
        f"{'env':5s} {'c':>5s}  "
        + "  ".join(f"{f'[{i}]':>22s}" for i in range(len(checkouts)))
        + "".join(f"  [{i}]/[0]" for i in range(1, len(checkouts)))
    )
    for (env, concurrency), by_checkout in runs.items():
        medians = [statistics.median(by_checkout[c]) for c in checkouts]
        cells = [
            f"{m / 1e6:.3f} ({min(by_checkout[c]) / 1e6:.3f}-{max(by_checkout[c]) / 1e6:.3f})"
            for m, c in zip(medians, checkouts, strict=True)
        ]
        ratios = "".join(f"  {m / medians[0]:7.3f}" for m in medians[1:])
        print(f"{env:5s} {concurrency:5d}  " + "  ".join(f"{cell:>22s}" for cell in cells) + ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", type=Path, nargs="+", help="the checkouts; the first is the baseline")
    parser.add_argument("--env", nargs="+", choices=sorted(ENVS), default=["noop"], help="envs to measure")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16], help="collect --concurrency")
    parser.add_argument(
        "--rows",
        type=int,
        nargs=2,
        default=[50, 550],
        metavar=("SMALL", "LARGE"),
        help="task rows of the two runs whose difference is measured",
    )
    parser.add_argument("--repeats", type=int, default=2, help="collect --num-repeats")
    parser.add_argument(
        "--rounds", type=int, default=1, help="measurements per checkout (in alternating order)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every count to this file")
    args = parser.parse_args()
    checkouts = [c.resolve() for c in args.checkouts]
    for checkout in checkouts:
        check_imports(checkout)
    sizes = (min(args.rows), max(args.rows))
    runs: dict[tuple[str, int], dict[Path, list[float]]] = {}
    raw: list[dict[str, Any]] = []
    fake, url = start_fake_model(checkouts[0])
    try:
        with tempfile.TemporaryDirectory(prefix="ab-instructions-") as tmp:
            work = Path(tmp)
            for rows in sizes:
                write_tasks(work / f"tasks_{rows}.jsonl", rows)
            for env, c in itertools.product(args.env, args.concurrency):
                runs[(env, c)] = {checkout: [] for checkout in checkouts}
                for round_ in range(args.rounds):
                    for checkout in checkouts if round_ % 2 == 0 else checkouts[::-1]:  # A B, B A, ...
                        found = per_rollout(checkout, work, sizes, url, env, c, args.repeats)
                        runs[(env, c)][checkout].append(found["per_rollout"])
                        raw.append(
                            {
                                "checkout": str(checkout),
                                "env": env,
                                "concurrency": c,
                                "round": round_,
                                **found,
                            }
                        )
                        print(
                            f"{env} c={c} round {round_}: {checkout}: {found['per_rollout'] / 1e6:.3f} M",
                            flush=True,
                        )
    finally:
        fake.kill()
        fake.wait()
    print_table(checkouts, runs, args.rounds)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": sizes, "repeats": args.repeats, "runs": raw}, indent=2))


if __name__ == "__main__":
    main()
