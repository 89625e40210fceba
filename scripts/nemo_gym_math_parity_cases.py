r"""The varied answers of NeMo Gym's math parity table (:mod:`nemo_gym_math_parity` scores them).

Each row is an (expected answer, response text) pair -- integers, fractions, decimals, percents, roots,
pi, intervals, sets, tuples, units, text, lookalike Unicode, ``\fbox``, ``\boxed`` variants, several or
empty boxes, relations, negations, huge numbers, near misses, prose around the box. Why its own module:
the table is data a reviewer reads and extends; the scoring run beside it is NeMo Gym's server code.
Plain Python (no NeMo Gym import), so it also loads outside NeMo Gym's interpreter.
"""

from __future__ import annotations


def _boxed(answer: str) -> str:
    return "\\boxed{" + answer + "}"


def cases() -> list[tuple[str, str, str]]:
    """``(category, expected_answer, response_text)`` rows; deterministic."""
    rows: list[tuple[str, str, str]] = []

    def add(category: str, expected: str, answers: list[str], wrap: bool = True) -> None:
        for answer in answers:
            rows.append((category, expected, _boxed(answer) if wrap else answer))

    # Integers, spelled many ways.
    add(
        "integer",
        "12",
        ["12", "13", "-12", "012", "+12", "12.0", "12.00", "1 2", "1,2", "12,", " 12 ", "{12}"],
    )
    add("integer", "1000", ["1000", "1,000", "1{,}000", "1\\,000", "1\\;000", "1 000", "10^3", "1e3", "999"])
    add("integer", "-7", ["-7", "- 7", "7", "−7", "(-7)", "-(7)", "-7.0", "\\left(-7\\right)"])
    add("integer", "0", ["0", "-0", "0.0", "00", "O", "\\emptyset", "zero", "\\text{zero}"])
    add(
        "integer",
        "42",
        ["42", "\\mathbf{42}", "\\textbf{42}", "\\text{42}", "42.", "\\,42", "4 2", "4\\cdot 2", "6\\times7"],
    )
    # Fractions.
    add(
        "fraction",
        "\\frac{3}{4}",
        [
            "\\frac{3}{4}",
            "\\dfrac{3}{4}",
            "\\tfrac{3}{4}",
            "3/4",
            "\\frac34",
            "0.75",
            "\\frac{6}{8}",
            "\\frac{4}{3}",
            "-\\frac{3}{4}",
            "\\frac{-3}{-4}",
            "75\\%",
            "0.7500",
        ],
    )
    add(
        "fraction",
        "-\\frac{1}{2}",
        [
            "-\\frac{1}{2}",
            "\\frac{-1}{2}",
            "\\frac{1}{-2}",
            "-1/2",
            "-0.5",
            "\\frac{1}{2}",
            "-\\frac{2}{4}",
            "-.5",
        ],
    )
    add(
        "fraction",
        "\\frac{83}{499}",
        ["\\frac{83}{499}", "83/499", "0.166333", "0.1663327", "\\frac{166}{998}", "0.17"],
    )
    # Decimals.
    add(
        "decimal",
        "0.5",
        ["0.5", ".5", "\\frac{1}{2}", "1/2", "0.50", "0.500001", "0.5000001", "0,5", "5\\times10^{-1}"],
    )
    add(
        "decimal",
        "\\frac{1}{3}",
        ["0.333333", "0.3333333", "0.333", "0.33", "\\frac{1}{3}", "0.\\overline{3}", "0.3\\overline{3}"],
    )
    add("decimal", "3.14", ["3.14", "\\pi", "3.1400", "3.141", "3.14159", "314/100"])
    add("decimal", "2.5", ["2.5", "\\frac{5}{2}", "2\\frac{1}{2}", "2 \\frac{1}{2}", "2.50", "5/2", "25/10"])
    # Percents.
    add("percent", "50", ["50\\%", "50%", "50", "50 \\%", "50\\text{ percent}", "0.5", "50 percent"])
    add("percent", "50\\%", ["50", "50\\%", "0.5", "\\frac{1}{2}", "50%"])
    add("percent", "\\frac{1}{2}", ["50\\%", "50", "0.5", "50 \\%"])
    add("percent", "0.25", ["25\\%", "25", "\\frac{1}{4}"])
    add("percent", "7", ["7\\%", "700\\%", "0.07"])
    # Roots.
    add(
        "sqrt",
        "2\\sqrt{2}",
        [
            "2\\sqrt{2}",
            "\\sqrt{8}",
            "\\sqrt8",
            "2\\sqrt2",
            "2.828427",
            "2.8284271",
            "2.83",
            "\\sqrt{2}\\cdot 2",
            "8^{1/2}",
            "\\sqrt{2}",
        ],
    )
    add("sqrt", "5", ["\\sqrt{25}", "\\sqrt{5^2}", "\\sqrt{24}", "\\sqrt[3]{125}", "25^{0.5}", "\\sqrt{-25}"])
    add(
        "sqrt",
        "\\sqrt{3}",
        ["\\frac{\\sqrt{12}}{2}", "\\sqrt{3}", "3^{1/2}", "1.732051", "1.73", "\\frac{3}{\\sqrt{3}}"],
    )
    # Pi.
    add(
        "pi",
        "2\\pi",
        ["2\\pi", "2 \\pi", "\\pi \\cdot 2", "6.283185", "6.28", "2pi", "360^\\circ", "\\tau", "2\\Pi"],
    )
    add(
        "pi",
        "\\frac{\\pi}{2}",
        ["\\frac{\\pi}{2}", "\\pi/2", "0.5\\pi", "90^\\circ", "1.570796", "\\frac{1}{2}\\pi"],
    )
    # Intervals.
    add(
        "interval",
        "(0, 1)",
        [
            "(0, 1)",
            "(0,1)",
            "[0, 1]",
            "(0, 1]",
            "0 < x < 1",
            "x \\in (0, 1)",
            "(1, 0)",
            "\\left(0, 1\\right)",
            "]0, 1[",
        ],
    )
    add(
        "interval",
        "[2, \\infty)",
        [
            "[2, \\infty)",
            "[2, +\\infty)",
            "x \\geq 2",
            "x \\ge 2",
            "(2, \\infty)",
            "[2, \\infty]",
            "2 \\le x",
        ],
    )
    add(
        "interval",
        "(-\\infty, 1) \\cup (2, \\infty)",
        [
            "(-\\infty, 1) \\cup (2, \\infty)",
            "(2, \\infty) \\cup (-\\infty, 1)",
            "x < 1 \\text{ or } x > 2",
            "(-\\infty, 1)",
        ],
    )
    # Sets.
    add(
        "set",
        "\\{1, 2\\}",
        [
            "\\{1, 2\\}",
            "\\{2, 1\\}",
            "1, 2",
            "2, 1",
            "\\{1, 2, 2\\}",
            "\\{1\\}",
            "\\{1, 2, 3\\}",
            "{1, 2}",
            "1 \\text{ and } 2",
            "x = 1, x = 2",
        ],
    )
    add("set", "4", ["\\{4\\}", "\\{4, 4\\}", "4, 4", "\\{4, 5\\}"])
    # Tuples.
    add(
        "tuple",
        "(1, 2)",
        ["(1, 2)", "(2, 1)", "\\left(1, 2\\right)", "[1, 2]", "1, 2", "(1,2,3)", "x=1, y=2"],
    )
    add("tuple", "(3, -4)", ["(3, -4)", "(3,-4)", "(-4, 3)", "(3, 4)", "\\langle 3, -4 \\rangle"])
    # Units.
    add(
        "units",
        "5",
        [
            "5 \\text{ cm}",
            "5\\text{cm}",
            "5 \\mathrm{cm}",
            "5 cm",
            "5\\,\\text{m}",
            "5 \\text{ apples}",
            "5 \\text{ meters}",
            "5^\\circ",
            "\\$5",
            "5 \\text{ dollars}",
        ],
    )
    add(
        "units",
        "30^\\circ",
        ["30", "30^\\circ", "30^{\\circ}", "30 \\text{ degrees}", "\\frac{\\pi}{6}", "30°"],
    )
    # Text answers.
    add(
        "text",
        "\\text{(B)}",
        ["\\text{(B)}", "(B)", "B", "\\text{B}", "b", "\\textbf{(B)}", "(C)", "\\text{(b)}"],
    )
    add("text", "\\text{yes}", ["\\text{yes}", "yes", "Yes", "\\text{Yes}", "\\text{no}", "\\text{YES}"])
    add("text", "A", ["A", "\\text{A}", "a", "(A)", "\\mathrm{A}"])
    # Lookalike Unicode.
    add("unicode", "4", ["４", "٤", "𝟒", "4\u200b", "\u200b4", "4\ufeff", "⁴", "IV", "Ⅳ", "4\u00a0"])
    add("unicode", "-4", ["−4", "–4", "—4", "－4", "-4"])
    add("unicode", "x = 4", ["x ＝ 4", "х = 4", "x = 4", "x == 4"])
    add("unicode", "12", ["1２", "١٢", "12"])
    # \fbox and box variants (not wrapped: the texts are whole responses).
    add(
        "fbox",
        "7",
        [
            "\\fbox{7}",
            "\\fbox{7} \\boxed{7}",
            "\\boxed{7} \\fbox{8}",
            "\\boxed{\\fbox{7}}",
            "\\fbox{\\boxed{7}}",
            "$\\fbox{7}$",
            "\\framebox{7}",
            "\\fbox{8} then \\boxed{7}",
        ],
        wrap=False,
    )
    add(
        "boxed_variant",
        "7",
        [
            "\\boxed {7}",
            "\\boxed7",
            "\\Boxed{7}",
            "\\boxed{{7}}",
            "\\boxed{\\boxed{7}}",
            "\\boxed{ 7 }",
            "\\boxed{7}.",
            "$\\boxed{7}$",
            "\\[\\boxed{7}\\]",
            "\\(\\boxed{7}\\)",
            "$$\\boxed{7}$$",
            "**\\boxed{7}**",
            "\\boxed{\\textbf{7}}",
            "\\boxed{\\mathbf{7}}",
            "boxed{7}",
            "\\\\boxed{7}",
            "\\boxed{7",
            "\\boxed{7}}",
            "\\boxed{$7$}",
            "\\boxed{\\(7\\)}",
            "\\boxed{\\displaystyle 7}",
            "\\boxed{7}\\%",
            "\\boxed{7} \\text{ cm}",
        ],
        wrap=False,
    )
    # Several boxes.
    add(
        "multiple_boxes",
        "7",
        [
            "\\boxed{3} then \\boxed{7}",
            "\\boxed{7} then \\boxed{3}",
            "\\boxed{7} and \\boxed{7}",
            "\\boxed{7}, \\boxed{7}, \\boxed{7}",
            "\\boxed{3}\\boxed{7}",
            "\\boxed{1} \\boxed{2} \\boxed{7}",
            "First \\boxed{7}. Double-checking gives \\boxed{7}.",
        ],
        wrap=False,
    )
    add(
        "multiple_boxes",
        "\\{1, 2\\}",
        [
            "\\boxed{1} and \\boxed{2}",
            "\\boxed{2} or \\boxed{1}",
            "\\boxed{1}, \\boxed{2}",
            "\\boxed{1}\\boxed{2}",
        ],
        wrap=False,
    )
    # Empty and broken boxes.
    add(
        "empty_box",
        "7",
        [
            "\\boxed{}",
            "\\boxed{ }",
            "\\boxed{7} \\boxed{}",
            "\\boxed{7} then \\boxed{ }",
            "\\boxed{\\text{}}",
            "\\boxed{{}}",
            "\\boxed{7} \\boxed{",
            "\\boxed{}7",
            "7",
            "The answer is 7.",
            "Answer: 7",
            "#### 7",
            "",
        ],
        wrap=False,
    )
    # Relations, negations, approximations, prose inside the box.
    add(
        "relation",
        "4",
        [
            "5 = 4",
            "4 = 5",
            "x = 4",
            "4 = 4",
            "x = 5 = 4",
            "4 \\approx 5",
            "4 \\neq 5",
            "\\neg 4",
            "\\lnot 4",
            "4 \\text{ is not the answer}",
            "\\text{not } 4",
            "x < 4",
            "x \\le 4",
            "4 < 5",
            "x \\approx 4",
            "\\approx 4",
            "4 \\pm 0",
            "\\pm 4",
            "x \\to 4",
            "4 \\text{ (approximately)}",
            "\\text{about } 4",
            "4 \\text{ or } 5",
            "4, 5",
            "4 \\text{ if } x > 0",
            "x := 4",
            "4!",
            "-4",
            "|4|",
            "|-4|",
        ],
    )
    add(
        "relation",
        "y = 2x + 1",
        ["y = 2x + 1", "2x + 1", "y = 1 + 2x", "y - 2x = 1", "y = 2x - 1", "2x + 1 = y", "f(x) = 2x + 1"],
    )
    add("relation", "x > 3", ["x > 3", "3 < x", "(3, \\infty)", "x \\geq 3", "x > 4"])
    # Huge numbers and near misses.
    big = "123456789012345678901234567890"
    add(
        "huge",
        big,
        [
            big,
            big[:-1] + "1",
            big + "0",
            "1.2345678901234568\\times 10^{29}",
            "1.23456789012345678901234567890e29",
        ],
    )
    add(
        "huge",
        "10^{100}",
        [
            "10^{100}",
            "1" + "0" * 100,
            "10^{99}",
            "100^{50}",
            "10^{100} + 1",
            "(10^{10})^{10}",
            "1e100",
            "10^{100}+10^{-31}",
        ],
    )
    add(
        "huge",
        "18446744073709551616",
        [
            "2^{64}",
            "18446744073709551616",
            "18446744073709551615",
            "4^{32}",
            "2^{64} - 1",
            "1.8446744073709552\\times10^{19}",
        ],
    )
    add(
        "near_miss",
        "4",
        [
            "4+10^{-31}",
            "4-10^{-100}",
            "\\frac{4\\cdot10^{40}+1}{10^{40}}",
            "\\frac{4\\cdot10^{40}}{10^{40}}",
            "4.000001",
            "4.0000001",
            "3.9999999",
            "3.999999",
            "4+10^{-7}",
            "4 + 0",
            "\\sqrt{16}",
            "\\sqrt{16}+10^{-31}",
            "2+2",
            "2^2",
            "\\frac{8}{2}",
            "\\lceil 3.5 \\rceil",
            "\\lfloor 4.9 \\rfloor",
            "4i",
            "4 + 0i",
            "4e0",
        ],
    )
    add(
        "near_miss",
        "\\sqrt{2}",
        [
            "\\sqrt{2}+10^{-31}",
            "\\sqrt{2}(1+10^{-100})",
            "\\sqrt{2+10^{-100}}",
            "1.414214",
            "1.41421356",
            "\\frac{2}{\\sqrt{2}}",
            "2^{0.5}",
        ],
    )
    add("near_miss", "\\pi", ["\\pi + 10^{-20}", "3.141593", "3.1415926535", "\\frac{22}{7}", "\\pi+0"])
    # Expressions and variables.
    add(
        "expression",
        "x^2 + 2x + 1",
        ["x^2 + 2x + 1", "(x+1)^2", "x^2+2x+2", "1 + 2x + x^2", "(x+1)(x+1)", "y^2+2y+1"],
    )
    add("expression", "\\frac{a}{b}", ["\\frac{a}{b}", "a/b", "ab^{-1}", "\\frac{b}{a}", "\\frac{2a}{2b}"])
    add("expression", "e^2", ["e^2", "\\exp(2)", "7.389056", "e \\cdot e", "\\mathrm{e}^2", "2e"])
    add("expression", "\\log_2 8", ["3", "\\log_2 8", "\\ln 8 / \\ln 2", "\\log 8"])
    add("expression", "3 + 2i", ["3 + 2i", "2i + 3", "3 - 2i", "3+2\\mathrm{i}", "(3, 2)"])
    add(
        "matrix",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        [
            "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
            "\\begin{bmatrix} 1 & 2 \\\\ 3 & 4 \\end{bmatrix}",
            "\\begin{pmatrix} 1 & 3 \\\\ 2 & 4 \\end{pmatrix}",
        ],
    )
    # Prose around the box (whole responses).
    add(
        "prose",
        "4",
        [
            "The answer is \\boxed{4}.",
            "So we get $x = \\boxed{4}$.",
            "The final answer is 5. I hope it is correct. \\boxed{4}",
            "The final answer is \\boxed{4}. I hope it is correct.",
            "Answer: 5\n\\boxed{4}",
            "I think \\boxed{4} or maybe 5.",
            "\\boxed{4} is wrong, the answer is 5",
            "**Final Answer**\n\\[\\boxed{4}\\]",
            "$2+2=\\boxed{4}$",
            "Therefore $\\boxed{4}$ apples.",
            "\\boxed{4}. Final answer: 5",
            "3 + 1 = \\boxed{4}",
            "The final answer is $5$. \\boxed{4}",
            "final answer: \\boxed{5}\n\\boxed{4}",
            "We have 12 apples... \\boxed{4}",
        ],
        wrap=False,
    )
    # Expected answers written with delimiters.
    for expected in (
        "$4$",
        "\\(4\\)",
        "\\[4\\]",
        "$$4$$",
        " 4 ",
        "4.0",
        "\\frac{8}{2}",
        "\\boxed{4}",
        "4\\%",
        "{4}",
    ):
        add("expected_delimiters", expected, ["4", "5", "4.0"])
    return rows
