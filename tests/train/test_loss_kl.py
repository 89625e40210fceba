"""The reference-KL term: values and gradients by hand, and its expected gradient over a whole policy.

The weight w = pi / pi_gen (or exp(logp - sg(logp)) = 1) stays in the graph, as in NeMo RL's
``ClippedPGLossFn`` since its "fix: KL backward in GRPO"; see gym_bridge/train/algorithm/loss.py's docstring.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from gym_bridge.train.algorithm.loss import ClippedPGLossFn, calculate_kl, global_normalizers
from gym_bridge.train.config import ClippedPGLossConfig

F64 = torch.float64
BETA = 0.3


def loss_fn(**overrides: object) -> ClippedPGLossFn:
    return ClippedPGLossFn(ClippedPGLossConfig(**overrides))


def token_kl(
    logp: float,
    ref: float,
    gen: float,
    kl_type: str,
    on_policy: bool,
    input_clamp: float | None,
    output_clamp: float | None,
) -> tuple[float, float]:
    """One token's w * k (after the clamps) and its derivative in logp, written out by hand."""
    log_r = ref - logp
    input_clamped = input_clamp is not None and abs(log_r) > input_clamp
    if input_clamped:
        log_r = math.copysign(input_clamp, log_r)
    k, dk = {  # dk / dlogp, with dlog_r / dlogp = -1
        "k1": (-log_r, 1.0),
        "k2": (log_r**2 / 2, -log_r),
        "k3": (math.exp(log_r) - 1 - log_r, 1.0 - math.exp(log_r)),
    }[kl_type]
    w = math.exp(logp - gen) if on_policy else 1.0  # dw / dlogp = w in both cases
    value = w * k
    grad = 0.0 if input_clamped else w * (dk + k)
    if output_clamp is not None and abs(value) > output_clamp:
        value, grad = math.copysign(output_clamp, value), 0.0
    return value, grad


# Two samples of three tokens; sample 1's last token is padding. Log-probs chosen so that with
# clamps (0.5, 0.06) some tokens hit the input clamp, some the output clamp, and some neither.
CURR = [[-0.7, -1.6, -0.1], [-2.3, -0.4, 0.0]]
GEN = [[-0.9, -1.2, -0.3], [-2.0, -0.5, 0.0]]
REF = [[-1.4, -1.3, -0.2], [-1.2, -0.8, 0.0]]
PREV = [[-0.8, -1.5, -0.2], [-2.2, -0.6, 0.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
CLAMPS = {"off": (None, None), "on": (0.5, 0.06)}


def kl_value_and_grad(**settings: object) -> tuple[float, torch.Tensor]:
    """The KL part of the loss and of its gradient: loss(beta) - loss(beta = 0) on the same batch."""

    def run(beta: float) -> tuple[float, torch.Tensor]:
        curr = torch.tensor(CURR, dtype=F64, requires_grad=True)
        loss, _ = loss_fn(**settings, reference_policy_kl_penalty=beta)(
            curr,
            prev_logprobs=torch.tensor(PREV, dtype=F64),
            generation_logprobs=torch.tensor(GEN, dtype=F64),
            reference_logprobs=torch.tensor(REF, dtype=F64),
            advantages=torch.tensor([0.8, -1.1], dtype=F64),
            token_mask=torch.tensor(MASK, dtype=F64),
        )
        loss.backward()
        return loss.item(), curr.grad

    (with_kl, grad_with), (without, grad_without) = run(BETA), run(0.0)
    return with_kl - without, grad_with - grad_without


@pytest.mark.parametrize(
    ("kl_type", "on_policy", "clamps", "token_level"),
    list(itertools.product(["k1", "k2", "k3"], [False, True], ["off", "on"], [True, False])),
)
def test_kl_value_and_gradient_per_token_match_the_hand_formula(
    kl_type: str, on_policy: bool, clamps: str, token_level: bool
) -> None:
    input_clamp, output_clamp = CLAMPS[clamps]
    value, grad = kl_value_and_grad(
        reference_policy_kl_type=kl_type,
        use_on_policy_kl_approximation=on_policy,
        kl_input_clamp_value=input_clamp,
        kl_output_clamp_value=output_clamp,
        token_level_loss=token_level,
    )
    lengths = [sum(row) for row in MASK]
    expected_value = 0.0
    expected_grad = [[0.0] * 3 for _ in range(2)]
    for i, j in itertools.product(range(2), range(3)):
        if not MASK[i][j]:
            continue
        v, g = token_kl(CURR[i][j], REF[i][j], GEN[i][j], kl_type, on_policy, input_clamp, output_clamp)
        scale = BETA / (sum(lengths) + 1e-8) if token_level else BETA / (lengths[i] + 1e-8) / (2 + 1e-8)
        expected_value += scale * v
        expected_grad[i][j] = scale * g
    assert value == pytest.approx(expected_value, rel=1e-9, abs=1e-12)
    assert grad.tolist() == [pytest.approx(row, rel=1e-9, abs=1e-12) for row in expected_grad]


def test_clamped_grid_exercises_both_clamps() -> None:
    """The 'on' clamps above hit the input clamp on some tokens and the output clamp on others."""
    input_clamp, output_clamp = CLAMPS["on"]
    log_rs = [REF[i][j] - CURR[i][j] for i in range(2) for j in range(3) if MASK[i][j]]
    assert any(abs(x) > input_clamp for x in log_rs)
    k3 = [math.exp(x) - 1 - x for x in log_rs if abs(x) <= input_clamp]
    assert any(v > output_clamp for v in k3) and any(v < output_clamp for v in k3)


def test_hand_computed_tokens() -> None:
    """pi = (1/2, 1/5), pi_ref = (1/4, 2/5), beta = 1, token-level mean over 2 tokens, no clamps.

    Per token with w = 1: k3 = r - 1 - log r and d(w k3)/dlogp = (1 - r) + k3 = -log r, so the
    gradients are log 2 / 2 and -log 2 / 2; k1 = -log r and d(w k1)/dlogp = 1 - log r.
    """
    curr = torch.tensor([[math.log(0.5), math.log(0.2)]], dtype=F64)
    ref = torch.tensor([[math.log(0.25), math.log(0.4)]], dtype=F64)
    ln2 = math.log(2)
    expected = {
        # values: mean of (1/2 - 1 + ln 2, 2 - 1 - ln 2); of (ln 2, -ln 2)
        "k3": ((0.5 - 1 + ln2 + 1 - ln2) / 2, [ln2 / 2, -ln2 / 2]),
        "k1": (0.0, [(1 + ln2) / 2, (1 - ln2) / 2]),
    }
    for kl_type, (value, grads) in expected.items():
        c = curr.clone().requires_grad_(True)
        loss, metrics = loss_fn(
            reference_policy_kl_penalty=1.0,
            reference_policy_kl_type=kl_type,
            kl_input_clamp_value=None,
            kl_output_clamp_value=None,
        )(
            c,
            prev_logprobs=curr,
            generation_logprobs=curr,
            reference_logprobs=ref,
            advantages=torch.zeros(1, dtype=F64),
            token_mask=torch.ones((1, 2), dtype=F64),
        )
        loss.backward()
        assert loss.item() == pytest.approx(value, abs=1e-8), kl_type
        assert metrics["kl_penalty"] == pytest.approx(value, abs=1e-8), kl_type
        assert c.grad[0].tolist() == pytest.approx(grads, rel=1e-7), kl_type


def test_calculate_kl_detaches_the_weight_where_the_input_clamp_is_active() -> None:
    logp = torch.tensor([[-3.0, -1.0]], dtype=F64, requires_grad=True)
    weights = torch.exp(logp - logp.detach())
    kl = calculate_kl(logp, torch.zeros_like(logp), "k3", 2.0, None, importance_sampling_weights=weights)
    # log r = 3 is clamped to 2: value e^2 - 3 and no gradient; log r = 1: e - 2 and grad (1 - e) + (e - 2).
    assert kl.detach()[0].tolist() == pytest.approx([math.exp(2) - 3, math.e - 2], rel=1e-12)
    kl.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -1.0], abs=1e-12)


def test_calculate_kl_clamps_the_weighted_estimate() -> None:
    """clamp(w * k), not w * clamp(k): a large weight is capped together with the estimate."""
    logp = torch.tensor([[-1.0]], dtype=F64, requires_grad=True)
    weights = 100.0 * torch.exp(logp - logp.detach())
    kl = calculate_kl(logp, torch.zeros_like(logp), "k3", None, 1.0, importance_sampling_weights=weights)
    assert kl.item() == 1.0  # w * k = 100 (e - 2) = 71.8, capped at 1
    kl.sum().backward()
    assert logp.grad.item() == 0.0
    assert calculate_kl(logp, torch.zeros_like(logp), "k3", None, 1.0).item() == pytest.approx(math.e - 2)


# ------------------------------------------------------------------ expected gradient over a whole policy


LOGITS = [0.3, -1.2, 0.8, 0.05, -0.4]
REF_PROBS = [0.1, 0.3, 0.2, 0.25, 0.15]
GEN_PROBS = [0.3, 0.1, 0.25, 0.15, 0.2]


def expected_kl_gradient(kl_type: str, on_policy: bool) -> torch.Tensor:
    """d/dlogits of E_y[loss of a one-token batch y], summed exactly over the 5 outcomes y.

    Without the on-policy approximation y ~ pi (the policy itself); with it y ~ pi_gen, a fixed
    other distribution, and the loss is given log pi_gen(y) as the generation log-prob.
    """
    logits = torch.tensor(LOGITS, dtype=F64, requires_grad=True)
    logp = torch.log_softmax(logits, dim=0)
    ref = torch.log(torch.tensor(REF_PROBS, dtype=F64))
    gen = torch.log(torch.tensor(GEN_PROBS, dtype=F64))
    sampling = torch.exp(gen) if on_policy else torch.exp(logp).detach()
    fn = loss_fn(
        reference_policy_kl_penalty=1.0,
        reference_policy_kl_type=kl_type,
        use_on_policy_kl_approximation=on_policy,
        kl_input_clamp_value=None,
        kl_output_clamp_value=None,
    )
    total = torch.zeros((), dtype=F64)
    for y in range(len(LOGITS)):
        loss, _ = fn(
            logp[y].view(1, 1),
            prev_logprobs=logp[y].detach().view(1, 1),
            generation_logprobs=(gen[y] if on_policy else logp[y].detach()).view(1, 1),
            reference_logprobs=ref[y].view(1, 1),
            advantages=torch.zeros(1, dtype=F64),
            token_mask=torch.ones((1, 1), dtype=F64),
        )
        total = total + sampling[y] * loss
    total.backward()
    return logits.grad * (1 + 1e-8)  # undo the 1 / (1 + 1e-8) of the one-token mean


def exact_gradient(divergence: str) -> torch.Tensor:
    logits = torch.tensor(LOGITS, dtype=F64, requires_grad=True)
    logp = torch.log_softmax(logits, dim=0)
    ref = torch.log(torch.tensor(REF_PROBS, dtype=F64))
    value = {
        "KL(pi||ref)": (logp.exp() * (logp - ref)).sum(),
        "KL(ref||pi)": (ref.exp() * (ref - logp)).sum(),
        "E_pi[k2]": (logp.exp() * (ref - logp) ** 2 / 2).sum(),
    }[divergence]
    value.backward()
    return logits.grad


@pytest.mark.parametrize("on_policy", [False, True])
@pytest.mark.parametrize("kl_type", ["k1", "k3"])
def test_expected_gradient_is_the_gradient_of_reverse_kl(kl_type: str, on_policy: bool) -> None:
    got = expected_kl_gradient(kl_type, on_policy)
    want = exact_gradient("KL(pi||ref)")
    assert torch.allclose(got, want, rtol=0, atol=1e-9), (got, want)
    # The test can fail: a detached weight gives zero (k1) or the forward KL's gradient (k3).
    assert want.abs().max() > 0.05
    assert (want - exact_gradient("KL(ref||pi)")).abs().max() > 0.05


@pytest.mark.parametrize("on_policy", [False, True])
def test_expected_gradient_of_k2_is_that_of_its_expectation(on_policy: bool) -> None:
    got = expected_kl_gradient("k2", on_policy)
    assert torch.allclose(got, exact_gradient("E_pi[k2]"), rtol=0, atol=1e-9)


# ------------------------------------------------------------------------------------------ micro-batches


@pytest.mark.parametrize(
    ("kl_type", "on_policy", "clamps", "token_level"),
    list(itertools.product(["k1", "k2", "k3"], [False, True], ["off", "on"], [True, False])),
)
def test_kl_gradients_accumulate_over_micro_batches(
    kl_type: str, on_policy: bool, clamps: str, token_level: bool
) -> None:
    input_clamp, output_clamp = CLAMPS[clamps]
    fn = loss_fn(
        reference_policy_kl_penalty=BETA,
        reference_policy_kl_type=kl_type,
        use_on_policy_kl_approximation=on_policy,
        kl_input_clamp_value=input_clamp,
        kl_output_clamp_value=output_clamp,
        token_level_loss=token_level,
    )
    g = torch.Generator().manual_seed(11)
    b, t = 6, 5
    prev = torch.log(torch.rand(b, t, generator=g, dtype=F64) * 0.9 + 0.05)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    tensors = {
        "prev_logprobs": prev,
        "generation_logprobs": prev + 0.2 * torch.randn(b, t, generator=g, dtype=F64),
        "reference_logprobs": prev + 0.6 * torch.randn(b, t, generator=g, dtype=F64),
        "advantages": torch.randn(b, generator=g, dtype=F64),
        "token_mask": (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).to(F64),
        "sample_mask": torch.tensor([1, 1, 0, 1, 1, 1], dtype=F64),
    }
    curr = prev + 0.3 * torch.randn(b, t, generator=g, dtype=F64)

    full = curr.clone().requires_grad_(True)
    full_loss, _ = fn(full, **tensors)
    full_loss.backward()

    toks, seqs = global_normalizers(tensors["token_mask"], tensors["sample_mask"])
    micro = curr.clone().requires_grad_(True)
    total = 0.0
    for rows in ([0, 1], [2], [3, 4, 5]):
        loss, _ = fn(
            micro[rows], **{k: v[rows] for k, v in tensors.items()}, global_valid_toks=toks, global_valid_seqs=seqs
        )
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(full_loss.item(), rel=1e-12)
    assert torch.allclose(micro.grad, full.grad, rtol=1e-12, atol=1e-15)
    assert full.grad.abs().sum() > 0
