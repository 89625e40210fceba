"""Which figures describe which recipe: ``bench/results/recipe_figures.json`` holds, per shipped recipe,
the SHA-256 of its resolved config beside the figures measured on it, so a changed setting cannot
leave old figures standing (tests/train/test_recipe_figures.py recomputes the hashes).

The hash covers everything ``load_config`` resolves (the recipe, the recipes it inherits, the defaults
of every key), written by ``config_to_dict`` as sorted JSON with the repository's path replaced by
``<repo>``, so a clone elsewhere hashes the same. A change to an inherited recipe changes the hash of
every recipe that inherits it: re-measure those too.

    .venv/bin/python bench/recipe_figures.py check                    # every recorded hash still matches?
    .venv/bin/python bench/recipe_figures.py hash recipes/grpo_smollm2_135m_lora.yaml
    .venv/bin/python bench/recipe_figures.py record recipes/grpo_smollm2_135m_lora.yaml \
        --bench-results DIR1/smollm2_recipe.json DIR2/smollm2_recipe.json   # BENCH_RESULTS_DIR of each run
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIGURES_FILE = REPO / "bench" / "results" / "recipe_figures.json"


def resolved_config_hash(recipe: str | Path) -> str:
    """SHA-256 of the recipe's resolved config (sorted JSON, repository path as ``<repo>``)."""
    from gym_bridge.train.config import config_to_dict, load_config

    text = json.dumps(config_to_dict(load_config(Path(recipe))), sort_keys=True, default=str)
    return hashlib.sha256(text.replace(str(REPO), "<repo>").encode()).hexdigest()


def load_figures(path: Path = FIGURES_FILE) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {"recipes": {}}


def stale(path: Path = FIGURES_FILE) -> list[str]:
    """Recipes (repository-relative paths) whose recorded hash no longer matches their resolved config."""
    recorded = load_figures(path)["recipes"]
    return [
        name
        for name, entry in recorded.items()
        if resolved_config_hash(REPO / name) != entry["config_sha256"]
    ]


def figures_of(bench_results: list[Path], recipe: Path) -> dict[str, Any]:
    """Per-seed figures of ``recipe`` from ``bench_smollm2_recipe.py`` result files: validation curve, base,
    final and best accuracy, gain, wall minutes, peak RSS of the process tree, and the command and machine.
    A result file holds runs per recipe (``details.runs``: ``{"lora": [...], "full": [...]}``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_smollm2_recipe import RECIPES

    keys = [key for key, path in RECIPES.items() if path.resolve() == recipe.resolve()]
    runs, sources = [], []
    for path in bench_results:
        result = json.loads(path.read_text())
        if result["details"].get("overrides"):
            raise SystemExit(
                f"{path}: measured with overrides {result['details']['overrides']}, not the recipe"
            )
        by_recipe = result["details"]["runs"]
        if not keys or keys[0] not in by_recipe:
            raise SystemExit(f"{path}: no runs of {recipe} (it holds runs of {sorted(by_recipe)})")
        sources.append({k: result[k] for k in ("command", "measured_at", "machine")})
        for run in by_recipe[keys[0]]:
            runs.append(
                {
                    "seed": run["seed"],
                    "curve": run["curve"],
                    "base": run["base"],
                    "final": run["final"],
                    "best": run["best"],
                    "gain": run["final"] - run["base"],
                    "wall_min": run["wall_s"] / 60,
                    "peak_rss_gib": run["peak_rss_gib"],
                }
            )
    return {"runs": sorted(runs, key=lambda r: r["seed"]), "measured_by": sources}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="exit 1 naming every recipe whose figures were measured on other settings")
    hash_cmd = sub.add_parser("hash", help="print a recipe's resolved-config hash")
    hash_cmd.add_argument("recipe", type=Path)
    record = sub.add_parser("record", help="store a recipe's hash with the runs measured on it")
    record.add_argument("recipe", type=Path)
    record.add_argument(
        "--bench-results",
        type=Path,
        nargs="+",
        required=True,
        help="smollm2_recipe.json files of bench/bench_smollm2_recipe.py runs of this recipe (one per seed or more)",
    )
    args = parser.parse_args()
    if args.command == "hash":
        print(resolved_config_hash(args.recipe))
        return
    if args.command == "check":
        bad = stale()
        for name in bad:
            print(f"{name}: its settings changed since its figures were measured; re-measure and record them")
        sys.exit(1 if bad else 0)
    data = load_figures()
    name = str(args.recipe.resolve().relative_to(REPO))
    data["recipes"][name] = {
        "config_sha256": resolved_config_hash(args.recipe),
        "figures": figures_of(args.bench_results, args.recipe),
    }
    FIGURES_FILE.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(f"recorded {name} in {FIGURES_FILE}")


if __name__ == "__main__":
    main()
