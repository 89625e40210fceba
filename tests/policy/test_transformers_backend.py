"""TransformersBackend: exact log-probabilities, seeded rows independent of their batch, stopping rules."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gym_bridge.generation.backend import GenerationRequest, SamplingParams
from gym_bridge.generation.transformers_backend import TransformersBackend


@pytest.fixture(scope="module")
def backend(tiny_model, tokenizer) -> TransformersBackend:
    return TransformersBackend(tiny_model, tokenizer, model_name="tiny-test", seed=123)


def chat_prompt(tokenizer, text: str, system: str | None = None) -> list[int]:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": text})
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    )


def reference_logprobs(model, prompt: list[int], generated: list[int], temperature: float = 1.0) -> list[float]:
    """Log-probabilities of ``generated`` from one plain forward pass (no padding, no cache), of the
    distribution at ``temperature``."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(generated)]


def test_logprobs_match_a_plain_forward_pass(backend, tiny_model, tokenizer):
    prompts = [
        chat_prompt(tokenizer, "What is 2 + 3?"),
        chat_prompt(tokenizer, "A much longer question that makes this prompt longer", system="Be brief."),
        chat_prompt(tokenizer, "Hi"),
    ]
    requests = [
        GenerationRequest(p, SamplingParams(max_new_tokens=12, temperature=1.0, seed=i))
        for i, p in enumerate(prompts)
    ]
    results = backend.generate(requests)
    assert [r.prompt_token_ids for r in results] == prompts
    for result in results:
        assert 1 <= len(result.token_ids) <= 12
        assert len(result.logprobs) == len(result.token_ids)
        assert all(lp <= 0 for lp in result.logprobs)
        reference = reference_logprobs(tiny_model, result.prompt_token_ids, result.token_ids)
        assert result.logprobs == pytest.approx(reference, abs=1e-4)


def test_logprobs_are_of_the_unscaled_distribution(backend, tiny_model, tokenizer):
    prompt = chat_prompt(tokenizer, "What is 4 + 4?")
    (result,) = backend.generate(
        [GenerationRequest(prompt, SamplingParams(max_new_tokens=8, temperature=0.3, top_k=5, seed=1))]
    )
    assert result.logprobs == pytest.approx(
        reference_logprobs(tiny_model, prompt, result.token_ids), abs=1e-4
    )


def test_processed_logprobs_are_of_the_distribution_each_row_sampled_from(backend, tiny_model, tokenizer):
    """A trainer's backend (``logprobs_mode="processed"``): the same tokens as the raw mode (same seeds),
    log-probs of each row's temperature-scaled distribution; a greedy row's stay raw."""
    processed = TransformersBackend(tiny_model, tokenizer, seed=123, logprobs_mode="processed")
    prompt = chat_prompt(tokenizer, "What is 6 + 2?")
    requests = [
        GenerationRequest(prompt, SamplingParams(max_new_tokens=8, temperature=t, seed=5)) for t in (0.5, 1.7, 0.0)
    ]
    scaled, raw = processed.generate(requests), backend.generate(requests)
    for request, got, plain in zip(requests, scaled, raw, strict=True):
        assert got.token_ids == plain.token_ids
        temperature = request.params.temperature or 1.0
        want = reference_logprobs(tiny_model, prompt, got.token_ids, temperature)
        assert got.logprobs == pytest.approx(want, abs=1e-4)
    assert scaled[0].logprobs != pytest.approx(raw[0].logprobs, abs=1e-3)
    assert scaled[2].logprobs == pytest.approx(raw[2].logprobs, abs=1e-6)
    with pytest.raises(ValueError, match="logprobs_mode"):
        TransformersBackend(tiny_model, tokenizer, logprobs_mode="scaled")


def test_seeded_row_is_independent_of_its_batch(backend, tokenizer):
    prompt = chat_prompt(tokenizer, "What is 7 + 1?")
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=42)
    alone = backend.generate([GenerationRequest(prompt, params)])[0]
    neighbours = [
        GenerationRequest(
            chat_prompt(tokenizer, "Something else entirely, and longer than the others"),
            SamplingParams(max_new_tokens=3, seed=5),
        ),
        GenerationRequest(
            chat_prompt(tokenizer, "x"), SamplingParams(max_new_tokens=30, temperature=0.7, top_p=0.5, seed=9)
        ),
        GenerationRequest(chat_prompt(tokenizer, "y"), SamplingParams(max_new_tokens=30, temperature=0.0)),
    ]
    batched = backend.generate([neighbours[0], GenerationRequest(prompt, params), *neighbours[1:]])[1]
    assert batched.token_ids == alone.token_ids
    assert batched.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    other_seed = backend.generate([GenerationRequest(prompt, SamplingParams(max_new_tokens=16, seed=43))])[0]
    assert other_seed.token_ids != alone.token_ids


def test_unseeded_rows_differ_and_follow_the_backend_seed(tiny_model, tokenizer):
    prompt = chat_prompt(tokenizer, "What is 1 + 1?")
    requests = [GenerationRequest(prompt, SamplingParams(max_new_tokens=10)) for _ in range(4)]
    first = [r.token_ids for r in TransformersBackend(tiny_model, tokenizer, seed=7).generate(requests)]
    again = [r.token_ids for r in TransformersBackend(tiny_model, tokenizer, seed=7).generate(requests)]
    assert first == again
    assert len({tuple(t) for t in first}) > 1


def test_temperature_zero_is_greedy_and_deterministic(backend, tiny_model, tokenizer):
    prompt = chat_prompt(tokenizer, "What is 3 + 5?")
    runs = [
        backend.generate(
            [GenerationRequest(prompt, SamplingParams(max_new_tokens=10, temperature=0.0, seed=s))]
        )[0]
        for s in (1, 2)
    ]
    assert runs[0].token_ids == runs[1].token_ids
    ids = list(prompt)
    with torch.no_grad():
        for token in runs[0].token_ids:
            assert token == int(tiny_model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
    top_k_one = backend.generate(
        [GenerationRequest(prompt, SamplingParams(max_new_tokens=10, top_k=1, seed=3))]
    )[0]
    assert top_k_one.token_ids == runs[0].token_ids
    tiny_top_p = backend.generate(
        [GenerationRequest(prompt, SamplingParams(max_new_tokens=10, top_p=1e-6, seed=3))]
    )[0]
    assert tiny_top_p.token_ids == runs[0].token_ids


def test_max_new_tokens_and_finish_reason(backend, tokenizer):
    prompt = chat_prompt(tokenizer, "Count")
    results = backend.generate(
        [GenerationRequest(prompt, SamplingParams(max_new_tokens=n, seed=n)) for n in (0, 1, 5)]
    )
    assert [len(r.token_ids) for r in results][0] == 0
    for n, result in zip((0, 1, 5), results, strict=True):
        assert len(result.token_ids) <= n
        stopped_on_eos = bool(result.token_ids) and result.token_ids[-1] == tokenizer.eos_token_id
        assert result.finish_reason == ("stop" if stopped_on_eos else "length")
        if result.finish_reason == "length":
            assert len(result.token_ids) == n


def token_whose_text_stops_first(tokenizer, token_ids: list[int]) -> tuple[int, str]:
    """``(j, text of token j)`` for the first token j >= 1 whose own text is printable and first appears
    exactly where that token puts it: as a stop string it must end generation at token j."""
    for j in range(1, len(token_ids)):
        before = tokenizer.decode(token_ids[:j], skip_special_tokens=True)
        piece = tokenizer.decode(token_ids[j : j + 1], skip_special_tokens=True)
        through = tokenizer.decode(token_ids[: j + 1], skip_special_tokens=True)
        if (
            piece.strip()
            and "\ufffd" not in piece
            and through == before + piece
            and through.find(piece) == len(before)
        ):
            return j, piece
    raise AssertionError(f"no token of {token_ids} makes a usable stop string")


def test_stop_token_ids_and_stop_strings(backend, tokenizer):
    """The stops are picked from what the model samples unconstrained with the same seed, so any weights do."""
    prompt = chat_prompt(tokenizer, "Go")
    params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=0)
    free = backend.generate([GenerationRequest(prompt, params)])[0]
    assert len(free.token_ids) >= 3, "the sampled continuation should be long enough to cut"

    stop_id = free.token_ids[len(free.token_ids) // 2]
    first = free.token_ids.index(stop_id)
    cut = backend.generate([GenerationRequest(prompt, replace(params, stop_token_ids=[stop_id]))])[0]
    assert cut.token_ids == free.token_ids[: first + 1]
    assert cut.logprobs == pytest.approx(free.logprobs[: first + 1], abs=1e-5)
    assert cut.finish_reason == "stop"

    last, stop = token_whose_text_stops_first(tokenizer, free.token_ids)
    by_string = backend.generate([GenerationRequest(prompt, replace(params, stop_strings=[stop]))])[0]
    assert by_string.finish_reason == "stop"
    assert by_string.token_ids == free.token_ids[: last + 1]
    assert by_string.text == free.text[: free.text.find(stop)]
    assert stop not in by_string.text
    assert by_string.logprobs == pytest.approx(free.logprobs[: last + 1], abs=1e-5)


def test_bad_prompts_are_refused(backend):
    with pytest.raises(ValueError, match="empty"):
        backend.generate([GenerationRequest([], SamplingParams())])
    with pytest.raises(ValueError, match="context"):
        backend.generate([GenerationRequest([5] * backend.max_context, SamplingParams())])
    with pytest.raises(ValueError, match="prompt_token_ids"):
        backend.generate([GenerationRequest([5, backend.vocab_size], SamplingParams())])
    with pytest.raises(ValueError, match="prompt_token_ids"):
        backend.generate([GenerationRequest([-1, 5], SamplingParams())])
    assert backend.generate([]) == []


def test_bad_sampling_params_are_refused():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)


def test_update_weights_loads_a_state_dict_and_restores_training_mode(tokenizer, llama_factory):
    served, trained = llama_factory(tokenizer, seed=1), llama_factory(tokenizer, seed=2)
    backend = TransformersBackend(served, tokenizer)
    prompt = chat_prompt(tokenizer, "Hi")
    request = GenerationRequest(prompt, SamplingParams(max_new_tokens=6, temperature=0.0))
    before = backend.generate([request])[0]
    backend.update_weights(trained.state_dict())
    after = backend.generate([request])[0]
    expected = TransformersBackend(trained, tokenizer).generate([request])[0]
    assert after.token_ids == expected.token_ids
    assert after.logprobs != pytest.approx(before.logprobs)
    served.train()
    backend.generate([request])
    assert served.training


def test_repeated_prompts_share_one_prefill_and_stay_exact(backend, tiny_model, tokenizer):
    """A GRPO-shaped batch (one prompt, several seeds, plus another prompt) equals each row run alone."""
    prompt, other = (
        chat_prompt(tokenizer, "What is 5 + 4?"),
        chat_prompt(tokenizer, "Different and longer prompt"),
    )
    requests = [GenerationRequest(prompt, SamplingParams(max_new_tokens=10, seed=s)) for s in range(4)]
    requests.insert(2, GenerationRequest(other, SamplingParams(max_new_tokens=10, seed=99)))
    batched = backend.generate(requests)
    assert len({tuple(r.token_ids) for r in batched}) > 1
    for request, result in zip(requests, batched, strict=True):
        alone = backend.generate([request])[0]
        assert result.token_ids == alone.token_ids
        reference = reference_logprobs(tiny_model, request.prompt_token_ids, result.token_ids)
        assert result.logprobs == pytest.approx(reference, abs=1e-4)


def test_distinct_prompts_with_a_common_start_run_it_once_and_stay_exact(backend, tiny_model, tokenizer):
    """Validation-shaped batch: different problems behind one system prompt. The common start runs once
    (batch 1), each problem's own end after it; every row equals the row run alone and the plain pass."""
    from gym_bridge.models.shared_prefix import MIN_COMMON_PREFIX, common_prefix_length

    system = "Solve the problem. End your reply with: The answer is N. Show one short line of work first."
    prompts = [
        chat_prompt(tokenizer, q, system=system) for q in ("What is 5 + 4?", "What is 12 - 7?", "7 * 3?")
    ]
    common = common_prefix_length(prompts)
    assert common >= MIN_COMMON_PREFIX
    requests = [
        GenerationRequest(p, SamplingParams(max_new_tokens=10, seed=s)) for s, p in enumerate(prompts * 2)
    ]
    shapes: list[tuple[int, ...]] = []
    hook = tiny_model.get_input_embeddings().register_forward_hook(
        lambda m, args, out: shapes.append(args[0].shape)
    )
    try:
        batched = backend.generate(requests)
    finally:
        hook.remove()
    assert shapes[0] == (1, common)  # the common start, once
    assert shapes[1] == (3, max(len(p) for p in prompts) - common)  # each distinct prompt's own end
    for request, result in zip(requests, batched, strict=True):
        alone = backend.generate([request])[0]
        assert result.token_ids == alone.token_ids
        reference = reference_logprobs(tiny_model, request.prompt_token_ids, result.token_ids)
        assert result.logprobs == pytest.approx(reference, abs=1e-4)
