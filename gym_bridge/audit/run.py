"""Play the catalogue against a server: controls first, then every attack through the agent loop, then
the raw requests; collect findings per attack class."""

from __future__ import annotations

import asyncio
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from gym_bridge.audit.attacks import ATTACK_CLASSES, Attack, AuditOptions, Finding, Outcome, RawAttack
from gym_bridge.audit.envs import ENVS, catalogue
from gym_bridge.audit.scripted_model import scripted_model
from gym_bridge.rollout.agent import AgentConfig, Rollout, make_session, run_rollout
from gym_bridge.serving.in_process import InProcessClient
from gym_bridge.serving.retry import RetryPolicy, RoutedClient

__all__ = ["AuditError", "AuditReport", "run_audit"]

_STATUS = re.compile(r"answered HTTP (\d{3})")


class AuditError(Exception):
    """The audit could not run (server unreachable, a control the server does not pay): nothing was checked."""


@dataclass
class AuditReport:
    url: str
    env: str
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return [f for o in self.outcomes for f in o.findings]

    def by_class(self) -> dict[str, tuple[int, int]]:
        """Attack class -> (attacks run, findings)."""
        table = {name: [0, 0] for name in ATTACK_CLASSES}
        for o in self.outcomes:
            if o.skipped is None:
                table[o.attack_class][0] += 1
                table[o.attack_class][1] += len(o.findings)
        return {k: (v[0], v[1]) for k, v in table.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "env": self.env,
            "by_class": {k: {"attacks": a, "findings": f} for k, (a, f) in self.by_class().items()},
            "findings": [f.__dict__ for f in self.findings],
            "outcomes": [
                {k: v for k, v in o.__dict__.items() if k != "findings"} | {"findings": len(o.findings)}
                for o in self.outcomes
            ],
        }


def _shmem_mb() -> float:
    """This machine's shared memory in use (``Shmem`` of /proc/meminfo), in MB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) / 1024
    return 0.0


def is_local(url: str) -> bool:
    """Whether the server runs on this machine (marker files can then be looked for)."""
    host = urlsplit(url).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


class _Runner:
    def __init__(self, url: str, stall_s: float, headers: dict[str, str], local: bool) -> None:
        self.url = url.rstrip("/")
        self.stall_s = stall_s
        self.headers = headers
        self.local = local
        self.in_process = InProcessClient()
        self.session = make_session(max_connections=64)
        self._models = 0
        self.policy = RetryPolicy(max_attempts=1, request_timeout=stall_s * 2, total_timeout=stall_s * 2 + 5)

    async def aclose(self) -> None:
        await self.in_process.aclose()
        await self.session.close()

    async def rollout(self, attack: Attack) -> tuple[Rollout, float]:
        self._models += 1
        model_url = await self.in_process.mount(f"audit-model-{self._models}", scripted_model(attack.turns))
        client = RoutedClient(self.session, {model_url: self.in_process})
        config = AgentConfig(
            model_url=model_url,
            max_steps=len(attack.turns),
            model_retry=self.policy,
            env_retry=self.policy,
            env_headers=self.headers,
        )
        started = time.perf_counter()
        result = await run_rollout(client, attack.row, self.url, config)
        return result, time.perf_counter() - started

    def judge(self, attack: Attack, result: Rollout, seconds: float) -> Outcome:
        """The findings of one finished rollout."""
        outcome = Outcome(attack.name, attack.attack_class, seconds=round(seconds, 3))

        def found(cls: str, observed: str) -> None:
            outcome.findings.append(Finding(attack.name, cls, attack.what, observed))

        if result.record is None:
            failure = result.failure
            assert failure is not None
            status = _STATUS.search(failure.message)
            if status and status.group(1).startswith("5"):
                found("crash", f"HTTP {status.group(1)} at {failure.stage}: {failure.message[:200]}")
            elif failure.failure_class.endswith("_timeout"):
                found("stall", f"no answer at {failure.stage} within {self.policy.request_timeout:.0f} s")
            elif failure.failure_class.endswith("_connection_error"):
                found("crash", f"connection lost at {failure.stage}: {failure.message[:200]}")
            elif attack.min_reward > 0:
                found(attack.attack_class, f"the honest answer failed: {failure.message[:200]}")
            else:
                outcome.note = f"refused ({failure.failure_class}): {failure.message[:160]}"
        else:
            reward = result.record.get("reward")
            outcome.reward = reward if isinstance(reward, (int, float)) else None
            if (
                not isinstance(reward, (int, float))
                or isinstance(reward, bool)
                or not math.isfinite(reward)
                or (not 0.0 <= reward <= 1.0)
            ):
                found("wrong-reward", f"reward {reward!r} is not a finite number in [0, 1]")
            elif reward < attack.min_reward:
                found(attack.attack_class, f"the honest answer scored {reward}")
            elif reward > attack.max_reward:
                found("wrong-reward", f"scored {reward} (at most {attack.max_reward} expected)")
        if seconds > self.stall_s:
            found("stall", f"took {seconds:.1f} s (stall bound {self.stall_s:.0f} s)")
        if self.local:
            for path in attack.markers:
                if os.path.exists(path):
                    found("escape/leak", f"the answer created {path} on the server's machine")
                    try:
                        os.remove(path)
                    except OSError:
                        pass
        return outcome

    async def play(self, attack: Attack) -> list[Outcome]:
        if attack.concurrent > 1:
            return await self._under_load(attack)
        shmem_before = _shmem_mb() if self.local and attack.host_shmem_growth_mb is not None else None
        result, seconds = await self.rollout(attack)
        outcomes = [self.judge(attack, result, seconds)]
        if shmem_before is not None and attack.host_shmem_growth_mb is not None:
            grown = _shmem_mb() - shmem_before
            if grown > attack.host_shmem_growth_mb:
                outcomes[0].findings.append(
                    Finding(
                        attack.name,
                        "escape/leak",
                        attack.what,
                        f"host shared memory grew {grown:.0f} MB and stayed",
                    )
                )
        for innocent in attack.then:
            follow, seconds = await self.rollout(innocent)
            for f in self.judge(
                innocent, follow, seconds
            ).findings:  # the attack changed a later answer's reward
                outcomes[0].findings.append(
                    Finding(
                        attack.name, "escape/leak", attack.what, f"afterwards, {innocent.what}: {f.observed}"
                    )
                )
        return outcomes

    async def _under_load(self, attack: Attack) -> list[Outcome]:
        """``concurrent`` copies of the attack in flight; meanwhile the plain follow-up, timed one by one."""
        load = [asyncio.ensure_future(self.rollout(attack)) for _ in range(attack.concurrent)]
        await asyncio.sleep(0.2)
        assert attack.then, "a load attack needs a plain follow-up to time"
        plain = attack.then[0]
        latencies = []
        while not all(t.done() for t in load) and len(latencies) < 200:
            result, seconds = await self.rollout(plain)
            latencies.append(seconds)
            if result.record is None or result.record.get("reward") != 1.0:
                break
        results = await asyncio.gather(*load)
        outcome = self.judge(attack, *results[0])
        for extra in results[1:]:
            outcome.findings.extend(
                f for f in self.judge(attack, *extra).findings if f.attack_class != "stall"
            )
        worst = max(latencies) if latencies else 0.0
        outcome.note = f"plain answer under load: {len(latencies)} timed, worst {worst:.2f} s"
        bound = attack.plain_bound_s
        if worst > bound:
            outcome.findings.append(
                Finding(
                    attack.name, "stall", attack.what, f"a plain answer took {worst:.2f} s (bound {bound} s)"
                )
            )
        return [outcome]

    async def raw(self, attack: RawAttack, control: Attack | None) -> Outcome:
        outcome = Outcome(attack.name, attack.attack_class)
        headers = {**self.headers, **attack.headers}
        async with httpx.AsyncClient(timeout=self.stall_s * 2) as client:
            if attack.needs_session and control is not None:
                seeded = await client.post(f"{self.url}/seed_session", json=control.row, headers=self.headers)
                cookie = "; ".join(f"{k}={v}" for k, v in seeded.cookies.items())
                if cookie:
                    headers["cookie"] = cookie
            started = time.perf_counter()
            try:
                answer = await client.post(
                    f"{self.url}{attack.path}", content=attack.content, headers=headers
                )
            except httpx.TimeoutException:
                outcome.findings.append(Finding(attack.name, "stall", attack.what, "no answer"))
                return outcome
            except httpx.TransportError as e:
                outcome.findings.append(Finding(attack.name, "crash", attack.what, f"connection lost: {e}"))
                return outcome
            outcome.seconds = round(time.perf_counter() - started, 3)
        if answer.status_code >= 500:
            outcome.findings.append(
                Finding(
                    attack.name, "crash", attack.what, f"HTTP {answer.status_code}: {answer.text[:160]!r}"
                )
            )
        elif (problem := attack.check(answer.status_code, answer.content)) is not None:
            outcome.findings.append(Finding(attack.name, attack.attack_class, attack.what, problem))
        else:
            outcome.note = f"HTTP {answer.status_code}"
        return outcome


async def run_audit(
    url: str,
    env: str,
    *,
    stall_s: float = 30.0,
    options: AuditOptions | None = None,
    headers: dict[str, str] | None = None,
    local: bool | None = None,
    only: set[str] | None = None,
    progress: Callable[[Outcome], None] | None = None,
) -> AuditReport:
    """Run ``env``'s catalogue against the server at ``url``.

    ``options``: what the catalogue needs to know of the server (see :class:`AuditOptions`). ``only``:
    attack names to run (the controls always run). Raises :class:`AuditError` when the server cannot be
    audited with the built-in probes.
    """
    if env not in ENVS:
        raise AuditError(f"--env must be one of {', '.join(ENVS)}; got {env!r}")
    attacks, raws = catalogue(env, options)
    report = AuditReport(url, env)
    runner = _Runner(url, stall_s, dict(headers or {}), is_local(url) if local is None else local)
    try:
        controls = [a for a in attacks if a.control]
        for control in controls:
            result, seconds = await runner.rollout(control)
            outcome = runner.judge(control, result, seconds)
            if outcome.findings:
                raise AuditError(
                    f"the control '{control.name}' ({control.what}) did not score 1 at {url}: "
                    f"{outcome.findings[0].observed}. The built-in probe rows do not fit this server, or it is "
                    "not the env named by --env; nothing was audited."
                )
        for attack in attacks:
            if attack.control or (only is not None and attack.name not in only):
                continue
            for outcome in await runner.play(attack):
                report.outcomes.append(outcome)
                if progress is not None:
                    progress(outcome)
        for raw in raws:
            if only is not None and raw.name not in only:
                continue
            outcome = await runner.raw(raw, controls[0] if controls else None)
            report.outcomes.append(outcome)
            if progress is not None:
                progress(outcome)
    except (httpx.ConnectError, OSError) as e:
        raise AuditError(f"cannot reach {url}: {e}") from None
    finally:
        await runner.aclose()
    return report
