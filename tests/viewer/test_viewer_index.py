"""The index, search, per-task numbers, sample log and metrics tail, without a browser."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from viewer_records import nemo_rl_line, rollout, run_a, write_jsonl

from gym_bridge.records.metrics import aggregate_rewards
from gym_bridge.train.bookkeeping.sample_log import list_sample_files, sample_file, write_rollout_samples
from gym_bridge.viewer.compare import compare_runs
from gym_bridge.viewer.index import RolloutIndex
from gym_bridge.viewer.run_dir import MetricsTail

REPO = Path(__file__).resolve().parents[2]


def _index(path: Path) -> RolloutIndex:
    index = RolloutIndex(path).build()
    assert index.ready and index.error is None
    return index


def test_bad_lines_are_counted_with_line_numbers_and_good_ones_read_back(tmp_path: Path) -> None:
    recs = run_a()
    hostile = [b"{not json\n", b"[1, 2]\n", b"\xff\xfe garbage\n", b"\n", b'{"response": 5}\n', b'"just a string"\n']
    path = write_jsonl(tmp_path / "r.jsonl", recs[:3], hostile)
    with open(path, "ab") as f:
        for rec in recs[3:]:
            f.write(json.dumps(rec).encode() + b"\n")
        f.write(b'{"torn": ')  # a torn last line
    index = _index(path)
    assert index.num_records == len(recs)
    assert index.bad_lines == 6  # the blank line is not bad
    assert [b.lineno for b in index.bad_examples] == [4, 5, 6, 8, 9, len(recs) + 7]
    assert "array" in index.bad_examples[1].reason and "$.response" in index.bad_examples[3].reason
    for rid in range(index.num_records):
        assert index.read(rid) == recs[rid]
    assert index.linenos[3] == 10  # the fourth good line comes after the six hostile ones


def test_task_numbers_are_gym_bridge_metrics_of_each_group(tmp_path: Path) -> None:
    recs = run_a()
    index = _index(write_jsonl(tmp_path / "r.jsonl", recs))
    assert index.num_tasks == 4
    for tid in range(index.num_tasks):
        row = index.task_row(tid)
        group = [r for r in recs if r["_ng_task_index"] == row.task_index]
        expected = aggregate_rewards(group)
        n = len(group)
        assert row.num_rollouts == n
        assert row.mean_reward == pytest.approx(expected["mean_reward"])
        assert row.pass_1 == pytest.approx(expected["pass@1"])
        assert row.pass_k == pytest.approx(expected[f"pass@{n}"])
        assert row.majority_k == expected.get(f"majority@{n}")
        assert row.failures == expected["failure_kinds"]
        assert row.mean_output_tokens == pytest.approx(expected.get("mean_output_tokens", 0))
    summary = index.summary()
    whole = aggregate_rewards(recs)
    assert summary["mean_reward"] == pytest.approx(whole["mean_reward"])
    assert summary["k"] == 2 and summary["pass_k"] == pytest.approx(whole["pass@2"])
    assert summary["failure_kinds"] == whole["failure_kinds"]
    assert summary["output_tokens"] == whole["total_output_tokens"]


def test_search_finds_escaped_and_unicode_text_case_insensitively(tmp_path: Path) -> None:
    recs = [
        rollout(0, 0, 1.0, "1", question='Say "Grüße" to Zoë'),
        rollout(1, 0, 0.0, "2", text='He said "ok" \\o/'),
        rollout(2, 0, 0.0, "3"),
    ]
    path = tmp_path / "r.jsonl"
    with open(path, "w") as f:  # one line ASCII-escaped, the others raw UTF-8
        f.write(json.dumps(recs[0], ensure_ascii=True) + "\n")
        for rec in recs[1:]:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    index = _index(path)
    assert index.search("grüSSe") == set()  # case folding stays simple: lower(), not casefold()
    assert index.search("GRÜSSE") == set()
    assert index.search("grüße") == {0}
    assert index.search("ZOË") == {0}
    assert index.search('said "ok" \\o/') == {1}
    assert index.search("boxed{3}") == {2}
    assert index.search("temperature") == set()  # only prompts and answers, not every field
    assert index.search("  ") == {0, 1, 2}


def test_token_only_lines_group_by_prompt_and_carry_logged_advantages(tmp_path: Path) -> None:
    lines = [
        nemo_rl_line(1.0, [1, 2, 3], [7, 8], [-0.1, -0.2], [-0.1, -0.3], 0.5),
        nemo_rl_line(0.0, [1, 2, 3], [9], [-1.0], [-1.0], -0.5),
        nemo_rl_line(0.0, [4, 5], [9], [-1.0], [-1.0], 0.0),
    ]
    index = _index(write_jsonl(tmp_path / "train_data_step1.jsonl", lines))
    assert index.num_tasks == 2
    assert [index.task_n[t] for t in range(2)] == [2, 1]
    assert list(index.output_tokens) == [2, 1, 1] and list(index.input_tokens) == [3, 3, 2]
    assert index.task_mean_reward[0] == 0.5


def test_compare_matches_tasks_by_prompt_whatever_their_index(tmp_path: Path) -> None:
    a = _index(write_jsonl(tmp_path / "a.jsonl", [rollout(0, 0, 0.0, "1"), rollout(1, 0, 1.0, "2")]))
    moved = [rollout(5, 0, 1.0, "1", question="What is 0 + 0? Put the answer in \\boxed{}."),
             rollout(6, 0, 1.0, "3", question="something else")]
    b = _index(write_jsonl(tmp_path / "b.jsonl", moved))
    rows, counts = compare_runs(a, b)
    assert [(r.tid_a, r.tid_b, r.flip) for r in rows] == [(0, 0, "up")]
    assert counts == {"both": 1, "only_a": 1, "only_b": 1, "improved": 1, "regressed": 0,
                      "flipped_up": 1, "flipped_down": 0}


def test_sample_log_keeps_whole_groups_atomically(tmp_path: Path) -> None:
    recs = [rollout(t, r, float(r), str(r)) for t in range(3) for r in range(2)]
    groups = [0, 0, 1, 1, 2, 2]
    path = write_rollout_samples(tmp_path, 12, recs, groups, advantages=[1, -1, 0.5, -0.5, 0, 0], max_groups=2)
    assert path == sample_file(tmp_path, 12) == tmp_path / "rollouts" / "step_000012.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(x["_gb_step"], x["_gb_group"], x["advantage"]) for x in lines] == [
        (12, 0, 1.0), (12, 0, -1.0), (12, 1, 0.5), (12, 1, -0.5)]
    assert {k: v for k, v in lines[0].items() if not k.startswith("_gb") and k != "advantage"} == recs[0]
    assert not list(path.parent.glob("*.tmp"))
    assert write_rollout_samples(tmp_path, 13, recs, groups, max_groups=0) is None
    assert not sample_file(tmp_path, 13).exists()
    write_rollout_samples(tmp_path, 2, recs, groups)  # default: 2 groups, no advantages
    assert "advantage" not in json.loads(sample_file(tmp_path, 2).read_text().splitlines()[0])
    assert [s for s, _ in list_sample_files(tmp_path)] == [2, 12]
    with pytest.raises(ValueError, match="3 group ids"):
        write_rollout_samples(tmp_path, 1, recs, [0, 0, 1])
    with pytest.raises(ValueError, match="max_groups"):
        write_rollout_samples(tmp_path, 1, recs, groups, max_groups=-1)
    # a group split across the step (groups need not be contiguous) is still kept whole
    path = write_rollout_samples(tmp_path, 3, recs, [0, 1, 0, 1, 2, 0], max_groups=1)
    assert [json.loads(x)["_gb_group"] for x in path.read_text().splitlines()] == [0, 0, 0]


def test_metrics_tail_reads_complete_lines_and_restarts_when_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(tmp_path)
    assert tail.poll() == 0  # no file yet
    path.write_text('{"step": 1, "split": "train", "reward_mean": NaN}\nnot json\n{"step": 2')
    assert tail.poll() == 1 and tail.records[0]["reward_mean"] is None and tail.bad_lines == 1
    with open(path, "a") as f:
        f.write(', "split": "train"}\n')
    assert [r["step"] for r in tail.since(0)] == [1, 2]
    path.write_text('{"step": 1, "split": "train"}\n')  # a resumed run rewrote it shorter
    assert [r["step"] for r in tail.since(0)] == [1]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gym_bridge.cli", "view", *args], capture_output=True, text=True,
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=60)


def test_cli_refuses_bad_paths_and_options_by_name(tmp_path: Path) -> None:
    missing = _cli(str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and f"{tmp_path / 'nope.jsonl'}: no such file" in missing.stderr
    f = write_jsonl(tmp_path / "a.jsonl", run_a())
    three = _cli(str(f), str(f), str(f))
    assert three.returncode == 2 and "one or two rollout files" in three.stderr
    mixed = _cli(str(f), str(tmp_path))
    assert mixed.returncode == 2 and "a run directory can only be viewed alone" in mixed.stderr
    tok = _cli(str(f), "--tokenizer", str(tmp_path / "no_such_tokenizer"))
    assert tok.returncode == 2 and "--tokenizer" in tok.stderr


def test_viewer_starts_and_serves_pages_without_torch_or_transformers(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "a.jsonl", run_a())
    code = f"""
import sys
from pathlib import Path
from fastapi.testclient import TestClient
import gym_bridge.cli
from gym_bridge.viewer.app import Viewer, build_app
viewer = Viewer.for_paths([Path({str(f)!r})])
for index in viewer.files.values():
    index.build()
client = TestClient(build_app(viewer))
for url in ("/f/a", "/f/a?q=zebra&sort=majority", "/f/a/rollout/0/tokens", "/f/a/rollout/0.json"):
    assert client.get(url).status_code == 200, url
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print("heavy:", heavy)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "heavy: []" in out.stdout


def test_a_huge_group_is_cut_on_its_page_and_says_so(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from gym_bridge.viewer.app import GROUP_SHOWN, Viewer, build_app

    recs = [rollout(0, r, float(r % 2), str(r % 3)) for r in range(GROUP_SHOWN + 6)]
    viewer = Viewer.for_paths([write_jsonl(tmp_path / "big.jsonl", recs)])
    viewer.files["a"].build()
    client = TestClient(build_app(viewer))
    page = client.get("/f/a/task/0").text
    assert page.count('<article class="rollout') == GROUP_SHOWN
    assert f"The first {GROUP_SHOWN} of {GROUP_SHOWN + 6} rollouts are shown." in page
    for url, status, detail in [("/f/a/task/1", 404, "no task 1"), ("/f/a/task/-1", 404, "no task -1"),
                                ("/f/zz", 404, "no file"), ("/f/a/rollout/999.json", 404, "no rollout 999"),
                                ("/f/a?page=0", 422, "page"), ("/f/a?sort=nope", 422, "sort"),
                                ("/compare", 404, "two rollout files"), ("/run", 404, "not viewing a training run")]:
        answer = client.get(url)
        assert answer.status_code == status, url
        assert detail in answer.text, url


NEMO_GYM_EXAMPLES = REPO / "tests" / "data" / "nemo_gym_examples"


def test_every_nemo_gym_example_rollout_file_indexes_and_renders() -> None:
    """NeMo Gym 0.7.0's shipped example rollouts (vendored): every page of every file answers 200."""
    from fastapi.testclient import TestClient

    from gym_bridge.viewer.app import Viewer, build_app

    files = sorted(NEMO_GYM_EXAMPLES.glob("*.jsonl"))
    assert len(files) == 184
    placeholders = 0
    for path in files:
        viewer = Viewer.for_paths([path])
        index = viewer.files["a"].build()
        if path.read_bytes().startswith(b"<PLACEHOLDER ROW>"):  # NeMo Gym ships a few non-JSON files
            placeholders += 1
            assert index.bad_lines == 1 and index.num_records == 0, path.name
            continue
        assert index.bad_lines == 0 and index.num_records > 0, (path.name, index.bad_examples[:1])
        client = TestClient(build_app(viewer))
        urls = ["/f/a"] + [f"/f/a/task/{t}" for t in range(index.num_tasks)]
        urls += [f"/f/a/rollout/{r}/tokens" for r in range(index.num_records)]
        for url in urls:
            answer = client.get(url)
            assert answer.status_code == 200, (path.name, url, answer.text[:300])
        group = client.get("/f/a/task/0").text
        assert group.count('<article class="rollout') == index.task_n[0]
    assert placeholders >= 1


def test_host_and_port_options_bind_where_they_say(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    f = write_jsonl(tmp_path / "a.jsonl", run_a())
    served = serve(str(f), "--host", "127.0.0.2", "--port", str(port))  # the last --port wins over the fixture's 0
    assert served.url == f"http://127.0.0.2:{port}"
    assert httpx.get(served.url + "/health").status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health")


def test_progress_page_shows_running_totals_while_indexing(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from gym_bridge.viewer.app import Viewer, build_app

    f = write_jsonl(tmp_path / "a.jsonl", run_a(), [b"oops\n"])
    viewer = Viewer.for_paths([f])
    index = viewer.files["a"]
    index._scan()  # scanned, not finished: what the app sees mid-way
    client = TestClient(build_app(viewer))
    page = client.get("/f/a").text
    assert "Indexing a.jsonl" in page and 'http-equiv="refresh"' in page
    totals = index.running_totals()
    assert totals == {"records": 14, "tasks": 4, "bad_lines": 1, "mean_reward": pytest.approx(6 / 14)}
    assert ">14<" in page and ">4<" in page and f">{6 / 14:.3f}<" in page
