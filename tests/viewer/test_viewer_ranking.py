"""``gym-bridge view GROUPS.jsonl`` over the file ``gym-bridge eval ranked --groups-out`` writes: served for
real, read in a real browser, its numbers those of ``eval ranked``'s report."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from typer.testing import CliRunner

from gym_bridge.cli import app
from tests.evaluation.test_eval_ranked_cli import GROUPS as EVAL_GROUPS

# The eval command's own groups (the tiny model orders the first two as their ranks do; the third has one
# rank only) and one ranked backwards on purpose, which the model orders the other way round.
GROUPS = [*EVAL_GROUPS, {"prompt": "What is 1 + 2? Put the answer in \\boxed{}.", "group": [
    {"response": "\\boxed{7}", "rank": 1}, {"response": "\\boxed{3}", "rank": 2}]}]  # fmt: skip


def eval_groups(tmp_path: Path) -> tuple[dict, Path]:
    ranked, report, groups = tmp_path / "ranked.jsonl", tmp_path / "report.json", tmp_path / "groups.jsonl"
    ranked.write_text("".join(json.dumps(g) + "\n" for g in GROUPS))
    args = ["eval", "ranked", str(ranked), "--model", "tiny", "-o", str(report), "--groups-out", str(groups)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(report.read_text()), groups


def test_groups_file_shows_eval_ranked_numbers_and_each_groups_order(serve, page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    report, groups = eval_groups(tmp_path)
    assert report["pairwise_accuracy"] == 5 / 6  # 3 + 2 pairs right, group 4's one pair wrong
    served = serve(str(groups))
    page.goto(served.url + "/")
    assert page.url.endswith("/ranked")
    cards = {k: page.inner_text(f"#{k}") for k in ("n-groups", "n-rankable", "n-pairs", "pairwise", "top1", "tau")}
    assert cards == {
        "n-groups": str(report["groups"]), "n-rankable": str(report["rankable_groups"]), "n-pairs": str(report["pairs"]),
        "pairwise": f"{report['pairwise_accuracy']:.3f}", "top1": f"{report['top1_accuracy']:.3f}",
        "tau": f"{report['kendall_tau']:.3f}",
    }  # fmt: skip
    rows = page.locator("#groups tbody tr")
    assert rows.locator("td:first-child").all_inner_texts() == ["1", "2", "3", "4"]
    assert rows.locator("td.pairwise").all_inner_texts() == ["1.000", "1.000", "–", "0.000"]

    page.click("#sort-pairwise")  # worst first, the group with nothing to order last
    assert page.locator("#groups tbody tr td:first-child").all_inner_texts() == ["4", "1", "2", "3"]
    page.click("#only-misordered")
    assert page.locator("#groups tbody tr td:first-child").all_inner_texts() == ["4"]
    page.click("#groups a.group-link")
    assert page.inner_text("#group-pairwise") == "0.000" and page.inner_text("#group-tau") == "-1.000"
    members = page.locator("#members tbody tr")
    assert members.locator("td.rank").all_inner_texts() == ["1", "2"]
    assert members.locator("td.model-rank").all_inner_texts() == ["2", "1"]  # the model prefers the right sum
    assert [t.strip() for t in members.locator("td.response").all_inner_texts()] == ["\\boxed{7}", "\\boxed{3}"]
    assert members.nth(0).get_attribute("class") == "member moved"
    page.screenshot(path=str(tmp_path / "ranked_group.png"), full_page=True)

    page.goto(served.url + "/ranked/1")  # a chat prompt, and an empty response scored null
    assert "user: What is 4 + 4?" in page.inner_text("#prompt")
    assert page.locator("#members td.score").all_inner_texts()[2] == "–"
    with httpx.Client(base_url=served.url) as client:
        missing = client.get("/ranked/9")
        assert missing.status_code == 404 and "gid: no group 9" in missing.text
        bad_sort = client.get("/ranked", params={"sort": "nope"})
        assert bad_sort.status_code == 422 and "sort" in bad_sort.text


def test_bad_lines_are_counted_and_named(serve, page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, groups = eval_groups(tmp_path)
    lines = groups.read_text().splitlines()
    bad = json.loads(lines[0])
    bad["group"][0]["score"] = "high"
    groups.write_text("\n".join([*lines, "{oops", json.dumps(bad)]) + "\n")
    served = serve(str(groups))
    page.goto(served.url + "/ranked")
    assert page.inner_text("#n-groups") == "4"
    text = page.inner_text("#bad-lines")
    assert text.startswith("2 bad lines skipped") and f"{groups}:5" in text
