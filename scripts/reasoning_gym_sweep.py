"""Sweep every reasoning-gym family's scorer with wrong, degenerate and reformatted answers; report the paid ones.

Why: a scorer that pays a wrong answer is learned, and round three found four such scorers by hand
(``resources_servers/reasoning_gym/corrections.py``). This does it for every family the server offers:
it generates a few tasks per family, builds a battery of answers from each (empty, whitespace, ``nan``,
``inf``, ``None``, ``True``, ``0``, ``-1``, the question itself, another task's answer, the right answer
with junk or a wrong one before or after it, twice, every candidate at once, a JSON answer of the wrong
shape, very long answers, two ``<answer>`` tags with different values, the right answer in another case;
and right answers in an obvious other format: padded, with a full stop, boxed, ``4.0`` for ``4``...),
scores each the way the server does (the server's own extraction, then its scorer worker pool: the
package's scorer or its correction, under the same guards), and flags:

* ``wrong_paid``: a wrong answer paid more than its probe warrants (``--wrong-max``, default 0.1: the most
  format credit any family gives by design; hedges and junk around the right answer: ``--hedge-max``,
  default 0.5, since the package's default scorer pays ``len(expected) / len(answer)`` to an answer that
  contains the expected one);
* ``case_paid``: the right answer in another letter case paid 1.0 (worth reading only where case matters);
* ``right_unpaid``: a right answer in an obvious other format paid less than the exact one.

Then a sample (every flag and ``--http-sample`` other checks) is sent over real HTTP to a reasoning_gym
server (started in-process), and any reward that differs from the pool's is reported too. Flags listed in
:data:`TRIAGED` (read, and by design or documented) are counted apart; the command exits 1 when an
untriaged ``wrong_paid`` flag or an HTTP mismatch remains.

    .venv/bin/python scripts/reasoning_gym_sweep.py [--tasks 3] [--seed 0] [--family a,b] \\
        [--http-sample 200] [--json out.json] [--show 40]

Not used by the tests (it takes a few minutes); ``tests/test_reasoning_gym_redteam.py`` keeps its findings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from reasoning_gym.factory import DATASETS

from resources_servers.reasoning_gym.app import extract
from resources_servers.reasoning_gym.generate import task_rows
from resources_servers.reasoning_gym.pool import ScorerPool

_CELLS = "pays the share of right cells (by design; `no_partial_credit` drops it)"
_IN_PLACE = "pays the share of expected words/letters in place; what follows them is not read (by design)"
_PARSED = "reads its grid, moves or roles out of the text: the right one with words around it is right"
_SAME = "the same value within the tolerance or significant figures the task asks for"
_FIRST = "reads the first number/fraction/value only: 'A or B' scores A, so a hedge scores its first guess"
_DISTANCE = "pays by distance to the expected value (by design; `no_partial_credit` drops it)"
TRIAGED: dict[tuple[str, str], str] = {
    **{(f, "*"): _CELLS for f in ("game_of_life", "futoshiki", "sudoku", "mini_sudoku", "manipulate_matrix")},
    **{(f, "*"): _IN_PLACE for f in ("letter_jumble", "word_sorting", "spell_backward", "sentence_reordering")},
    **{(f, "*"): _PARSED for f in ("kakurasu", "survo", "sokoban", "quantum_lock", "knights_knaves")},
    **{(f, "*"): _FIRST for f in ("gsm_symbolic", "fraction_simplification", "advanced_geometry")},
    **{(f, "*"): _DISTANCE for f in ("rectangle_count", "time_intervals")},
    **{(f, "*"): "its own len(expected) / len(answer) credit, as the default scorer's"
       for f in ("chain_sum", "products")},  # fmt: skip
    **{(f, p): _SAME for f in ("decimal_arithmetic", "decimal_chain_sum", "number_format", "pool_matrix",
                               "power_function") for p in ("last_char_dropped", "truncated")},  # fmt: skip
    ("codeio", "*"): "pays a text-similarity share (by design)",
    ("figlet_font", "*"): "pays a letter-similarity share (by design)",
    ("coin_flip", "*"): "corrections.py: the share of leading digits that agree, over the longer number",
    ("propositional_logic", "*"): "0.25 for a trivial conclusion, valid because the premises contradict (by design)",
    ("polynomial_equations", "*"): "roots it cannot parse are skipped; half the roots earn half (by design)",
    ("simple_integration", "*"): "the junk is a constant of integration: still an antiderivative",
    ("intermediate_integration", "*"): "the junk is a constant of integration: still an antiderivative",
    ("prime_factorization", "reversed"): "the same factors in another order: right",
    ("puzzle24", "reversed"): "the same numbers making exactly 24: right",
    ("knights_knaves", "last_char_dropped"): "the full stop dropped: the same roles",
    ("advanced_geometry", "last_char_dropped"): "the closing parenthesis dropped: the same point",
    ("fraction_simplification", "last_char_dropped"): "the closing '$' dropped: the same fraction",
    **{("polynomial_equations", p): "'0.' or '0' for 0.0: the same root" for p in ("last_char_dropped", "truncated")},
    **{("time_intervals", p): "'5 day' or '5 d' for '5 days': the same interval" for p in ("last_char_dropped",
                                                                                           "truncated")},  # fmt: skip
}
"""(family, probe) -> why a flag there is by design (read in the family's scorer); probe ``*``: any probe of the
family, except that a wrong answer paid in full (1.0) is triaged only by its own probe."""

JUNK = "banana"
LONG = 20_000


@dataclass
class Check:
    family: str
    task: int
    probe: str
    kind: str  # wrong | hedge | case | right | exact
    text: str  # the assistant text the server would get
    limit: float  # a wrong answer paid above this is a flag; a right one paid below it
    answer: str = ""  # what the server's extraction hands the scorer
    reward: float | None = None
    status: str = ""
    detail: str | None = None
    flag: str | None = None
    triaged: str | None = None


def tagged(text: str) -> str:
    return f"<answer>{text}</answer>"


def _number(text: str) -> float | None:
    try:
        value = float(text.replace(",", ""))
    except (ValueError, AttributeError):
        return None
    return value if math.isfinite(value) else None


def _same(a: str, b: str) -> bool:
    """Whether two answers say the same thing for a constant probe (then it is not a wrong answer)."""
    if a.strip().lower() == b.strip().lower():
        return True
    x, y = _number(a), _number(b)
    return x is not None and y is not None and x == y


def probes(expected: str | None, question: str, others: list[str]) -> Iterator[tuple[str, str, str, float]]:
    """``(probe, kind, assistant text, limit)`` for one task; ``others``: other tasks' (different) answers."""
    wrong_max, hedge_max = ARGS.wrong_max, ARGS.hedge_max
    for name, const in [("empty", ""), ("whitespace", "  \n "), ("nan", "nan"), ("inf", "inf"), ("neg_inf", "-inf"),
                        ("None", "None"), ("True", "True"), ("False", "False"), ("zero", "0"), ("minus_one", "-1"),
                        ("one", "1"), ("json_object", "{}"), ("json_list", "[]"), ("json_nested", "[[]]"),
                        ("null", "null")]:  # fmt: skip
        if expected is None or not _same(const, expected):
            yield name, "wrong", tagged(const), wrong_max
    yield "question", "wrong", tagged(question), wrong_max
    yield "no_tag_question", "wrong", question, wrong_max
    yield "long_digits", "wrong", tagged("9" * LONG), wrong_max
    yield "long_words", "wrong", tagged("a " * LONG), wrong_max
    if expected is None:
        return
    other = others[0] if others else None
    if other is not None:
        yield "other_answer", "wrong", tagged(other), hedge_max
        yield "right_or_wrong", "hedge", tagged(f"{expected} or {other}"), hedge_max
        yield "wrong_or_right", "hedge", tagged(f"{other} or {expected}"), hedge_max
        yield "wrong_newline_right", "hedge", tagged(f"{other}\n{expected}"), hedge_max
        yield "right_newline_wrong", "hedge", tagged(f"{expected}\n{other}"), hedge_max
        candidates = [expected, *others[:4]]
        for sep_name, sep in (("comma", ", "), ("newline", "\n"), ("or", " or ")):
            random.Random(len(expected)).shuffle(candidates)
            yield f"all_candidates_{sep_name}", "hedge", tagged(sep.join(candidates)), hedge_max
        yield "two_tags_right_then_wrong", "wrong", f"{tagged(expected)} {tagged(other)}", hedge_max
        yield "boxed_right_tag_wrong", "wrong", f"\\boxed{{{expected}}} {tagged(other)}", hedge_max
        yield "json_wrapped_other", "wrong", tagged(json.dumps({"answer": other})), hedge_max
    yield "junk_after", "hedge", tagged(f"{expected} {JUNK}"), hedge_max
    yield "junk_before", "hedge", tagged(f"{JUNK} {expected}"), hedge_max
    yield "junk_glued", "hedge", tagged(f"{expected}{JUNK}"), hedge_max
    yield "twice_space", "hedge", tagged(f"{expected} {expected}"), hedge_max
    yield "twice_glued", "hedge", tagged(f"{expected}{expected}"), hedge_max
    yield "twice_newline", "hedge", tagged(f"{expected}\n{expected}"), hedge_max
    yield "long_after_right", "hedge", tagged(f"{expected} {'x' * LONG}"), hedge_max
    yield "json_wrapped", "hedge", tagged(json.dumps({"answer": expected})), hedge_max
    yield "json_listed", "hedge", tagged(json.dumps([expected])), hedge_max
    if len(expected) > 1:
        yield "truncated", "wrong", tagged(expected[: len(expected) // 2]), hedge_max
    if expected[::-1].strip() != expected.strip():
        yield "reversed", "wrong", tagged(expected[::-1]), hedge_max
    if len(expected) > 1 and expected[:-1]:
        yield "last_char_dropped", "wrong", tagged(expected[:-1]), 0.99
    if any(c.isalpha() for c in expected) and expected.swapcase() != expected:
        yield "swapcase", "case", tagged(expected.swapcase()), 1.0
    # right answers, another format
    yield "exact", "exact", tagged(expected), 1.0
    yield "padded", "right", tagged(f"  {expected}  "), 1.0
    yield "bare", "right", expected, 1.0
    yield "full_stop", "right", tagged(f"{expected}."), 1.0
    if "{" not in expected and "}" not in expected:
        yield "boxed", "right", f"The answer is \\boxed{{{expected}}}", 1.0
    if _number(expected) is not None and expected.lstrip("-").isdigit():
        yield "int_as_float", "right", tagged(f"{expected}.0"), 1.0
    if expected in ("True", "False", "Yes", "No"):
        yield "lowercase", "right", tagged(expected.lower()), 1.0
    try:
        parsed = json.loads(expected)
    except ValueError:
        parsed = None
    if isinstance(parsed, list | dict):
        yield "json_compact", "right", tagged(json.dumps(parsed, separators=(",", ":"))), 1.0
        yield "json_spaced", "right", tagged(json.dumps(parsed)), 1.0
    if "\n" in expected:
        yield "trailing_spaces_per_line", "right", tagged("\n".join(line + " " for line in expected.split("\n"))), 1.0


def build(families: list[str], tasks: int, seed: int) -> tuple[list[Check], dict[tuple[str, int], dict[str, Any]]]:
    checks: list[Check] = []
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for family in families:
        drawn = list(task_rows([family], tasks + 6, seed=seed))
        for i, row in enumerate(drawn[:tasks]):
            rows[(family, i)] = json.loads(json.dumps(row))  # as the server gets it (tuples become lists)
            expected = row["answer"]
            others = list(dict.fromkeys(r["answer"] for r in drawn if r["answer"] not in (None, expected)))
            for probe, kind, text, limit in probes(expected, row["question"], others):
                checks.append(Check(family, i, probe, kind, text, limit, answer=extract(text)[0]))
    return checks, rows


CONSTANTS = ("", "0", "1", "-1", "2", "True", "False", "Yes", "No", "none", "[]")
CONSTANT_BASE = 100
"""Task numbers of the constants pass start here (apart from the battery's)."""


def build_constants(
    families: list[str], tasks: int, seed: int, rows: dict[tuple[str, int], dict[str, Any]]
) -> list[Check]:
    """One answer for every task of a family: the constants, the first task's answer, the most common answer."""
    checks: list[Check] = []
    for family in families:
        drawn = list(task_rows([family], tasks, seed=seed + 1))
        answers = [r["answer"] for r in drawn if isinstance(r["answer"], str)]
        extra = {f"first_task:{answers[0][:30]}": answers[0]} if answers else {}
        if answers:
            common = Counter(answers).most_common(1)[0][0]
            extra[f"most_common:{common[:30]}"] = common
        for i, row in enumerate(drawn):
            rows[(family, CONSTANT_BASE + i)] = json.loads(json.dumps(row))
            for name, value in {**{f"constant:{c}": c for c in CONSTANTS}, **extra}.items():
                checks.append(Check(family, CONSTANT_BASE + i, name, "constant", tagged(value), 0.0,
                                    answer=extract(tagged(value))[0]))  # fmt: skip
    return checks


def constant_flags(
    checks: list[Check], rows: dict[tuple[str, int], dict[str, Any]]
) -> list[tuple[str, str, float, float]]:
    """``(family, answer, mean reward, share of tasks it is right for)`` where the mean exceeds that share by more
    than ``--constant-max``: one answer for every task earns more than being right on some of them warrants."""
    by: dict[tuple[str, str], list[tuple[float, bool]]] = {}
    for c in checks:
        expected = rows[(c.family, c.task)]["answer"]
        right = isinstance(expected, str) and _same(c.answer, expected)
        by.setdefault((c.family, c.probe), []).append((c.reward or 0.0, right))
    flags = []
    for (family, probe), scored in sorted(by.items()):
        mean = sum(r for r, _ in scored) / len(scored)
        share = sum(1 for _, right in scored if right) / len(scored)
        if mean - share > ARGS.constant_max:
            flags.append((family, probe, mean, share))
    return flags


def judge(check: Check, exact: float | None) -> str | None:
    if check.reward is None:
        return None
    if check.kind in ("wrong", "hedge"):
        return "wrong_paid" if check.reward > check.limit + 1e-9 else None
    if check.kind == "case":
        return "case_paid" if check.reward >= 1.0 else None
    if check.kind == "right":
        return "right_unpaid" if exact is not None and check.reward < exact - 1e-9 else None
    return None


async def score_all(checks: list[Check], rows: dict[tuple[str, int], dict[str, Any]]) -> None:
    pool = ScorerPool(ARGS.pool_size, ARGS.timeout_s, 2048)
    await pool.start()
    done = 0
    started = time.monotonic()
    try:
        queue: asyncio.Queue[Check] = asyncio.Queue()
        for c in checks:
            queue.put_nowait(c)

        async def one() -> None:
            nonlocal done
            while not queue.empty():
                c = queue.get_nowait()
                row = rows[(c.family, c.task)]
                entry = {k: row[k] for k in ("question", "answer", "metadata")}
                outcome = await pool.score(c.family, c.answer, entry)
                c.status, c.detail = outcome.status, outcome.detail or outcome.refused
                c.reward = outcome.score if outcome.status == "ok" else 0.0
                done += 1
                if done % 1000 == 0:
                    print(f"  {done}/{len(checks)} scored ({time.monotonic() - started:.0f} s)", file=sys.stderr)

        await asyncio.gather(*(one() for _ in range(ARGS.pool_size * 2)))
    finally:
        await pool.close()


def over_http(sample: list[Check], rows: dict[tuple[str, int], dict[str, Any]]) -> list[tuple[Check, float, str]]:
    """The sample's rewards from a real server over HTTP: ``(check, reward, failure_kind)`` where they differ."""
    import httpx

    from gym_bridge.rollout.envs import running_env

    differ = []
    with running_env("reasoning_gym", pool_size=ARGS.pool_size, timeout_s=ARGS.timeout_s) as url:
        with httpx.Client(base_url=url, timeout=120) as client:
            for c in sample:
                body = {**rows[(c.family, c.task)], "response": {"output": [
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": c.text}]},
                ]}}  # fmt: skip
                out = client.post("/verify", json=body)
                if out.status_code != 200:
                    differ.append((c, math.nan, f"HTTP {out.status_code}: {out.text[:200]}"))
                    continue
                got = out.json()
                if got["reward"] != c.reward:
                    differ.append((c, got["reward"], str(got.get("failure_kind"))))
    return differ


def _default_scorer(family: str) -> bool:
    from reasoning_gym.dataset import ProceduralDataset

    registered = DATASETS[family]
    cls = registered[0] if isinstance(registered, tuple) else registered
    return getattr(cls, "score_answer", None) is ProceduralDataset.score_answer


def _triage(check: Check, expected: Any) -> str | None:
    if (
        isinstance(expected, str) and expected and expected in check.answer and _default_scorer(check.family)
        and abs((check.reward or 0) - len(expected) / len(check.answer)) < 1e-9
    ):  # fmt: skip
        return "the package's default scorer: len(expected) / len(answer) for an answer holding the expected one"
    exact = TRIAGED.get((check.family, check.probe))
    if exact or (check.kind == "wrong" and (check.reward or 0) >= 1.0):
        return exact
    return TRIAGED.get((check.family, "*"))


def main(argv: list[str] | None = None) -> int:
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3, help="Tasks per family.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", default="", help="Comma-separated families (default: every family).")
    parser.add_argument("--wrong-max", type=float, default=0.1)
    parser.add_argument("--hedge-max", type=float, default=0.5)
    parser.add_argument("--constants", type=int, default=10, help="Tasks per family for the constant answers (0: none).")
    parser.add_argument("--constant-max", type=float, default=0.25)
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--http-sample", type=int, default=200, help="Unflagged checks also sent over HTTP.")
    parser.add_argument("--json", default="", help="Write every check here.")
    parser.add_argument("--show", type=int, default=60, help="Flags listed per kind.")
    ARGS = parser.parse_args(argv)
    families = [f.strip() for f in ARGS.family.split(",") if f.strip()] or sorted(set(DATASETS) - {"composite"})
    unknown = [f for f in families if f not in DATASETS]
    if unknown:
        parser.error(f"--family: unknown {unknown}")
    started = time.monotonic()
    checks, rows = build(families, ARGS.tasks, ARGS.seed) if ARGS.tasks else ([], {})
    constants = build_constants(families, ARGS.constants, ARGS.seed, rows) if ARGS.constants else []
    print(f"{len(families)} families, {len(rows)} tasks, {len(checks) + len(constants)} answers to score", file=sys.stderr)
    asyncio.run(score_all(checks + constants, rows))
    open_constants = [f for f in constant_flags(constants, rows) if (f[0], "*") not in TRIAGED]
    exact = {(c.family, c.task): c.reward for c in checks if c.kind == "exact"}
    for c in checks:
        c.flag = judge(c, exact.get((c.family, c.task)))
        c.triaged = _triage(c, rows[(c.family, c.task)]["answer"]) if c.flag else None
    flagged = [c for c in checks if c.flag]
    rest = [c for c in checks if not c.flag]
    sample = flagged + random.Random(ARGS.seed).sample(rest, min(ARGS.http_sample, len(rest)))
    differ = over_http(sample, rows) if sample else []
    elapsed = time.monotonic() - started

    statuses = Counter(c.status for c in checks + constants)
    print(f"\nfamilies {len(families)}, tasks {len(rows)}, answers scored {len(checks) + len(constants)} "
          f"({', '.join(f'{k} {v}' for k, v in statuses.most_common())}); {elapsed:.0f} s")  # fmt: skip
    unpaid_exact = sorted({c.family for c in checks if c.kind == "exact" and (c.reward or 0) < 1.0})
    if unpaid_exact:
        print(f"exact expected answer not paid 1.0 (no stored answer or scored by simulation): {unpaid_exact}")
    for kind in ("wrong_paid", "case_paid", "right_unpaid"):
        these = [c for c in flagged if c.flag == kind]
        open_ = [c for c in these if not c.triaged]
        fams = sorted({c.family for c in open_})
        print(f"\n{kind}: {len(these)} flags ({len(these) - len(open_)} triaged), untriaged in {len(fams)} families: "
              f"{', '.join(fams)}")  # fmt: skip
        by_pair = Counter((c.family, c.probe) for c in open_)
        for (family, probe), n in by_pair.most_common(ARGS.show):
            worst = max((c for c in open_ if (c.family, c.probe) == (family, probe)), key=lambda c: c.reward or 0)
            print(f"  {family:26s} {probe:28s} x{n}  reward {worst.reward:.3f}  answer {worst.answer[:70]!r}"
                  f"  expected {str(rows[(family, worst.task)]['answer'])[:40]!r}")  # fmt: skip
    print(f"\nconstant_paid (one answer for every task; mean reward vs the share of tasks it is right for): "
          f"{len(open_constants)} untriaged")  # fmt: skip
    for family, probe, mean, share in open_constants:
        print(f"  {family:26s} {probe[:50]!r:52s} mean {mean:.3f}  right for {share:.2f}")
    print(f"\nover HTTP: {len(sample)} checks ({len(flagged)} flagged + {len(sample) - len(flagged)} sampled), "
          f"{len(differ)} rewards differ from the pool's")  # fmt: skip
    for c, got, why in differ[: ARGS.show]:
        print(f"  {c.family} {c.probe}: pool {c.reward} http {got} ({why})")
    if ARGS.json:
        with open(ARGS.json, "w", encoding="utf-8") as f:
            json.dump([{**asdict(c), "text": c.text[:300], "answer": c.answer[:300]} for c in checks + constants], f)
    open_wrong = [c for c in flagged if c.flag == "wrong_paid" and not c.triaged]
    return 1 if open_wrong or open_constants or differ else 0


ARGS: argparse.Namespace

if __name__ == "__main__":
    sys.exit(main())
