"""Run the math server in the foreground with a test config (a JSON argument): the hostile-answer tests
start it as a subprocess under ``prlimit --as``, so a memory regression fails the test instead of
taking down the machine.

    python -m resources_servers.math.tests.serve_capped '{"pool_size": 1, "timeout_s": 2}'
"""

from __future__ import annotations

import json
import sys

from gym_bridge.serving.server import ServerSettings
from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.math.app import MathConfig, MathServer


def main() -> None:
    config = MathConfig.model_validate(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
    server = MathServer(ServerSettings(port=0), config)
    running = start_in_thread(server.build_app(), port=0)
    print(f"math listening on {running.url}", flush=True)
    try:
        running._thread.join()
    except KeyboardInterrupt:
        running.stop()


if __name__ == "__main__":
    main()
