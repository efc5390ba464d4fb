"""Contract tests of lmpo.integrations.verl against the real verl 0.9.1 (CPU, no cluster).

- every preset through ``get_policy_loss_fn("lmpo_<name>")`` equals the core ``Objective`` (loss and
  gradient), with verl's global-batch normalisation and rollout-correction weights;
- cross-checks against verl's own losses: ``vanilla`` (= lmpo grpo + dual clip, every loss_agg_mode),
  ``gspo``, ``clip_cov`` (selection forced) and ``kl_cov``;
- registration, ``external_lib`` import, the example Hydra config and refusals.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn
from verl.workers.config import ActorConfig

import lmpo.integrations.verl as lv  # registers the lmpo_* losses
from lmpo.objectives import PRESETS, Objective

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNSUPPORTED = {"adaptive_entropy": "entropies", "grad_adaptive": "gradient norms"}
VERL_MODES = tuple(lv.AGGREGATION_FROM_VERL)


def actor_config(loss_agg_mode="token-mean", clip_low=0.2, clip_high=0.2, global_batch_info=None, lmpo=None,
                 **policy_loss):
    config = ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=clip_low, clip_ratio_low=clip_low,
        clip_ratio_high=clip_high, loss_agg_mode=loss_agg_mode,
        policy_loss=lv.LmpoPolicyLossConfig(lmpo=dict(lmpo or {}), **policy_loss),
    )
    config.global_batch_info.update(global_batch_info or {})
    return config


def batch(seed, B=6, T=11, noise=0.3, per_token_adv=False, empty_row=True):
    """Random verl inputs: (B, T) log-probs, advantages broadcast per sequence (verl's GRPO) or per token."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    if empty_row:
        lengths[-1] = 0  # verl excludes all-masked rows from its sequence count
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    old = -torch.rand(B, T, generator=g) * 3
    logp = old + noise * torch.randn(B, T, generator=g)
    adv = torch.randn(B, T, generator=g) if per_token_adv else torch.randn(B, 1, generator=g).expand(B, T).clone()
    is_weights = torch.rand(B, T, generator=g) * 1.5
    return old, logp, adv, mask, is_weights


def loss_and_grad(fn, old, logp, *args, **kwargs):
    logp = logp.clone().requires_grad_()
    loss, metrics = fn(old, logp, *args, **kwargs)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, metrics


def test_every_preset_is_registered_and_resolves():
    assert lv.REGISTERED_LOSS_MODES == tuple(f"lmpo_{name}" for name in PRESETS)
    for name in PRESETS:
        fn = get_policy_loss_fn(f"lmpo_{name}")
        assert fn is POLICY_LOSS_REGISTRY[f"lmpo_{name}"] and fn.__name__ == f"lmpo_{name}"


def test_external_lib_import_path_registers():
    """What verl runs in each Ray worker for actor_rollout_ref.model.external_lib."""
    from verl.utils.import_utils import import_external_libs

    import_external_libs("lmpo.integrations.verl")
    assert get_policy_loss_fn("lmpo_gspo") is POLICY_LOSS_REGISTRY["lmpo_gspo"]
    assert lv.register_lmpo_losses() == list(lv.REGISTERED_LOSS_MODES)  # idempotent


@pytest.mark.parametrize("name", list(PRESETS))
def test_adapter_equals_core_for_every_preset(name):
    """The preset under its own aggregation, global batch info of a 2-rank step, and rollout IS weights."""
    preset = Objective.preset(name)
    mode = lv.AGGREGATION_TO_VERL[preset.aggregation]
    fn = get_policy_loss_fn(f"lmpo_{name}")
    old, logp, adv, mask, w = batch(seed=len(name))
    if name in UNSUPPORTED:
        with pytest.raises(NotImplementedError, match=UNSUPPORTED[name]):
            fn(old, logp, adv, mask, mode, actor_config(mode))
        return
    info = {"dp_size": 2, "batch_num_tokens": 70, "global_batch_size": 13, "loss_scale_factor": None}
    # verl's rollout-correction weights become correction="given": they multiply the per-token policy terms
    core = preset.replace(norm_constant=float(mask.shape[-1]) if preset.aggregation == "seq_sum_norm" else None,
                          correction="given")
    norm = {"num_tokens": 35.0} if preset.aggregation == "token_mean" else {"num_seqs": 6.5}  # global / dp_size
    torch.manual_seed(0)  # clip_cov draws from the global RNG in both paths
    want_loss, want_grad, _ = loss_and_grad(
        lambda o, lp, *a: core(lp, o, adv, mask, rollout_is_weights=w, **norm), old, logp)
    torch.manual_seed(0)
    got_loss, got_grad, metrics = loss_and_grad(fn, old, logp, adv, mask, mode, actor_config(mode, global_batch_info=info),
                                                w)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-6, atol=1e-7)
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "loss/policy"} <= set(metrics)
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics["loss/policy"] == pytest.approx(float(want_loss), rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("mode", VERL_MODES)
@pytest.mark.parametrize("global_info", [False, True])
def test_grpo_with_dual_clip_equals_verl_vanilla(mode, global_info):
    """verl's ``vanilla`` PPO loss is lmpo grpo + dual clip (c = 3) under every aggregation and normaliser."""
    old, logp, adv, mask, w = batch(seed=3, noise=0.8)  # large noise: ratios beyond 1 ± 0.2 and beyond c = 3
    info = {"dp_size": 4, "batch_num_tokens": 123, "global_batch_size": 21, "loss_scale_factor": 16} if global_info else {}
    config = actor_config(mode, global_batch_info=info, lmpo={"dual_clip": True, "dual_clip_c": 3.0})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # aggregation differs from the preset's: warned, tested elsewhere
        got = loss_and_grad(get_policy_loss_fn("lmpo_grpo"), old, logp, adv, mask, mode, config, w)
    want = loss_and_grad(get_policy_loss_fn("vanilla"), old, logp, adv, mask, mode, config, w)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-7)
    # the clip fraction is the same event (clip active); verl's lower fraction counts dual-clipped tokens
    assert got[2]["actor/pg_clipfrac"] == pytest.approx(want[2]["actor/pg_clipfrac"], abs=1e-6)
    assert got[2]["actor/pg_clipfrac_lower"] == pytest.approx(want[2]["actor/pg_clipfrac_lower"], abs=1e-6)
    assert want[2]["actor/pg_clipfrac"] > 0 and want[2]["actor/pg_clipfrac_lower"] > 0  # both regimes exercised


@pytest.mark.parametrize(("preset", "per_token_adv"), [("gspo", False), ("gspo_token", False), ("gspo_token", True)])
def test_gspo_equals_verl_gspo(preset, per_token_adv):
    """verl's ``gspo`` is GSPO-token: equal to lmpo gspo_token always, to gspo when A is constant per sequence
    (sequence-level gspo with per-token advantages is a different objective, so that pair is not compared)."""
    old, logp, adv, mask, _ = batch(seed=5, noise=0.02, per_token_adv=per_token_adv)
    mode = "seq-mean-token-mean"
    config = actor_config(mode, clip_low=3e-4, clip_high=4e-4)
    got = loss_and_grad(get_policy_loss_fn(f"lmpo_{preset}"), old, logp, adv, mask, mode, config)
    want = loss_and_grad(get_policy_loss_fn("gspo"), old, logp, adv, mask, mode, config)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-8)
    assert got[2]["actor/pg_clipfrac"] == pytest.approx(want[2]["actor/pg_clipfrac"], abs=1e-6)
    assert 0 < want[2]["actor/pg_clipfrac"] < 1  # the 3e-4/4e-4 clip binds for some tokens only


def test_clip_cov_equals_verl_when_selection_is_forced():
    """With clip_cov_ratio = 1 both pick every candidate (valid, not trust-clipped, lb < cov < ub).

    Differences left out by forcing the selection: verl draws with torch.randperm from the global RNG and
    lmpo with uniform keys from a passed torch.Generator, so the random subset differs when r·N < #candidates.
    """
    old, logp, adv, mask, _ = batch(seed=11, B=8, T=16, noise=0.3, empty_row=False)
    adv = adv * 4  # covariances of order 1 so that (lb, ub) = (0.5, 5) holds candidates
    config = actor_config("token-mean", clip_cov_ratio=1.0, clip_cov_lb=0.5, clip_cov_ub=5.0,
                          lmpo={"clip_cov_ratio": 1.0, "clip_cov_lb": 0.5, "clip_cov_ub": 5.0})
    got = loss_and_grad(get_policy_loss_fn("lmpo_clip_cov"), old, logp, adv, mask, "token-mean", config)
    want = loss_and_grad(get_policy_loss_fn("clip_cov"), old, logp, adv, mask, "token-mean", config)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-7)
    # verl's pg_clipfrac for clip_cov is the fraction of cov-clipped tokens
    assert got[2]["cov/clipped_tokens"] / float(mask.sum()) == pytest.approx(want[2]["actor/pg_clipfrac"])
    assert got[2]["cov/clipped_tokens"] >= 3


def test_clip_cov_random_selection_picks_the_same_number():
    """At the default-like small ratio the subsets are random in both; their size max(1, ⌊r·N⌋) agrees."""
    old, logp, adv, mask, _ = batch(seed=11, B=8, T=16, noise=0.3, empty_row=False)
    adv = adv * 4
    config = actor_config("token-mean", clip_cov_ratio=0.05, clip_cov_lb=0.5, clip_cov_ub=5.0,
                          lmpo={"clip_cov_ratio": 0.05, "clip_cov_lb": 0.5, "clip_cov_ub": 5.0})
    got = loss_and_grad(get_policy_loss_fn("lmpo_clip_cov"), old, logp, adv, mask, "token-mean", config)[2]
    want = loss_and_grad(get_policy_loss_fn("clip_cov"), old, logp, adv, mask, "token-mean", config)[2]
    expected = max(1, int(0.05 * float(mask.sum())))
    assert got["cov/clipped_tokens"] == expected
    assert want["actor/pg_clipfrac"] * float(mask.sum()) == pytest.approx(expected)


def test_kl_cov_equals_verl_kl_cov():
    """verl's kl_cov: unclipped −A·ρ plus ppo_kl_coef·|log ρ| on the top ⌊kl_cov_ratio·N⌋ tokens by cov.

    Units: verl 0.9.1's kl_cov_ratio is already a fraction (default 2e-4) and lmpo's kl_cov_frac too
    (default 2e-3); the original PRIME-RL code's k_percent was a percentage. Coefficients: verl
    ppo_kl_coef 0.1 by default, lmpo kl_cov_coef 1.0. Set equal here.
    """
    old, logp, adv, mask, _ = batch(seed=13, B=8, T=16, noise=0.3, empty_row=False)
    config = actor_config("token-mean", kl_cov_ratio=0.05, ppo_kl_coef=0.1,
                          lmpo={"kl_cov_frac": 0.05, "kl_cov_coef": 0.1})
    got = loss_and_grad(get_policy_loss_fn("lmpo_kl_cov"), old, logp, adv, mask, "token-mean", config)
    want = loss_and_grad(get_policy_loss_fn("kl_cov"), old, logp, adv, mask, "token-mean", config)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-7)
    assert got[2]["cov/penalised_tokens"] == max(1, int(0.05 * float(mask.sum())))


def test_overrides_come_from_policy_loss_lmpo():
    old, logp, adv, mask, _ = batch(seed=17, noise=0.5)
    fn = get_policy_loss_fn("lmpo_dapo")
    loose = fn(old, logp, adv, mask, "token-mean", actor_config(lmpo={"eps_high": 10.0, "eps_low": 0.9}))
    default = fn(old, logp, adv, mask, "token-mean", actor_config())
    no_clip = Objective.preset("dapo", trust_region="none")(logp, old, adv, mask)
    # with ε this wide nothing is clipped: the loss is the unclipped one, unlike the preset's
    torch.testing.assert_close(loose[0], no_clip[0])
    assert loose[1]["actor/pg_clipfrac"] == 0.0 < default[1]["actor/pg_clipfrac"]
    with pytest.raises(TypeError, match="unknown Objective field"):
        fn(old, logp, adv, mask, "token-mean", actor_config(lmpo={"eps_hi": 0.3}))
    with pytest.raises(ValueError, match="loss_agg_mode"):
        fn(old, logp, adv, mask, "token-mean", actor_config(lmpo={"aggregation": "token_mean"}))


def test_aggregation_mismatch_warns_and_verl_mode_wins():
    old, logp, adv, mask, _ = batch(seed=19)
    lv._warn_aggregation_once.cache_clear()  # warned once per process and combination
    with pytest.warns(UserWarning, match="seq-mean-token-sum-norm"):
        loss, _ = get_policy_loss_fn("lmpo_dr_grpo")(old, logp, adv, mask, "token-mean", actor_config())
    want, _ = Objective.preset("dr_grpo", aggregation="token_mean")(logp, old, adv, mask)
    torch.testing.assert_close(loss, want)


@pytest.mark.parametrize(
    ("name", "lmpo", "match"),
    [
        ("adaptive_entropy", {}, "entropy_coeff"),
        ("grad_adaptive", {}, "LmpoGRPOTrainer"),
        ("grpo", {"entropy_coef": 0.01}, "entropy_coeff"),
        ("grpo", {"kl_coef": 0.01}, "use_kl_loss"),
    ],
)
def test_refusals_name_the_alternative(name, lmpo, match):
    old, logp, adv, mask, _ = batch(seed=23)
    with pytest.raises(NotImplementedError, match=match):
        get_policy_loss_fn(f"lmpo_{name}")(old, logp, adv, mask, "seq-mean-token-mean", actor_config(lmpo=lmpo))


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_cov_presets_with_rollout_weights_equal_verl(name):
    """verl's weights multiply the policy terms; the covariance selection sees the plain advantages, as verl's."""
    old, logp, adv, mask, w = batch(seed=29, B=8, T=16, noise=0.3, empty_row=False)
    adv = adv * 4
    if name == "clip_cov":
        verl_cfg = dict(clip_cov_ratio=1.0, clip_cov_lb=0.5, clip_cov_ub=5.0)
        lmpo = {"clip_cov_ratio": 1.0, "clip_cov_lb": 0.5, "clip_cov_ub": 5.0}
    else:
        verl_cfg, lmpo = dict(kl_cov_ratio=0.05, ppo_kl_coef=0.1), {"kl_cov_frac": 0.05, "kl_cov_coef": 0.1}
    config = actor_config("token-mean", lmpo=lmpo, **verl_cfg)
    got = loss_and_grad(get_policy_loss_fn(f"lmpo_{name}"), old, logp, adv, mask, "token-mean", config, w)
    want = loss_and_grad(get_policy_loss_fn(name), old, logp, adv, mask, "token-mean", config, w)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-7)
    assert got[2]["rollout/weight_mean"] > 0


def test_lmpo_corrections_are_refused_with_verls_alternative():
    old, logp, adv, mask, w = batch(seed=31)
    with pytest.raises(NotImplementedError, match="rollout_correction"):
        get_policy_loss_fn("lmpo_grpo")(old, logp, adv, mask, "seq-mean-token-mean",
                                        actor_config(lmpo={"correction": "tis"}), w)


def test_example_hydra_config_builds_the_actor_config():
    """examples/verl/config/lmpo_gspo.yaml composes on verl's tree and instantiates LmpoPolicyLossConfig."""
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    with initialize_config_dir(config_dir=os.path.join(REPO, "examples", "verl", "config"), version_base=None):
        cfg = compose(config_name="lmpo_gspo", overrides=[
            "actor_rollout_ref.actor.policy_loss.lmpo.eps_high=0.001",
            "+actor_rollout_ref.actor.policy_loss.lmpo.dual_clip=true",
        ])
    assert cfg.actor_rollout_ref.model.external_lib == "lmpo.integrations.verl"
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, lv.LmpoPolicyLossConfig)
    assert actor.policy_loss.loss_mode == "lmpo_gspo"
    objective = lv.objective_for_verl("gspo", actor.loss_agg_mode, actor)
    assert (objective.eps_low, objective.eps_high, objective.aggregation) == (3e-4, 1e-3, "seq_mean_token_mean")
    assert objective.dual_clip and objective.level == "sequence"


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_two_data_parallel_ranks_give_the_loss_and_gradient_of_one(mode):
    """verl's data parallelism without a cluster: each of two ranks gets half of a global batch (rows of mixed
    lengths) and verl's ``global_batch_info``; DDP / FSDP average the ranks' gradients. The mean of the two ranks'
    losses and their averaged gradients equal one rank holding the whole batch."""
    fn = get_policy_loss_fn("lmpo_grpo")
    old, logp, adv, mask, _ = batch(seed=5, B=8, empty_row=False)
    tokens, seqs = int(mask.sum()), 8
    one = actor_config(mode, global_batch_info={"dp_size": 1, "batch_num_tokens": tokens, "global_batch_size": seqs})
    want_loss, want_grad, _ = loss_and_grad(fn, old, logp, adv, mask, mode, one)
    two = actor_config(mode, global_batch_info={"dp_size": 2, "batch_num_tokens": tokens, "global_batch_size": seqs})
    losses, grads = [], []
    for rows in (slice(0, 4), slice(4, 8)):
        loss, grad, _ = loss_and_grad(fn, old[rows], logp[rows], adv[rows], mask[rows], mode, two)
        losses.append(loss)
        grads.append(grad)
    torch.testing.assert_close(sum(losses) / 2, want_loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(torch.cat(grads) / 2, want_grad, rtol=1e-6, atol=1e-7)
