"""The clipped policy-gradient loss: formulas pinned to hand-computed numbers, gradients, micro-batches."""

from __future__ import annotations

import math

import pytest
import torch

from gym_bridge.train.algorithm.loss import (
    ClippedPGLossFn,
    calculate_kl,
    gather_token_logprobs,
    global_normalizers,
    masked_mean,
    reduce_microbatch_metrics,
)
from gym_bridge.train.config import ClippedPGLossConfig

F64 = torch.float64


def lp(probs: list[list[float]]) -> torch.Tensor:
    """Log-probs from probabilities (0 entries become log 1 = 0, i.e. padding)."""
    return torch.tensor([[math.log(p) if p > 0 else 0.0 for p in row] for row in probs], dtype=F64)


def loss_fn(**overrides: object) -> ClippedPGLossFn:
    settings = {"reference_policy_kl_penalty": 0.0, **overrides}
    return ClippedPGLossFn(ClippedPGLossConfig(**settings))


def clipped_term(
    advantage: float, ratio: float, low: float = 0.2, high: float = 0.2, c: float | None = None
) -> float:
    value = max(-advantage * ratio, -advantage * min(max(ratio, 1 - low), 1 + high))
    if c is not None and advantage < 0:
        value = min(value, -advantage * c)
    return value


# Two samples of three tokens; sample 1's last token is padding.
CURR = [[0.5, 0.6, 0.3], [0.2, 0.9, 0.0]]
PREV = [[0.5, 0.4, 0.3], [0.4, 0.6, 0.0]]
GEN = [[0.4, 0.4, 0.25], [0.5, 0.6, 0.0]]
REF = [[0.6, 0.3, 0.3], [0.2, 0.5, 0.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=F64)
ADV = torch.tensor([1.0, -2.0], dtype=F64)


def call(fn: ClippedPGLossFn, curr: torch.Tensor | None = None, **kwargs: object):
    args = {
        "prev_logprobs": lp(PREV),
        "generation_logprobs": lp(GEN),
        "advantages": ADV,
        "token_mask": MASK,
        "reference_logprobs": lp(REF),
    }
    args.update(kwargs)
    return fn(lp(CURR) if curr is None else curr, **args)


def valid_tokens() -> list[tuple[int, int]]:
    return [(i, j) for i in range(2) for j in range(3) if MASK[i, j]]


# ------------------------------------------------------------------------------------------ loss values


def test_token_level_clipped_loss_matches_hand_computation() -> None:
    loss, metrics = call(loss_fn())
    terms = [clipped_term(ADV[i].item(), CURR[i][j] / PREV[i][j]) for i, j in valid_tokens()]
    expected = sum(terms) / (5 + 1e-8)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert metrics["loss"] == pytest.approx(expected, rel=1e-12)
    assert metrics["kl_penalty"] == 0.0 and metrics["num_valid_samples"] == 2.0


def test_sequence_level_loss_averages_tokens_per_sequence_then_sequences() -> None:
    loss, _ = call(loss_fn(token_level_loss=False))
    per_sequence = []
    for i, n in ((0, 3), (1, 2)):
        terms = [clipped_term(ADV[i].item(), CURR[i][j] / PREV[i][j]) for j in range(n)]
        per_sequence.append(sum(terms) / (n + 1e-8))
    assert loss.item() == pytest.approx(sum(per_sequence) / (2 + 1e-8), rel=1e-12)


def test_asymmetric_clip_bounds() -> None:
    # Sample 0 token 1 has ratio 1.5 and A > 0: clipped at 1 + ratio_clip_max.
    loss_small, _ = call(loss_fn(ratio_clip_min=0.2, ratio_clip_max=0.2))
    loss_high, _ = call(loss_fn(ratio_clip_min=0.2, ratio_clip_max=0.28))
    diff = (loss_small - loss_high).item()
    assert diff == pytest.approx((-1 * 1.2 + 1 * 1.28) / (5 + 1e-8), rel=1e-9)


def test_sample_mask_drops_a_whole_sample() -> None:
    loss, metrics = call(loss_fn(), sample_mask=torch.tensor([1.0, 0.0], dtype=F64))
    terms = [clipped_term(1.0, CURR[0][j] / PREV[0][j]) for j in range(3)]
    assert loss.item() == pytest.approx(sum(terms) / (3 + 1e-8), rel=1e-12)
    assert metrics["num_valid_samples"] == 1.0


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
def test_reference_kl_penalty_per_type(kl_type: str) -> None:
    beta = 0.05
    loss, metrics = call(loss_fn(reference_policy_kl_penalty=beta, reference_policy_kl_type=kl_type))
    actor, _ = call(loss_fn())
    kls = []
    for i, j in valid_tokens():
        log_r = math.log(REF[i][j]) - math.log(CURR[i][j])
        kls.append({"k1": -log_r, "k2": log_r**2 / 2, "k3": math.exp(log_r) - 1 - log_r}[kl_type])
    kl_mean = sum(kls) / (5 + 1e-8)
    assert (loss - actor).item() == pytest.approx(beta * kl_mean, rel=1e-9)
    assert metrics["kl_penalty"] == pytest.approx(kl_mean, rel=1e-9)


def test_kl_input_and_output_clamps() -> None:
    curr = torch.tensor([[-30.0, -1.0]], dtype=F64)
    ref = torch.tensor([[-1.0, -30.0]], dtype=F64)  # log r = +29 and -29
    k3 = calculate_kl(curr, ref, "k3", input_clamp_value=20.0, output_clamp_value=10.0)
    assert k3.tolist() == [[10.0, 10.0]]  # exp(20) - 21 and exp(-20) + 19, both capped at 10
    k3_in_only = calculate_kl(curr, ref, "k3", input_clamp_value=20.0, output_clamp_value=None)
    assert k3_in_only[0].tolist() == pytest.approx([math.exp(20) - 21, math.exp(-20) + 19], rel=1e-12)
    k1 = calculate_kl(curr, ref, "k1", input_clamp_value=5.0, output_clamp_value=None)
    assert k1.tolist() == [[-5.0, 5.0]]
    free = calculate_kl(curr, ref, "k2", input_clamp_value=None, output_clamp_value=None)
    assert free.tolist() == [[29.0**2 / 2, 29.0**2 / 2]]
    with pytest.raises(ValueError, match="k4"):
        calculate_kl(curr, ref, "k4")


def test_on_policy_kl_approximation_weights_kl_by_policy_over_generation() -> None:
    beta = 0.1
    plain, _ = call(loss_fn(reference_policy_kl_penalty=beta, reference_policy_kl_type="k3"))
    weighted, _ = call(
        loss_fn(
            reference_policy_kl_penalty=beta,
            reference_policy_kl_type="k3",
            use_on_policy_kl_approximation=True,
        )
    )
    actor, _ = call(loss_fn())
    terms = []
    for i, j in valid_tokens():
        log_r = math.log(REF[i][j]) - math.log(CURR[i][j])
        terms.append(CURR[i][j] / GEN[i][j] * (math.exp(log_r) - 1 - log_r))
    assert (weighted - actor).item() == pytest.approx(beta * sum(terms) / (5 + 1e-8), rel=1e-9)
    assert weighted.item() != pytest.approx(plain.item())


def test_importance_sampling_correction_weights_the_actor_term() -> None:
    loss, metrics = call(loss_fn(use_importance_sampling_correction=True))
    terms = [
        PREV[i][j] / GEN[i][j] * clipped_term(ADV[i].item(), CURR[i][j] / PREV[i][j])
        for i, j in valid_tokens()
    ]
    assert loss.item() == pytest.approx(sum(terms) / (5 + 1e-8), rel=1e-12)
    ratios = [PREV[i][j] / GEN[i][j] for i, j in valid_tokens()]
    assert metrics["sampling_importance_ratio"] == pytest.approx(sum(ratios) / (5 + 1e-8), rel=1e-12)


def test_truncated_importance_sampling_caps_the_weights() -> None:
    loss, _ = call(loss_fn(use_importance_sampling_correction=True, truncated_importance_sampling_ratio=1.1))
    terms = [
        min(PREV[i][j] / GEN[i][j], 1.1) * clipped_term(ADV[i].item(), CURR[i][j] / PREV[i][j])
        for i, j in valid_tokens()
    ]
    assert loss.item() == pytest.approx(sum(terms) / (5 + 1e-8), rel=1e-12)


# ------------------------------------------------------------------------------------------ dual clip


def one_token(advantage: float, ratio: float, **cfg: object) -> tuple[float, float]:
    """Loss and d loss / d logp for a single token with the given ratio to the old policy."""
    prev = torch.tensor([[math.log(0.2)]], dtype=F64)
    curr = (prev + math.log(ratio)).clone().requires_grad_(True)
    loss, _ = loss_fn(**cfg)(
        curr,
        prev_logprobs=prev,
        generation_logprobs=prev,
        advantages=torch.tensor([advantage], dtype=F64),
        token_mask=torch.ones((1, 1), dtype=F64),
    )
    loss.backward()
    return loss.item(), curr.grad.item()


def test_dual_clip_caps_the_loss_only_for_negative_advantages() -> None:
    # A < 0 with ratio 5 > c = 3: loss capped at -A * c and no gradient.
    value, grad = one_token(-2.0, 5.0, ratio_clip_c=3.0)
    assert value == pytest.approx(6.0 / (1 + 1e-8)) and grad == 0.0
    without, grad_without = one_token(-2.0, 5.0)
    assert without == pytest.approx(10.0 / (1 + 1e-8)) and grad_without == pytest.approx(10.0 / (1 + 1e-8))
    # A > 0 with the same ratio: dual clip changes nothing.
    assert one_token(2.0, 5.0, ratio_clip_c=3.0) == one_token(2.0, 5.0)
    # A < 0 with ratio below c: dual clip changes nothing either.
    assert one_token(-2.0, 2.0, ratio_clip_c=3.0) == one_token(-2.0, 2.0)


def test_dual_clip_fraction_metric() -> None:
    _, metrics = call(loss_fn(ratio_clip_c=1.4))
    # Sample 1 (A = -2): ratios 0.5 and 1.5; only 1.5 > c.
    assert metrics["dual_clip_fraction"] == pytest.approx(1 / (5 + 1e-8), rel=1e-12)


def test_ratio_clip_c_must_exceed_one() -> None:
    cfg = ClippedPGLossConfig.model_construct(**{**ClippedPGLossConfig().model_dump(), "ratio_clip_c": 0.5})
    with pytest.raises(ValueError, match="must exceed 1"):
        ClippedPGLossFn(cfg)


# ------------------------------------------------------------------------------------------- gradients


@pytest.mark.parametrize(
    ("advantage", "ratio", "clipped"),
    [
        (1.0, 1.1, False),
        (1.0, 1.5, True),
        (1.0, 0.5, False),
        (-1.0, 0.5, True),
        (-1.0, 1.5, False),
        (-1.0, 0.9, False),
    ],
)
def test_gradient_is_zero_exactly_where_the_clip_is_active(
    advantage: float, ratio: float, clipped: bool
) -> None:
    _, grad = one_token(advantage, ratio)
    expected = 0.0 if clipped else -advantage * ratio / (1 + 1e-8)  # d(-A e^{logp - prev}) / d logp
    assert grad == pytest.approx(expected, rel=1e-12, abs=0.0)


def test_token_gradients_in_a_batch() -> None:
    curr = lp(CURR).requires_grad_(True)
    loss, _ = call(loss_fn(), curr=curr)
    loss.backward()
    for i in range(2):
        for j in range(3):
            ratio = CURR[i][j] / PREV[i][j] if MASK[i, j] else 1.0
            a = ADV[i].item()
            active = (a > 0 and ratio > 1.2) or (a < 0 and ratio < 0.8)
            expected = 0.0 if (not MASK[i, j] or active) else -a * ratio / (5 + 1e-8)
            assert curr.grad[i, j].item() == pytest.approx(expected, rel=1e-12, abs=1e-15), (i, j)


@pytest.mark.parametrize("token_level", [True, False])
def test_gradcheck_in_float64(token_level: bool) -> None:
    torch.manual_seed(0)
    prev = torch.log(torch.rand(3, 4, dtype=F64) * 0.8 + 0.1)
    # Ratios well inside or well outside the clip range, so no kink lies within gradcheck's eps.
    offsets = torch.tensor(
        [[0.05, 0.5, -0.5, 0.0], [0.1, -0.1, 0.6, -0.02], [0.0, 0.02, -0.7, 0.4]], dtype=F64
    )
    curr = (prev + offsets).requires_grad_(True)
    # With the on-policy KL approximation the KL weight pi / pi_gen is a function of curr in value
    # too; without it the weight is exp(logp - sg(logp)), 1 in value, and the gradient deliberately
    # differs from the loss's derivative (test_loss_kl.py pins that gradient).
    fn = loss_fn(
        reference_policy_kl_penalty=0.1,
        reference_policy_kl_type="k3",
        use_on_policy_kl_approximation=True,
        use_importance_sampling_correction=True,
        ratio_clip_c=3.0,
        token_level_loss=token_level,
    )
    kwargs = {
        "prev_logprobs": prev,
        "generation_logprobs": prev - 0.05,
        "reference_logprobs": prev + 0.3,
        "advantages": torch.tensor([1.5, -0.7, 0.3], dtype=F64),
        "token_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=F64),
        "sample_mask": torch.tensor([1, 1, 1], dtype=F64),
    }
    assert torch.autograd.gradcheck(lambda c: fn(c, **kwargs)[0], (curr,), eps=1e-6, atol=1e-8)


# ------------------------------------------------------------------------------------------ micro-batches


def random_batch(seed: int, b: int = 6, t: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    prev = torch.log(torch.rand(b, t, generator=g, dtype=F64) * 0.9 + 0.05)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    return {
        "curr": prev + 0.4 * torch.randn(b, t, generator=g, dtype=F64),
        "prev_logprobs": prev,
        "generation_logprobs": prev + 0.1 * torch.randn(b, t, generator=g, dtype=F64),
        "reference_logprobs": prev + 0.2 * torch.randn(b, t, generator=g, dtype=F64),
        "advantages": torch.randn(b, generator=g, dtype=F64),
        "token_mask": (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).to(F64),
        "sample_mask": torch.tensor([1, 1, 0, 1, 1, 1][:b], dtype=F64),
    }


@pytest.mark.parametrize("token_level", [True, False])
def test_micro_batch_losses_and_gradients_sum_to_the_full_batch(token_level: bool) -> None:
    fn = loss_fn(
        reference_policy_kl_penalty=0.05,
        use_on_policy_kl_approximation=True,
        use_importance_sampling_correction=True,
        ratio_clip_c=3.0,
        token_level_loss=token_level,
    )
    batch = random_batch(7)
    tensors = {k: v for k, v in batch.items() if k != "curr"}

    full_curr = batch["curr"].clone().requires_grad_(True)
    full_loss, full_metrics = fn(full_curr, **tensors)
    full_loss.backward()

    toks, seqs = global_normalizers(batch["token_mask"], batch["sample_mask"])
    micro_curr = batch["curr"].clone().requires_grad_(True)
    total = torch.zeros((), dtype=F64)
    metrics = []
    for rows in ([0, 1], [2], [3, 4, 5]):
        loss, m = fn(
            micro_curr[rows],
            **{k: v[rows] for k, v in tensors.items()},
            global_valid_toks=toks,
            global_valid_seqs=seqs,
        )
        loss.backward()  # gradient accumulation
        total = total + loss.detach()
        metrics.append(m)

    assert total.item() == pytest.approx(full_loss.item(), rel=1e-12)
    assert torch.allclose(micro_curr.grad, full_curr.grad, rtol=1e-12, atol=1e-15)
    reduced = reduce_microbatch_metrics(metrics)
    assert reduced.keys() == full_metrics.keys()
    for key, value in full_metrics.items():
        assert reduced[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_global_normalizers_count_valid_tokens_and_sequences() -> None:
    token_mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    assert global_normalizers(token_mask) == (6.0, 3.0)
    assert global_normalizers(token_mask, torch.tensor([1, 0, 1])) == (5.0, 2.0)


# ------------------------------------------------------------------------------------------------ metrics


def test_mismatch_metrics_match_their_formulas() -> None:
    _, m = call(loss_fn())
    toks = valid_tokens()

    def mean(f) -> float:
        return sum(f(i, j) for i, j in toks) / 5

    def lg(p: list[list[float]], i: int, j: int) -> float:
        return math.log(p[i][j])

    assert m["token_mult_prob_error"] == pytest.approx(
        mean(lambda i, j: math.exp(abs(lg(GEN, i, j) - lg(PREV, i, j))))
    )
    # k3 estimates: gen_kl with log r = prev - gen, policy_kl with log r = gen - prev.
    assert m["gen_kl_error"] == pytest.approx(
        mean(lambda i, j: math.exp(lg(PREV, i, j) - lg(GEN, i, j)) - 1 - (lg(PREV, i, j) - lg(GEN, i, j)))
    )
    assert m["policy_kl_error"] == pytest.approx(
        mean(lambda i, j: math.exp(lg(GEN, i, j) - lg(PREV, i, j)) - 1 - (lg(GEN, i, j) - lg(PREV, i, j)))
    )

    def js(i: int, j: int) -> float:
        p, q = PREV[i][j], GEN[i][j]
        mix = math.log(0.5 * p + 0.5 * q)
        a, b = math.log(p) - mix, math.log(q) - mix
        return 0.5 * (math.exp(a) - a - 1) + 0.5 * (math.exp(b) - b - 1)

    assert m["js_divergence_error"] == pytest.approx(mean(js))
    assert m["sampling_importance_ratio"] == pytest.approx(mean(lambda i, j: PREV[i][j] / GEN[i][j]))
    assert m["approx_entropy"] == pytest.approx(mean(lambda i, j: -(CURR[i][j] / GEN[i][j]) * lg(CURR, i, j)))
    assert m["probs_ratio"] == pytest.approx(mean(lambda i, j: CURR[i][j] / PREV[i][j]))
    assert m["probs_ratio_clamped"] == pytest.approx(
        mean(lambda i, j: min(max(CURR[i][j] / PREV[i][j], 0.8), 1.2))
    )
    assert m["probs_ratio_min"] == pytest.approx(0.5) and m["probs_ratio_max"] == pytest.approx(1.5)
    assert m["probs_ratio_clamped_min"] == pytest.approx(0.8) and m[
        "probs_ratio_clamped_max"
    ] == pytest.approx(1.2)


def test_clip_fractions_count_tokens_where_clipping_is_active() -> None:
    _, m = call(loss_fn())
    # A = +1 tokens: ratios 1, 1.5, 1 -> one clipped high. A = -2 tokens: ratios 0.5, 1.5 -> one clipped low.
    assert m["clip_fraction_high"] == pytest.approx(1 / 5)
    assert m["clip_fraction_low"] == pytest.approx(1 / 5)


def test_nemo_rl_guide_example_of_a_rare_token_mismatch() -> None:
    """docs/guides/grpo.md: logp_gen = -5, logp_policy = -15 gives gen_kl ~ 9 and policy_kl ~ 22,015 (k3)."""
    prev = torch.tensor([[-15.0]], dtype=F64)
    _, m = loss_fn(reference_policy_kl_type="k3")(
        prev,
        prev_logprobs=prev,
        generation_logprobs=torch.tensor([[-5.0]], dtype=F64),
        advantages=torch.tensor([0.0], dtype=F64),
        token_mask=torch.ones((1, 1), dtype=F64),
    )
    assert m["gen_kl_error"] == pytest.approx(math.exp(-10) + 10 - 1, rel=1e-6)
    assert round(m["gen_kl_error"]) == 9
    assert m["policy_kl_error"] == pytest.approx(math.exp(10) - 10 - 1, rel=1e-6)
    assert round(m["policy_kl_error"]) == 22015


def test_reference_logprobs_required_when_kl_is_on() -> None:
    fn = loss_fn(reference_policy_kl_penalty=0.1)
    assert fn.needs_reference_logprobs and not loss_fn().needs_reference_logprobs
    with pytest.raises(ValueError, match="reference_logprobs"):
        call(fn, reference_logprobs=None)


# ---------------------------------------------------------------------------------------------- helpers


def test_masked_mean_with_and_without_global_denominator() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert masked_mean(values, mask).item() == pytest.approx(7 / 3)
    assert masked_mean(values, mask, global_normalization_factor=10).item() == pytest.approx(0.7)
    assert masked_mean(values, mask, dim=-1).tolist() == pytest.approx([1.5, 4.0])


def test_gather_token_logprobs_matches_log_softmax() -> None:
    torch.manual_seed(3)
    logits = torch.randn(2, 4, 7)
    ids = torch.randint(0, 7, (2, 4))
    got = gather_token_logprobs(logits, ids)
    assert got.shape == (2, 3) and got.dtype == torch.float32
    for i in range(2):
        for j in range(3):
            row = logits[i, j].tolist()
            log_z = math.log(sum(math.exp(x) for x in row))
            assert got[i, j].item() == pytest.approx(row[ids[i, j + 1]] - log_z, rel=1e-5)
