"""NeMo Gym's entrypoint for this server (``gym env start``, ``configs/*.yaml``); see gym_bridge/rollout/nemo_gym_entry.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the gym-bridge checkout this directory is in

from gym_bridge.rollout.nemo_gym_entry import main  # noqa: E402

if __name__ == "__main__":  # the math server's verifier pool spawns processes, which re-import this file
    main(Path(__file__).resolve().parent.name)
