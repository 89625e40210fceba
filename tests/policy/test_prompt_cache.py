"""The policy server's chat-template cache: identical conversations render once, nothing else is shared."""

from __future__ import annotations

from typing import Any

import pytest

from gym_bridge.policy.prompt_cache import RenderCache

USER = [{"role": "user", "content": "What is 2 + 2?"}]
TOOLS = [{"type": "function", "function": {"name": "add"}}]


class Renderer:
    """A fake rendering that counts its calls and encodes its inputs into the ids."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, messages: Any, tools: Any, add_generation_prompt: bool, param: str) -> list[int]:
        self.calls += 1
        if messages and messages[-1]["content"] == "boom":
            raise ValueError(f"{param}: cannot render")
        return [len(messages), len(tools or []), int(add_generation_prompt), self.calls]


def test_identical_conversations_render_once_and_get_fresh_lists() -> None:
    render = Renderer()
    cache = RenderCache(render)
    first = cache(USER, None)
    first.append(99)  # a caller changing its list must not change the cached rendering
    second = cache([dict(m) for m in USER], None)
    assert second == [1, 0, 1, 1] and render.calls == 1 and cache.hits == 1


@pytest.mark.parametrize(
    ("messages", "tools", "add_generation_prompt"),
    [
        ([{"role": "user", "content": "What is 2 + 3?"}], None, True),
        (USER, TOOLS, True),
        (USER, None, False),
        ([{"content": "What is 2 + 2?", "role": "user"}], None, True),  # key order is part of the input
    ],
)
def test_any_difference_renders_anew(messages: Any, tools: Any, add_generation_prompt: bool) -> None:
    render = Renderer()
    cache = RenderCache(render)
    cache(USER, None, True)
    cache(messages, tools, add_generation_prompt)
    assert render.calls == 2


def test_errors_are_not_cached_and_name_the_field() -> None:
    render = Renderer()
    cache = RenderCache(render)
    for _ in range(2):
        with pytest.raises(ValueError, match="input: cannot render"):
            cache([{"role": "user", "content": "boom"}], None, param="input")
    assert render.calls == 2


def test_templates_that_read_the_clock_are_never_cached() -> None:
    render = Renderer()
    cache = RenderCache(render, chat_template="Today is {{ strftime_now('%d %b %Y') }}.")
    cache(USER, None)
    cache(USER, None)
    assert render.calls == 2 and cache.hits == 0


def test_the_cache_keeps_at_most_size_renderings() -> None:
    render = Renderer()
    cache = RenderCache(render, size=2)
    conversations = [[{"role": "user", "content": str(i)}] for i in range(3)]
    for conversation in conversations:
        cache(conversation, None)
    cache(conversations[0], None)  # pushed out by the third: rendered again
    cache(conversations[2], None)  # still there
    assert render.calls == 4 and cache.hits == 1
