"""The paired gradient study: every objective's gradient estimator on the same off-policy batches.

At one policy snapshot θ_s of a reference run (docs/lab.md, "The gradient study"):

1. **Off-policy point.** θ' = θ_s after k GRPO minibatch updates (AdamW at the train section's lr, gradient
   clipping as configured) on an *update batch* sampled from θ_s. The behaviour policy is θ_s, the gradient
   is taken at θ', so importance ratios differ from 1 and trust regions act — the situation of the (k+1)-th
   optimizer step of a training RL step.
2. **Behaviour batches.** R independent batches (P prompts × G completions, rewards, advantages) sampled from
   θ_s, with their behaviour log-probs under θ_s.
3. **Reference direction.** g* = the mean on-policy policy gradient at θ' over ``onpolicy_batches`` batches
   sampled from θ': ``∇ −(1/B) Σ_i A_i Σ_t log π_θ'(y_it)`` (token ratios equal to 1, no clipping, the
   same advantages as the objectives).
4. **Every objective on the same batches.** For each objective and batch r, g_r = the gradient at θ' of the
   objective's loss on batch r (the whole batch as one optimizer step, exact normalisers) — the same
   samples for every objective, so differences are the estimators', not the data's. From the R gradients:
   the Gram matrix ``<g_r, g_r'>`` and ``<g_r, g*>``, which give the signal-to-noise ratio
   ``‖E g‖² / E‖g − E g‖²`` and the cosine of the mean gradient to g* (``lmpo.lab.stats``), with batches left
   out in turn for their intervals; per batch, the variance over valid tokens of the importance weight each
   token's gradient is multiplied by (a sequence weight counts once per token of its sequence), and the
   clip and mask fractions the objective reports.

Rollouts and log-probs are reached through the four functions of "the seam" below and nowhere else, so that
a move of the generation code is a change in one place.
"""

from __future__ import annotations

import copy
import math
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from lmpo.generation import RolloutBatch
from lmpo.lab import stats as st
from lmpo.trainer.config import config_from_dict
from lmpo.trainer.run import build
from lmpo.trainer.step import stages

# ----------------------------------------------------------------------------------------------------
# The seam: the only code here that calls the rollout engine and the trainer's log-prob forward
# ----------------------------------------------------------------------------------------------------


def _sample(trainer, model, prompts: list[str], seed: int):
    """G sampled completions per prompt from ``model`` with the train section's sampling settings, and the engine
    (which also decodes ReMax's greedy baselines from ``model``)."""
    engine = build.build_rollout_engine(trainer.cfg, trainer.model, trainer.tokenizer,
                                        record_logprobs=trainer.driver.needs.rollout_logp)
    engine.sync_weights(model)
    return engine.generate(prompts, trainer.cfg.rollout.completions_per_prompt, seed=seed), engine


def _sequences(batch: dict) -> RolloutBatch:
    """The study's batch dict as the trainer's typed batch (the fields a log-prob forward reads)."""
    return RolloutBatch(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        completion_ids=batch["completion_ids"], loss_mask=batch["mask"])


def _for_logprobs(trainer, model):
    """``model``, or for the trainer's own policy the view its log-prob forwards use (compiled under loop.compile)."""
    return trainer.policy() if model is trainer.model else model


def _token_logp(trainer, driver, model, batch: dict, rows: torch.Tensor, T: int) -> dict[str, torch.Tensor]:
    """Log-probs (with gradient) of ``rows``, plus what ``driver``'s objective needs (entropy, token
    gradient norms), exactly as the trainer computes them for its own objective."""
    needs = driver.needs
    out = stages.logprobs(_for_logprobs(trainer, model), _sequences(batch), rows, settings=trainer.logprob_settings,
                          with_grad=True, with_entropy=needs.entropy, grad_norm_mode=needs.token_grad_norm)
    return {k: v for k, v in (("logp", out.logp), ("entropy", out.entropy),
                              ("token_grad_norm", out.token_grad_norm)) if v is not None}


def _no_grad_logp(trainer, model, batch: dict, T: int) -> torch.Tensor:
    """(B, T) log-probs of the batch's completions under ``model`` (behaviour log-probs)."""
    return stages.logprobs(_for_logprobs(trainer, model), _sequences(batch), settings=trainer.logprob_settings,
                           with_grad=False).logp


def _score(trainer, examples: list, rollout, engine) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(B,) total rewards of a rollout, scored as the trainer scores its own, and what the advantage estimator
    needs beyond them (``lmpo.trainer.step.stages.advantage_inputs``, as the trainer computes them)."""
    rewards, per_fn = stages.score_rewards(trainer.scorer, examples, rollout)
    return rewards, stages.advantage_inputs(trainer.estimator, trainer.scorer, examples, rollout, per_fn,
                                            engine=engine, device=trainer.device,
                                            autocast_enabled=trainer.cfg.loop.autocast)


# ----------------------------------------------------------------------------------------------------
# Batches and gradients
# ----------------------------------------------------------------------------------------------------


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


class _Batches:
    """Draws the study's batches: prompts from the training pool, completions from a given policy."""

    def __init__(self, trainer, seed: int, step: int) -> None:
        self.trainer = trainer
        self.seed, self.step = seed, step
        self.pool = trainer.train_examples
        self.device = trainer.device

    def draw(self, model, tag: int, index: int) -> dict[str, Any]:
        cfg = self.trainer.cfg
        gen = torch.Generator().manual_seed(_seed(self.seed, self.step, tag, index, 0))
        pick = torch.randperm(len(self.pool), generator=gen)[: cfg.loop.prompts_per_step].tolist()
        examples = [self.pool[i] for i in pick]
        ro, engine = _sample(self.trainer, model, [e.prompt for e in examples],
                             _seed(self.seed, self.step, tag, index, 1))
        rewards, adv_inputs = _score(self.trainer, examples, ro, engine)
        rewards = rewards.to(self.device)
        d = self.device
        return {"input_ids": torch.cat([ro.prompt_ids, ro.completion_ids], 1).to(d),
                "attention_mask": torch.cat([ro.prompt_mask, ro.completion_mask], 1).to(d),
                "completion_ids": ro.completion_ids.to(d), "mask": ro.completion_mask.to(d).bool(),
                "group": ro.group_ids.to(d), "rewards": rewards, "adv_inputs": adv_inputs, "adv": {}}


def _advantages(trainer, batch: dict, scale: str) -> torch.Tensor:
    from lmpo.objectives.advantages import make_estimator

    if scale not in batch["adv"]:
        ob = trainer.cfg.objective
        estimator = make_estimator(ob.advantage_estimator, default_scale=scale, **ob.advantage_options)
        batch["adv"][scale] = estimator(batch["rewards"], batch["group"], **batch["adv_inputs"])[0]
    return batch["adv"][scale]


def _accumulate(trainer, driver, model, batch: dict, old_logp: torch.Tensor | None, generator=None,
                rows: torch.Tensor | None = None) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Backward of the objective over ``rows`` (default: the whole batch) as one optimizer step, in
    microbatches with the step's exact normalisers. ``old_logp=None``: on-policy (behaviour = current).
    Returns the merged statistics and the detached forward outputs of the last microbatch's rows, in order."""
    cfg = trainer.cfg
    T = batch["completion_ids"].shape[1]
    rows = torch.arange(batch["input_ids"].shape[0], device=trainer.device) if rows is None else rows
    adv = _advantages(trainer, batch, driver.objective.advantage_scale)
    num_tokens, num_seqs = batch["mask"][rows].sum(), int(rows.numel())
    outputs: dict[str, list[torch.Tensor]] = {}
    for start in range(0, num_seqs, cfg.loop.seqs_per_microbatch):
        mu = rows[start:start + cfg.loop.seqs_per_microbatch]
        fwd = _token_logp(trainer, driver, model, batch, mu, T)
        old = old_logp[mu] if old_logp is not None else fwd["logp"].detach()
        loss = driver.loss(fwd["logp"], old, adv[mu], batch["mask"][mu], weight=mu.numel() / num_seqs,
                           entropy=fwd.get("entropy"), token_grad_norm=fwd.get("token_grad_norm"),
                           num_tokens=num_tokens, num_seqs=num_seqs, generator=generator)
        loss.backward()
        for k, v in fwd.items():
            outputs.setdefault(k, []).append(v.detach())
    merged = driver.end_step(update_controller=False)
    return merged, {k: torch.cat(v, 0) for k, v in outputs.items()}


def _vector(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float().cpu()
                      for p in params])


def importance_weights(objective, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                       advantages: torch.Tensor, **inputs: torch.Tensor) -> torch.Tensor:
    """(B, T) the importance weight the objective's level multiplies each token's gradient by.

    Token levels give one weight per token, sequence levels one per sequence broadcast over its tokens; the
    weights are computed by the objective's own level part (with its credit weights where it has them),
    from the same context the objective builds. ``logp``, ``old_logp``, ``mask``: (B, T); ``advantages``: (B,);
    ``inputs``: the objective's optional (B, T) inputs (``token_grad_norm`` for gradient-adaptive credit).
    Values at invalid positions are meaningless (mask them).
    """
    from lmpo.objectives.parts import Context

    with torch.no_grad():
        valid = mask.bool()
        dtype = torch.promote_types(logp.dtype, torch.float32)
        m = valid.to(dtype)
        lengths = m.sum(-1)
        diff = torch.where(valid, logp.to(dtype) - old_logp.to(dtype), 0.0)
        clamp = objective.log_ratio_clamp
        adv = torch.where(lengths > 0, advantages.to(dtype), 0.0).unsqueeze(-1)
        ctx = Context(logp=logp, old_logp=old_logp, valid=valid, m=m, lengths=lengths, num_valid=lengths.sum(),
                      diff=diff, log_ratio=diff.clamp(-clamp, clamp), adv=adv, dtype=dtype,
                      inputs={k: torch.where(valid, x.to(dtype), 0.0) for k, x in inputs.items()}, generator=None,
                      clamp=clamp)
        ctx.credit = objective.parts["credit"].weights(ctx)
        _, value = objective.parts["level"].weight(ctx)
        return value.expand_as(m)


def token_gradient_weights(driver, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                           mask: torch.Tensor, *, seed: int, **inputs: torch.Tensor) -> torch.Tensor:
    """(B, T) ``∂loss/∂logp_t``: how much the objective's loss moves each token's log-prob, everything included
    (importance weight, trust region, credit, masks, penalties, aggregation), at fixed inputs.

    A pure tensor computation over the batch's (detached) log-probs; randomness (Clip-Cov's pick) comes from a
    generator seeded with ``seed``, so two objectives see the same draw. Zero at invalid positions."""
    x = logp.detach().clone().requires_grad_(True)
    gen = torch.Generator(device=x.device).manual_seed(seed)
    n_tok, n_seq = mask.sum(), int(mask.shape[0])
    loss = driver.loss(x, old_logp, advantages, mask, weight=1.0, num_tokens=n_tok, num_seqs=n_seq, generator=gen,
                       **{k: v.detach() for k, v in inputs.items()})
    driver.end_step(update_controller=False)
    (grad,) = torch.autograd.grad(loss, x, allow_unused=True)
    return torch.zeros_like(x) if grad is None else torch.where(mask.bool(), grad.detach(), 0.0)


def weight_diff_frac(weights: torch.Tensor, baseline: torch.Tensor, mask: torch.Tensor, *,
                     tolerance: float = 0.01) -> float:
    """Share of valid tokens whose gradient weight differs from the baseline's by more than ``tolerance``
    (relative to the baseline's; a token the baseline does not move counts when the objective moves it)."""
    valid = mask.bool()
    w, b = weights[valid].double(), baseline[valid].double()
    if w.numel() == 0:
        return math.nan
    scale = b.abs().clamp_min(1e-12 * float(b.abs().max().clamp_min(1e-30)))
    return float(((w - b).abs() > tolerance * scale).double().mean())


def weight_variance(weights: torch.Tensor, mask: torch.Tensor) -> float:
    """Unbiased variance of ``weights`` over the valid tokens of ``mask``."""
    w = weights[mask.bool()].double()
    return float(w.var(unbiased=True)) if w.numel() > 1 else math.nan


def _needed(objective) -> set[str]:
    from lmpo.objectives import ObjectiveDriver

    needs = ObjectiveDriver(objective).needs
    return {name for name, on in (("entropy", needs.entropy), ("token_grad_norm", bool(needs.token_grad_norm))) if on}


def _objective(section: dict):
    """The objective and driver a run of the trainer's ``objective`` section (preset + overrides) trains with:
    built as ``Trainer`` builds it (``build.build_objective``)."""
    from lmpo.trainer.config import ObjectiveConfig

    ob = ObjectiveConfig(preset=section["preset"], overrides=dict(section.get("overrides", {})))
    obj, driver, _ = build.build_objective(ob, ob.validate())
    return obj, driver


def off_policy_point(trainer, batches: _Batches, k: int, seed: int, step: int, *, optimizer_state=None):
    """Step 1 of the study: freeze a copy of ``trainer.model`` (θ_s, the behaviour policy, returned) and move the
    model to θ' by k GRPO minibatch updates on an update batch from θ_s, with AdamW at the train section's
    settings and, when given, the snapshot's optimizer state (its moments), so that the step sizes are those
    of training at that point and not those of a fresh AdamW."""
    from lmpo.trainer.run.optim import build_optimizer

    cfg, model = trainer.cfg, trainer.model
    behaviour = copy.deepcopy(model).eval()
    for p in behaviour.parameters():
        p.requires_grad_(False)
    model.train()
    upd = batches.draw(behaviour, tag=0, index=0)
    upd_old = _no_grad_logp(trainer, behaviour, upd, upd["completion_ids"].shape[1])
    _, grpo = _objective({"preset": "grpo"})
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    order = torch.randperm(upd["input_ids"].shape[0], generator=torch.Generator().manual_seed(_seed(seed, step, 9)))
    size = -(-order.numel() // k)
    for m in range(k):
        optimizer.zero_grad(set_to_none=True)
        _accumulate(trainer, grpo, model, upd, upd_old, rows=order[m * size:(m + 1) * size].to(trainer.device))
        if cfg.optim.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.optim.max_grad_norm)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return behaviour


def gradient_study(spec: dict, log: Callable[[str], None]) -> dict[str, Any]:
    """The study at one snapshot (see the module docstring); ``spec`` is the job spec of ``lmpo.lab.grid``."""
    from lmpo.objectives import Objective, ObjectiveDriver
    from lmpo.trainer import Trainer
    from lmpo.trainer.run.state import load_checkpoint

    t0 = time.perf_counter()
    cfg = config_from_dict(spec["train"])
    trainer = Trainer(cfg, log=log)
    model = trainer.model
    optimizer_state = None
    if spec.get("checkpoint"):  # the snapshot's weights and its AdamW moments, as training would continue
        optimizer_state = load_checkpoint(spec["checkpoint"], model).get("optimizer")
    pattern = re.compile(spec["params"]) if spec.get("params") else None
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad and (pattern is None or pattern.search(n))]
    if not named:
        raise ValueError(f"gradients.params = {spec.get('params')!r} matches no trainable parameter")
    params = [p for _, p in named]
    step, k = int(spec["step"]), int(spec["updates_before_gradient"])
    # each (reference seed, point) draws its own update batch and behaviour batches
    seed = _seed(int(spec["seed"]), int(spec.get("reference_seed", 0)), int(spec.get("point", 0)))
    batches = _Batches(trainer, seed, step)
    behaviour = off_policy_point(trainer, batches, k, seed, step, optimizer_state=optimizer_state)
    log(f"snapshot {step}, point {spec.get('point', 0)}: {k} update(s) from the snapshot"
        + (" (its optimizer state carried)" if optimizer_state is not None else " (fresh optimizer: RL start)"))

    # 2. the R behaviour batches (from θ_s) and 3. the on-policy reference direction (from θ')
    R, R_on = int(spec["batches"]), int(spec["onpolicy_batches"])
    data = [batches.draw(behaviour, tag=1, index=r) for r in range(R)]
    old = [_no_grad_logp(trainer, behaviour, b, b["completion_ids"].shape[1]) for b in data]
    pg = ObjectiveDriver(Objective(level="token", trust_region="none", aggregation="seq_mean_token_sum",
                                   check_finite=False, name="policy_gradient"))
    on_vectors = []
    for j in range(R_on):
        b = batches.draw(model, tag=2, index=j)
        model.zero_grad(set_to_none=True)
        _accumulate(trainer, pg, model, b, None)
        on_vectors.append(_vector(params))
    on = torch.stack(on_vectors).double()
    g_star = on.mean(0)
    on_gram = (on @ on.T).numpy()
    log(f"snapshot {step}: reference direction from {R_on} on-policy batches (SNR {st.gram_snr(on_gram):.3g})")

    # 4. every objective on the same R batches at θ'
    setup_seconds = time.perf_counter() - t0
    results: dict[str, Any] = {}
    token_weights: dict[str, list[torch.Tensor]] = {}
    logp_at: list[torch.Tensor | None] = [None] * len(data)
    inputs_at: list[dict[str, torch.Tensor]] = [{} for _ in data]
    for entry in spec["objectives"]:
        t1 = time.perf_counter()
        obj, driver = _objective(entry["objective"])
        vectors, rows = [], []
        for r, (b, o) in enumerate(zip(data, old)):
            model.zero_grad(set_to_none=True)
            gen = torch.Generator(device=trainer.device).manual_seed(_seed(seed, step, 3, r))
            merged, fwd = _accumulate(trainer, driver, model, b, o, generator=gen)
            vectors.append(_vector(params))
            if logp_at[r] is None:  # θ' does not move between objectives: one forward serves them all
                logp_at[r] = fwd["logp"]
            inputs_at[r].update({k: fwd[k] for k in ("entropy", "token_grad_norm") if k in fwd})
            extra = {k: fwd[k] for k in ("token_grad_norm",) if k in fwd}
            w = importance_weights(obj, fwd["logp"], o, b["mask"], _advantages(trainer, b, obj.advantage_scale),
                                   **extra)
            tokens = merged.get("tokens/valid", float(b["mask"].sum()))
            masked = merged.get("cov/clipped_tokens", 0.0) + merged.get("cov/penalised_tokens", 0.0)
            rows.append({"weight_var": weight_variance(w, b["mask"]), "clip_frac": merged.get("clip/region_frac"),
                         "clip_low_frac": merged.get("clip/low_frac"), "clip_high_frac": merged.get("clip/high_frac"),
                         "mask_frac": masked / tokens if tokens else 0.0, "ratio_max": merged.get("ratio/max"),
                         "kl_behaviour": merged.get("kl/behaviour_k3")})
        model.zero_grad(set_to_none=True)
        token_weights[entry["label"]] = [
            token_gradient_weights(_objective(entry["objective"])[1], logp_at[r], o,
                                   _advantages(trainer, b, obj.advantage_scale), b["mask"], seed=_seed(seed, step, 3, r),
                                   **{k: v for k, v in inputs_at[r].items() if k in _needed(obj)})
            for r, (b, o) in enumerate(zip(data, old))]
        V = torch.stack(vectors).double()
        gram = (V @ V.T).numpy()
        dots = (V @ g_star).numpy()
        per_batch = {key: [row[key] for row in rows] for key in rows[0]}
        per_batch["grad_norm"] = [float(math.sqrt(max(g, 0.0))) for g in np.diag(gram)]
        results[entry["label"]] = {
            "objective": obj.to_dict(), "gram": gram.tolist(), "dots": dots.tolist(), "per_batch": per_batch,
            "snr": st.gram_snr(gram), "cos_onpolicy": st.gram_cosine(gram, dots, float(g_star @ g_star),
                                                                     ref_noise=st.mean_noise(on_gram)),
            "seconds": time.perf_counter() - t1,
        }
        log(f"snapshot {step}: {entry['label']}: SNR {results[entry['label']]['snr']:.3g}, cosine to the on-policy "
            f"direction {results[entry['label']]['cos_onpolicy']:.3g}")
    for label, res in results.items():  # the activity measure against every baseline measured here
        res["weight_diff_frac"] = {
            base: [weight_diff_frac(w, wb, b["mask"]) for w, wb, b in zip(token_weights[label], token_weights[base], data)]
            for base in spec.get("baselines", []) if base in token_weights and base != label}
    return {"step": step, "reference_seed": int(spec.get("reference_seed", 0)), "point": int(spec.get("point", 0)),
            "optimizer_state_carried": optimizer_state is not None,
            "batches": R, "onpolicy_batches": R_on, "updates_before_gradient": k,
            "setup_seconds": setup_seconds, "params": [n for n, _ in named], "num_params": int(sum(p.numel() for p in params)),
            "kl_behaviour": float(np.mean(next(iter(results.values()))["per_batch"]["kl_behaviour"])) if results
            else math.nan, "onpolicy": {"sq_norm": float(g_star @ g_star), "gram": on_gram.tolist(),
                                                           "snr": st.gram_snr(on_gram)},
            "objectives": results}


__all__ = ["gradient_study", "importance_weights", "token_gradient_weights", "weight_diff_frac", "weight_variance"]
