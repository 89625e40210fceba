"""Write tests/data/nemo_gym/code_comparator_0.7.0.json: NeMo Gym 0.7.0's ``code_gen`` verdicts on output pairs,
so a test can hold the code server's comparator against NeMo Gym's without NeMo Gym installed.

NeMo Gym's ``code_gen`` server grades with its copy of LiveCodeBench's ``testing_util``: stdout lines equal
as text, else token-wise ``Decimal`` equality with a 1e-6 tolerance (absolute, or relative to
``max(|expected|, 1)``) whenever *either* token has a point or an exponent; a return value ``==`` the expected
one, else ``values_are_close`` (``numpy.allclose``) when either side is a float. Our comparator
(:mod:`resources_servers.code.grading`) keeps that tolerance only where the *expected* token or value is a
non-integer number; ``test_code_comparator.py`` checks we agree there and differ only where the expected
value is an integer. Usage (NeMo Gym installed in its own venv, e.g. by ``../shared/tools/nemo_gym/install.sh``):

    .venv/bin/python scripts/nemo_gym_code_comparator_fixture.py --ng-python /tmp/nemogym-dev/venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests/data/nemo_gym/code_comparator_0.7.0.json"
STDOUT_CASES = [  # (program output, expected output)
    ("2000000001.0", "2000000000"),
    ("2000000000.0", "2000000000"),
    ("1.219326313559686e+23", "121932631355968601347401"),
    ("11", "00000011"),
    ("7 5", "07 05"),
    ("3", "3.0"),
    ("3.0", "3"),
    ("0.3333333", "0.33333333333"),
    ("0.34", "0.33"),
    ("1.5000015", "1.5"),
    ("1.500002", "1.5"),
    ("150000.1", "150000.0"),
    ("150000.2", "150000.0"),
    ("0.0000005", "0.0"),
    ("0.0000015", "0.0"),
    ("1e-7", "0.0"),
    ("1.0000001e10", "1e10"),
    ("1.000001e10", "1e10"),
    ("-2.5", "-2.50"),
    ("2.5", "-2.5"),
    ("abc", "abd"),
    ("1.5 2", "1.5000001 2"),
    ("nan", "0.5"),
]
CALL_CASES = [  # (returned value, expected value), JSON-able
    (1000000007.0, 1000000006),
    (120000000062.0, 120000000000),
    (7.0, 7),
    (0.30000000000000004, 0.3),
    (2.500025, 2.5),
    (2.50003, 2.5),
    (2, 2.0),
    ([1, 2.0000001], [1, 2.0]),
]
NEMO_GYM_SIDE = """
import json, sys, warnings
warnings.simplefilter("ignore")
from resources_servers.code_gen.lcb_integration import testing_util as t
cases = json.load(sys.stdin)

def line_ok(got, expected):  # grade_stdio's per-line rule (case-insensitive yes/no aside)
    got, expected = got.strip(), expected.strip()
    if got == expected:
        return True
    ok_got, got_dec = t.convert_line_to_decimals(got)
    ok_exp, exp_dec = t.convert_line_to_decimals(expected)
    return ok_got and ok_exp and t.decimal_lines_match(expected.split(), got.split(), exp_dec, got_dec)

def call_ok(got, expected):  # grade_call_based's rule
    if isinstance(got, tuple):
        got = list(got)
    ok = got == expected or json.dumps(got) == json.dumps(expected) or t.values_are_close(expected, got)
    if not ok and isinstance(got, list) and isinstance(expected, list):
        ok = len(got) == len(expected) and all(t.values_are_close(e, g) for g, e in zip(got, expected))
    return bool(ok)

print(json.dumps({
    "stdout": [[g, e, line_ok(g, e)] for g, e in cases["stdout"]],
    "call": [[g, e, call_ok(g, e)] for g, e in cases["call"]],
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ng-python", required=True, help="The Python of a venv with nemo-gym 0.7.0 installed."
    )
    args = parser.parse_args()
    cases = json.dumps({"stdout": STDOUT_CASES, "call": CALL_CASES})
    done = subprocess.run(
        [args.ng_python, "-c", NEMO_GYM_SIDE],
        input=cases,
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
    )  # not the repository: its resources_servers would shadow NeMo Gym's
    if done.returncode != 0:
        raise SystemExit(f"NeMo Gym side failed:\n{done.stderr}")
    verdicts = json.loads(done.stdout)
    OUT.write_text(json.dumps({
        "source": "nemo-gym 0.7.0 resources_servers/code_gen/lcb_integration/testing_util.py (Apache-2.0)",
        "columns": ["got", "expected", "nemo_gym_passes"], **verdicts,
    }, indent=1) + "\n")  # fmt: skip
    print(f"wrote {OUT} ({len(verdicts['stdout'])} stdout and {len(verdicts['call'])} return-value cases)")


if __name__ == "__main__":
    main()
