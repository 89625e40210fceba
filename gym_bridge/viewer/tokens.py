"""Per-token views of a rollout: each generated token with its log-probability, and a tokenizer to read them.

Where the ids come from: NeMo Gym rollouts carry ``generation_token_ids`` / ``generation_log_probs`` (and
``prompt_token_ids``) on their output items, one segment per model turn; NeMo RL's ``train_data_step``
lines carry the whole sequence (``token_ids``) with ``token_loss_mask`` (1 = generated),
``generation_logprobs`` (the sampler's) and ``prev_logprobs`` (the trainer's), so there the
generation/trainer mismatch ``|generation - trainer|`` is shown too.

Colours: the probability ``exp(logprob)`` from red (0) to green (1); the mismatch from green (0) to red
(>= 1 nat). Without a tokenizer a token is shown as its id.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from gym_bridge.viewer.records import record_kind

__all__ = ["TokenCell", "TokenSegment", "Tokenizer", "load_tokenizer", "token_segments"]


@dataclass
class TokenCell:
    token_id: int
    text: str
    generated: bool
    logprob: float | None = None
    trainer_logprob: float | None = None

    @property
    def prob(self) -> float | None:
        if self.logprob is None:
            return None
        return math.exp(self.logprob) if self.logprob < 709.0 else math.inf  # a log-prob > 0 is shown, not raised

    @property
    def mismatch(self) -> float | None:
        if self.logprob is None or self.trainer_logprob is None:
            return None
        return abs(self.logprob - self.trainer_logprob)

    @property
    def prob_colour(self) -> str:
        p = self.prob
        return "transparent" if p is None else f"hsl({120 * max(0.0, min(1.0, p)):.0f},75%,78%)"

    @property
    def mismatch_colour(self) -> str:
        m = self.mismatch
        return "transparent" if m is None else f"hsl({120 * (1 - min(1.0, m)):.0f},75%,78%)"


@dataclass
class TokenSegment:
    title: str
    cells: list[TokenCell]
    total: int = 0
    """Tokens the record has in this segment (more than ``cells`` when a page's limit cut it)."""

    @property
    def hidden(self) -> int:
        return max(self.total - len(self.cells), 0)

    @property
    def generated(self) -> int:
        return sum(c.generated for c in self.cells)

    @property
    def mean_logprob(self) -> float | None:
        values = [c.logprob for c in self.cells if c.generated and c.logprob is not None]
        return sum(values) / len(values) if values else None

    @property
    def has_mismatch(self) -> bool:
        return any(c.trainer_logprob is not None for c in self.cells)


class Tokenizer:
    """Decodes ids for the token view (one token at a time, and whole sequences), caching single tokens."""

    def __init__(self, hf_tokenizer: Any, name: str) -> None:
        self._tok = hf_tokenizer
        self.name = name
        self._cache: dict[int, str] = {}

    def token(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            try:
                text = self._tok.decode([token_id])
            except (ValueError, TypeError, OverflowError, IndexError):
                text = f"<{token_id}?>"
            if len(self._cache) < 200_000:
                self._cache[token_id] = text
        return text

    def decode(self, ids: list[int]) -> str:
        try:
            return self._tok.decode(ids)
        except (ValueError, TypeError, OverflowError, IndexError):
            return "".join(self.token(i) for i in ids)


def load_tokenizer(spec: str) -> Tokenizer:
    """``tiny`` (the embedded byte-level tokenizer, built locally) or a local tokenizer directory.

    Imports transformers here, not at start. Raises ValueError naming ``--tokenizer`` when it cannot load.
    """
    try:
        if spec == "tiny":
            from gym_bridge.models.tokenizer import build_tokenizer

            return Tokenizer(build_tokenizer(), "tiny")
        if not os.path.isdir(spec):
            raise ValueError(f"--tokenizer {spec!r}: not 'tiny' and not a directory")
        from transformers import AutoTokenizer

        return Tokenizer(AutoTokenizer.from_pretrained(spec, local_files_only=True), spec)
    except ImportError as err:
        raise ValueError(f"--tokenizer {spec!r} needs transformers (pip install 'gym-bridge[train]'): {err}") from None
    except OSError as err:
        raise ValueError(f"--tokenizer {spec!r}: {err}") from None


def _ints(value: Any) -> list[int]:
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool)] if isinstance(value, list) else []


def _floats(value: Any) -> list[float | None]:
    if not isinstance(value, list):
        return []
    return [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in value]


def _text(tokenizer: Tokenizer | None, token_id: int) -> str:
    return tokenizer.token(token_id) if tokenizer is not None else f"#{token_id}"


def token_segments(
    rec: dict[str, Any], tokenizer: Tokenizer | None = None, max_cells: int | None = None
) -> list[TokenSegment]:
    """The record's generated tokens (NeMo RL lines: the whole sequence, prompt greyed), per model turn;
    at most ``max_cells`` cells in all (a segment past them is cut, and its ``hidden`` says how many)."""
    kind = record_kind(rec)
    segments: list[TokenSegment] = []
    room = max_cells if max_cells is not None else math.inf
    if kind == "nemo_gym":
        output = (rec.get("response") or {}).get("output") if isinstance(rec.get("response"), dict) else None
        for turn, item in enumerate(output if isinstance(output, list) else []):
            if not isinstance(item, dict):
                continue
            ids = _ints(item.get("generation_token_ids"))
            if not ids:
                continue
            lps = _floats(item.get("generation_log_probs"))
            shown = ids[: int(min(room, len(ids)))]
            room -= len(shown)
            cells = [
                TokenCell(t, _text(tokenizer, t), True, lps[i] if i < len(lps) else None) for i, t in enumerate(shown)
            ]
            prompt = len(_ints(item.get("prompt_token_ids")))
            title = f"output item {turn} ({item.get('type', '?')}): {len(ids)} generated tokens after a {prompt}-token prompt"
            segments.append(TokenSegment(title, cells, len(ids)))
    elif kind == "nemo_rl_tokens":
        ids = _ints(rec.get("token_ids"))
        mask = rec.get("token_loss_mask") if isinstance(rec.get("token_loss_mask"), list) else [1] * len(ids)
        gen = _floats(rec.get("generation_logprobs"))
        prev = _floats(rec.get("prev_logprobs"))
        cells = []
        for i, t in enumerate(ids[: int(min(room, len(ids)))]):
            generated = bool(mask[i]) if i < len(mask) else False
            cells.append(
                TokenCell(
                    t,
                    _text(tokenizer, t),
                    generated,
                    gen[i] if generated and i < len(gen) else None,
                    prev[i] if generated and i < len(prev) else None,
                )
            )
        generated = sum(1 for m in mask[: len(ids)] if m)
        segments.append(TokenSegment(f"sequence: {len(ids)} tokens, {generated} generated", cells, len(ids)))
    return segments
