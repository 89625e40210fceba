"""The figures in bench/results/recipe_figures.json were measured on the recipes as they are now: each
entry's recorded hash of the resolved config (bench/recipe_figures.py) must match the recipe's today, so
changing a measured setting (or a recipe it inherits) without re-measuring fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _figures_module():  # noqa: ANN202  (bench/ is not a package)
    spec = importlib.util.spec_from_file_location("recipe_figures", REPO / "bench" / "recipe_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


figures = _figures_module()
RECORDED = figures.load_figures()["recipes"]


def test_recorded_figures_were_measured_on_the_recipes_as_they_are() -> None:
    for recipe, entry in RECORDED.items():
        assert figures.resolved_config_hash(REPO / recipe) == entry["config_sha256"], (
            f"{recipe}: its resolved settings changed since its figures were measured; re-measure it and "
            "record the figures with bench/recipe_figures.py record (and update what quotes them)"
        )
        runs = entry["figures"]["runs"]
        assert runs and all({"seed", "base", "final", "wall_min", "peak_rss_gib"} <= set(run) for run in runs)


def test_the_hash_follows_a_setting_and_an_inherited_recipe(tmp_path: Path) -> None:
    lora = REPO / "recipes" / "grpo_smollm2_135m_lora.yaml"
    same = tmp_path / "same.yaml"
    same.write_text(f"defaults: {lora}\n")
    changed = tmp_path / "changed.yaml"
    changed.write_text(f"defaults: {lora}\ngrpo:\n  max_num_steps: 21\n")
    assert figures.resolved_config_hash(same) == figures.resolved_config_hash(lora)
    assert figures.resolved_config_hash(changed) != figures.resolved_config_hash(lora)
    # a change in the recipe another inherits changes the inheritor's hash
    body = lora.read_text().split("defaults: grpo_smollm2_135m.yaml", 1)[1]
    hashes = []
    for name, extra in (
        ("kept", ""),
        ("again", ""),
        ("changed", "policy:\n  generation:\n    temperature: 0.8\n"),
    ):
        (tmp_path / f"parent_{name}.yaml").write_text(
            f"defaults: {REPO / 'recipes' / 'grpo_smollm2_135m.yaml'}\n{extra}"
        )
        (tmp_path / f"child_{name}.yaml").write_text(f"defaults: parent_{name}.yaml\n" + body)
        hashes.append(figures.resolved_config_hash(tmp_path / f"child_{name}.yaml"))
    assert hashes[0] == hashes[1] != hashes[2]


def test_record_takes_the_runs_of_the_recipe_named(tmp_path: Path) -> None:
    """bench_smollm2_recipe.py files hold runs per recipe; record keeps only the named recipe's."""
    import json

    run = {"curve": [[0, 0.1], [20, 0.9]], "base": 0.1, "final": 0.9, "best": 0.9, "wall_s": 600.0, "peak_rss_gib": 2.0}
    result = {"command": "c", "measured_at": "t", "machine": "m",
              "details": {"runs": {"lora": [{**run, "seed": 42}], "full": [{**run, "seed": 1, "final": 0.5}]}}}  # fmt: skip
    path = tmp_path / "smollm2_recipe.json"
    path.write_text(json.dumps(result))
    lora = figures.figures_of([path], REPO / "recipes" / "grpo_smollm2_135m_lora.yaml")
    assert [(r["seed"], r["final"], r["wall_min"]) for r in lora["runs"]] == [(42, 0.9, 10.0)]
    full = figures.figures_of([path], REPO / "recipes" / "grpo_smollm2_135m.yaml")
    assert [(r["seed"], r["final"]) for r in full["runs"]] == [(1, 0.5)]
