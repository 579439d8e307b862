"""Loss aggregation modes, GSPO's sequence ratio and the dual clip, against numbers computed by hand."""
import pytest
import torch

from paw_lightning.objectives import PolicyObjective
from paw_lightning.objectives.aggregation import aggregate

# The example of tests/test_policy_objective.py: two samples, T = 4, old log-probs 0 (ρ = exp(logprobs)).
#   sample 0 (A = +1): action tokens ρ = 1.5, 0.9      sample 1 (A = −2): action tokens ρ = 0.5, 1.1, 1.3
# min(ρA, clip(ρ, 0.8, 1.2)A) per action token: s0 [1.2 (clipped), 0.9]; s1 [−1.6 (clipped), −2.2, −2.6]
#   row sums: s0 2.1, s1 −6.4; all tokens −4.3 over 5 tokens and N = 2 samples
RATIOS = torch.tensor([[1.5, 0.9, 1.0, 1.0], [1.0, 0.5, 1.1, 1.3]])
MASK = torch.tensor([[True, True, False, False], [False, True, True, True]])
ADV = torch.tensor([1.0, -2.0])
ENTROPY = torch.tensor([[1.0, 2.0, 9.0, 9.0], [9.0, 3.0, 4.0, 5.0]])

# loss, and d loss / d logπ of the unclipped tokens (s0 ρ=0.9, s1 ρ=1.1, s1 ρ=1.3) = −ρA · (the token's weight):
#   token-mean               −(−4.3)/5 = 0.86              weight 1/5:      [−0.18, 0.44, 0.52]
#   seq-mean-token-mean      −(2.1/2 − 6.4/3)/2 = 0.541667 weights 1/(2·2), 1/(2·3): [−0.225, 0.366667, 0.433333]
#   seq-mean-token-sum       −(2.1 − 6.4)/2 = 2.15          weight 1/2:      [−0.45, 1.1, 1.3]
#   seq-mean-token-sum-norm  −(2.1 − 6.4)/(2·4) = 0.5375    weight 1/(2·4), L = 4: [−0.1125, 0.275, 0.325]
CASES = {
    "token-mean": (0.86, [-0.18, 0.44, 0.52]),
    "seq-mean-token-mean": (0.541667, [-0.225, 0.366667, 0.433333]),
    "seq-mean-token-sum": (2.15, [-0.45, 1.1, 1.3]),
    "seq-mean-token-sum-norm": (0.5375, [-0.1125, 0.275, 0.325]),
}


def _logprobs(ratios=RATIOS):
    return ratios.log().clone().requires_grad_(True)


@pytest.mark.parametrize("mode", CASES)
def test_each_aggregation_mode_against_hand_values(mode):
    loss, grads = CASES[mode]
    logprobs = _logprobs()
    out = PolicyObjective(kl_coef=0.0, aggregation=mode, loss_norm_tokens=4)(logprobs, torch.zeros(2, 4), ADV, MASK)
    torch.testing.assert_close(out.loss, torch.tensor(loss))
    out.loss.backward()
    expected = torch.zeros(2, 4)  # clipped tokens (s0 ρ=1.5, s1 ρ=0.5) and non-actions: 0
    expected[0, 1], expected[1, 2], expected[1, 3] = grads
    torch.testing.assert_close(logprobs.grad, expected)


def test_sequence_mean_is_an_alias_of_seq_mean_token_mean():
    assert PolicyObjective(aggregation="sequence-mean").aggregation == "seq-mean-token-mean"
    values, mask = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[True, True, False]])
    assert aggregate(values, mask, "sequence-mean") == aggregate(values, mask, "seq-mean-token-mean") == 1.5


@pytest.mark.parametrize("mode", CASES)
@pytest.mark.parametrize("variant", [{}, {"importance_sampling": "sequence"}, {"clip_ratio_c": 3.0}])
def test_micro_batches_sum_to_the_mini_batch(mode, variant):
    """Rows split into micro-batches, each divided by the whole mini-batch's ``totals``: losses,
    gradients and metrics add up to the whole's (surrogate, KL and entropy all aggregated)."""
    ratios = torch.tensor([[1.5, 0.9, 1.0, 1.0], [1.0, 0.5, 1.1, 1.3], [2.0, 4.0, 1.0, 1.0]])
    mask = torch.tensor([[True, True, False, False], [False, True, True, True], [True, True, False, False]])
    adv, old = torch.tensor([1.0, -2.0, -1.0]), torch.zeros(3, 4)
    ref, entropy = torch.full((3, 4), -0.3), ENTROPY.repeat(2, 1)[:3]
    objective = PolicyObjective(kl_coef=0.1, entropy_coef=0.01, aggregation=mode, loss_norm_tokens=4, **variant)
    whole_lp = _logprobs(ratios)
    whole = objective(whole_lp, old, adv, mask, ref_logprobs=ref, entropy=entropy)
    whole.loss.backward()
    totals = objective.totals(adv, mask)
    parts_lp = _logprobs(ratios)
    loss, metrics = 0.0, {}
    for rows in ([0, 2], [1]):
        out = objective(parts_lp[rows], old[rows], adv[rows], mask[rows], ref_logprobs=ref[rows], entropy=entropy[rows], totals=totals)
        out.loss.backward()
        loss = loss + out.loss
        metrics = {key: metrics.get(key, 0.0) + value for key, value in out.metrics.items()}
    torch.testing.assert_close(loss, whole.loss)
    torch.testing.assert_close(parts_lp.grad, whole_lp.grad)
    assert metrics.keys() == whole.metrics.keys()
    for key, value in whole.metrics.items():
        torch.testing.assert_close(metrics[key], value, msg=key)


# GSPO, two samples, T = 3, old log-probs 0, so the token log-ratios are the log-probs:
#   sample 0 (A = +1): log ρ = [0.5, 0.1]        s0 = exp((0.5 + 0.1)/2) = exp(0.3) = 1.349859
#   sample 1 (A = −2): log ρ = [−0.6, 0.0, 0.3]  s1 = exp((−0.6 + 0 + 0.3)/3) = exp(−0.1) = 0.904837
GSPO_LOG_RATIOS = torch.tensor([[0.5, 0.1, 0.0], [-0.6, 0.0, 0.3]])
GSPO_MASK = torch.tensor([[True, True, False], [True, True, True]])


def literal_gspo(logprobs: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """GSPO as the paper writes it: −mean_i min(s_i A_i, clip(s_i) A_i), s_i through autograd."""
    s = ((logprobs * GSPO_MASK).sum(-1) / GSPO_MASK.sum(-1)).exp()
    return -torch.minimum(s * ADV, s.clamp(1 - low, 1 + high) * ADV).mean()


def test_gspo_sequence_ratio_loss_and_gradient():
    # ε = 0.2: s0 = 1.349859 > 1.2 with A > 0 -> clipped, term 1.2, no gradient
    #          s1 = 0.904837 in [0.8, 1.2] -> term s1·A = −1.809675
    # loss = −(1.2 − 1.809675)/2 = 0.304837
    # d loss / d logπ_t of sample 1 = −½ · A1 · ∂s1/∂logπ_t = −½ · (−2) · s1/3 = 0.904837/3 = 0.301612 (each of its 3 tokens)
    objective = PolicyObjective(kl_coef=0.0, importance_sampling="sequence", aggregation="seq-mean-token-mean")
    logprobs = GSPO_LOG_RATIOS.clone().requires_grad_(True)
    out = objective(logprobs, torch.zeros(2, 3), ADV, GSPO_MASK)
    torch.testing.assert_close(out.loss, torch.tensor(0.304837), atol=1e-6, rtol=0)
    out.loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0.0, 0.0], [0.301612, 0.301612, 0.301612]]), atol=1e-6, rtol=0)
    # metrics: 1 of 2 sequences clipped; token means over 5 tokens: 2 clipped tokens -> 0.4;
    #   ratio_mean (2·1.349859 + 3·0.904837)/5 = 5.414229/5 = 1.082846
    torch.testing.assert_close(out.metrics["policy/seq_clip_frac"], torch.tensor(0.5))
    torch.testing.assert_close(out.metrics["policy/clip_frac"], torch.tensor(0.4))
    torch.testing.assert_close(out.metrics["policy/ratio_mean"], torch.tensor(1.082846), atol=1e-6, rtol=0)
    # the token form equals the literal sequence form in value and gradient
    literal_lp = GSPO_LOG_RATIOS.clone().requires_grad_(True)
    literal = literal_gspo(literal_lp, 0.2, 0.2)
    literal.backward()
    torch.testing.assert_close(out.loss, literal)
    torch.testing.assert_close(logprobs.grad, literal_lp.grad)


def test_gspo_with_the_papers_clip_range():
    # ε_low 3e-4, ε_high 4e-4: s0 = 1.349859 -> 1.0004 (A > 0); s1 = 0.904837 < 0.9997 with A < 0:
    #   min(−1.809675, 0.9997·(−2) = −1.9994) = −1.9994 (clipped). loss = −(1.0004 − 1.9994)/2 = 0.4995, no gradient
    objective = PolicyObjective(kl_coef=0.0, importance_sampling="sequence", aggregation="seq-mean-token-mean", clip_low=3e-4, clip_high=4e-4)
    logprobs = GSPO_LOG_RATIOS.clone().requires_grad_(True)
    out = objective(logprobs, torch.zeros(2, 3), ADV, GSPO_MASK)
    torch.testing.assert_close(out.loss, torch.tensor(0.4995))
    out.loss.backward()
    assert torch.equal(logprobs.grad, torch.zeros(2, 3))
    assert out.metrics["policy/seq_clip_frac"].item() == 1.0


# Dual clip, c = 3, ε = 0.2, token-mean over 4 action tokens, old log-probs 0:
#   sample 0 (A = −1): ρ = 4   min(−4, −1.2) = −4, max(−4, 3·(−1)) = −3: the constant, no gradient (ρ > c)
#                      ρ = 2   min(−2, −1.2) = −2, max(−2, −3) = −2: unclipped, d/dlogπ (−ρA/4) = 2/4 = 0.5
#                      ρ = 0.5 min(−0.5, −0.8) = −0.8 (clipped below): no gradient
#   sample 1 (A = +1): ρ = 0.25 min(0.25, 0.8) = 0.25: dual clip not applied (A > 0; applied it would be 3),
#                      d/dlogπ (−ρA/4) = −0.0625
#   loss = −(−3 − 2 − 0.8 + 0.25)/4 = 5.55/4 = 1.3875; without the dual clip −(−4 − 2 − 0.8 + 0.25)/4 = 1.6375
DUAL_RATIOS = torch.tensor([[4.0, 2.0, 0.5], [0.25, 1.0, 1.0]])
DUAL_MASK = torch.tensor([[True, True, True], [True, False, False]])
DUAL_ADV = torch.tensor([-1.0, 1.0])


def test_dual_clip_value_and_where_the_gradient_is_zero():
    logprobs = _logprobs(DUAL_RATIOS)
    out = PolicyObjective(kl_coef=0.0, clip_ratio_c=3.0)(logprobs, torch.zeros(2, 3), DUAL_ADV, DUAL_MASK)
    torch.testing.assert_close(out.loss, torch.tensor(1.3875))
    out.loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0.5, 0.0], [-0.0625, 0.0, 0.0]]))
    assert logprobs.grad[0, 0].item() == 0.0
    torch.testing.assert_close(out.metrics["policy/dual_clip_frac"], torch.tensor(0.25))  # the ρ = 4 token of 4
    torch.testing.assert_close(out.metrics["policy/clip_frac"], torch.tensor(0.25))  # the ρ = 0.5 token
    # off by default: today's loss, ρ = 4 has gradient −ρA/4 = 1.0, no dual_clip_frac
    logprobs = _logprobs(DUAL_RATIOS)
    out = PolicyObjective(kl_coef=0.0)(logprobs, torch.zeros(2, 3), DUAL_ADV, DUAL_MASK)
    torch.testing.assert_close(out.loss, torch.tensor(1.6375))
    out.loss.backward()
    torch.testing.assert_close(logprobs.grad[0, 0], torch.tensor(1.0))
    assert "policy/dual_clip_frac" not in out.metrics and "policy/seq_clip_frac" not in out.metrics


def test_bad_values_are_refused_with_the_key():
    with pytest.raises(ValueError, match="unknown aggregation 'seq-sum'"):
        PolicyObjective(aggregation="seq-sum")
    with pytest.raises(ValueError, match="loss_norm_tokens"):
        PolicyObjective(aggregation="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="loss_norm_tokens"):
        PolicyObjective(aggregation="seq-mean-token-sum-norm", loss_norm_tokens=0)
    with pytest.raises(ValueError, match="importance_sampling"):
        PolicyObjective(importance_sampling="trajectory")
    with pytest.raises(ValueError, match="clip_ratio_c"):
        PolicyObjective(clip_ratio_c=1.0)
    PolicyObjective(aggregation="token-mean", loss_norm_tokens=512)  # read only by seq-mean-token-sum-norm


def test_dr_grpo_divides_by_the_runs_generation_budget(tiny_model_dir, tmp_path, monkeypatch):
    """The recipe leaves L null: ``fit`` reads the run's ``data.rollout.max_new_tokens``; a
    number given stays."""
    from paw_lightning.cli import PawCLI

    from helpers import ROOT, tiny_args

    monkeypatch.chdir(tmp_path)
    recipe = ("-c", str(ROOT / "configs/algorithms/dr_grpo.yaml"))
    for extra, expected in (((), 12), (("--data.rollout.max_new_tokens=24",), 24), (("--model.policy_objective.init_args.loss_norm_tokens=512",), 512)):
        cli = PawCLI(args=tiny_args(tiny_model_dir, tmp_path, *recipe, *extra), run=False)  # tests/configs/tiny.yaml's budget: 12
        assert cli.model.policy_objective.aggregation == "seq-mean-token-sum-norm"
        assert cli.model.policy_objective.loss_norm_tokens == expected
