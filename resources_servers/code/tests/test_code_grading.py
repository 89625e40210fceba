"""Code extraction and answer comparison (pure functions, host side)."""

from __future__ import annotations

from resources_servers.code.grading import call_output_matches, extract_code, stdout_matches


def test_extracts_the_last_python_block() -> None:
    text = "First try:\n```python\nprint(1)\n```\nBetter:\n```python\nprint(2)\n```\nDone."
    assert extract_code(text) == "print(2)\n"


def test_extract_accepts_py_and_untagged_fences_but_not_other_languages() -> None:
    assert extract_code("```py\nx = 1\n```") == "x = 1\n"
    assert extract_code("```\nx = 2\n```") == "x = 2\n"
    assert extract_code("```cpp\nint main(){}\n```") is None
    assert extract_code("```python\nprint(3)\n```\n```bash\nls\n```") == "print(3)\n"


def test_extract_finds_nothing_without_a_closed_fence() -> None:
    assert extract_code("print(1)") is None
    assert extract_code("```python\nprint(1)") is None
    assert extract_code("```python\n\n```") is None


def test_stdout_comparison_normalises_whitespace() -> None:
    assert stdout_matches("1 2 \n\n3\n", "1  2\n3")
    assert stdout_matches("  a\tb  \r\n", "a b\n")
    assert not stdout_matches("1 2\n3\n", "1 2 3\n")
    assert not stdout_matches("1\n", "1\n2\n")
    assert not stdout_matches("", "0\n")


def test_stdout_comparison_tolerates_float_rounding_only() -> None:
    assert stdout_matches("0.3333333\n", "0.33333333333\n")
    assert not stdout_matches("0.34\n", "0.33\n")
    assert not stdout_matches("abc\n", "abd\n")


def test_reference_task_output_with_trailing_spaces_and_blank_line() -> None:
    assert stdout_matches("1\n3\n-1\n0\n2\n1 2\n", "1\n3 \n-1\n0\n\n2\n1 2 \n")


def test_call_output_comparison_apps_and_livecodebench_styles() -> None:
    assert call_output_matches(3, [3])  # APPS wraps the return value
    assert call_output_matches([0, 1], "[0, 1]")  # LiveCodeBench: JSON text
    assert call_output_matches([[1, 2]], [[1, 2]])
    assert call_output_matches([1, 2], [[1, 2]])
    assert call_output_matches((1, 2), [1, 2])
    assert call_output_matches(0.1 + 0.2, [0.3])
    assert not call_output_matches(True, [1])  # booleans are not numbers
    assert not call_output_matches([1, 2], [2, 1])
    assert not call_output_matches("3", [3])
    assert call_output_matches({"a": 1}, '{"a": 1}')


def _harness():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "code_harness", Path(__file__).resolve().parent.parent / "harness.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines functions only; main() is not run
    return module


def test_harness_json_encoder_agrees_with_json() -> None:
    import json
    import math

    import pytest

    to_json = _harness().to_json
    values = [
        None, True, False, 0, -7, 10**30, 1.5, -0.0, 1e-300, "plain", 'q"uote\\back', "tab\tnew\nline\x00\x1f\x7f",
        "ünïcödé ✓ 𝄞", [1, [2, (3, 4)]], {"a": {"b": [None]}, "1": 2}, {1: "int key", None: "none", False: "f", 2.5: "float"},
    ]  # fmt: skip
    for value in values:
        assert json.loads(to_json(value)) == json.loads(json.dumps(value)), value
    assert json.loads(to_json({3, 1, 2})) == [1, 2, 3]
    assert math.isnan(json.loads(to_json(float("nan")))) and json.loads(to_json(float("-inf"))) == float(
        "-inf"
    )
    with pytest.raises(TypeError):
        to_json(object())
    with pytest.raises(TypeError):
        to_json({(1, 2): 3})


def test_test_messages_for_stdin_and_calls() -> None:
    from resources_servers.code.runner import test_message

    assert test_message("1 2\n", None) == {"stdin": "1 2\n"}
    assert test_message(["1 2", "3"], None) == {"stdin": "1 2\n3"}
    assert test_message([[1, 2], "x"], "f") == {"args": [[1, 2], "x"]}
    assert test_message("[2,7,11,15]\n9", "f") == {"args": [[2, 7, 11, 15], 9]}
    assert test_message("not json", "f") == {"args": ["not json"]}
    assert test_message({"k": (1, 2)}, "f") == {"args": [{"k": [1, 2]}]}


def test_integers_compare_exactly_and_reals_with_tolerance() -> None:
    """A near-miss integer is a wrong answer, however large (issue 12: a+b+1 passed 1e9-sized answers)."""
    assert not stdout_matches("2000000001\n", "2000000000\n")
    assert not stdout_matches("1000000008\n", "1000000007\n")
    assert not stdout_matches("+5 007\n", "5 7\n")  # an expected integer needs its own text (issue 33)
    assert not stdout_matches("2000000000.0000001\n", "2000000000\n")  # no tolerance for an expected integer
    assert stdout_matches("2000000000.0000001\n", "2000000000.0\n")  # an expected real keeps it
    assert not call_output_matches(1000000008, [1000000007])
    assert not call_output_matches(10**18 + 1, 10**18)
    assert call_output_matches(10**18, "1000000000000000000")
    assert not call_output_matches(10**400, [1.5])  # too large for a float: unequal, not an error
    assert not call_output_matches(2.0000000000001, [2])  # an expected int is matched exactly (issue 33)
    assert call_output_matches(2.0000000000001, [2.0])
