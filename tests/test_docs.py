"""The README is a front page and the manual in docs/ cannot drift: every relative link resolves, the
config reference equals what the config classes say, and the site builds with mkdocs in strict mode."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from gym_bridge.train.config.reference import render_reference, section_keys

ROOT = Path(__file__).resolve().parents[1]
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return [target for target in _LINK.findall(text) if "://" not in target and not target.startswith("mailto:")]


def test_readme_is_a_front_page() -> None:
    assert (ROOT / "README.md").stat().st_size < 15_000


def test_every_relative_link_resolves() -> None:
    pages = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [
        f"{page.relative_to(ROOT)} -> {target}"
        for page in pages
        if "docs/bench" not in str(page)
        for target in _relative_links(page)
        if not (page.parent / target).exists()
    ]
    assert not broken, broken


def test_config_reference_is_current() -> None:
    """Regenerate with: python scripts/config_reference.py"""
    assert (ROOT / "docs" / "reference" / "config.md").read_text() == render_reference()


def test_every_config_key_is_documented() -> None:
    undocumented = [key for key, field in section_keys() if not (field.description or "").strip()]
    assert not undocumented, undocumented


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """mkdocs (material theme) in strict mode: a broken link or a page left out of the site fails it."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (tmp_path / "site" / "guides" / "audit" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()
