"""The shared-prompt pass gives the plain pass's log-probs and gradients, and batches keep groups whole."""

from __future__ import annotations

import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gym_bridge.models.logprobs import token_logprobs  # noqa: E402
from gym_bridge.models.shared_prefix import (  # noqa: E402
    plan_prefixes,
    prefix_micro_batches,
    prompt_length,
    shared_prefix_logprobs,
    shares_prefixes,
)

PAD = 0


@pytest.fixture(scope="module")
def model() -> Any:
    from gym_bridge.models.tiny import TinyRecipe, new_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer

    recipe = TinyRecipe(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return new_tiny_model(build_tokenizer(), recipe, seed=3).float()


def grpo_batch(seed: int, prompts: int = 3, per_prompt: int = 4) -> tuple[list[list[int]], list[list[int]]]:
    """Rows of prompts of different lengths, each with completions of different lengths; one row is
    multi-turn (an untrained tool output between two trained turns)."""
    rng = random.Random(seed)
    token_ids: list[list[int]] = []
    loss_masks: list[list[int]] = []
    for _ in range(prompts):
        prompt = [rng.randrange(3, 300) for _ in range(rng.randint(4, 12))]
        for _ in range(per_prompt):
            completion = [rng.randrange(3, 300) for _ in range(rng.randint(1, 9))]
            token_ids.append(prompt + completion)
            loss_masks.append([0] * len(prompt) + [1] * len(completion))
    tool, turn = [rng.randrange(3, 300) for _ in range(3)], [rng.randrange(3, 300) for _ in range(2)]
    token_ids[1] = token_ids[1] + tool + turn
    loss_masks[1] = loss_masks[1] + [0] * len(tool) + [1] * len(turn)
    return token_ids, loss_masks


def padded(token_ids: list[list[int]], loss_masks: list[list[int]]) -> tuple[Any, Any, Any]:
    width = max(len(t) for t in token_ids)
    ids = torch.full((len(token_ids), width), PAD, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros((len(token_ids), width), dtype=torch.float32)
    for i, (tokens, m) in enumerate(zip(token_ids, loss_masks, strict=True)):
        ids[i, : len(tokens)] = torch.tensor(tokens)
        attention[i, : len(tokens)] = 1
        mask[i, : len(tokens)] = torch.tensor(m, dtype=torch.float32)
    return ids, attention, mask[:, 1:]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_log_probs_and_gradients_match_the_plain_pass(model: Any, seed: int) -> None:
    token_ids, loss_masks = grpo_batch(seed)
    ids, attention, token_mask = padded(token_ids, loss_masks)
    plan = plan_prefixes(token_ids, loss_masks)
    assert len(plan.prompts) == 3 and plan.repeats

    model.zero_grad()
    plain = token_logprobs(model, ids, attention, token_mask)
    (plain * torch.linspace(0.5, 1.5, plain.shape[1])).sum().backward()
    plain_grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    shared = shared_prefix_logprobs(model, token_ids, token_mask, plan, PAD)
    (shared * torch.linspace(0.5, 1.5, shared.shape[1])).sum().backward()
    shared_grads = [p.grad.clone() for p in model.parameters()]

    assert shared.shape == plain.shape
    assert torch.equal(shared != 0, token_mask.bool())  # same positions filled, nothing outside the mask
    torch.testing.assert_close(shared, plain, atol=2e-5, rtol=1e-5)
    for got, want in zip(shared_grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    # The prompt pass gets gradient from every row: the embedding rows of prompt tokens are touched.
    assert model.get_input_embeddings().weight.grad[token_ids[0][0]].abs().sum() > 0


def test_a_wrong_fan_out_is_caught(model: Any) -> None:
    """Guards the test above: routing rows to the wrong prompt changes the log-probs."""
    token_ids, loss_masks = grpo_batch(5)
    ids, attention, token_mask = padded(token_ids, loss_masks)
    plan = plan_prefixes(token_ids, loss_masks)
    with torch.no_grad():
        plain = token_logprobs(model, ids, attention, token_mask)
        plan.row_prompt = [(p + 1) % len(plan.prompts) for p in plan.row_prompt]
        wrong = shared_prefix_logprobs(model, token_ids, token_mask, plan, PAD)
    assert not torch.allclose(wrong, plain, atol=1e-3)


def test_prompt_length_stops_at_the_first_trained_token() -> None:
    assert prompt_length([5, 6, 7, 8], [0, 0, 1, 1]) == 2
    assert prompt_length([5, 6, 7, 8], [0, 0, 0, 0]) == 3  # nothing trained: one token left to predict
    assert prompt_length([5, 6, 7], [1, 1, 1]) == 1  # at least one prompt token
    assert prompt_length([5, 6, 7, 8, 9], [0, 1, 0, 0, 1]) == 1  # multi-turn: the first prompt only


def test_micro_batches_keep_a_prompt_s_rows_together() -> None:
    token_ids, loss_masks = grpo_batch(7, prompts=5, per_prompt=4)
    batches = prefix_micro_batches(token_ids, loss_masks, list(range(len(token_ids))), max_rows=8)
    assert sorted(i for b in batches for i in b) == list(range(20))
    assert all(len(b) <= 8 for b in batches)
    plan = plan_prefixes(token_ids, loss_masks)
    for b in batches:  # groups of 4 fit whole in batches of 8: no prompt is split
        for prompt in {plan.row_prompt[i] for i in b}:
            rows = [i for i, p in enumerate(plan.row_prompt) if p == prompt]
            assert set(rows) <= set(b)
    # A group larger than a micro-batch is split across micro-batches of at most max_rows.
    big = prefix_micro_batches(token_ids, loss_masks, list(range(len(token_ids))), max_rows=3)
    assert all(len(b) <= 3 for b in big) and sorted(i for b in big for i in b) == list(range(20))


def test_models_with_capped_logits_use_the_plain_pass(model: Any) -> None:
    assert shares_prefixes(model)
    model.config.final_logit_softcapping = 30.0
    try:
        assert not shares_prefixes(model)
    finally:
        model.config.final_logit_softcapping = None


@pytest.mark.parametrize("seed", [0, 1])
def test_prompts_with_a_common_start_match_the_plain_pass(model: Any, seed: int) -> None:
    """Distinct prompts behind one long common start (a system prompt and worked examples): the start
    runs once for all of them, and log-probs and gradients are still the plain pass's."""
    from gym_bridge.models.shared_prefix import MIN_COMMON_PREFIX, common_prefix_length

    token_ids, loss_masks = grpo_batch(seed)
    start = [random.Random(seed + 10).randrange(3, 300) for _ in range(MIN_COMMON_PREFIX + 4)]
    token_ids = [start + t for t in token_ids]
    loss_masks = [[0] * len(start) + m for m in loss_masks]
    ids, attention, token_mask = padded(token_ids, loss_masks)
    plan = plan_prefixes(token_ids, loss_masks)
    assert common_prefix_length(plan.prompts) >= len(start)

    model.zero_grad()
    plain = token_logprobs(model, ids, attention, token_mask)
    (plain * torch.linspace(0.5, 1.5, plain.shape[1])).sum().backward()
    plain_grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    shapes: list[tuple[int, ...]] = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda m, args, out: shapes.append(args[0].shape)
    )
    try:
        shared = shared_prefix_logprobs(model, token_ids, token_mask, plan, PAD)
    finally:
        hook.remove()
    (shared * torch.linspace(0.5, 1.5, shared.shape[1])).sum().backward()
    assert shapes[0][0] == 1 and shapes[0][1] >= len(start)  # the common start, once
    torch.testing.assert_close(shared, plain, atol=2e-5, rtol=1e-5)
    for got, want in zip((p.grad for p in model.parameters()), plain_grads, strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_a_common_start_run_once_for_several_micro_batches_gives_their_gradients(model: Any) -> None:
    """An optimizer step's micro-batches share one run of the prompts' common start (CommonStart):
    log-probs and summed gradients equal those of each micro-batch running the start itself, and the
    start goes through the model once instead of once per micro-batch."""
    from gym_bridge.models.shared_prefix import MIN_COMMON_PREFIX, common_start

    token_ids, loss_masks = grpo_batch(5, prompts=4, per_prompt=3)
    start = [random.Random(11).randrange(3, 300) for _ in range(MIN_COMMON_PREFIX + 6)]
    token_ids = [start + t for t in token_ids]
    loss_masks = [[0] * len(start) + m for m in loss_masks]
    batches = [list(range(0, 6)), list(range(6, 12))]  # two micro-batches of two prompts each
    plans, masks = [], []
    for rows in batches:
        plans.append(plan_prefixes([token_ids[i] for i in rows], [loss_masks[i] for i in rows]))
        masks.append(padded([token_ids[i] for i in rows], [loss_masks[i] for i in rows])[2])

    def step(shared_start: bool) -> tuple[list[Any], list[Any], list[tuple[int, ...]]]:
        model.zero_grad()
        shapes: list[tuple[int, ...]] = []
        hook = model.get_input_embeddings().register_forward_hook(lambda m, a, o: shapes.append(tuple(a[0].shape)))
        try:
            once = common_start(model, plans, torch.device("cpu")) if shared_start else None
            outs = []
            for rows, plan, mask in zip(batches, plans, masks, strict=True):
                got = shared_prefix_logprobs(model, [token_ids[i] for i in rows], mask, plan, PAD, start=once)
                (got * torch.linspace(0.5, 1.5, got.shape[1])).sum().backward()
                outs.append(got.detach())
            if once is not None:
                once.backward()
        finally:
            hook.remove()
        return outs, [p.grad.clone() for p in model.parameters()], shapes

    plain_outs, plain_grads, plain_shapes = step(False)
    outs, grads, shapes = step(True)
    assert [s for s in plain_shapes if s == (1, len(start))] == [(1, len(start))] * 2  # once per micro-batch
    assert [s for s in shapes if s == (1, len(start))] == [(1, len(start))]  # once for the step
    for got, want in zip(outs, plain_outs, strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    for got, want in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert any(float(g.abs().sum()) > 0 for g in grads)
