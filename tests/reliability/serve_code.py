"""Serve the code resources server with the limits given as JSON (argv[1]); print its URL; run until killed.

``gym-bridge serve code`` takes the defaults of ``config.yaml``; the reward-hacking suite wants shorter
limits so that its sleepers and spinners cost seconds, not tens of seconds.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gym_bridge.serving.uvicorn_thread import start_in_thread  # noqa: E402
from resources_servers.code.app import CodeConfig, CodeServer  # noqa: E402

if __name__ == "__main__":
    config = CodeConfig.model_validate(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
    server = CodeServer(config=config)
    running = start_in_thread(server.build_app())
    print(f"code server (uids from {server.sandbox.uid_base}) listening on {running.url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        running.stop()
