"""Every reasoning-gym family through the isolated scorer workers, over real HTTP: the guards (literal-only
``eval``, math-only SymPy parsing, the audit hook) and the dropped privileges must not change what the
package itself pays for a right answer, a near miss or a wrong one (for the families ``corrections.py``
lists, what their correction pays)."""

from __future__ import annotations

import json

import httpx
import pytest
import reasoning_gym
from reasoning_gym.factory import DATASETS

from gym_bridge.rollout.envs import running_env
from resources_servers.reasoning_gym.app import extract
from resources_servers.reasoning_gym.corrections import CORRECTED
from resources_servers.reasoning_gym.generate import task_rows
from resources_servers.reasoning_gym.tests.helpers import answered


@pytest.fixture(scope="module")
def client():
    with running_env("reasoning_gym", pool_size=2) as url, httpx.Client(base_url=url, timeout=120) as c:
        yield c


def test_every_family_scores_as_the_package_does(client):
    families = sorted(set(DATASETS) - {"composite"})  # composite mixes the others; it has no rows of its own
    assert len(families) >= 100
    mismatches = []
    for family in families:
        (row,) = task_rows([family], 1, seed=0)
        # as the server gets it: through JSON (arc_agi's metadata holds tuples, which JSON makes lists)
        entry = json.loads(json.dumps({k: row[k] for k in ("question", "answer", "metadata")}))
        given = row["answer"] or ""  # a few families score by simulation and store no answer
        for answer in dict.fromkeys((given, given[:-1], "certainly not this")):
            scored = extract(f"<answer>{answer}</answer>")[0]  # what the server hands the scorer
            try:
                # the package's scorer, or for the few in corrections.py (which pay wrong answers), their fix
                scorer = CORRECTED.get(family) or reasoning_gym.get_score_answer_fn(family)
                expected = float(scorer(answer=scored, entry=entry))
                kinds: tuple[str | None, ...] = (None, "answer_refused")
            except Exception:  # the package's own scorer raises on it: reward 0, scorer_error
                expected, kinds = 0.0, ("scorer_error",)
            out = client.post("/verify", json=answered(row, f"<answer>{answer}</answer>"))
            assert out.status_code == 200, (family, out.text)
            body = out.json()
            if body["reward"] != expected or body["failure_kind"] not in kinds:
                mismatches.append((family, answer[:40], expected, body["reward"], body["failure_reason"]))
    assert not mismatches
