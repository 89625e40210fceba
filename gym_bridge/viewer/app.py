"""The viewer's FastAPI app: server-rendered pages (Jinja2) over :class:`Viewer`'s indexes, no CDN, no build.

Pages: ``/f/{fid}`` a file's tasks (sort, filter, search, pages), ``/f/{fid}/task/{tid}`` a task's group
side by side, ``/f/{fid}/rollout/{rid}/tokens`` the token view, ``/f/{fid}/rollout/{rid}.json`` the raw
record, ``/compare`` two files, ``/run`` a training run's curves and per-step samples
(``/api/run/metrics`` is what its page polls). ``/health`` is open; with a token every other path needs
``Authorization: Bearer TOKEN``, or ``?token=TOKEN`` once (a browser), which sets a cookie.

Why FastAPI here and not :class:`~gym_bridge.serving.json_http.JsonApp`, which serves every other server of the
project: a JsonApp route table matches exact ``(method, path)`` pairs and reads JSON bodies, which is all a
resources server or the policy server needs and why it is cheap on the collect and training hot path
(tens of thousands of small requests). These pages need what a web framework is for: path parameters
(``/f/{fid}/task/{tid}``), typed query parameters refused by name (``sort``, ``page >= 1``), Jinja2 pages
(HTML error pages too), 303 redirects, a cookie set from ``?token=``, and static files with
``ETag``/304. Adding those to JsonApp would write a second framework inside it for one person's clicks.
What must be the same is shared: the Host-name check is the same
:class:`~gym_bridge.serving.request_guard.RequestGuard` (421, same message), run before anything else, and the
bearer token is compared in constant time as JsonApp does; JSON paths (``/api/...``, ``*.json``) answer
errors as ``{"detail": ...}`` like the servers.
"""

from __future__ import annotations

import functools
import hmac
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from gym_bridge.serving.request_guard import RequestGuard
from gym_bridge.viewer.compare import compare_runs
from gym_bridge.viewer.groups import ADVANTAGE_SETTINGS, group_advantages
from gym_bridge.viewer.index import RolloutIndex
from gym_bridge.viewer.ranking import RankingFile, add_ranking_routes, is_ranking_file
from gym_bridge.viewer.records import (
    TURN_TEXT_LIMIT,
    clip_middle,
    clip_turns,
    display_json,
    prompt_text,
    record_kind,
    stored_advantage,
    turns,
)
from gym_bridge.viewer.run_dir import CURVES, MetricsTail, list_sample_files
from gym_bridge.viewer.tokens import Tokenizer, load_tokenizer, token_segments

__all__ = ["Viewer", "build_app"]

HERE = Path(__file__).parent
PAGE_SIZE = 100
TOKEN_COOKIE = "gym_bridge_view_token"
RAW_INLINE_LIMIT = 200_000
GROUP_SHOWN = 64  # rollouts of one task shown side by side (a group larger than this is cut, and says so)
MAX_ADVANTAGE_GROUP = 2048  # compute_advantages builds a (b, b) matrix: beyond this, no advantages
SORT_KEYS = ("task", "env", "n", "reward", "pass1", "passk", "majority", "failures", "tokens")
COLUMN_TEXT_LIMIT = 300_000  # characters of one rollout's turns together
FIELD_TEXT_LIMIT = 2_000  # an extracted answer or failure reason in a column's header
TOKENS_SHOWN = 100_000  # token cells on one token page
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; style-src-attr 'unsafe-inline'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""Only the package's own script and stylesheet run (no inline script: a string a record smuggled past the
escaping would still not run), style attributes only for the computed colours, no framing (clickjacking)."""
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cross-origin-resource-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
}


@dataclass
class Viewer:
    """What one ``gym-bridge view`` serves: up to two rollout files, or a run directory."""

    files: dict[str, RolloutIndex] = field(default_factory=dict)
    run_dir: Path | None = None
    ranking: RankingFile | None = None
    tokenizer_spec: str | None = None
    _tokenizer: Tokenizer | None = None
    _metrics: MetricsTail | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def for_paths(cls, paths: list[Path], tokenizer: str | None = None) -> Viewer:
        """One or two files (``a``, ``b``), one run directory, or one ``eval ranked --groups-out`` file.
        Raises ValueError naming a bad path."""
        viewer = cls(tokenizer_spec=tokenizer)
        if len(paths) == 1 and paths[0].is_dir():
            viewer.run_dir = paths[0]
            viewer._metrics = MetricsTail(paths[0])
            return viewer
        if len(paths) == 1 and paths[0].is_file() and is_ranking_file(paths[0]):
            viewer.ranking = RankingFile.load(paths[0])
            return viewer
        if not 1 <= len(paths) <= 2:
            raise ValueError(f"give one or two rollout files, or one run directory (got {len(paths)} paths)")
        for fid, path in zip(("a", "b"), paths, strict=False):
            if path.is_dir():
                raise ValueError(f"{path}: a run directory can only be viewed alone")
            if not path.is_file():
                raise ValueError(f"{path}: no such file")
            viewer.files[fid] = RolloutIndex(path)
        return viewer

    def start(self) -> None:
        for index in self.files.values():
            index.start()

    def index(self, fid: str) -> RolloutIndex:
        """A loaded file, or a step's sample file of the run (indexed on first use); indexed again when it
        was rewritten or replaced since (its numbers, and in place its offsets, would be another file's)."""
        index = self.files.get(fid)
        if index is not None and index.ready and (index.change() or ("",))[0] in ("rewritten", "replaced"):
            with self._lock:
                if self.files.get(fid) is index:
                    fresh = RolloutIndex(index.path, name=index.name)
                    if fid.startswith("step_"):
                        fresh.build()
                    else:
                        fresh.start()
                    self.files[fid] = fresh  # the old one stays open: a request may still be reading it
                index = self.files[fid]
        if index is None and self.run_dir is not None and fid.startswith("step_"):
            with self._lock:
                index = self.files.get(fid)
                if index is None:
                    for step, path in list_sample_files(self.run_dir):
                        if f"step_{step:06d}" == fid:
                            index = self.files[fid] = RolloutIndex(path, name=f"step {step}").build()
                            break
        if index is None:
            raise HTTPException(404, f"no file {fid!r} in this viewer")
        return index

    def tokenizer(self) -> Tokenizer | None:
        if self.tokenizer_spec is None:
            return None
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = load_tokenizer(self.tokenizer_spec)
        return self._tokenizer


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _clip(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


@functools.cache
def _templates() -> Jinja2Templates:
    """The page templates, compiled once per process (every app shares them)."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["fmt"] = _fmt
    templates.env.filters["clip"] = _clip
    return templates


def build_app(viewer: Viewer, *, token: str | None = None, allowed_hosts: Iterable[str] = ()) -> FastAPI:
    """The app over ``viewer`` (call ``viewer.start()`` to index its files in the background);
    ``allowed_hosts``: ``Host`` names it answers besides IP addresses, ``localhost`` and this machine's name
    (others get 421: a page re-pointing its own name at this machine must not read rollouts)."""
    app = FastAPI(title="gym-bridge view", docs_url=None, redoc_url=None, openapi_url=None)
    templates = _templates()
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    expected = f"Bearer {token}" if token else None

    @app.middleware("http")
    async def bearer_auth(request: Request, call_next: Any) -> Response:
        if expected is None or request.url.path == "/health":
            return await call_next(request)
        given = request.query_params.get("token")
        if given is not None and hmac.compare_digest(given.encode(), token.encode()):  # type: ignore[union-attr]
            params = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            path = "/" + request.url.path.lstrip("/\\")  # "//host/..." would send the browser to that host
            target = path + (f"?{urlencode(params)}" if params else "")
            answer = RedirectResponse(target, status_code=303)
            answer.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")  # type: ignore[arg-type]
            return answer
        header = request.headers.get("authorization", "")
        cookie = request.cookies.get(TOKEN_COOKIE, "")
        if hmac.compare_digest(header.encode(), expected.encode()) or hmac.compare_digest(
            cookie.encode(), token.encode()  # type: ignore[union-attr]
        ):
            return await call_next(request)
        return JSONResponse({"detail": "missing or wrong bearer token (open the URL with ?token=...)"}, 401)

    @app.middleware("http")  # after the Host check, before the token
    async def browser_guard(request: Request, call_next: Any) -> Response:
        refused = cross_site_refusal(request.method, request.headers)
        answer = JSONResponse({"detail": refused}, 403) if refused else await call_next(request)
        answer.headers.update(SECURITY_HEADERS)
        return answer

    guard = RequestGuard(allowed_hosts)

    @app.middleware("http")  # added last, so it runs first
    async def host_check(request: Request, call_next: Any) -> Response:
        refused = guard.refusal(request.scope)
        if refused is not None:
            return JSONResponse({"detail": refused[1]}, refused[0])
        return await call_next(request)

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("files", viewer.files)
        context.setdefault("changes", [c[1] for ix in list(viewer.files.values()) if ix.ready and (c := ix.change())])
        context.setdefault("run_dir", viewer.run_dir)
        context.setdefault("ranking_file", viewer.ranking)
        return templates.TemplateResponse(request, name, context, status_code=status)

    def ready_or_progress(request: Request, index: RolloutIndex) -> HTMLResponse | None:
        if index.error:
            return page(request, "error.html", 500, message=f"could not read {index.error}")
        if not index.ready:
            return page(request, "progress.html", index=index)
        return None

    if viewer.ranking is not None:
        add_ranking_routes(app, viewer.ranking, page)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "files": {fid: ix.ready for fid, ix in viewer.files.items()}}

    @app.get("/")
    def root() -> RedirectResponse:
        if viewer.run_dir is not None:
            return RedirectResponse("/run", 303)
        if viewer.ranking is not None:
            return RedirectResponse("/ranked", 303)
        return RedirectResponse("/f/a", 303)

    @app.get("/f/{fid}", response_class=HTMLResponse)
    def overview(
        request: Request,
        fid: str,
        sort: Literal[SORT_KEYS] = "task",  # type: ignore[valid-type]
        order: Literal["asc", "desc"] = "asc",
        min_reward: str = Query("", description="lowest task mean reward shown"),
        max_reward: str = Query("", description="highest task mean reward shown"),
        failure: str = "",
        env: str = "",
        q: str = Query("", max_length=500),
        page_no: int = Query(1, alias="page", ge=1),
    ) -> HTMLResponse:
        index = viewer.index(fid)
        waiting = ready_or_progress(request, index)
        if waiting is not None:
            return waiting
        low, high = _number("min_reward", min_reward), _number("max_reward", max_reward)
        tids: list[int] = list(range(index.num_tasks))
        if low is not None:
            tids = [t for t in tids if index.task_mean_reward[t] >= low]
        if high is not None:
            tids = [t for t in tids if index.task_mean_reward[t] <= high]
        if failure:
            if failure not in index.failure_kinds:
                raise HTTPException(422, f"failure: no rollout has failure_kind {failure!r}")
            code = index.failure_kinds.index(failure)
            with_kind = {index.task_of[r] for r, c in enumerate(index.failure_codes) if c == code}
            tids = [t for t in tids if t in with_kind]
        if env:
            if env not in index.envs:
                raise HTTPException(422, f"env: no task has environment {env!r}")
            code = index.envs.index(env)
            tids = [t for t in tids if index.task_env[t] == code]
        if q.strip():
            hits = index.search(q)
            tids = [t for t in tids if t in hits]
        keys = {
            "task": lambda t: (index.task_index[t], t),
            "env": lambda t: (index.envs[index.task_env[t]] if index.task_env[t] >= 0 else "", t),
            "n": lambda t: index.task_n[t],
            "reward": lambda t: index.task_mean_reward[t],
            "pass1": lambda t: index.task_pass_1[t],
            "passk": lambda t: index.task_pass_k[t],
            "majority": lambda t: -1.0 if index.majority(t) is None else index.majority(t),
            "failures": lambda t: index.task_failed[t],
            "tokens": lambda t: index.task_out_tokens[t],
        }
        tids.sort(key=keys[sort], reverse=order == "desc")
        pages = max(1, math.ceil(len(tids) / PAGE_SIZE))
        page_no = min(page_no, pages)
        shown = tids[(page_no - 1) * PAGE_SIZE : page_no * PAGE_SIZE]
        rows = []
        for t in shown:
            first = index.read(index.task_records(t)[0])
            rows.append((index.task_row(t), prompt_text(first, _decoder(viewer))))
        params = {"min_reward": min_reward, "max_reward": max_reward, "failure": failure, "env": env, "q": q}
        base = {k: v for k, v in params.items() if v not in (None, "")}

        def link(**change: Any) -> str:
            merged = {**base, "sort": sort, "order": order, **change}
            return f"/f/{fid}?" + urlencode({k: v for k, v in merged.items() if v not in (None, "")})

        return page(
            request,
            "overview.html",
            fid=fid,
            index=index,
            summary=index.summary(),
            rows=rows,
            matched=len(tids),
            page_no=page_no,
            pages=pages,
            sort=sort,
            order=order,
            params=params,
            link=link,
            sort_keys=SORT_KEYS,
        )

    @app.get("/f/{fid}/task/{tid}", response_class=HTMLResponse)
    def group(request: Request, fid: str, tid: int) -> HTMLResponse:
        index = viewer.index(fid)
        waiting = ready_or_progress(request, index)
        if waiting is not None:
            return waiting
        if not 0 <= tid < index.num_tasks:
            raise HTTPException(404, f"tid: no task {tid} in {index.name} (it has {index.num_tasks})")
        all_rids = index.task_records(tid)
        rids = all_rids[:GROUP_SHOWN]
        records = [index.read(r) for r in rids]
        computed = None
        if len(all_rids) <= MAX_ADVANTAGE_GROUP:
            computed = group_advantages([index.rewards[r] for r in all_rids])
        decode = _decoder(viewer)
        columns = []
        for i, (rid, rec) in enumerate(zip(rids, records, strict=True)):
            # a line longer than the limit is longer indented too: not dumped only to be dropped
            raw = display_json(rec, indent=2) if index.lengths[rid] <= RAW_INLINE_LIMIT else ""
            columns.append(
                {
                    "rid": rid,
                    "lineno": index.linenos[rid],
                    "reward": index.rewards[rid],
                    "advantage": computed[i] if computed is not None else None,
                    "stored_advantage": stored_advantage(rec),
                    "extracted_answer": _short(rec.get("extracted_answer")),
                    "failure_kind": index.failure_kind(rid),
                    "failure_reason": _short(rec.get("failure_reason")),
                    "output_tokens": index.output_tokens[rid],
                    "turns": clip_turns(turns(rec, decode), TURN_TEXT_LIMIT, COLUMN_TEXT_LIMIT),
                    "has_tokens": bool(token_segments(rec, max_cells=1)),
                    "raw": raw if raw and len(raw) <= RAW_INLINE_LIMIT else None,
                }
            )
        return page(
            request,
            "group.html",
            fid=fid,
            index=index,
            task=index.task_row(tid),
            prompt=clip_middle(prompt_text(records[0], decode), TURN_TEXT_LIMIT),
            kind=record_kind(records[0]),
            columns=columns,
            torch_missing=computed is None and len(all_rids) <= MAX_ADVANTAGE_GROUP,
            too_big=len(all_rids) > MAX_ADVANTAGE_GROUP,
            hidden=len(all_rids) - len(rids),
            settings=ADVANTAGE_SETTINGS,
        )

    def _record(fid: str, rid: int) -> tuple[RolloutIndex, dict[str, Any]]:
        index = viewer.index(fid)
        if not index.ready:
            raise HTTPException(409, f"{index.name} is still being indexed")
        if not 0 <= rid < index.num_records:
            raise HTTPException(404, f"rid: no rollout {rid} in {index.name} (it has {index.num_records})")
        return index, index.read(rid)

    @app.get("/f/{fid}/rollout/{rid}.json")
    def raw_record(fid: str, rid: int) -> Response:
        index, _ = _record(fid, rid)
        return Response(index.raw(rid), media_type="application/json")

    @app.get("/f/{fid}/rollout/{rid}/tokens", response_class=HTMLResponse)
    def token_view(request: Request, fid: str, rid: int) -> HTMLResponse:
        index, rec = _record(fid, rid)
        try:
            tokenizer = viewer.tokenizer()
        except ValueError as err:
            raise HTTPException(422, str(err)) from None
        segments = token_segments(rec, tokenizer, max_cells=TOKENS_SHOWN)
        return page(
            request,
            "tokens.html",
            fid=fid,
            index=index,
            rid=rid,
            tid=index.task_of[rid],
            reward=index.rewards[rid],
            segments=segments,
            tokenizer=tokenizer,
            limit=TOKENS_SHOWN,
        )

    @app.get("/compare", response_class=HTMLResponse)
    def compare(
        request: Request,
        sort: Literal["change", "delta", "a", "b"] = "change",
        only: Literal["all", "flipped", "improved", "regressed"] = "all",
    ) -> HTMLResponse:
        if "a" not in viewer.files or "b" not in viewer.files:
            raise HTTPException(404, "compare needs two rollout files: gym-bridge view A.jsonl B.jsonl")
        a, b = viewer.index("a"), viewer.index("b")
        for index in (a, b):
            waiting = ready_or_progress(request, index)
            if waiting is not None:
                return waiting
        rows, counts = compare_runs(a, b)
        if only == "flipped":
            rows = [r for r in rows if r.flip]
        elif only == "improved":
            rows = [r for r in rows if r.delta > 0]
        elif only == "regressed":
            rows = [r for r in rows if r.delta < 0]
        sorters = {
            "change": lambda r: (-abs(r.delta), r.tid_a),
            "delta": lambda r: (r.delta, r.tid_a),
            "a": lambda r: (r.reward_a, r.tid_a),
            "b": lambda r: (r.reward_b, r.tid_a),
        }
        rows.sort(key=sorters[sort])
        shown = [(r, prompt_text(a.read(a.task_records(r.tid_a)[0]), _decoder(viewer))) for r in rows[:500]]
        return page(request, "compare.html", a=a, b=b, rows=shown, total=len(rows), counts=counts, sort=sort, only=only)

    @app.get("/run", response_class=HTMLResponse)
    def run(request: Request) -> HTMLResponse:
        if viewer.run_dir is None or viewer._metrics is None:
            raise HTTPException(404, "not viewing a training run: gym-bridge view LOG_DIR")
        viewer._metrics.poll()
        steps = [(step, f"step_{step:06d}") for step, _ in list_sample_files(viewer.run_dir)]
        return page(request, "run.html", steps=steps, curves=CURVES, metrics=viewer._metrics)

    @app.get("/api/run/metrics")
    def run_metrics(after: int = Query(0, ge=0)) -> dict[str, Any]:
        if viewer.run_dir is None or viewer._metrics is None:
            raise HTTPException(404, "not viewing a training run")
        records = viewer._metrics.since(after)
        steps = [step for step, _ in list_sample_files(viewer.run_dir)]
        return {"records": records, "next": after + len(records), "bad_lines": viewer._metrics.bad_lines,
                "sample_steps": steps}

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'request'}: {e.get('msg', 'invalid')}" for e in exc.errors()
        )
        return await http_error(request, HTTPException(422, detail))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        if request.url.path.startswith("/api/") or request.url.path.endswith(".json"):
            return JSONResponse({"detail": exc.detail}, exc.status_code)
        return page(request, "error.html", exc.status_code, message=exc.detail)

    return app


def cross_site_refusal(method: str, headers: Any) -> str | None:
    """Why a browser request another site's page made is refused (403), or None to answer it.

    Without ``--token`` any page the user opens can make the browser request ``http://127.0.0.1:PORT``:
    it cannot read the answer, but it can make the viewer scan the whole file (``?q=``) again and again
    and time the answers (whether a rollout holds a string), or frame a page. Browsers say where a
    request comes from (``Sec-Fetch-Site``); answered: the viewer's own pages (``same-origin``), what the
    user typed or bookmarked (``none``), a link followed to a page (a top-level ``GET`` navigation), and
    clients that send no such header (curl, httpx, older browsers)."""
    site = headers.get("sec-fetch-site")
    if site is None or site in ("same-origin", "none"):
        return None
    mode, dest = headers.get("sec-fetch-mode"), headers.get("sec-fetch-dest")
    if method in ("GET", "HEAD") and mode == "navigate" and dest in (None, "document"):
        return None
    return (f"a request made by another site's page (Sec-Fetch-Site {site!r}, Sec-Fetch-Dest {dest!r}) is refused: "
            "the viewer answers its own pages and links followed to them")


def _short(value: Any) -> str | None:
    """A header field of a column (extracted answer, failure reason) as text of bounded length."""
    if value is None:
        return None
    return clip_middle(value if isinstance(value, str) else display_json(value), FIELD_TEXT_LIMIT)


def _number(name: str, text: str) -> float | None:
    """A float query parameter that may be left empty (a form's blank field); 422 naming it otherwise."""
    if not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        raise HTTPException(422, f"{name}: {text!r} is not a number") from None
    if math.isnan(value):
        raise HTTPException(422, f"{name}: NaN is not a bound")
    return value


def _decoder(viewer: Viewer) -> Any:
    try:
        tokenizer = viewer.tokenizer()
    except ValueError:
        return None
    return tokenizer.decode if tokenizer is not None else None
