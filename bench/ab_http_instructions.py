"""A/B of the HTTP servers' work per request between checkouts, counted in instructions (callgrind).

Why: ``ab_http.py``'s rates swing by 10-20 % between sittings on a shared machine; instructions do not
depend on the load. Each checkout serves ``ab_http.py``'s two servers (the policy server over an
instant backend, the no-op resources server) in one process under ``valgrind --tool=callgrind``; per
target, after a warm-up burst, the counters are zeroed (``callgrind_control -z``), a burst of
``--requests`` is sent (``ab_http.burst``: collect's client, in this process, not counted) and the
counters are dumped (``callgrind_control -d``). The server's idle work (uvicorn's 0.1 s ticks), measured
the same way over one idle second, is taken off in proportion to the burst's duration. Checkouts take
turns (A B, then B A, ...); read differences under ~3 % as noise (thread interleaving).

    .venv/bin/python bench/ab_http_instructions.py /tmp/ab-old /tmp/ab-new --requests 300 --concurrency 16 --rounds 2

Needs valgrind; a checkout takes about 2 minutes a round on one free core. Writes
``bench/results/http_instructions_ab.json``. Only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ab_http import _SERVERS, TARGETS, burst
from common import figure, write_results


def _counted(pid: int, out: Path, action: object) -> tuple[int, float]:
    """Instructions the process ``pid`` ran while ``action()`` ran, and the seconds it took."""
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    started = time.perf_counter()
    action()  # type: ignore[operator]
    seconds = time.perf_counter() - started
    before = set(out.glob(f"cg.{pid}.*"))
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    dump = max(set(out.glob(f"cg.{pid}.*")) - before, key=lambda p: p.stat().st_mtime)
    found = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.M)
    if found is None:
        raise RuntimeError(f"no instruction count in {dump}")
    return int(found.group(1)), seconds


def per_request(checkout: Path, out: Path, requests: int, concurrency: int) -> dict[str, float]:
    """Each target's instructions per request in ``checkout``'s servers, idle work taken off."""
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p", "--dump-instr=no",
         sys.executable, "-c", _SERVERS, str(checkout)],
        env={**os.environ, "PYTHONPATH": str(checkout)}, cwd=checkout,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        urls = dict(zip(("policy", "noop"), proc.stdout.readline().split(), strict=True))  # type: ignore[union-attr]
        found = {}
        for name, (server, path, body) in TARGETS.items():
            url = urls[server] + path
            asyncio.run(burst(url, body, concurrency, 100))  # warm-up
            idle, idle_s = _counted(proc.pid, out, lambda: time.sleep(1.0))
            total, seconds = _counted(proc.pid, out, lambda: asyncio.run(burst(url, body, concurrency, requests)))  # noqa: B023
            found[name] = (total - idle / idle_s * seconds) / requests
            print(f"{checkout} {name}: {found[name] / 1e3:.0f} k instructions/request", flush=True)
        return found
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", type=Path, nargs=2, help="the baseline checkout (A), then B")
    parser.add_argument("--requests", type=int, default=300, help="requests per counted burst")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="measurements per checkout (alternating)")
    args = parser.parse_args()
    a, b = (c.resolve() for c in args.checkouts)
    counts: dict[str, dict[str, list[float]]] = {name: {"a": [], "b": []} for name in TARGETS}
    with tempfile.TemporaryDirectory(prefix="ab-http-instructions-") as tmp:
        for i in range(args.rounds):
            for side, checkout in (("a", a), ("b", b)) if i % 2 == 0 else (("b", b), ("a", a)):
                for name, value in per_request(checkout, Path(tmp) / f"{side}{i}", args.requests, args.concurrency).items():
                    counts[name][side].append(round(value))
    rows = []
    for name, by_side in counts.items():
        old, new = statistics.median(by_side["a"]), statistics.median(by_side["b"])
        print(f"{name:34s} A {old / 1e3:6.0f} k  B {new / 1e3:6.0f} k instructions/request  B/A {new / old:5.3f}")
        rows.append(figure(f"{name}, c={args.concurrency}, instructions per request (B: {b})", new, "instructions",
                           baseline=old, note=f"A: {a}; the serving process under callgrind, median of {args.rounds}, "
                           f"bursts of {args.requests}; lower is better"))  # fmt: skip
    path = write_results("http_instructions_ab", rows, details={"a": str(a), "b": str(b), "counts": counts,
                         "requests": args.requests, "concurrency": args.concurrency})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
