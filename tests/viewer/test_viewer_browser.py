"""The viewer served for real and read in a real browser: overview, filters, a group, tokens, compare."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import wait_ready
from viewer_records import nemo_rl_line, run_a, run_b, write_jsonl

BAD_LINES = [b"{not json\n", b"[1, 2]\n"]


def _files(tmp_path: Path) -> tuple[Path, Path]:
    a = write_jsonl(tmp_path / "run_a.jsonl", run_a(), BAD_LINES)
    b = write_jsonl(tmp_path / "run_b.jsonl", run_b())
    return a, b


def _task_labels(page) -> list[str]:  # type: ignore[no-untyped-def]
    return page.locator("#tasks tbody tr td:first-child").all_inner_texts()


def test_overview_shows_counts_and_filters(serve, page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a, _ = _files(tmp_path)
    served = serve(str(a))
    wait_ready(page, served.url + "/f/a")
    assert page.inner_text("#num-rollouts") == "14"
    assert page.inner_text("#num-tasks") == "4"
    assert page.inner_text("#bad-lines") == "2"
    assert page.inner_text("#mean-reward") == f"{(1 + 4 + 1) / 14:.3f}"
    assert _task_labels(page) == ["#0", "#1", "#2", "#3"]
    page.click("#bad-line-list summary")
    bad = page.inner_text("#bad-line-list")
    assert f"{a}:15: JSON is malformed" in bad and f"{a}:16: Expected `object`, got `array`" in bad
    row0 = page.locator('#tasks tbody tr[data-tid="0"] td').all_inner_texts()
    assert row0[3:8] == ["4", "0.250", "0.250", "1.000", "0.000"]  # n, mean, pass@1, pass@4, majority@4
    page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)

    page.fill("#min_reward", "0.9")
    with page.expect_navigation():
        page.click("#apply")
    assert _task_labels(page) == ["#2"]
    assert page.inner_text("#matched").startswith("1 task match")

    page.goto(served.url + "/f/a")
    page.select_option("#failure", "verifier_timeout")
    with page.expect_navigation():
        page.click("#apply")
    assert _task_labels(page) == ["#1"]
    assert "verifier_timeout × 1" in page.inner_text("#tasks")

    page.goto(served.url + "/f/a")
    page.select_option("#env", "tool_use")
    with page.expect_navigation():
        page.click("#apply")
    assert _task_labels(page) == ["#3"]

    page.goto(served.url + "/f/a")
    page.fill("#q", "ZEBRA")
    with page.expect_navigation():
        page.press("#q", "Enter")
    assert _task_labels(page) == ["#2"]
    page.goto(served.url + "/f/a?q=cold%20in%20paris")  # answer text is searched too
    assert _task_labels(page) == ["#3"]

    page.goto(served.url + "/f/a")
    for expected_first in ("#1", "#2"):  # sort ascending, then descending
        with page.expect_navigation():
            page.click("#tasks th >> text=mean reward")
        assert _task_labels(page)[0] == expected_first
    page.goto(served.url + "/f/a?min_reward=abc")
    assert "min_reward: 'abc' is not a number" in page.inner_text("#error")


def test_group_side_by_side_with_advantages_and_trajectory(serve, page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a, _ = _files(tmp_path)
    served = serve(str(a))
    wait_ready(page, served.url + "/f/a")
    page.click('#tasks tbody tr[data-tid="0"] a.task-link')
    columns = page.locator("article.rollout")
    assert columns.count() == 4
    assert columns.locator(".reward").all_inner_texts() == ["0.000", "0.000", "1.000", "0.000"]
    # leave-one-out, std-normalised (see viewer_records.run_a): -(1/3)/sqrt(1/3) and an unscaled 1.0
    assert columns.locator(".advantage").all_inner_texts() == ["-0.577", "-0.577", "1.000", "-0.577"]
    assert columns.locator(".answer").all_inner_texts() == ["1", "1", "0", "7"]
    assert page.inner_text("#group-mean") == "0.250"
    assert "What is 0 + 0?" in page.inner_text("#prompt")
    raw = columns.nth(2).locator("details.raw")
    assert not raw.locator("pre").is_visible()
    raw.locator("summary").click()
    assert json.loads(raw.locator("pre").inner_text())["_ng_rollout_index"] == 2
    page.screenshot(path=str(tmp_path / "group.png"), full_page=True)

    page.goto(served.url + "/f/a/task/3")
    first, second = page.locator("article.rollout").all()
    assert first.locator(".turn.function_call").inner_text().split("\n")[0].lower() == "call get_weather"
    assert '"city": "Paris"' in first.locator(".turn.function_call pre").inner_text()
    assert "cold" in first.locator(".turn.function_call_output").inner_text()
    assert "I should look it up." in first.locator(".turn.reasoning").inner_text()
    assert "<script>alert(1)</script> sunny" in second.locator(".turn.assistant").inner_text()  # shown as text
    assert page.dialogs == []  # and never run
    page.goto(served.url + "/f/a/task/1")
    assert page.locator("article.rollout .failure-kind").all_inner_texts() == ["verifier_timeout"]


def test_token_view_colours_by_log_prob(serve, page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from gym_bridge.models.tokenizer import build_tokenizer

    a, _ = _files(tmp_path)
    served = serve(str(a), "--tokenizer", "tiny")
    wait_ready(page, served.url + "/f/a/task/0")
    page.locator("article.rollout").first.locator("a.tokens-link").click()
    tokens = page.locator("#token-view .tok")
    assert tokens.count() == 3
    tok = build_tokenizer()
    assert tokens.all_text_contents() == [tok.decode([11]), tok.decode([12]), tok.decode([13])]
    assert "log-prob -2.5000" in tokens.nth(1).get_attribute("title")
    colours = [t.evaluate("e => getComputedStyle(e).backgroundColor") for t in tokens.all()]
    green, red = colours[0], colours[1]  # p = 0.95 vs p = 0.08
    assert green != red
    r_g, g_g, _ = (int(x) for x in green[4:-1].split(",")[:3])
    r_r, g_r, _ = (int(x) for x in red[4:-1].split(",")[:3])
    assert g_g > r_g and r_r > g_r
    page.screenshot(path=str(tmp_path / "tokens.png"), full_page=True)


def test_token_only_records_are_decoded_and_show_mismatch(serve, page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from gym_bridge.models.tokenizer import build_tokenizer

    tok = build_tokenizer()
    prompt = tok.encode("What is 2+2?")
    generated = tok.encode("The answer is 4")
    n = len(generated)
    lines = [
        nemo_rl_line(1.0, prompt, generated, [-0.1] * n, [-0.1] * (n - 1) + [-1.6], 0.87),
        nemo_rl_line(0.0, prompt, generated, [-0.2] * n, [-0.2] * n, -0.87),
    ]
    path = write_jsonl(tmp_path / "train_data_step3.jsonl", lines)
    tok.save_pretrained(tmp_path / "tokenizer")  # --tokenizer DIR, as a run's checkpoint holds it
    served = serve(str(path), "--tokenizer", str(tmp_path / "tokenizer"))
    wait_ready(page, served.url + "/f/a")
    assert page.inner_text("#num-tasks") == "1"  # grouped by the prompt tokens
    assert "What is 2+2?" in page.inner_text("#tasks")
    page.click("a.task-link")
    first = page.locator("article.rollout").first
    assert "The answer is 4" in first.locator(".turn.assistant").inner_text()
    assert "(logged 0.870)" in first.inner_text()
    first.locator("a.tokens-link").click()
    generated_cells = page.locator("#token-view .tok:not(.prompt)")
    assert generated_cells.count() == n
    assert page.locator("#token-view .tok.prompt").count() == len(prompt)
    last = generated_cells.nth(n - 1)
    before = last.evaluate("e => getComputedStyle(e).backgroundColor")
    page.check("#mode-mismatch")
    after = last.evaluate("e => getComputedStyle(e).backgroundColor")
    other = generated_cells.nth(0).evaluate("e => getComputedStyle(e).backgroundColor")
    assert before != after and after != other  # |Δ| = 1.5 is red, |Δ| = 0 green
    assert "trainer -1.6000" in last.get_attribute("title")


def test_compare_two_runs(serve, page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a, b = _files(tmp_path)
    served = serve(str(a), str(b))
    wait_ready(page, served.url + "/f/a")
    wait_ready(page, served.url + "/f/b")
    page.click("#nav-compare")
    assert page.inner_text("#n-both") == "3"
    assert page.inner_text("#n-improved") == "1"
    assert page.inner_text("#n-regressed") == "1"
    assert page.inner_text("#n-flip-up") == "1"
    assert page.inner_text("#n-flip-down") == "1"
    rows = page.locator("#compare tbody tr")
    assert rows.count() == 3
    first = rows.nth(0).locator("td").all_inner_texts()
    assert "zebra" in first[1] and first[2:5] == ["1.000", "0.000", "-1.000"] and first[5] == "now fails"
    second = rows.nth(1).locator("td").all_inner_texts()
    assert second[2:6] == ["0.250", "1.000", "+0.750", "now passes"]
    page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)
    page.click("#only-flipped")
    assert page.locator("#compare tbody tr").count() == 2
