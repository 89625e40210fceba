"""Step times of the tiny recipe with its math environment behind a proxy that never answers 1 in N /verify.

Why: issue 37's straggler finding, reproduced as a user meets it. The built-in math server runs on
loopback; an HTTP proxy in front of it forwards every request but leaves every N-th ``/verify`` without
an answer; ``recipes/grpo_math_tiny.yaml`` (async GRPO) trains against the proxy (``env.math.url``) with
the overrides given after ``--``. Prints each step's time and step line, and the mean step time.

    python scripts/straggler_steps.py --drop-every 40 --steps 20 -- grpo.rollout_timeout_s=1
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


class DroppingProxy:
    """Forwards every request to ``upstream``; every ``drop_every``-th /verify is never answered."""

    def __init__(self, upstream: str, drop_every: int) -> None:
        self.upstream, self.drop_every = upstream.rstrip("/"), drop_every
        self.verifies = self.dropped = 0
        self.url = ""
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._serve, daemon=True, name="dropping-proxy").start()
        self._ready.wait(30)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._loop.run_forever()

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.path.endswith("/verify"):
            self.verifies += 1
            if self.drop_every and self.verifies % self.drop_every == 0:
                self.dropped += 1
                await asyncio.Event().wait()  # never answered
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with self._session.request(request.method, self.upstream + request.path_qs, data=body,
                                         headers=headers) as answer:  # fmt: skip
            content = await answer.read()
            response = web.Response(status=answer.status, body=content)
            for key, value in answer.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    response.headers.add(key, value)
            return response


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    ours = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drop-every", type=int, default=40, help="Never answer every N-th /verify (0: none).")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--recipe", default=str(ROOT / "recipes/grpo_math_tiny.yaml"))
    args = parser.parse_args(ours)

    from gym_bridge.rollout.envs import running_env
    from gym_bridge.train.bookkeeping.logging import format_line, read_metrics
    from gym_bridge.train.config import load_config
    from gym_bridge.train.loop import train

    with tempfile.TemporaryDirectory(prefix="straggler-") as tmp, running_env("math", workers=4, extraction="boxed_or_final") as math_url:
        proxy = DroppingProxy(math_url, args.drop_every)
        cfg = load_config(
            args.recipe,
            ["env.math.server=null", "env.math.num_workers=null", "env.math.config={}", f"env.math.url={proxy.url}", f"grpo.max_num_steps={args.steps}", "grpo.val_period=0",
             "grpo.val_at_start=false", "grpo.val_at_end=false", f"checkpointing.checkpoint_dir={tmp}/ckpt",
             "checkpointing.enabled=false", f"logger.log_dir={tmp}/logs", "logger.tensorboard_enabled=false",
             *overrides],
        )  # fmt: skip
        started = time.perf_counter()
        train(cfg, show_progress=False)
        wall = time.perf_counter() - started
        steps = [r for r in read_metrics(Path(tmp) / "logs") if r["split"] == "train"]
    for r in steps:
        print(f"{r['time_step_s']:7.2f} s  {format_line(r['step'], r)}")
    later = [r["time_step_s"] for r in steps[1:]] or [r["time_step_s"] for r in steps]
    print(f"\n{len(steps)} steps in {wall:.1f} s; mean step after the first {statistics.mean(later):.2f} s; "
          f"/verify calls {proxy.verifies}, never answered {proxy.dropped}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
