"""Serve the reliability suite's :class:`ArithmeticEnv` in its own process; print its URL; run until killed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gym_bridge.serving.uvicorn_thread import start_in_thread  # noqa: E402
from reliability.envs import ArithmeticEnv  # noqa: E402

if __name__ == "__main__":
    running = start_in_thread(ArithmeticEnv().build_app())
    print(f"arithmetic env listening on {running.url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        running.stop()
