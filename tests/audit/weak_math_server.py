"""A deliberately weak math resources server, built the way a hurried environment author might: it reads
any body whatever its content type, answers any Host, evaluates the boxed answer with ``eval`` and compares
floats with a tolerance. ``gym-bridge audit`` must find each of these."""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import FastAPI, Request

_BOXED = re.compile(r"\\boxed\{(.*)\}", re.DOTALL)


def _last_text(body: dict[str, Any]) -> str:
    texts = []
    for item in body.get("response", {}).get("output", []):
        for part in item.get("content", []) if isinstance(item, dict) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
    return " ".join(texts)


def _as_python(latex: str) -> str:
    return latex.replace("^", "**").replace("{", "(").replace("}", ")").replace("\\cdot", "*")


def build_app() -> FastAPI:
    app = FastAPI()

    @app.post("/seed_session")
    async def seed_session(request: Request) -> dict[str, Any]:
        return {}

    @app.post("/verify")
    async def verify(request: Request) -> dict[str, Any]:
        body = json.loads(await request.body())  # whatever the content type says
        found = _BOXED.findall(_last_text(body))
        reward = 0.0
        if found:
            try:
                value = eval(_as_python(found[-1]))  # the weakness an answer can use
                reward = float(abs(float(value) - float(body["expected_answer"])) < 1e-6)
            except Exception:
                reward = 0.0
        return {**body, "reward": reward}

    return app
