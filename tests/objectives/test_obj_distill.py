"""On-policy distillation parts (lmpo.objectives.parts.distill): TRL's GKD loss, a slow loop, top-K, invariances."""

from __future__ import annotations

import math
import os

import pytest
import torch

from lmpo.errors import UnsupportedError
from lmpo.objectives import Objective, ObjectiveDriver
from lmpo.objectives.driver import Host, needs_of
from lmpo.objectives.parts.distill import generalized_jsd

B, T, V = 4, 7, 11


def _inputs(seed=0, dtype=torch.float64, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g, dtype=dtype) * scale).requires_grad_()
    teacher = torch.randn(B, T, V, generator=g, dtype=dtype) * scale
    lengths = torch.tensor([T, 3, 5, 1])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    logp = torch.log_softmax(logits.detach(), -1)[..., 0].requires_grad_()  # the policy term is switched off below
    return logits, teacher, mask, logp


def _distill_loss(name, logits, teacher, mask, logp, teacher_ids=None, **kw):
    obj = Objective(distill=name, distill_policy_coef=0.0, aggregation="token_mean", check_finite=False, **kw)
    adv = torch.zeros(B, dtype=logits.dtype)
    return obj(logp, logp.detach(), adv, mask, logits=logits, teacher_logits=teacher, teacher_ids=teacher_ids)


def _kl_loop(p_logits, q_logits):
    """KL(p‖q) of one position with a Python loop over the vocabulary."""
    lp, lq = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    return sum(lp[v].exp() * (lp[v] - lq[v]) for v in range(p_logits.numel()))


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_gkd_jsd_matches_trl_generalized_jsd_loss(beta):
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    gkd = pytest.importorskip("trl.experimental.gkd.gkd_trainer")
    worst = 0.0
    for seed in range(3):
        logits, teacher, mask, logp = _inputs(seed)
        loss, _ = _distill_loss("gkd_jsd", logits, teacher, mask, logp, jsd_beta=beta)
        (grad,) = torch.autograd.grad(loss, logits)
        ref_logits = logits.detach().clone().requires_grad_()
        labels = torch.where(mask, 1, -100)
        ref = gkd.GKDTrainer.generalized_jsd_loss(ref_logits, teacher, labels=labels, beta=beta)
        (ref_grad,) = torch.autograd.grad(ref, ref_logits)
        worst = max(worst, (loss - ref).abs().item(), (grad - ref_grad).abs().max().item())
    assert worst <= 1e-6, worst
    print(f"beta={beta}: max |lmpo − TRL| over loss and gradient = {worst:.2e}")


def test_reverse_kl_is_gkd_jsd_at_beta_one_and_matches_a_loop():
    logits, teacher, mask, logp = _inputs(1)
    rkl, stats = _distill_loss("reverse_kl", logits, teacher, mask, logp)
    jsd1, _ = _distill_loss("gkd_jsd", logits, teacher, mask, logp, jsd_beta=1.0)
    torch.testing.assert_close(rkl, jsd1, rtol=0, atol=1e-12)
    per_token = [_kl_loop(logits[b, t].detach(), teacher[b, t]) for b in range(B) for t in range(T) if mask[b, t]]
    expected = torch.stack(per_token).mean()
    torch.testing.assert_close(rkl.detach(), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(stats["distill/divergence"], expected, rtol=1e-10, atol=1e-12)


def test_jsd_loop_for_middle_beta():
    g = torch.Generator().manual_seed(3)
    p, q = torch.randn(V, generator=g, dtype=torch.float64), torch.randn(V, generator=g, dtype=torch.float64)
    beta = 0.3
    pp, qq = torch.softmax(p, -1), torch.softmax(q, -1)
    m = [(1 - beta) * pp[v] + beta * qq[v] for v in range(V)]
    expected = sum(beta * qq[v] * math.log(qq[v] / m[v]) + (1 - beta) * pp[v] * math.log(pp[v] / m[v])
                   for v in range(V))
    got = generalized_jsd(torch.log_softmax(p, -1), torch.log_softmax(q, -1), beta)
    assert abs(got.item() - expected) < 1e-12


def test_hand_computed_reverse_kl():
    # p = (1/2, 1/2), q = (1/4, 3/4): KL(p‖q) = ½·ln(0.5/0.25) + ½·ln(0.5/0.75) = ½(0.693147 − 0.405465) = 0.143841
    p = torch.log(torch.tensor([[[0.5, 0.5]]], dtype=torch.float64)).requires_grad_()
    q = torch.log(torch.tensor([[[0.25, 0.75]]], dtype=torch.float64))
    obj = Objective(distill="reverse_kl", distill_policy_coef=0.0)
    logp = torch.zeros(1, 1, dtype=torch.float64)
    loss, _ = obj(logp, logp, torch.zeros(1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.bool), logits=p,
                  teacher_logits=q)
    assert abs(loss.item() - 0.143841) < 1e-6


def test_top_k_with_every_token_equals_the_full_distribution():
    logits, teacher, mask, logp = _inputs(2)
    full, _ = _distill_loss("gkd_jsd", logits, teacher, mask, logp, jsd_beta=0.4)
    g_full = torch.autograd.grad(full, logits)[0]
    teacher_logp = torch.log_softmax(teacher, -1)
    ids = torch.argsort(torch.rand(B, T, V, generator=torch.Generator().manual_seed(0)), -1)  # any order of all V
    topk, _ = _distill_loss("gkd_jsd", logits, teacher_logp.gather(-1, ids), mask, logp, teacher_ids=ids,
                            jsd_beta=0.4, distill_top_k=V)
    g_topk = torch.autograd.grad(topk, logits)[0]
    torch.testing.assert_close(topk, full, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_topk, g_full, rtol=1e-8, atol=1e-12)


def test_top_k_compares_k_tokens_and_a_tail_bucket():
    K = 3
    logits, teacher, mask, logp = _inputs(4)
    teacher_logp = torch.log_softmax(teacher, -1)
    top, ids = teacher_logp.topk(K, -1)
    loss, stats = _distill_loss("reverse_kl", logits, top, mask, logp, teacher_ids=ids, distill_top_k=K)
    terms = []
    for b in range(B):
        for t in range(T):
            if not mask[b, t]:
                continue
            p = torch.softmax(logits[b, t].detach(), -1)
            q = teacher_logp[b, t].exp()
            chosen = ids[b, t].tolist()
            p_k = [p[v] for v in chosen] + [1 - sum(p[v] for v in chosen)]
            q_k = [q[v] for v in chosen] + [1 - sum(q[v] for v in chosen)]
            terms.append(sum(a * math.log(a / c) for a, c in zip(p_k, q_k)))
    expected = float(sum(terms) / len(terms))
    assert abs(loss.item() - expected) < 1e-10
    assert stats["distill/divergence"].item() == pytest.approx(expected, abs=1e-10)


def test_garbage_at_masked_positions_changes_nothing():
    logits, teacher, mask, logp = _inputs(5)
    base, _ = _distill_loss("gkd_jsd", logits, teacher, mask, logp)
    g_base = torch.autograd.grad(base, logits)[0]
    dirty_logits = torch.where(mask.unsqueeze(-1), logits.detach(), float("nan")).requires_grad_()
    dirty_teacher = torch.where(mask.unsqueeze(-1), teacher, float("inf"))
    dirty, _ = _distill_loss("gkd_jsd", dirty_logits, dirty_teacher, mask, logp.detach())
    g_dirty = torch.autograd.grad(dirty, dirty_logits)[0]
    torch.testing.assert_close(dirty, base)
    torch.testing.assert_close(g_dirty, g_base)
    assert torch.all(g_dirty[~mask] == 0)


def test_teacher_equal_to_policy_gives_zero_and_policy_term_keeps_its_weight():
    logits, _, mask, logp = _inputs(6)
    loss, stats = _distill_loss("gkd_jsd", logits, logits.detach().clone(), mask, logp)
    assert abs(loss.item()) < 1e-12
    adv = torch.randn(B, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    plain, _ = Objective(check_finite=False)(logp, logp.detach(), adv, mask)
    half, st = Objective(distill="reverse_kl", distill_policy_coef=0.5, check_finite=False)(
        logp, logp.detach(), adv, mask, logits=logits, teacher_logits=logits.detach())
    torch.testing.assert_close(half, 0.5 * plain)
    assert st["loss/distill"].abs().item() < 1e-12


def test_inputs_are_checked():
    logits, teacher, mask, logp = _inputs(7)
    obj = Objective(distill="reverse_kl")
    adv = torch.zeros(B, dtype=torch.float64)
    with pytest.raises(ValueError, match="logits is required"):
        obj(logp, logp.detach(), adv, mask, teacher_logits=teacher)
    with pytest.raises(ValueError, match="teacher_logits has shape"):
        obj(logp, logp.detach(), adv, mask, logits=logits, teacher_logits=teacher[..., :3])
    with pytest.raises(ValueError, match="teacher_ids"):
        Objective(distill="reverse_kl", distill_top_k=3)(logp, logp.detach(), adv, mask, logits=logits,
                                                          teacher_logits=teacher[..., :3])
    with pytest.raises(ValueError, match="jsd_beta"):
        Objective(distill="reverse_kl", jsd_beta=0.2)
    with pytest.raises(ValueError, match="out of range"):
        Objective(distill="gkd_jsd", jsd_beta=1.5)


def test_driver_needs_and_hosts_without_a_teacher_refuse():
    obj = Objective(distill="gkd_jsd", distill_top_k=5)
    needs = ObjectiveDriver(obj).needs
    assert needs.teacher and needs.teacher_top_k == 5
    assert not ObjectiveDriver(Objective()).needs.teacher
    host = Host("a host", frozenset({"entropy", "ref_logp"}))
    assert needs_of(obj, host).teacher
    with pytest.raises(UnsupportedError, match="teacher model's logits"):
        ObjectiveDriver(obj, host)
