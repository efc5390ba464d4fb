"""Token credit weights and gradient-norm helpers (SPEC §1.3)."""

import math

import pytest
import torch
from obj_helpers import make_batch

from lmpo.objectives import Objective, exact_grad_norm, lm_head_grad_norm, logits_grad_norm
from lmpo.objectives.parts.credit import gradient_adaptive_weights, temporal_decay_weights


def test_temporal_decay_hand_case():
    # valid = [1, 0, 1, 1], γ = 0.5: d = [1, 0, 0.5, 0.25]; normalised to sum 3: ×3/1.75
    valid = torch.tensor([[True, False, True, True]])
    lengths = torch.tensor([3.0])
    raw = temporal_decay_weights(valid, lengths, 0.5, normalize=False)
    torch.testing.assert_close(raw, torch.tensor([[1.0, 0.0, 0.5, 0.25]]))
    norm = temporal_decay_weights(valid, lengths, 0.5, normalize=True)
    torch.testing.assert_close(norm, torch.tensor([[1.0, 0.0, 0.5, 0.25]]) * 3 / 1.75)


def test_temporal_decay_loop_and_identity():
    g = torch.Generator().manual_seed(0)
    valid = torch.rand(4, 30, generator=g) > 0.3
    valid[2] = False
    lengths = valid.double().sum(-1)
    for gamma in (0.3, 0.9, 0.999):
        d = temporal_decay_weights(valid, lengths, gamma)
        for i in range(4):
            pos = [t for t in range(30) if valid[i, t]]
            raw = torch.tensor([gamma**k for k in range(len(pos))], dtype=torch.float64)
            if pos:
                torch.testing.assert_close(d[i, pos], raw * len(pos) / raw.sum())
        torch.testing.assert_close(d.sum(-1), lengths)
    torch.testing.assert_close(temporal_decay_weights(valid, lengths, 1.0), valid.double())


def test_gradient_adaptive_hand_case_and_invariance():
    # g = [0, ln 3 (masked 100 ignored)], τ = 1: softmax over valid = [1/4, 3/4], ×|y| = 2 → [0.5, 1.5]
    g = torch.tensor([[0.0, 100.0, math.log(3.0)]])
    valid = torch.tensor([[True, False, True]])
    c = gradient_adaptive_weights(g, valid, torch.tensor([2.0]), tau=1.0)
    torch.testing.assert_close(c, torch.tensor([[0.5, 0.0, 1.5]]))
    # shift invariance of the softmax; τ → large gives uniform weights
    torch.testing.assert_close(gradient_adaptive_weights(g + 7.0, valid, torch.tensor([2.0])), c)
    flat = gradient_adaptive_weights(g, valid, torch.tensor([2.0]), tau=1e9)
    torch.testing.assert_close(flat, torch.tensor([[1.0, 0.0, 1.0]]))


def test_credit_composes_with_gspo_as_in_seed():
    # seed 000 §2.2: with GSPO the per-token gradient term is s·A·c_t·∇logπ_t (then averaged over |y|)
    logp, old, adv, mask = make_batch(seed=3, drift=0.0)
    tgn = torch.rand(logp.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    obj = Objective(level="sequence", credit="gradient_adaptive", trust_region="none")
    loss, _ = obj(logp, old, adv, mask, token_grad_norm=tgn)
    (grad,) = torch.autograd.grad(loss, logp)
    m = mask.double()
    c = gradient_adaptive_weights(tgn, mask, m.sum(-1))
    s = torch.exp(((logp - old).detach() * c * m).sum(-1) / m.sum(-1))
    expected = -(s * adv)[:, None] * c * m / m.sum(-1, keepdim=True) / mask.shape[0]
    torch.testing.assert_close(grad, expected)


class _TinyLM(torch.nn.Module):
    def __init__(self, vocab=11, hidden=6, bias=False):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.mix = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=bias)

    def hidden(self, ids):
        h = self.embed(ids)
        return torch.tanh(self.mix(torch.cumsum(h, dim=1) / torch.arange(1, ids.shape[1] + 1)[:, None]))

    def forward(self, ids, attention_mask=None):
        return self.head(self.hidden(ids))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("scale", [1.0, 1 / 0.7])
def test_lm_head_norm_equals_autograd_restricted_to_head(bias, scale):
    torch.manual_seed(0)
    model = _TinyLM(bias=bias).double()
    ids = torch.randint(0, 11, (2, 9))
    response = 4
    head_params = list(model.head.parameters())
    exact = exact_grad_norm(model, ids, response, parameters=head_params, logit_scale=scale)
    with torch.no_grad():
        h = model.hidden(ids)[:, -response - 1 : -1]
        logits = model.head(h) * scale
    fast = lm_head_grad_norm(h, logits, ids[:, -response:], head_has_bias=bias, logit_scale=scale, chunk_rows=3)
    torch.testing.assert_close(fast, exact.float(), rtol=1e-5, atol=1e-6)
    # and the logits mode equals the gradient norm with respect to the logits
    z = logits.clone().requires_grad_()
    for b in range(2):
        for t in range(response):
            (gz,) = torch.autograd.grad(torch.log_softmax(z[b, t], -1)[ids[b, -response + t]], z)
            assert logits_grad_norm(logits, ids[:, -response:])[b, t].item() == pytest.approx(gz.norm().item(),
                                                                                              rel=1e-5)


def test_exact_grad_norm_full_parameters_hand_check():
    torch.manual_seed(1)
    model = _TinyLM().double()
    ids = torch.randint(0, 11, (1, 5))
    norms = exact_grad_norm(model, ids, 2)
    logits = model(ids)
    logp = torch.log_softmax(logits[0, 3], -1)[ids[0, 4]]
    grads = torch.autograd.grad(logp, list(model.parameters()))
    assert norms[0, 1].item() == pytest.approx(math.sqrt(sum(float((g**2).sum()) for g in grads)), rel=1e-6)
    # the head is only part of the parameters: full norms are at least the head norms
    head = exact_grad_norm(model, ids, 2, parameters=model.head.parameters())
    assert (norms >= head - 1e-6).all()


@pytest.mark.parametrize("level", ["sequence", "sequence_arith"])
def test_sequence_levels_apply_credit_once_inside_the_mean(level):
    # token-level advantages: ℓ_t = −s_c·A_t with s_c the credit-weighted mean; no second c_t factor
    logp, old, adv, mask = make_batch(seed=5, per_token_adv=True, drift=0.2)
    m = mask.double()
    lengths = m.sum(-1, keepdim=True)
    obj = Objective(level=level, credit="temporal_decay", decay_gamma=0.9, trust_region="none")
    loss, _ = obj(logp, old, adv, mask)
    c = temporal_decay_weights(mask, m.sum(-1), 0.9)
    r = (logp - old) * m
    if level == "sequence":
        s = torch.exp((c * r).sum(-1, keepdim=True) / lengths)
    else:
        s = (c * m * torch.exp(r)).sum(-1, keepdim=True) / lengths
    ref = (-(s * adv * m).sum(-1) / lengths.squeeze(-1)).mean()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(torch.autograd.grad(loss, logp)[0], torch.autograd.grad(ref, logp)[0])


def test_exact_grad_norm_with_wrapper_function_needs_parameters():
    torch.manual_seed(2)
    model = _TinyLM().double()
    ids = torch.randint(0, 11, (1, 6))

    def call(input_ids, attention_mask=None):
        return model(input_ids) * 2.0

    with pytest.raises(TypeError, match="pass parameters=model.parameters"):
        exact_grad_norm(call, ids, 2)
    wrapped = exact_grad_norm(call, ids, 2, parameters=model.parameters())
    direct = exact_grad_norm(model, ids, 2, logit_scale=2.0)
    torch.testing.assert_close(wrapped, direct)
