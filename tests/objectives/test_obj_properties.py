"""Properties of every part added for peer parity, over generated inputs (hypothesis, derandomized):

- finite in → finite out: loss, gradient and every statistic are finite for any finite log-probs, advantages,
  sampler log-probs, entropies, reference log-probs and masks (empty rows and all-masked batches included);
- zero advantage → zero gradient, for every part whose terms are proportional to A (all but DRO's
  quadratic penalty, which pulls π towards π_old whatever A is, and the KL term);
- garbage (NaN) at masked positions changes nothing.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmpo.objectives import Objective

PARTS = {
    "cispo": dict(trust_region="cispo", eps_low=0.2),
    "cispo_sequence": dict(trust_region="cispo", level="sequence"),
    "sapo": dict(trust_region="sapo"),
    "sapo_sequence": dict(trust_region="sapo", level="sequence"),
    "gmpo": dict(level="sequence_clipped", trust_region="none"),
    "vespo": dict(trust_region="vespo"),
    "vespo_tis": dict(trust_region="vespo", correction="tis"),
    "dppo_tv": dict(trust_region="dppo_tv"),
    "dppo_kl": dict(trust_region="dppo_kl"),
    "dro": dict(trust_region="dro"),
    "high_entropy": dict(credit="high_entropy"),
    "tis_token": dict(correction="tis", is_min=0.5),
    "tis_sequence": dict(correction="tis", is_level="sequence", is_batch_normalize=True),
    "mis_geometric": dict(correction="mis", is_mask_level="geometric", is_batch_normalize=True),
    "given": dict(correction="given"),
    "divergence_seq_max": dict(rejection="divergence", rs_level="seq_max"),
    "divergence_k1": dict(rejection="divergence", rs_estimator="k1", rs_level="seq_sum", rs_max=2.0),
    "off_policy_seq": dict(rejection="off_policy_seq"),
    "abs_kl": dict(kl_coef=0.1, kl_estimator="abs"),
    "low_var_kl_k2_grad_weighted": dict(kl_coef=0.1, kl_estimator="low_var_kl", kl_k2_grad=True,
                                        kl_ratio_weighted=True),
    "token_sum": dict(aggregation="token_sum"),
    "seq_mean_token_sum_norm": dict(aggregation="seq_mean_token_sum_norm"),
}
NOT_PROPORTIONAL_TO_A = {"dro", "abs_kl", "low_var_kl_k2_grad_weighted"}

@st.composite
def batches(draw):
    B, T = draw(st.integers(1, 4)), draw(st.integers(1, 6))

    def matrix(low, high):
        values = draw(st.lists(st.floats(low, high, allow_nan=False, width=64), min_size=B * T, max_size=B * T))
        return torch.tensor(values, dtype=torch.float64).view(B, T)

    logp = matrix(-40.0, 0.0)
    old = (logp + matrix(-25.0, 25.0)).clamp(max=0.0)
    rollout = (old + matrix(-25.0, 25.0)).clamp(max=0.0)
    per_token = draw(st.booleans())
    adv = matrix(-5.0, 5.0) if per_token else matrix(-5.0, 5.0)[:, 0]
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T))).view(B, T)
    return dict(logp=logp, old=old, rollout=rollout, adv=adv, mask=mask, entropy=matrix(0.0, 12.0),
                ref=(logp + matrix(-30.0, 30.0)).clamp(max=0.0), weights=matrix(0.0, 10.0))


def run(name, b, adv=None):
    obj = Objective(**PARTS[name])
    kw = {}
    if "rollout_logp" in obj.needs:
        kw["rollout_logp"] = b["rollout"]
    if "rollout_is_weights" in obj.needs:
        kw["rollout_is_weights"] = b["weights"]
    if "entropy" in obj.needs:
        kw["entropy"] = b["entropy"]
    if "ref_logp" in obj.needs:
        kw["ref_logp"] = b["ref"]
    leaf = b["logp"].clone().requires_grad_()
    loss, stats = obj(leaf, b["old"], b["adv"] if adv is None else adv, b["mask"], **kw)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss, grad, stats


SETTINGS = settings(max_examples=15, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("name", list(PARTS))
@SETTINGS
@given(b=batches())
def test_finite_zero_advantage_and_masked_garbage(name, b):
    # finite in → finite out; no gradient at masked positions
    loss, grad, stats = run(name, b)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert all(torch.isfinite(v).all() for v in stats.values()), stats
    assert (grad[~b["mask"]] == 0).all()
    # zero advantage → zero gradient (and loss), for the parts proportional to A
    if name not in NOT_PROPORTIONAL_TO_A:
        zero_loss, zero_grad, _ = run(name, b, adv=torch.zeros_like(b["adv"]))
        assert (zero_grad == 0).all() and zero_loss.item() == 0.0
    # NaN at masked positions of every (B, T) input changes nothing
    dirty = dict(b)
    hole = ~b["mask"]
    for key in ("logp", "old", "rollout", "entropy", "ref", "weights"):
        dirty[key] = b[key].masked_fill(hole, float("nan"))
    if b["adv"].dim() == 2:
        dirty["adv"] = b["adv"].masked_fill(hole, float("nan"))
    dirty_loss, dirty_grad, dirty_stats = run(name, dirty)
    torch.testing.assert_close(dirty_loss, loss)
    torch.testing.assert_close(dirty_grad.masked_fill(hole, 0.0), grad)
    for key, value in stats.items():
        torch.testing.assert_close(dirty_stats[key], value, msg=key)
