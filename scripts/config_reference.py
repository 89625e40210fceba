"""Write docs/reference/config.md from the config classes (see gym_bridge.train.config.reference)."""

from pathlib import Path

from gym_bridge.train.config.reference import render_reference

if __name__ == "__main__":
    path = Path(__file__).resolve().parents[1] / "docs" / "reference" / "config.md"
    path.write_text(render_reference())
    print(f"wrote {path}")
