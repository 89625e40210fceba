"""Chat-template renderings remembered by conversation: GRPO asks for every prompt many times.

Why: rendering a conversation (the Jinja chat template, then the tokenizer) is the largest single cost
of a policy-server request on CPU, about a quarter of it, and a GRPO step sends each prompt
``num_generations_per_prompt`` times (validation sends the same prompts at every evaluation). The key is
the exact conversation (messages, tools, generation prompt) as JSON, so only identical inputs share a
rendering. Templates that read the clock (``strftime_now``, as Llama 3's writes today's date) are never
cached.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["RenderCache"]


class RenderCache:
    """``render(messages, tools, add_generation_prompt, param) -> token ids`` with an LRU of ``size``.

    ``render`` is the uncached rendering; ``param`` only names the request field in its errors, which
    pass through (nothing is stored for them). Each call returns a fresh list (callers may change it).
    """

    def __init__(
        self,
        render: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, bool, str], list[int]],
        chat_template: Any = None,
        size: int = 4096,
    ) -> None:
        self._render = render
        self.size = 0 if "strftime" in str(chat_template or "") else size
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()  # large prompts are rendered on the tokenizer thread
        self.hits = 0
        self.misses = 0

    def __call__(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool = True,
        param: str = "messages",
    ) -> list[int]:
        key = self._key(messages, tools, add_generation_prompt) if self.size else None
        if key is not None:
            with self._lock:
                cached = self._cache.get(key)
                if cached is not None:
                    self._cache.move_to_end(key)
                    self.hits += 1
                    return list(cached)
        self.misses += 1
        ids = self._render(messages, tools, add_generation_prompt, param)
        if key is not None:
            with self._lock:
                self._cache[key] = tuple(ids)
                if len(self._cache) > self.size:
                    self._cache.popitem(last=False)
        return ids

    @staticmethod
    def _key(messages: Any, tools: Any, add_generation_prompt: bool) -> str | None:
        try:
            return json.dumps([messages, tools, add_generation_prompt], ensure_ascii=False)
        except (TypeError, ValueError):  # something JSON cannot hold exactly: render it every time
            return None
