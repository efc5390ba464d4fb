"""Padding-free packing (lmpo.generation.packing): the same log-probs and gradients as the padded forward."""

from __future__ import annotations

import pytest
import torch

from lmpo.generation import policy_logprobs
from lmpo.generation.packing import pack, packed_forward, packed_policy_logprobs
from lmpo.models import CharTokenizer, build_tiny_model


def _model(dtype=torch.float64):
    tok = CharTokenizer()
    return build_tiny_model(tok, seed=0, dtype=dtype, hidden_size=32, num_layers=2, num_heads=2,
                            intermediate_size=64)


def _batch(prompt_lengths=(3, 7, 1, 5), completion_lengths=(4, 1, 6, 6), seed=0):
    """Left-padded prompts then right-padded completions, as the rollout engines return them."""
    g = torch.Generator().manual_seed(seed)
    P, T = max(prompt_lengths), max(completion_lengths)
    B = len(prompt_lengths)
    ids = torch.randint(4, 90, (B, P + T), generator=g)
    attn = torch.zeros(B, P + T, dtype=torch.long)
    for b, (p, c) in enumerate(zip(prompt_lengths, completion_lengths)):
        attn[b, P - p:P + c] = 1
        ids[b, :P - p] = 0  # pad: must not matter
        ids[b, P + c:] = 0
    return ids, attn, ids[:, P:], attn[:, P:].bool()


def test_pack_by_hand():
    # two sequences: prompt [a b] + completion [c], prompt [d] + completion [e f]
    ids = torch.tensor([[10, 11, 12, 0], [0, 13, 14, 15]])
    attn = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])
    packed, positions, predict = pack(ids, attn, 2)
    assert packed.tolist() == [[10, 11, 12, 13, 14, 15]]
    assert positions.tolist() == [[0, 1, 2, 0, 1, 2]]
    # completion columns: (12, pad) predicted at packed 1 and masked; (14, 15) predicted at packed 3 and 4
    assert predict.tolist() == [[1, 0], [3, 4]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_log_probs_and_gradients_equal_the_padded_path(temperature):
    model = _model()
    ids, attn, completion, mask = _batch()
    padded = policy_logprobs(model, ids, attn, completion, temperature=temperature, with_entropy=True)
    loss = (padded.logp * mask).sum() + (padded.entropy * mask).sum()
    g_padded = torch.autograd.grad(loss, list(model.parameters()))
    packed = packed_forward(model, ids, attn, completion, temperature=temperature, with_entropy=True)
    torch.testing.assert_close(packed.logp[mask], padded.logp[mask], rtol=0, atol=1e-10)
    torch.testing.assert_close(packed.entropy[mask], padded.entropy[mask], rtol=0, atol=1e-10)
    loss = (packed.logp * mask).sum() + (packed.entropy * mask).sum()
    g_packed = torch.autograd.grad(loss, list(model.parameters()))
    for a, b in zip(g_packed, g_padded):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_float32_and_no_grad_microbatches():
    model = _model(torch.float32)
    ids, attn, completion, mask = _batch(prompt_lengths=(2, 9, 4, 4, 1, 6), completion_lengths=(8, 3, 1, 8, 5, 2))
    padded = policy_logprobs(model, ids, attn, completion, with_grad=False, seqs_per_microbatch=4)
    packed = packed_policy_logprobs(model, ids, attn, completion, with_grad=False, seqs_per_microbatch=4)
    torch.testing.assert_close(packed.logp[mask], padded.logp[mask], rtol=1e-5, atol=1e-5)
    assert model.training


def test_pad_tokens_change_nothing_and_an_empty_prompt_is_refused():
    model = _model()
    ids, attn, completion, mask = _batch()
    base = packed_forward(model, ids, attn, completion).logp
    other = torch.where(attn.bool(), ids, 77)  # different pad ids
    torch.testing.assert_close(packed_forward(model, other, attn, other[:, -completion.shape[1]:]).logp[mask],
                               base[mask], rtol=0, atol=0)
    attn2 = attn.clone()
    attn2[2, :-completion.shape[1]] = 0
    with pytest.raises(ValueError, match="at least one prompt token"):
        packed_forward(model, ids, attn2, completion)

