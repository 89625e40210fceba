"""GSPO, CISPO and Dr. GRPO pinned to numbers worked by hand from their published formulas, and the
config rules that keep them consistent (refusals name the key)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from gym_bridge.train.algorithm.loss import ClippedPGLossFn
from gym_bridge.train.config import ClippedPGLossConfig

F64 = torch.float64

# Two samples; sample 1's last token is padding. Probabilities chosen so the ratios are round:
#   sample 0 (A = +1): curr / prev = 0.5/0.5, 0.6/0.4, 0.3/0.3 = 1, 1.5, 1
#   sample 1 (A = -2): curr / prev = 0.2/0.4, 0.9/0.6        = 0.5, 1.5
CURR = [[0.5, 0.6, 0.3], [0.2, 0.9, 1.0]]
PREV = [[0.5, 0.4, 0.3], [0.4, 0.6, 1.0]]
GEN = [[0.4, 0.4, 0.25], [0.5, 0.6, 1.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=F64)
ADV = torch.tensor([1.0, -2.0], dtype=F64)


def lp(probs: list[list[float]], grad: bool = False) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in row] for row in probs], dtype=F64, requires_grad=grad)


def run(max_completion_length: int | None = None, curr: torch.Tensor | None = None, **settings: object):
    cfg = ClippedPGLossConfig(reference_policy_kl_penalty=0.0, **settings)
    fn = ClippedPGLossFn(cfg, max_completion_length=max_completion_length)
    return fn(
        lp(CURR) if curr is None else curr,
        prev_logprobs=lp(PREV),
        generation_logprobs=lp(GEN),
        advantages=ADV,
        token_mask=MASK,
    )


# ------------------------------------------------------------------------------------------ GSPO


def test_gspo_uses_one_length_normalised_ratio_per_sequence_clipped_per_sequence() -> None:
    # GSPO (Zheng et al. 2025, eq. 7): s_i = (prod_t r_t)^(1/|y_i|) = exp(mean_t log r_t).
    #   s_0 = (1 * 1.5 * 1)^(1/3) = 1.1447142   s_1 = (0.5 * 1.5)^(1/2) = sqrt(0.75) = 0.8660254
    # With ratio_clip_max = 0.1, s_0 (A > 0) is clipped to 1.1: term_0 = max(-1.1447, -1.1) = -1.1.
    # s_1 = 0.866 lies in [0.8, 1.1]: term_1 = -(-2) * 0.8660254 = 1.7320508.
    # Sequence-level mean (GSPO's 1/G sum_i): (-1.1 + 1.7320508) / 2 = 0.3160254.
    loss, metrics = run(sequence_level_importance_ratios=True, ratio_clip_max=0.1)
    assert loss.item() == pytest.approx(0.3160254038, rel=1e-7)
    # Token ratios give another number. Sample 0: -1, max(-1.5, -1.1) = -1.1, -1; sample 1 (A = -2):
    # max(2 * 0.5, 2 * 0.8) = 1.6 and max(2 * 1.5, 2 * 1.1) = 3.0. (-3.1 / 3 + 4.6 / 2) / 2 = 0.6333333.
    token, _ = run(token_level_loss=False, ratio_clip_max=0.1)
    assert token.item() == pytest.approx(0.6333333333, rel=1e-7)
    assert metrics["probs_ratio_max"] == pytest.approx(1.5 ** (1 / 3), rel=1e-7)


def test_gspo_gradient_flows_through_every_token_of_an_unclipped_sequence_only() -> None:
    # d loss / d logp_t = (1/2) * (-A_1) * s_1 / |y_1| = 0.5 * 2 * 0.8660254 / 2 = 0.4330127 on each of
    # sample 1's two tokens; sample 0 is clipped (s_0 = 1.1447 > 1.1 with A > 0): no gradient.
    curr = lp(CURR, grad=True)
    loss, _ = run(curr=curr, sequence_level_importance_ratios=True, ratio_clip_max=0.1)
    loss.backward()
    assert curr.grad[0].tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)
    assert curr.grad[1, :2].tolist() == pytest.approx([0.4330127019] * 2, rel=1e-7)
    assert curr.grad[1, 2].item() == 0.0  # padding


def test_gspo_off_policy_correction_is_the_sequence_likelihood_ratio() -> None:
    # NeMo RL's sequence-level correction: w_i = exp(sum_t(logp_prev - logp_gen)) = prod_t prev/gen
    #   w_0 = (0.5/0.4) * (0.4/0.4) * (0.3/0.25) = 1.25 * 1.2 = 1.5     w_1 = (0.4/0.5) * (0.6/0.6) = 0.8
    # clip 0.2: term_0 = max(-1.1447, -1.2) = -1.1447142; term_1 = 1.7320508.
    # (1.5 * -1.1447142 + 0.8 * 1.7320508) / 2 = (-1.7170714 + 1.3856406) / 2 = -0.1657154
    loss, metrics = run(sequence_level_importance_ratios=True, use_importance_sampling_correction=True)
    assert loss.item() == pytest.approx(-0.16571537, rel=1e-6)
    assert metrics["sampling_importance_ratio"] == pytest.approx((1.5 + 0.8) / 2, rel=1e-7)


def test_gspo_sets_sequence_level_loss_and_refuses_token_level_loss() -> None:
    assert ClippedPGLossConfig(sequence_level_importance_ratios=True).token_level_loss is False
    with pytest.raises(
        ValidationError,
        match="loss_fn.token_level_loss=true contradicts loss_fn.sequence_level_importance_ratios=true",
    ):
        ClippedPGLossConfig(sequence_level_importance_ratios=True, token_level_loss=True)


# ------------------------------------------------------------------------------------------ CISPO


def test_cispo_is_reinforce_weighted_by_the_clipped_stop_gradient_ratio() -> None:
    # CISPO (MiniMax-M1, eq. 4): J = 1/sum|y_i| * sum_i sum_t sg(clip(r_t)) * A_i * log pi(y_t); loss = -J.
    # Clipped weights (0.2 / 0.2): sample 0 -> 1, 1.2, 1; sample 1 -> clip(0.5) = 0.8, clip(1.5) = 1.2.
    #   sample 0: -(+1) * (1 * ln 0.5 + 1.2 * ln 0.6 + 1 * ln 0.3)
    #           = -(-0.6931472 - 0.6129907 - 1.2039728)       =  2.5101107
    #   sample 1: -(-2) * (0.8 * ln 0.2 + 1.2 * ln 0.9)
    #           = 2 * (-1.2875503 - 0.1264326)                 = -2.8279659
    # over the 5 valid tokens: (2.5101107 - 2.8279659) / 5 = -0.0635710
    curr = lp(CURR, grad=True)
    loss, _ = run(curr=curr, use_cispo=True)
    assert loss.item() == pytest.approx(-0.0635710328, rel=1e-7)
    # The weight's gradient is stopped: d loss / d logp_t = -A_i * w_t / 5, so a clipped token (sample 0
    # token 1, ratio 1.5 > 1.2) still gets -1.2 / 5 = -0.24, where PPO clipping would give it 0.
    loss.backward()
    assert curr.grad[0].tolist() == pytest.approx([-0.2, -0.24, -0.2], rel=1e-7)
    assert curr.grad[1, :2].tolist() == pytest.approx([2 * 0.8 / 5, 2 * 1.2 / 5], rel=1e-7)
    ppo_curr = lp(CURR, grad=True)
    ppo, _ = run(curr=ppo_curr)
    ppo.backward()
    assert ppo_curr.grad[0, 1].item() == 0.0


def test_cispo_config_rules_name_the_key() -> None:
    assert ClippedPGLossConfig(loss_type="cispo").use_cispo is True
    with pytest.raises(
        ValidationError, match="loss_fn.token_level_loss=false contradicts loss_fn.use_cispo=true"
    ):
        ClippedPGLossConfig(use_cispo=True, token_level_loss=False)
    with pytest.raises(ValidationError, match="loss_fn.ratio_clip_c"):
        ClippedPGLossConfig(use_cispo=True, ratio_clip_c=3.0)
    with pytest.raises(ValidationError, match="loss_fn.sequence_level_importance_ratios"):
        ClippedPGLossConfig(use_cispo=True, sequence_level_importance_ratios=True)
    with pytest.raises(
        ValidationError, match="loss_fn.use_cispo=false contradicts loss_fn.loss_type='cispo'"
    ):
        ClippedPGLossConfig(loss_type="cispo", use_cispo=False)


# ------------------------------------------------------------------------------------------ Dr. GRPO


def test_dr_grpo_divides_the_token_sum_by_sequences_times_max_completion_length() -> None:
    # Token terms (clip 0.2): sample 0: -1, max(-1.5, -1.2) = -1.2, -1 -> -3.2;
    # sample 1 (A = -2): max(1.0, 1.6) = 1.6, max(3.0, 2.4) = 3.0 -> 4.6. Sum 1.4.
    # Dr. GRPO (Liu et al. 2025; TRL's loss_type="dr_grpo"): 1.4 / (2 sequences * L = 4) = 0.175,
    # where the token mean is 1.4 / 5 = 0.28.
    dr, _ = run(max_completion_length=4, loss_type="dr_grpo")
    assert dr.item() == pytest.approx(0.175, rel=1e-7)
    token, _ = run()
    assert token.item() == pytest.approx(0.28, rel=1e-7)


def test_dr_grpo_micro_batches_add_up_to_the_full_batch() -> None:
    fn = ClippedPGLossFn(
        ClippedPGLossConfig(reference_policy_kl_penalty=0.0, loss_type="dr_grpo"), max_completion_length=4
    )
    parts = [
        fn(
            lp(CURR)[i : i + 1],
            prev_logprobs=lp(PREV)[i : i + 1],
            generation_logprobs=lp(GEN)[i : i + 1],
            advantages=ADV[i : i + 1],
            token_mask=MASK[i : i + 1],
            global_valid_toks=5.0,
            global_valid_seqs=2.0,
        )[0].item()
        for i in range(2)
    ]
    assert parts == pytest.approx([-3.2 / 8, 4.6 / 8], rel=1e-7)


def test_dr_grpo_needs_its_normaliser_and_token_level_sums() -> None:
    with pytest.raises(ValueError, match="'dr_grpo' needs max_completion_length"):
        ClippedPGLossFn(ClippedPGLossConfig(loss_type="dr_grpo"))
    with pytest.raises(
        ValidationError, match="loss_fn.token_level_loss=false contradicts loss_fn.loss_type='dr_grpo'"
    ):
        ClippedPGLossConfig(loss_type="dr_grpo", token_level_loss=False)


@pytest.mark.parametrize(
    ("loss_type", "token_level_loss"), [("grpo", False), ("bnpo", True), ("dapo", True), ("dr_grpo", True)]
)
def test_trl_loss_types_set_the_nemo_rl_keys_they_stand_for(loss_type: str, token_level_loss: bool) -> None:
    cfg = ClippedPGLossConfig(loss_type=loss_type)
    assert cfg.token_level_loss is token_level_loss and cfg.use_cispo is False
    with pytest.raises(ValidationError, match="loss_type"):
        ClippedPGLossConfig(loss_type="sapo")


# ------------------------------------------------------------------------------- entropy bonus


def test_entropy_bonus_subtracts_the_sampled_entropy_estimate_times_its_coefficient() -> None:
    # H_t = -(pi / pi_gen) * log pi per valid token (token-level mean over the 5 valid tokens):
    #   sample 0: 1.25 * 0.6931472 = 0.8664340, 1.5 * 0.5108256 = 0.7662384, 1.2 * 1.2039728 = 1.4447674
    #   sample 1: 0.4 * 1.6094379 = 0.6437752, 1.5 * 0.1053605 = 0.1580408 (its padding is out)
    #   H = 3.8792558 / 5 = 0.7758511; the loss moves by -0.1 * H.
    plain, _ = run()
    with_bonus, metrics = run(entropy_coeff=0.1)
    assert with_bonus.item() - plain.item() == pytest.approx(-0.07758511430, rel=1e-7)
    assert metrics["approx_entropy"] == pytest.approx(0.7758511430, rel=1e-7)


def test_a_step_coefficient_replaces_the_configured_one() -> None:
    # Adaptive entropy control passes each step's coefficient; the configured one is then unused.
    fn = ClippedPGLossFn(ClippedPGLossConfig(reference_policy_kl_penalty=0.0, entropy_coeff=0.5))
    args = dict(prev_logprobs=lp(PREV), generation_logprobs=lp(GEN), advantages=ADV, token_mask=MASK)
    stepped, _ = fn(lp(CURR), **args, entropy_coeff=0.1)
    assert stepped.item() == pytest.approx(run(entropy_coeff=0.1)[0].item(), rel=1e-7)
    assert fn(lp(CURR), **args, entropy_coeff=0.0)[0].item() == pytest.approx(run()[0].item(), rel=1e-7)
    assert fn.learns_without_advantage() and not fn.learns_without_advantage(0.0)


def test_entropy_bonus_gradient_is_the_score_function_gradient_of_the_entropy() -> None:
    # d(-c * H_t / N) / d log pi_t = c * (pi / pi_gen) * (log pi + 1) / N, with c = 0.1 and N = 5:
    #   token (0, 0): 0.1 * 1.25 * (1 - 0.6931472) / 5 = 0.0076713; token (0, 2): 0.1 * 1.2 * (1 - 1.2039728)
    #   / 5 = -0.0048953 (a rare token is pushed up, a likely one down).
    grads = {}
    for coeff in (0.0, 0.1):
        curr = lp(CURR, grad=True)
        run(curr=curr, entropy_coeff=coeff)[0].backward()
        grads[coeff] = curr.grad
    bonus = grads[0.1] - grads[0.0]
    assert bonus[0].tolist() == pytest.approx([0.0076713205, 0.0146752313, -0.0048953473], rel=1e-7)
    assert bonus[1, :2].tolist() == pytest.approx([-0.0048755033, 0.0268391845], rel=1e-7)
    assert bonus[1, 2].item() == 0.0  # padding


def test_entropy_gradient_in_expectation_is_the_exact_entropy_gradient() -> None:
    # Over every token of a 5-way categorical, each weighted by the sampler's probability q, the
    # estimate's expectation is -sum_x pi(x) log pi(x) = H(pi), and so is its gradient.
    torch.manual_seed(0)
    logits = torch.randn(5, dtype=F64, requires_grad=True)
    q = torch.softmax(torch.randn(5, dtype=F64), dim=0)
    fn = ClippedPGLossFn(ClippedPGLossConfig(reference_policy_kl_penalty=0.0, entropy_coeff=1.0))
    logp = torch.log_softmax(logits, dim=0)
    expected_loss = torch.zeros((), dtype=F64)
    for x in range(5):
        token = logp[x].reshape(1, 1)
        loss, _ = fn.loss_and_metrics(
            token,
            prev_logprobs=token.detach(),
            generation_logprobs=q[x].log().reshape(1, 1),
            advantages=torch.zeros(1, dtype=F64),
            token_mask=torch.ones(1, 1, dtype=F64),
        )
        expected_loss = expected_loss + q[x] * loss
    (grad,) = torch.autograd.grad(expected_loss, logits)
    exact = torch.distributions.Categorical(logits=logits).entropy()
    (exact_grad,) = torch.autograd.grad(-exact, logits)
    assert expected_loss.item() == pytest.approx(-exact.item(), rel=1e-7)
    assert torch.allclose(grad, exact_grad, atol=1e-7)


def test_entropy_coeff_must_not_be_negative() -> None:
    with pytest.raises(ValidationError, match="entropy_coeff"):
        ClippedPGLossConfig(entropy_coeff=-0.01)
