"""lmpo's verl policy losses on verl's multi-turn response masks (verl 0.9.1, CPU).

In verl's agent loop (``verl/experimental/agent_loop``) a multi-turn rollout is one response in which the model's
turns and the tool / environment observations alternate; ``response_mask`` is 1 on the model's tokens and 0 on
the observations and the padding (``AgentLoopWorker.generate_sequences``' docstring)::

    responses:     |<- LLM generation ->|<- tool_calls ->|<- LLM generation ->|<- padding ->|
    response_mask: | 1, 1, 1, ..., 1, 1 | 0, 0, .., 0, 0 | 1, 1, 1, ..., 1, 1 | 0, 0, ..., 0|

The engine counts ``batch_num_tokens`` on that mask (``loss_mask = response_mask``) and ``ppo_loss`` hands it to
the policy loss as a bool tensor. Checked here with masks of that shape (several observation runs, a response
cut inside an observation, a one-turn response, an empty row):

- every preset verl can run gives exactly zero gradient on observation tokens, and its loss ignores whatever
  log-probs, advantages and weights sit there;
- ``lmpo_grpo`` (+ dual clip) equals verl's ``vanilla`` loss under every ``loss_agg_mode``, with and without
  global batch info, and ``lmpo_gspo`` verl's ``gspo``; counting the observations as the policy's tokens breaks
  the equality (so the check can fail);
- the same through verl's own actor loss ``verl.workers.utils.losses.ppo_loss``, fed the way verl's engine
  feeds it (padded prompts and responses, unpadded log-probs, token count from the mask).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding

import lmpo.integrations.verl as lv  # registers the lmpo_* losses
from lmpo.objectives import PRESETS, Objective

VERL_MODES = tuple(lv.AGGREGATION_FROM_VERL)
REFUSED = {"adaptive_entropy", "grad_adaptive"}  # need entropies / gradient norms the hook does not receive

#: per row: alternating (model, observation, model, …) run lengths, as verl's agent loop appends them
TURNS = [
    [3, 4, 2, 3, 2],  # model, tool, model, tool, model
    [5],  # one turn, no tool call
    [2, 6, 4],  # model, tool, model
    [1, 2, 1, 2, 1, 2, 3],  # several short turns
    [4, 5],  # cut inside an observation (response_length reached)
    [6, 1, 2],
    [],  # empty response: excluded from verl's sequence count
]


def multiturn_mask(turns=TURNS, T=20):
    """(B, T) bool ``response_mask`` and (B, T) response attention mask, built as verl's agent loop builds them:
    1 per model token, 0 per observation token, right padding; the mask times the attention mask."""
    rows, attention = [], []
    for runs in turns:
        mask = [int(k % 2 == 0) for k, n in enumerate(runs) for _ in range(n)][:T]
        rows.append(mask + [0] * (T - len(mask)))
        attention.append([1] * len(mask) + [0] * (T - len(mask)))
    attention = torch.tensor(attention)
    return (torch.tensor(rows) * attention).bool(), attention


def batch(seed, noise=0.3, T=20):
    g = torch.Generator().manual_seed(seed)
    mask, attention = multiturn_mask(T=T)
    B = mask.shape[0]
    old = -torch.rand(B, T, generator=g) * 3
    logp = old + noise * torch.randn(B, T, generator=g)
    adv = torch.randn(B, 1, generator=g).expand(B, T).clone()  # verl's GRPO: one advantage per response
    is_weights = torch.rand(B, T, generator=g) * 1.5
    return old, logp, adv, mask, attention, is_weights


def actor_config(loss_agg_mode="token-mean", global_batch_info=None, lmpo=None, loss_mode="vanilla", **kwargs):
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
                         clip_ratio_low=0.2, clip_ratio_high=0.2, loss_agg_mode=loss_agg_mode,
                         policy_loss=lv.LmpoPolicyLossConfig(loss_mode=loss_mode, lmpo=dict(lmpo or {})), **kwargs)
    config.global_batch_info.update(global_batch_info or {})
    return config


def loss_and_grad(fn, old, logp, *args, **kwargs):
    logp = logp.clone().requires_grad_()
    loss, metrics = fn(old, logp, *args, **kwargs)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, metrics


def test_the_masks_have_verls_multiturn_shape():
    mask, attention = multiturn_mask()
    observation = attention.bool() & ~mask
    assert observation.any(-1).sum() >= 4  # observations inside responses
    starts = (mask[:, 1:] & ~mask[:, :-1]).sum(-1)  # a model turn starting after an observation
    assert int(starts.max()) >= 3 and not mask[-1].any()


@pytest.mark.parametrize("name", [n for n in PRESETS if n not in REFUSED])
def test_observation_tokens_get_zero_gradient_and_do_not_count(name):
    mode = lv.AGGREGATION_TO_VERL[Objective.preset(name).aggregation]
    old, logp, adv, mask, _, w = batch(seed=len(name), noise=2e-3 if Objective.preset(name).is_sequence_level
                                       else 0.3)
    fn = get_policy_loss_fn(f"lmpo_{name}")
    config = actor_config(mode)
    torch.manual_seed(0)  # clip_cov draws from the global RNG
    loss, grad, _ = loss_and_grad(fn, old, logp, adv, mask, mode, config, w)
    assert torch.equal(grad[~mask], torch.zeros_like(grad[~mask]))
    assert grad[mask].abs().sum() > 0
    # whatever sits on the observation tokens (log-probs, advantages, weights) does not change the loss
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(logp.shape, generator=g) * ~mask

    def moved(x, scale):
        return x + scale * noise

    torch.manual_seed(0)
    loss2, grad2, _ = loss_and_grad(fn, moved(old, 2.0), moved(logp, -2.0), moved(adv, 3.0), mask, mode, config,
                                    moved(w, 0.5).abs())
    torch.testing.assert_close(loss2, loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad2, grad, rtol=1e-6, atol=1e-7)


def _vanilla_pair(mode, global_info):
    info = {"dp_size": 2, "batch_num_tokens": 70, "global_batch_size": 12, "loss_scale_factor": 24} \
        if global_info else {}
    return actor_config(mode, global_batch_info=info, lmpo={"dual_clip": True, "dual_clip_c": 3.0})


@pytest.mark.parametrize("mode", VERL_MODES)
@pytest.mark.parametrize("global_info", [False, True])
def test_grpo_equals_verl_vanilla_on_multiturn_masks(mode, global_info):
    old, logp, adv, mask, attention, w = batch(seed=3, noise=0.8)  # ratios beyond 1 ± 0.2 and beyond c = 3
    config = _vanilla_pair(mode, global_info)
    lmpo_grpo = get_policy_loss_fn("lmpo_grpo")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the preset's own aggregation differs for most modes (warned)
        got = loss_and_grad(lmpo_grpo, old, logp, adv, mask, mode, config, w)
        # the check can fail: counting the observations as the policy's tokens gives another loss / gradient
        wrong = loss_and_grad(lmpo_grpo, old, logp, adv, attention.bool(), mode, config, w)
    want = loss_and_grad(get_policy_loss_fn("vanilla"), old, logp, adv, mask, mode, config, w)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-7)
    assert got[2]["actor/pg_clipfrac"] == pytest.approx(want[2]["actor/pg_clipfrac"], abs=1e-6)
    assert got[2]["actor/pg_clipfrac_lower"] == pytest.approx(want[2]["actor/pg_clipfrac_lower"], abs=1e-6)
    assert not torch.allclose(wrong[1], want[1], rtol=1e-3, atol=1e-6)


def test_gspo_equals_verl_gspo_on_multiturn_masks():
    """The sequence-level ratio is the geometric mean over the model's tokens only, in both."""
    old, logp, adv, mask, attention, _ = batch(seed=5, noise=0.02)
    mode = "seq-mean-token-mean"
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=3e-4,
                         clip_ratio_low=3e-4, clip_ratio_high=4e-4, loss_agg_mode=mode)
    got = loss_and_grad(get_policy_loss_fn("lmpo_gspo"), old, logp, adv, mask, mode, config)
    want = loss_and_grad(get_policy_loss_fn("gspo"), old, logp, adv, mask, mode, config)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-8)
    assert 0 < want[2]["actor/pg_clipfrac"] < 1
    wrong = loss_and_grad(get_policy_loss_fn("lmpo_gspo"), old, logp, adv, attention.bool(), mode, config)
    assert not torch.allclose(wrong[1], want[1], rtol=1e-3, atol=1e-8)


def engine_batch(seed, P=5):
    """What verl's engine hands ``ppo_loss``: left-padded prompts, right-padded responses (observations
    included), the multi-turn ``response_mask``, and log-probs unpadded (one row of prompt + response tokens
    after another, each response token's log-prob one position before it, as ``no_padding_2_padding`` reads)."""
    old, logp, adv, mask, attention, _ = batch(seed, noise=0.8)
    B, T = mask.shape
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(1, P + 1, (B,), generator=g)
    prompt_mask = (torch.arange(P).unsqueeze(0) >= P - prompt_lens.unsqueeze(1)).long()
    attention_mask = torch.cat([prompt_mask, attention], 1)
    data = tu.get_tensordict({
        "prompts": torch.randint(4, 50, (B, P), generator=g) * prompt_mask,
        "responses": torch.randint(4, 50, (B, T), generator=g) * attention,
        "attention_mask": attention_mask,
        "response_mask": mask.long(),
        "old_log_probs": old,
        "advantages": adv,
    })
    # the engine's counts: tokens of loss_mask (= response_mask) over the data-parallel group, one rank here
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=B)
    return data, logp, prompt_lens, attention.sum(-1)


def unpadded(logp, prompt_lens, response_lens):
    """(total tokens,) log-probs in verl's unpadded layout, differentiable in ``logp``."""
    pieces = []
    for row, (p, r) in enumerate(zip(prompt_lens.tolist(), response_lens.tolist())):
        before = torch.zeros(p - 1)
        pieces += [before, logp[row, :r], torch.zeros(1)]
    return torch.cat(pieces)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_verls_actor_loss_runs_lmpo_on_multiturn_masks(mode):
    """verl's ``ppo_loss`` with ``loss_mode=lmpo_grpo`` (+ dual clip) equals it with ``vanilla``; observation
    tokens get zero gradient through verl's whole actor-loss path."""
    data, logp, prompt_lens, response_lens = engine_batch(seed=7)
    mask = data["response_mask"].bool()
    results = {}
    for loss_mode in ("lmpo_grpo", "vanilla"):
        config = actor_config(mode, lmpo={"dual_clip": True, "dual_clip_c": 3.0}, loss_mode=loss_mode,
                              entropy_coeff=0.0, use_kl_loss=False)
        leaf = logp.clone().requires_grad_()
        flat = unpadded(leaf, prompt_lens, response_lens)
        on_responses = (torch.arange(logp.shape[1]) < response_lens.unsqueeze(1))
        assert torch.equal(no_padding_2_padding(flat, data)[on_responses], logp[on_responses])  # verl's reading
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss, metrics = ppo_loss(config, {"log_probs": flat}, data)
        (grad,) = torch.autograd.grad(loss, leaf)
        assert ("loss/policy" in metrics) == (loss_mode == "lmpo_grpo")  # verl called the registered lmpo loss
        results[loss_mode] = loss.detach(), grad
    got, want = results["lmpo_grpo"], results["vanilla"]
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-7)
    assert torch.equal(got[1][~mask], torch.zeros_like(got[1][~mask])) and got[1][mask].abs().sum() > 0
