"""Selective log-softmax and chunked entropy against the textbook formulas; sequence_logprobs on the tiny model."""

import math

import pytest
import torch

from lmpo.generation.logprobs import (
    chunked_entropy,
    position_ids_from_mask,
    selective_log_softmax,
    selective_log_softmax_with_entropy,
    sequence_logprobs,
)
from lmpo.models import load_model_and_tokenizer


def naive(logits, index, temperature=1.0):
    compute = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logp = torch.log_softmax(logits.to(compute) / temperature, dim=-1)
    token = logp.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return token, entropy


def grads(y_list, x):
    return torch.autograd.grad(sum(y_list), x, retain_graph=True)[0]


# float32 paths: a few ulps at |log p| ~ 30 (logits of scale 3 at temperature 0.7)
TOL = {torch.float64: 1e-12, torch.float32: 5e-5, torch.bfloat16: 5e-5}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 2), (3, 5, 17), (2, 7, 301)])
@pytest.mark.parametrize("chunk_rows", [None, 1, 4, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_naive_values_and_grads(dtype, shape, chunk_rows, temperature):
    gen = torch.Generator().manual_seed(hash((shape, chunk_rows)) % 2**31)
    x = (3 * torch.randn(shape, generator=gen)).to(dtype).requires_grad_(True)
    index = torch.randint(0, shape[-1], shape[:-1], generator=gen)
    g_lp = torch.randn(shape[:-1], generator=gen, dtype=torch.float64)
    g_h = torch.randn(shape[:-1], generator=gen, dtype=torch.float64)

    ref_lp, ref_h = naive(x, index, temperature)
    lp = selective_log_softmax(x, index, chunk_rows=chunk_rows, temperature=temperature)
    h = chunked_entropy(x, chunk_rows=chunk_rows, temperature=temperature)
    lp2, h2 = selective_log_softmax_with_entropy(x, index, chunk_rows=chunk_rows, temperature=temperature)
    assert lp.dtype == ref_lp.dtype and lp.shape == shape[:-1]
    tol = TOL[dtype]
    torch.testing.assert_close(lp, ref_lp, rtol=tol, atol=tol)
    torch.testing.assert_close(h, ref_h, rtol=tol, atol=tol)
    torch.testing.assert_close(lp2, ref_lp, rtol=tol, atol=tol)
    torch.testing.assert_close(h2, ref_h, rtol=tol, atol=tol)

    cast = ref_lp.dtype
    gtol = 1e-12 if dtype == torch.float64 else (5e-5 if dtype == torch.float32 else 1e-2)
    # gradients of each output alone and of the joint function
    torch.testing.assert_close(
        grads([(lp * g_lp.to(cast)).sum()], x),
        grads([(ref_lp * g_lp.to(cast)).sum()], x),
        rtol=gtol,
        atol=gtol,
    )
    torch.testing.assert_close(
        grads([(h * g_h.to(cast)).sum()], x), grads([(ref_h * g_h.to(cast)).sum()], x), rtol=gtol, atol=gtol
    )
    torch.testing.assert_close(
        grads([(lp2 * g_lp.to(cast)).sum(), (h2 * g_h.to(cast)).sum()], x),
        grads([(ref_lp * g_lp.to(cast)).sum(), (ref_h * g_h.to(cast)).sum()], x),
        rtol=gtol,
        atol=gtol,
    )


def test_gradcheck_float64():
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 6, (2, 3))
    assert torch.autograd.gradcheck(lambda z: selective_log_softmax_with_entropy(z, index, 2, 0.8), (x,))
    assert torch.autograd.gradcheck(lambda z: chunked_entropy(z, 4), (x,))


def test_hand_computed_case():
    # logits [0, ln 3] -> p = [1/4, 3/4]; log p(1) = ln(3/4) = -0.28768...;
    # H = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.56233...; d log p(1)/dz = onehot - p = [-1/4, 1/4]
    x = torch.tensor([[[0.0, math.log(3.0)]]], requires_grad=True)
    lp, h = selective_log_softmax_with_entropy(x, torch.tensor([[1]]))
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert h.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)
    (grad,) = torch.autograd.grad(lp.sum(), x)
    torch.testing.assert_close(grad, torch.tensor([[[-0.25, 0.25]]]))


def test_invariant_to_logit_shift_and_chunking():
    # softmax is invariant to adding a constant per row; chunk size must not change a single bit of meaning
    x = torch.randn(4, 9, 50)
    index = torch.randint(0, 50, (4, 9))
    shifted = x + 100.0 * torch.randn(4, 9, 1)
    torch.testing.assert_close(
        selective_log_softmax(shifted, index), selective_log_softmax(x, index), atol=1e-4, rtol=0
    )
    torch.testing.assert_close(
        selective_log_softmax(x, index, chunk_rows=3), selective_log_softmax(x, index, chunk_rows=36)
    )


def test_bad_arguments():
    with pytest.raises(ValueError, match="index shape"):
        selective_log_softmax(torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        selective_log_softmax(torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), temperature=0.0)


def test_position_ids_from_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer("tiny", seed=0)


def _slow_logprobs(model, ids, response_length, temperature=1.0):
    """One unpadded sequence, full logits, textbook log-softmax."""
    logits = model(input_ids=ids[None]).logits[0].double() / temperature  # (L, V)
    logp = torch.log_softmax(logits, -1)
    targets = ids[-response_length:]
    return logp[-response_length - 1 : -1].gather(-1, targets[:, None]).squeeze(-1)


def test_sequence_logprobs_left_padding_matches_unpadded(tiny):
    model, tok = tiny
    prompts = ["12+34=", "5+6="]
    responses = ["46", "11"]
    enc = tok(prompts, padding=True, return_tensors="pt")  # left padding
    resp = torch.tensor(
        [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in responses]
    )
    ids = torch.cat([enc["input_ids"], resp], dim=1)
    mask = torch.cat([enc["attention_mask"], torch.ones_like(resp)], dim=1)
    out = sequence_logprobs(
        model,
        ids,
        mask,
        response_length=resp.shape[1],
        temperature=0.9,
        with_entropy=True,
        return_hidden=True,
    )
    assert out.logprobs.shape == (2, 3) and out.entropy.shape == (2, 3) and out.hidden.shape == (2, 3, 128)
    for row in range(len(prompts)):
        unpadded = ids[row][mask[row].bool()]
        ref = _slow_logprobs(model, unpadded, 3, temperature=0.9).float()
        torch.testing.assert_close(out.logprobs[row], ref, atol=2e-5, rtol=0)
    # the hidden states are the lm_head inputs at the predicting positions
    logits = model.lm_head(out.hidden).double() / 0.9
    ref_lp = torch.log_softmax(logits, -1).gather(-1, resp[..., None]).squeeze(-1).float()
    torch.testing.assert_close(out.logprobs, ref_lp, atol=2e-5, rtol=0)
    # gradients flow to the model
    out.logprobs.sum().backward()
    assert model.lm_head.weight.grad is not None and torch.isfinite(model.lm_head.weight.grad).all()
    model.zero_grad(set_to_none=True)


def test_sequence_logprobs_ignores_garbage_after_eos(tiny):
    # tokens after EOS (mask 0) must not change log-probs at earlier positions
    model, tok = tiny
    enc = tok(["7+8="], return_tensors="pt")
    tail_a = torch.tensor([[6, 10, tok.eos_token_id, tok.pad_token_id, tok.pad_token_id]])
    tail_b = torch.tensor([[6, 10, tok.eos_token_id, 42, 57]])
    resp_mask = torch.tensor([[1, 1, 1, 0, 0]])
    outs = []
    for tail in (tail_a, tail_b):
        ids = torch.cat([enc["input_ids"], tail], 1)
        mask = torch.cat([enc["attention_mask"], resp_mask], 1)
        with torch.no_grad():
            outs.append(sequence_logprobs(model, ids, mask, 5).logprobs[:, :3])
    torch.testing.assert_close(outs[0], outs[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [33, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.8])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_inplace_backward_matches_naive(with_entropy, temperature, vocab, dtype):
    # τ = 1 without entropy is the path where the softmax kernel writes over its own input
    gen = torch.Generator().manual_seed(7)
    base = (3 * torch.randn(3, 4, vocab, generator=gen)).to(dtype)
    index = torch.randint(0, vocab, (3, 4), generator=gen)
    g = torch.randn(3, 4, generator=gen)
    ref_x = base.clone().requires_grad_(True)
    ref_lp, ref_h = naive(ref_x, index, temperature)
    ((ref_lp + ref_h) * g if with_entropy else ref_lp * g).sum().backward()
    x = base.clone().requires_grad_(True)
    if with_entropy:
        lp, h = selective_log_softmax_with_entropy(x, index, 5, temperature, inplace_backward=True)
        ((lp + h) * g).sum().backward()
    else:
        lp = selective_log_softmax(x, index, 5, temperature, inplace_backward=True)
        (lp * g).sum().backward()
    torch.testing.assert_close(lp, ref_lp, atol=5e-5, rtol=1e-5)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(x.grad, ref_x.grad, atol=tol, rtol=tol)
    # the gradient lives in the logits' own storage: no second (B, T, V) buffer was allocated
    assert x.grad.data_ptr() == x.data_ptr()


def test_sequence_logprobs_parameter_grads_match_naive(tiny):
    model, tok = tiny
    enc = tok(["12+34=", "5+6="], padding=True, return_tensors="pt")
    resp = torch.tensor([[8, 10, tok.eos_token_id], [5, 5, tok.eos_token_id]])
    ids = torch.cat([enc["input_ids"], resp], 1)
    mask = torch.cat([enc["attention_mask"], torch.ones_like(resp)], 1)
    weights = torch.tensor([[1.0, -2.0, 0.5], [0.3, 0.0, 1.5]])

    out = sequence_logprobs(model, ids, mask, 3, temperature=0.9, with_entropy=True)
    ((out.logprobs + 0.1 * out.entropy) * weights).sum().backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    ref_lp, ref_h = naive(logits[:, -4:-1], resp, 0.9)
    ((ref_lp + 0.1 * ref_h) * weights).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(ours[name], p.grad, atol=1e-5, rtol=1e-4, msg=name)
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("chunk_rows", [1, 3, 6, 100])
@pytest.mark.parametrize("inplace", [False, True])
def test_strided_slice_2d_and_4d_inputs(chunk_rows, inplace):
    # out.logits[:, :-1] cannot be flattened to (B·T, V) without a copy; blocks walk it as it is
    gen = torch.Generator().manual_seed(3)
    full = torch.randn(3, 6, 40, generator=gen)
    index = torch.randint(0, 40, (3, 5), generator=gen)
    g = torch.randn(3, 5, generator=gen)
    ref_full = full.clone().requires_grad_(True)
    ref_lp, ref_h = naive(ref_full[:, :-1], index)
    ((ref_lp + ref_h) * g).sum().backward()
    ours_full = full.clone().requires_grad_(True)
    lp, h = selective_log_softmax_with_entropy(ours_full[:, :-1], index, chunk_rows, inplace_backward=inplace)
    ((lp + h) * g).sum().backward()
    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(ours_full.grad, ref_full.grad, atol=1e-6, rtol=1e-5)
    # 2-D (N, V) and 4-D (A, B, T, V) inputs
    flat, flat_index = full.reshape(-1, 40), torch.randint(0, 40, (18,), generator=gen)
    torch.testing.assert_close(
        selective_log_softmax(flat, flat_index, chunk_rows), naive(flat, flat_index)[0]
    )
    four, four_index = full.reshape(3, 2, 3, 40), torch.randint(0, 40, (3, 2, 3), generator=gen)
    torch.testing.assert_close(chunked_entropy(four, chunk_rows), naive(four, four_index)[1])


@pytest.mark.parametrize("with_bias, temperature, chunk_rows", [(False, 1.0, 3), (True, 0.7, 5), (True, 1.3, 64)])
def test_fused_head_matches_the_naive_head_and_its_gradients(with_bias, temperature, chunk_rows):
    from lmpo.generation.logprobs import head_log_softmax

    g = torch.Generator().manual_seed(3)
    head = torch.nn.Linear(8, 11, bias=with_bias).double()
    hidden = torch.randn(2, 7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 11, (2, 7), generator=g)
    w_lp, w_h = torch.randn(2, 7, generator=g, dtype=torch.float64), torch.randn(2, 7, generator=g, dtype=torch.float64)

    def naive():
        logp_all = torch.log_softmax(head(hidden) / temperature, -1)
        return logp_all.gather(-1, index[..., None])[..., 0], -(logp_all.exp() * logp_all).sum(-1)

    lp, h = head_log_softmax(hidden, head, index, temperature, with_entropy=True, chunk_rows=chunk_rows)
    lp_ref, h_ref = naive()
    torch.testing.assert_close(lp, lp_ref.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h, h_ref.float(), rtol=1e-5, atol=1e-6)
    params = [hidden, *head.parameters()]
    ours = torch.autograd.grad((lp * w_lp + h * w_h).sum(), params)
    ref = torch.autograd.grad((lp_ref * w_lp + h_ref * w_h).sum(), params)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("group_size", [None, 3])
def test_policy_logprobs_fused_head_equals_logits_path(tiny, group_size):
    from lmpo.generation import HFRollout, policy_logprobs

    model, tok = tiny
    ro = HFRollout(model, tok, max_new_tokens=5).generate(["7+8=", "12+3=", "1+1="], 3, seed=0)
    mask = ro.completion_mask.bool()
    out = {}
    for fused in (False, True):
        model.zero_grad()
        res = policy_logprobs(model, ro.input_ids, ro.attention_mask, ro.completion_ids, temperature=0.8,
                              with_entropy=True, group_size=group_size, fused_head=fused)
        ((res.logp * mask).sum() + 0.3 * (res.entropy * mask).sum()).backward()
        out[fused] = (res.logp.detach(), res.entropy.detach(), [p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(out[True][0][mask], out[False][0][mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[True][1][mask], out[False][1][mask], rtol=1e-5, atol=1e-5)
    for a, b in zip(out[True][2], out[False][2]):  # float32 sums in another order: ~1e-6 apart
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5)
