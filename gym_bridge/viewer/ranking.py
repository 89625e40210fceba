"""The per-group file of ``gym-bridge eval ranked --groups-out``: each group's members in rank order
beside the model's scores and its own order, and the groups sorted by how well the model ranked them.

A line is ``{"line", "prompt", "pairwise_accuracy", "top1", "kendall_tau", "pairs", "group": [{"response",
"rank", "score", "model_rank"}]}``. The metrics shown are recomputed from the members' ranks and scores
by :func:`gym_bridge.evaluation.ranked.group_metrics` (a null score, an empty response, is ``-inf`` as
when it was scored), so the page and ``eval ranked``'s report are one implementation. The file is read
whole when the viewer starts (a groups file is as long as a model could score); bad lines are counted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse

from gym_bridge.evaluation.ranked import GroupResult, RankedReport, group_metrics
from gym_bridge.records.jsonl import JsonlError, iter_jsonl
from gym_bridge.viewer.records import clip_middle
from transforms.common import RecordError
from transforms.ranked import check_ranked, dense_ranks

__all__ = ["RankingFile", "add_ranking_routes", "is_ranking_file"]

SORTS = ("line", "pairwise", "top1", "tau")
PAGE_SIZE = 200


def _member_is_scored(member: Any) -> bool:
    return isinstance(member, dict) and "score" in member and "model_rank" in member


def is_ranking_file(path: Path) -> bool:
    """Whether ``path``'s first non-empty line is an ``eval ranked --groups-out`` group."""
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    first = json.loads(raw)
                except ValueError:
                    return False
                group = first.get("group") if isinstance(first, dict) else None
                return isinstance(group, list) and bool(group) and all(map(_member_is_scored, group))
    return False


def _score(value: Any) -> float:
    if value is None:
        return -math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError(f"'score' must be a number or null, got {value!r}")
    return float(value)


@dataclass
class RankingFile:
    """A groups file, its groups' recomputed metrics and the overall numbers."""

    path: Path
    groups: list[GroupResult] = field(default_factory=list)
    bad_lines: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> RankingFile:
        loaded = cls(path)
        report = RankedReport()
        for lineno, record in iter_jsonl(path, strict=False, on_error=lambda e: loaded.bad_lines.append(str(e))):
            try:
                checked = check_ranked(record)
                result = group_metrics(
                    int(record.get("line", lineno)), checked, [_score(m.get("score")) for m in checked["group"]]
                )
            except (RecordError, ValueError, TypeError) as err:
                loaded.bad_lines.append(str(JsonlError(path, lineno, str(err))))
                continue
            loaded.groups.append(result)
            report.add(result)
        loaded.summary = report.summary()
        return loaded

    @property
    def name(self) -> str:
        return self.path.name


def _sort_key(sort: str) -> Callable[[tuple[int, GroupResult]], Any]:
    """Worst first for a metric (unrankable groups last), file order for ``line``."""
    if sort == "line":
        return lambda item: item[0]
    attr = {"pairwise": "pairwise_accuracy", "top1": "top1", "tau": "kendall_tau"}[sort]

    def key(item: tuple[int, GroupResult]) -> Any:
        value = getattr(item[1], attr)
        return (value is None, value if value is not None else 0.0, item[0])

    return key


def _prompt_text(prompt: Any) -> str:
    """A prompt as text: as is, or its chat messages as ``role: text`` paragraphs."""
    from gym_bridge.evaluation.scoring import prompt_messages
    from gym_bridge.records.schema import content_text

    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(f"{m.get('role')}: {content_text(m.get('content'))}" for m in prompt_messages(prompt))


def add_ranking_routes(app: FastAPI, ranking: RankingFile, page: Callable[..., HTMLResponse]) -> None:
    """``/ranked`` the groups (sortable, worst first), ``/ranked/{gid}`` one group's members."""
    from gym_bridge.evaluation.scoring import response_text

    @app.get("/ranked", response_class=HTMLResponse)
    def ranked_groups(
        request: Request,
        sort: Literal[SORTS] = "line",  # type: ignore[valid-type]
        misordered: bool = False,
    ) -> HTMLResponse:
        items = list(enumerate(ranking.groups))
        if misordered:
            items = [(g, r) for g, r in items if r.pairwise_accuracy is not None and r.pairwise_accuracy < 1.0]
        items.sort(key=_sort_key(sort))
        rows = [(g, r, _prompt_text(r.prompt)) for g, r in items[:PAGE_SIZE]]
        return page(
            request, "ranked.html", ranking=ranking, rows=rows, matched=len(items), sort=sort,
            sorts=SORTS, misordered=misordered,
        )  # fmt: skip

    @app.get("/ranked/{gid}", response_class=HTMLResponse)
    def ranked_group(request: Request, gid: int) -> HTMLResponse:
        if not 0 <= gid < len(ranking.groups):
            raise HTTPException(404, f"gid: no group {gid} in {ranking.name} (it has {len(ranking.groups)})")
        result = ranking.groups[gid]
        model_ranks = dense_ranks(result.scores)
        members = sorted(
            (
                {"rank": k, "score": s, "model_rank": m, "response": clip_middle(response_text(r)), "index": i}
                for i, (r, k, s, m) in enumerate(
                    zip(result.responses, result.ranks, result.scores, model_ranks, strict=True)
                )
            ),
            key=lambda m: (m["rank"], -m["score"], m["index"]),
        )
        return page(
            request, "ranked_group.html", ranking=ranking, gid=gid, result=result, members=members,
            prompt=clip_middle(_prompt_text(result.prompt)),
        )  # fmt: skip
