"""Open time and memory of ``gym-bridge view`` on a generated 1,000,000-line rollout file.

Measured in the same run on the same file (the generator of ``bench_transform.py``: NeMo Gym math
rollouts, 8 per task), each in its own child process so peak RSS and CPU time are its own:

* the viewer's index alone (``RolloutIndex.build``): wall and CPU time, peak RSS;
* baselines: a plain line count of the file (``for line in f``: the I/O floor of any pass over it) and
  ``json.loads`` of every line (what a viewer that parses the file pays);
* the served viewer (``gym-bridge view FILE --port 0``): time until its first page answers (the index is
  built in the background; the page shows progress), until the file is indexed, then the overview's
  first page, a task's group (its first view imports torch for the advantages) and a free-text search;
  the server's peak RSS (``VmHWM``).

    .venv/bin/python bench/bench_viewer.py            # 1,000,000 lines; writes bench/results/viewer.json
    .venv/bin/python bench/bench_viewer.py --quick    # 100,000 lines
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_transform import _PARSE_ONLY, _measure, generate  # noqa: E402
from common import figure, write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FULL_LINES, QUICK_LINES = 1_000_000, 100_000

_LINE_COUNT = """
import sys
with open(sys.argv[1], "rb") as f:
    print(sum(1 for _ in f))
"""

_INDEX = """
import sys
from gym_bridge.viewer.index import RolloutIndex
index = RolloutIndex(sys.argv[1]).build()
assert index.ready and index.num_records == int(sys.argv[2]), (index.error, index.num_records)
"""


def _timed_get(client: httpx.Client, url: str, **params: Any) -> float:
    start = time.perf_counter()
    answer = client.get(url, params=params)
    seconds = time.perf_counter() - start
    if answer.status_code != 200:
        raise SystemExit(f"GET {url} {params}: {answer.status_code} {answer.text[:300]}")
    return seconds


def _served(path: Path, lines: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gym_bridge.cli", "view", str(path), "--port", "0"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        match = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
        if not match:
            raise SystemExit(f"view printed no URL: {line!r} {proc.stderr.read()}")  # type: ignore[union-attr]
        url = match.group(1)
        with httpx.Client(timeout=600) as client:
            client.get(url + "/f/a").raise_for_status()  # the progress page while it indexes
            first_page = time.perf_counter() - start
            while client.get(url + "/health").json()["files"]["a"] is not True:
                time.sleep(0.05)
            indexed = time.perf_counter() - start
            overview = _timed_get(client, url + "/f/a")
            overview_sorted = _timed_get(client, url + "/f/a", sort="reward", order="desc", page=3)
            group_first = _timed_get(client, url + "/f/a/task/7")
            group_next = _timed_get(client, url + "/f/a/task/8")
            search = _timed_get(client, url + "/f/a", q=f"(task {lines // 8 - 1})")
        status = Path(f"/proc/{proc.pid}/status").read_text()
        hwm = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {
        "first_page_s": round(first_page, 2),
        "indexed_s": round(indexed, 2),
        "overview_s": round(overview, 3),
        "overview_sorted_page3_s": round(overview_sorted, 3),
        "group_first_s": round(group_first, 3),
        "group_next_s": round(group_next, 3),
        "search_s": round(search, 2),
        "server_peak_rss_mib": round(hwm, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_LINES:,} lines instead of {FULL_LINES:,}")
    parser.add_argument("--lines", type=int, default=None, help=f"default {FULL_LINES:,} ({QUICK_LINES:,} quick)")
    parser.add_argument("--workdir", type=Path, default=None, help="Where to put the generated file.")
    args = parser.parse_args()
    lines = args.lines or (QUICK_LINES if args.quick else FULL_LINES)

    with tempfile.TemporaryDirectory(prefix="bench-viewer-", dir=args.workdir) as tmp:
        src = Path(tmp) / "rollouts.jsonl"
        t0 = time.perf_counter()
        generate(src, lines)
        size_mib = src.stat().st_size / 2**20
        print(f"generated {lines:,} lines ({size_mib:,.0f} MiB) in {time.perf_counter() - t0:.1f}s", flush=True)
        line_count = _measure([sys.executable, "-c", _LINE_COUNT, str(src)])
        parse_all = _measure([sys.executable, "-c", _PARSE_ONLY, str(src)])
        index = _measure([sys.executable, "-c", _INDEX, str(src), str(lines)])
        served = _served(src, lines)
    details = {"lines": lines, "file_mib": round(size_mib), "line_count": line_count, "json_loads_all": parse_all,
               "index": index, "served": served}
    print(details, flush=True)
    at = f"{lines:,} lines, {size_mib:,.0f} MiB"
    same = "same file, same run, own child process"
    rows = [
        figure(f"view: index build ({at})", index["seconds"], "s", baseline=line_count["seconds"],
               note=f"baseline: a plain line count of the file ({same}); lower is better"),
        figure(f"view: index build vs parsing every line ({at})", index["cpu_seconds"], "cpu-s",
               baseline=parse_all["cpu_seconds"],
               note=f"baseline: json.loads of every line ({same}), CPU time; lower is better"),
        figure(f"view: index peak RSS ({at})", index["peak_rss_mib"], "MiB", baseline=line_count["peak_rss_mib"],
               note=f"baseline: the line count's peak RSS ({same}); lower is better"),
        figure(f"view: first page answers ({at})", served["first_page_s"], "s", baseline=line_count["seconds"],
               note="server start to the first page (indexing goes on in the background, the page shows "
               "progress); baseline: the plain line count; lower is better"),
        figure(f"view: file indexed, served ({at})", served["indexed_s"], "s", baseline=line_count["seconds"],
               note="server start until the whole file is indexed; baseline: the plain line count"),
        figure(f"view: overview page ({at})", served["overview_s"], "s",
               note="GET of the first 100 tasks once indexed"),
        figure(f"view: free-text search ({at})", served["search_s"], "s", baseline=line_count["seconds"],
               note="one pass over the file with a raw-byte pre-filter; baseline: the plain line count"),
        figure(f"view: server peak RSS ({at})", served["server_peak_rss_mib"], "MiB",
               baseline=line_count["peak_rss_mib"],
               note="after indexing, the overview, two groups (torch imported) and a search; baseline: the "
               "line count's peak RSS"),
    ]  # fmt: skip
    write_results("viewer", rows, quick=args.quick, details=details)


if __name__ == "__main__":
    main()
