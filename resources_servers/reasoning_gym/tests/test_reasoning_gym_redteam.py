"""Red-team round on the reasoning_gym server, over real HTTP: answers a policy under RL pressure would try.
Findings first (scorers of the package that paid wrong answers: ``corrections.py``); then attacks that held,
kept as regression cases."""

from __future__ import annotations

import json
from fractions import Fraction

import httpx
import pytest
import reasoning_gym
from pydantic import ValidationError

from gym_bridge.rollout.envs import running_env
from resources_servers.reasoning_gym.generate import task_rows
from resources_servers.reasoning_gym.pool import ReasoningGymConfig
from resources_servers.reasoning_gym.tests.helpers import answered


@pytest.fixture(scope="module")
def client():
    with running_env("reasoning_gym", pool_size=1) as url, httpx.Client(base_url=url, timeout=60) as c:
        yield c


def reward(client, row, text) -> float:
    out = client.post("/verify", json=answered(row, text))
    assert out.status_code == 200, out.text
    return out.json()["reward"]


def package_score(family, answer, row) -> float:
    entry = {"question": row["question"], "answer": row["answer"], "metadata": row["metadata"]}
    return float(reasoning_gym.get_score_answer_fn(family)(answer=answer, entry=entry))


def test_game_of_life_halting_pays_only_the_right_verdict(client):
    """Finding: the package's scorer compares ``bool(answer) == bool(entry["answer"])`` on strings, so every
    non-empty answer ("False" for "True", "banana") scored 1.0; NeMo Gym 0.7.0 calls the same scorer."""
    rows = {row["answer"]: row for row in task_rows(["game_of_life_halting"], 12, seed=3)}
    assert set(rows) == {"True", "False"}
    for truth, row in rows.items():
        wrong = "False" if truth == "True" else "True"
        assert package_score("game_of_life_halting", wrong, row) == 1.0  # the package's bug, kept as evidence
        assert reward(client, row, f"<answer>{wrong}</answer>") == 0.0
        assert reward(client, row, "<answer>I cannot tell</answer>") == 0.0
        assert reward(client, row, "") == 0.0
        assert reward(client, row, f"<answer>{truth}</answer>") == 1.0
        assert reward(client, row, f"<answer> {truth.lower()} </answer>") == 1.0


@pytest.mark.parametrize("nan", ["nan", "NaN", "(nan)", "nan+1i", "-nan"])
def test_complex_arithmetic_pays_nothing_for_nan(client, nan):
    """Finding: the score is ``min(1.0, exp(-distance))``; ``nan`` makes the distance NaN and ``min(1.0, nan)``
    is 1.0, so "nan" scored 1.0 on every complex_arithmetic task."""
    for row in task_rows(["complex_arithmetic"], 2, seed=1):
        assert package_score("complex_arithmetic", nan, row) == 1.0  # the package's bug, kept as evidence
        assert reward(client, row, f"<answer>{nan}</answer>") == 0.0
        assert reward(client, row, f"<answer>{row['answer']}</answer>") == 1.0
        for text in ("inf", "3+4i"):  # everything else as the package scores it
            assert reward(client, row, f"<answer>{text}</answer>") == pytest.approx(
                package_score("complex_arithmetic", text, row)
            )


def test_coin_flip_pays_a_prefix_of_the_probability_as_partial_credit_only(client):
    """Finding: the package divides the agreeing leading characters by the shorter string, so any prefix of the
    expected probability scored 1.0: the constant answer "0" was paid 1.0 on every task below probability 1."""
    rows = [row for row in task_rows(["coin_flip"], 6, seed=21) if float(row["answer"]) < 0.5]
    assert len(rows) >= 3
    for row in rows[:3]:
        for constant in ("0", "0.0", "-0"):
            assert package_score("coin_flip", constant, row) == 1.0  # the package's bug, kept as evidence
            assert reward(client, row, f"<answer>{constant}</answer>") < 0.5
        prefix = row["answer"][:3]  # "0.1" of "0.171875": two places short
        assert reward(client, row, f"<answer>{prefix}</answer>") < 1.0
        assert reward(client, row, f"<answer>{row['answer']}</answer>") == 1.0
    fraction = str(Fraction(rows[0]["answer"]))  # "11/64": the package reads fractions
    assert reward(client, rows[0], f"<answer>{fraction}</answer>") == 1.0


def test_spell_backward_pays_a_padded_answer_what_the_family_means(client):
    """Finding: the right letters followed by anything ("<answer> or <reversed>") are meant to score 0.8, but the
    package's float sum missed its ``== 1.0`` test and paid ~1.0 (0.9999999) for most lengths."""
    rows = [row for row in task_rows(["spell_backward"], 40, seed=1)]
    padded = [(row, f"{row['answer']} or {row['answer'][::-1]}") for row in rows]
    overpaid = [(row, text) for row, text in padded if package_score("spell_backward", text, row) > 0.8 + 1e-9]
    assert overpaid, "no row shows the package's rounding any more"
    for row, text in overpaid[:5]:
        assert reward(client, row, f"<answer>{text}</answer>") == pytest.approx(0.8)
        assert reward(client, row, f"<answer>{row['answer']}</answer>") == 1.0
        near = row["answer"][:-1] + ("a" if row["answer"][-1] != "a" else "b")
        assert reward(client, row, f"<answer>{near}</answer>") == pytest.approx(package_score("spell_backward", near, row))


def test_puzzle24_pays_only_the_tasks_own_numbers_making_exactly_24(client):
    """Finding (round four's sweep, ``scripts/reasoning_gym_sweep.py``): the package checks only that the answer has
    four numbers between 1 and 10 and that ``int(value) == 24``, never that they are the task's numbers, so the
    constant "1*2*3*4" scored 1.0 on every puzzle24 task, and so did "4*6 + 2/8" (24.25, truncated) and "(1 + 5)**3/9"
    (a power, not one of the four operators) with the task's own numbers."""
    rows = [row for row in task_rows(["puzzle24"], 8, seed=5)]
    for row in rows:
        numbers = sorted(row["metadata"]["numbers"])
        for constant in ("1*2*3*4", "4*6*1*1", "(9*8+1)/3", "2**3*3*1", "10+10+2+2"):
            if sorted(int(n) for n in constant.replace("**", " ").translate(str.maketrans("*+/()", "     ")).split()) == numbers:
                continue  # this task's own numbers: not a constant for it
            assert package_score("puzzle24", constant, row) == 1.0  # the package's bug, kept as evidence
            assert reward(client, row, f"<answer>{constant}</answer>") == pytest.approx(0.01), (constant, numbers)
        assert reward(client, row, f"<answer>{row['answer']}</answer>") == 1.0
        assert reward(client, row, f"<answer>{row['answer'].replace(' ', '')}</answer>") == 1.0
    first, _, _, fourth = task_rows(["puzzle24"], 4, seed=0)
    assert first["metadata"]["numbers"] == [1, 3, 5, 9] and fourth["metadata"]["numbers"] == [4, 8, 6, 2]
    for other_right in ("9 + 5*3*1", "(9 + 3*5)/1", "3*5 + 9*1", "-(-9 - 3*5)*1", "(1 + 5/3)*9"):  # exactly 24
        assert reward(client, first, f"<answer>{other_right}</answer>") == 1.0, other_right
    for row, wrong in ((first, "(1 + 5)**3/9"), (fourth, "4*6 + 2/8")):  # a power; 24.25, truncated to 24
        assert package_score("puzzle24", wrong, row) == 1.0  # the package's bug, kept as evidence
        assert reward(client, row, f"<answer>{wrong}</answer>") == pytest.approx(0.01), wrong
    for wrong in ("1*3*5 + 9 + 0", "1*3*5 + 9*1", "9 + 5*3", "1*3*5 + 9 = 24", "banana"):
        assert reward(client, first, f"<answer>{wrong}</answer>") == pytest.approx(0.01), wrong


def test_time_intervals_grades_against_the_tasks_own_range(client):
    """Finding: time_intervals' partial credit is ``1 - difference / max_difference`` with the package's default
    maximum (100 days, 86,400 s) whatever the task was made with, so on a dataset of short intervals any well-formed
    answer earned nearly 1.0 (a constant "00:05:00" ~0.99 on every time task)."""
    config = {"max_date_difference_days": 10, "max_time_difference_seconds": 600}
    rows = list(task_rows(["time_intervals"], 30, seed=0, config=config))
    date = next(r for r in rows if r["metadata"]["task_type"] == "date" and int(r["answer"].split()[0]) <= 4)
    days = int(date["answer"].split()[0])
    off = f"{days + 5} days"  # five days off in a range of ten: half the credit
    assert package_score("time_intervals", off, date) == pytest.approx(0.95)  # the package's bug, kept as evidence
    assert reward(client, date, f"<answer>{off}</answer>") == pytest.approx(0.5)
    clock = next(r for r in rows if r["metadata"]["task_type"] == "time_seconds")
    h, m, s = map(int, clock["answer"].split(":"))
    total = h * 3600 + m * 60 + s + 300  # five minutes off in a range of ten
    later = f"{total // 3600:02d}:{total // 60 % 60:02d}:{total % 60:02d}"
    assert package_score("time_intervals", later, clock) > 0.99
    assert reward(client, clock, f"<answer>{later}</answer>") == pytest.approx(0.5)
    for row in (date, clock):
        assert reward(client, row, f"<answer>{row['answer']}</answer>") == 1.0
    (default,) = task_rows(["time_intervals"], 1, seed=0)  # made with the defaults: the package's own verdicts
    assert reward(client, default, "<answer>0 days</answer>") == pytest.approx(package_score("time_intervals", "0 days", default))


def test_decimal_arithmetic_tolerance_follows_the_tasks_decimal_places(client):
    """Finding: the tolerance is one unit in the default ``max_num_decimal_places`` (3), so with 6 places an answer
    off by 0.0009 scored 1.0."""
    config = {"min_num_decimal_places": 6, "max_num_decimal_places": 6}
    for row in task_rows(["decimal_arithmetic"], 3, seed=0, config=config):
        value = float(row["answer"])
        off = f"{value + 0.0009:.6f}"
        assert package_score("decimal_arithmetic", off, row) == 1.0  # the package's bug, kept as evidence
        assert reward(client, row, f"<answer>{off}</answer>") == 0.0
        assert reward(client, row, f"<answer>{value:.6f}</answer>") == 1.0  # rounded to its own places: right
        assert reward(client, row, f"<answer>{row['answer']}</answer>") == 1.0
    (default,) = task_rows(["decimal_arithmetic"], 1, seed=0)  # 3 places: a 0.0009 miss is within its tolerance
    near = f"{float(default['answer']) + 0.0009:.9f}"
    assert reward(client, default, f"<answer>{near}</answer>") == package_score("decimal_arithmetic", near, default) == 1.0


@pytest.mark.parametrize("family", ["arc_agi", "rearc"])
def test_arc_boards_pay_the_right_grid(client, family):
    """Finding (a right answer paid as a wrong one): the scorer compares the parsed grid, a tuple of tuples, with
    ``metadata.output``, which a row read from JSON holds as lists, so the expected grid itself scored 0.05 (the
    wrong-grid credit) on every task; NeMo Gym 0.7.0, which reads its rows from JSONL too, pays it 0.05 as well."""
    for row in task_rows([family], 3, seed=2):
        as_sent = json.loads(json.dumps(row))  # what a collector sends
        assert package_score(family, row["answer"], as_sent) == 0.05  # the package's bug, kept as evidence
        assert reward(client, as_sent, f"<answer>{row['answer']}</answer>") == 1.0
        assert reward(client, as_sent, f"<answer>\n{row['answer']}\n</answer>") == 1.0
        grid = [line.split() for line in row["answer"].split("\n")]
        grid[0][0] = "1" if grid[0][0] != "1" else "2"  # one cell wrong
        wrong = "\n".join(" ".join(line) for line in grid)
        assert reward(client, as_sent, f"<answer>{wrong}</answer>") == 0.05
        assert reward(client, as_sent, "<answer>banana</answer>") == package_score(family, "banana", as_sent)


# ---------------------------------------------------------------------------------------------- attacks that held


def test_knights_and_knaves_hedges_earn_nothing(client):
    """Both assignments in one answer: the package scores the set of (name, role) pairs, so a hedge has too many."""
    row = next(r for r in task_rows(["knights_knaves"], 5, seed=3) if "knight" in r["answer"] or "knave" in r["answer"])
    right = row["answer"]
    flipped = right.replace("knight", "@").replace("knave", "knight").replace("@", "knave")
    assert flipped != right
    for text in (f"{right} or {flipped}", f"{flipped} or {right}", f"{right}, {flipped}"):
        assert reward(client, row, f"<answer>{text}</answer>") == 0.0, text
    assert reward(client, row, f"<answer>{right}</answer>") == 1.0


@pytest.mark.parametrize(
    ("family", "hedge"),
    [
        ("polynomial_equations", lambda a: f"{a}, {a}"),  # the roots listed twice: extras are penalised
        ("word_sorting", lambda a: ", ".join(reversed(a.split(", ")))),  # the words, the other way round
        ("basic_arithmetic", lambda a: "0123456789"),  # every digit in one answer: contains a one-digit answer
        ("gsm_symbolic", lambda a: f"{int(float(a)) + 1} or {a}"),  # the first number is the one scored
        # round four's sweep, held: countdown checks the task's numbers (puzzle24 did not); the words of
        # letter_jumble the other way round; an infinite complex number (the correction refuses only NaN's 1.0)
        ("countdown", lambda a: "1*2*3*4"),
        ("letter_jumble", lambda a: " ".join(reversed(a.split())) if len(a.split()) > 1 else a[::-1]),
        ("complex_arithmetic", lambda a: "inf"),
    ],
    ids=["roots-twice", "reversed", "all-digits", "second-number", "countdown-constant", "jumble-reversed",
         "complex-inf"],  # fmt: skip
)
def test_hedged_answers_score_below_the_right_one(client, family, hedge):
    for row in task_rows([family], 3, seed=4):
        text = hedge(row["answer"])
        got = reward(client, row, f"<answer>{text}</answer>")
        assert got == pytest.approx(package_score(family, text, row)) and got < 1.0, (family, text, got)


def test_tampered_metadata_is_the_collectors_row_not_the_policys(client):
    """The policy writes only ``response``; a ``metadata`` or ``answer`` inside its output items is not read."""
    (row,) = task_rows(["basic_arithmetic"], 1, seed=1)
    forged = answered(row, "<answer>banana</answer>")
    forged["response"]["output"][0].update(metadata={"source_dataset": "game_of_life_halting"}, answer="banana")
    forged["response"]["metadata"] = {"answer": "banana"}
    out = client.post("/verify", json=forged)
    assert out.status_code == 200 and out.json()["reward"] == 0.0 and out.json()["task_name"] == "basic_arithmetic"


def test_no_partial_credit_drops_what_the_empty_grid_earns():
    """game_of_life pays the share of right cells: the all-dead grid earns ~0.95 on sparse boards without
    simulating anything. ``no_partial_credit`` (per family, or ``*``) pays such a task 1 or 0."""
    rows = [row for row in task_rows(["game_of_life"], 6, seed=33) if "1" in row["answer"]][:2]
    (plain,) = task_rows(["basic_arithmetic"], 1, seed=1)  # "-4": "it is -4" earns the default scorer's 0.25
    assert rows
    with running_env("reasoning_gym", pool_size=1, no_partial_credit=["game_of_life"]) as url:
        with httpx.Client(base_url=url, timeout=60) as strict:
            for row in rows:
                grid = json.loads(row["answer"])
                empty = json.dumps([[0] * len(grid[0]) for _ in grid])
                assert package_score("game_of_life", empty, row) > 0.9
                out = strict.post("/verify", json=answered(row, f"<answer>{empty}</answer>")).json()
                assert out["reward"] == 0.0 and out["score"] == pytest.approx(package_score("game_of_life", empty, row))
                assert reward(strict, row, f"<answer>{row['answer']}</answer>") == 1.0
            assert reward(strict, plain, "it is -4") == pytest.approx(package_score("basic_arithmetic", "it is -4", plain))
    with running_env("reasoning_gym", pool_size=1, no_partial_credit=["*"]) as url:
        with httpx.Client(base_url=url, timeout=60) as strictest:
            assert reward(strictest, plain, "it is -4") == 0.0
            assert reward(strictest, plain, "-4") == 1.0


def test_no_partial_credit_refuses_an_unknown_family():
    with pytest.raises(ValidationError, match="(?s)no_partial_credit.*game_of_lief"):
        ReasoningGymConfig(no_partial_credit=["game_of_lief"])
