"""Shared helpers for bench modules: the result-row shape ``run_all.py`` reads, and the machine's facts.

A bench module builds its figures with :func:`figure` and writes them with :func:`write_results`::

    from common import figure, write_results   # bench/ is the script's directory, so this imports

    rows = [figure("verify requests/s (c=16)", 412.0, "req/s", baseline=1650.0, baseline_unit="req/s",
                   note="baseline: GET /health on the same server, same run; higher is better")]
    write_results("math_verify", rows, quick=args.quick, details={...})

See bench/README.md for the contract.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
ROW_KEYS = ("name", "value", "unit", "baseline", "baseline_unit", "ratio", "note")


def figure(
    name: str,
    value: float,
    unit: str,
    *,
    baseline: float | None = None,
    baseline_unit: str | None = None,
    ratio: float | None = None,
    note: str = "",
) -> dict[str, Any]:
    """One result row; ``ratio`` defaults to value / baseline when both are there and the units match."""
    baseline_unit = baseline_unit if baseline_unit is not None else (unit if baseline is not None else None)
    if ratio is None and baseline not in (None, 0) and baseline_unit == unit:
        ratio = value / baseline  # type: ignore[operator]
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_unit": baseline_unit,
        "ratio": ratio,
        "note": note,
    }


def is_row(obj: Any) -> bool:
    """Whether ``obj`` is a result row in the contract's shape (name, numeric value, unit)."""
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("name"), str)
        and isinstance(obj.get("value"), int | float)
        and not isinstance(obj.get("value"), bool)
        and isinstance(obj.get("unit"), str)
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """CPU model, cores, RAM, OS and library versions, read without importing torch."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    return {
        "cpu": _cpu_model(),
        "cores": cores,
        "ram_gib": _ram_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "loadavg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants (a run's rollout and verifier processes too)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def write_results(
    name: str,
    rows: list[dict[str, Any]],
    *,
    quick: bool = False,
    details: dict[str, Any] | None = None,
    results_dir: Path | None = None,
) -> Path:
    """Write ``<results_dir>/<name>.json`` in the contract's shape (atomically); return its path.

    The directory defaults to ``$BENCH_RESULTS_DIR`` (set by ``run_all.py``), else bench/results.
    """
    bad = [r for r in rows if not is_row(r)]
    if bad:
        raise ValueError(f"not result rows (need name, numeric value, unit): {bad[:3]}")
    out_dir = results_dir or Path(os.environ.get("BENCH_RESULTS_DIR") or RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "bench": name,
        "quick": quick,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": machine_info(),
        "rows": [{key: row.get(key) for key in ROW_KEYS} for row in rows],
        "details": details or {},
    }
    path = out_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def print_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """One line per figure, with its ratio to the baseline, then where :func:`write_results` put them."""
    for row in rows:
        ratio = f"  (x{row['ratio']:.2f} of baseline {row['baseline']:.1f})" if row["ratio"] else ""
        print(f"{row['name']}: {row['value']:.1f} {row['unit']}{ratio}")
    print(f"wrote {path}")


@contextmanager
def builtin_server(
    name: str, stop_timeout: float = 30, extra_args: tuple[str, ...] = (), tree: Path = REPO
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``gym-bridge serve NAME --port 0 [EXTRA_ARGS]`` as a child process, as users run it: ``(process, url)``.

    A child process keeps the server's CPU apart from the bench client's (see :func:`tree_cpu_seconds`);
    it is stopped (SIGTERM, then SIGKILL after ``stop_timeout`` seconds) when the block ends. ``tree``: the
    source tree whose code it runs (another commit's copy for an A/B; its own directory comes first on
    the path).
    """
    command = [sys.executable, "-m", "gym_bridge.cli", "serve", name, "--port", "0", *extra_args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=tree)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "listening on " not in line:
            raise RuntimeError(f"the {name} server did not start: {line!r}")
        yield process, line.split("listening on ")[1].split()[0]
    finally:
        process.terminate()
        try:
            process.wait(stop_timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def tree_cpu_seconds(root: int) -> float:
    """User+system CPU seconds of a process and all its live descendants (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / ticks
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(cpu.get(pid, 0.0) for pid in tree)


def trl_answer_dataset(path: Path) -> Any:
    """A task JSONL as TRL rows: ``prompt`` (the request's messages) and ``expected_answer``."""
    from datasets import Dataset

    from gym_bridge.records.jsonl import iter_jsonl

    rows = [row for _, row in iter_jsonl(path)]
    return Dataset.from_list(
        [{"prompt": r["responses_create_params"]["input"], "expected_answer": r["expected_answer"]} for r in rows]
    )


def run_trl_timed(args: Any, **trainer_kwargs: Any) -> dict[str, Any]:
    """``GRPOTrainer(args=args, **trainer_kwargs).train()``, timed: the wall time and per step its seconds,
    generated tokens (mean completion length x batch) and mean reward, the rows the TRL benches report."""
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    step_times: list[float] = []
    logs: list[dict[str, float]] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step_times.append(time.perf_counter() - self.started)

        def on_log(self, args: Any, state: Any, control: Any, logs_: Any = None, **kwargs: Any) -> None:
            record = kwargs.get("logs") or logs_
            if record and "reward" in record:
                logs.append(dict(record))

    trainer = GRPOTrainer(args=args, callbacks=[Timer()], **trainer_kwargs)
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    batch = args.per_device_train_batch_size
    return {
        "wall_s": wall,
        "steps": [
            {
                "step_s": seconds,
                "generated_tokens": log.get("completions/mean_length", float("nan")) * batch,
                "reward": log["reward"],
            }
            for seconds, log in zip(step_times, logs, strict=False)
        ],
    }
