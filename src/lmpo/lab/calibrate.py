"""Calibration of the variants' parameters from baseline runs with seeds the study does not use.

``python -m lmpo.lab.calibrate configs/lab_cpu.yaml --seeds 100 101`` runs, for each calibration seed, the lab's
warm-up and one GRPO cell (the train section as it is: same model, task, budget), and measures on the warm-up
model — the start of RL — R off-policy batches exactly as the gradient study draws them (k GRPO minibatch
updates from the snapshot, so that ratios differ from 1 as at the last update of a training step). It prints
(and writes to ``DIR/calibration.json``) the measurements — with the GRPO cells' entropy trajectory and, with
``lab.sampled_eval_k``, pass@k / avg@k at the start and the end (the exploration precondition) — and the
parameters they give:

- ``ptrw_sigma`` = 2 × the standard deviation over sequences of AMIC's sequence ratio ``s' = mean_t ρ_t``: the
  Gaussian factor φ then falls to ``exp(−1/8) ≈ 0.88`` one spread from 1 and ``exp(−1/2) ≈ 0.61`` two spreads
  away, instead of ``φ ≥ 0.9995`` with the default σ = 0.5 when the spread is ~0.015;
- ``decay_gamma`` = 1 − 1 / (mean completion length): a decay horizon ``1/(1 − γ)`` of one completion;
- ``entropy_target`` = the GRPO cells' mean starting entropy (``entropy_start``, the metric the adaptive-entropy
  precondition compares with), so the controller holds entropy near its start instead of raising it;
- ``clip_cov_ratio`` / ``kl_cov_frac`` = ``target_tokens`` / (valid tokens per minibatch): about
  ``target_tokens`` tokens per minibatch (Clip-Cov further limited to its covariance band; the share of
  tokens inside the band is reported), instead of one token per minibatch with the papers' 2e-4 / 2e-3.

Every number comes from the runs; nothing is hard-coded beyond the rules above.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmpo.lab.config import load_lab_config, replace_lab, updates_before_gradient

COV_QUANTILES = (0.80, 0.85, 0.90, 0.95, 0.98, 0.99)
"""Quantiles of the token covariance recorded per minibatch (Clip-Cov's band is set from one of them)."""


def measure_start(train: dict, seed: int, *, batches: int, updates: int, log=print) -> dict[str, Any]:
    """Token- and sequence-level quantities of R off-policy batches at the start of RL (see the module docstring)."""
    from lmpo.lab.gradients import _advantages, _Batches, _no_grad_logp, _sequences, off_policy_point
    from lmpo.trainer import Trainer
    from lmpo.trainer.config import config_from_dict
    from lmpo.trainer.step import stages

    cfg = config_from_dict(train)
    trainer = Trainer(cfg, log=log)
    draw = _Batches(trainer, seed, 0)
    behaviour = off_policy_point(trainer, draw, updates, seed, 0)
    from lmpo.objectives import Objective

    clip_cov = Objective.preset("clip_cov")
    band_lo, band_hi = clip_cov.clip_cov_lb, clip_cov.clip_cov_ub
    seq_ratio, tok_ratio, entropy, lengths, per_minibatch, in_band = [], [], [], [], [], []
    cov_q: dict[str, list[float]] = {f"{q:g}": [] for q in COV_QUANTILES}
    minibatches = cfg.loop.minibatches_per_step
    for r in range(batches):
        b = draw.draw(behaviour, tag=1, index=r)
        old = _no_grad_logp(trainer, behaviour, b, b["completion_ids"].shape[1])
        with torch.no_grad():
            out = stages.logprobs(trainer.model, _sequences(b), settings=trainer.logprob_settings, with_grad=False,
                                  with_entropy=True)
        mask = b["mask"].double()
        n = mask.sum(-1).clamp_min(1)
        rho = torch.exp((out.logp.double() - old.double()).clamp(-20, 20)) * mask
        seq_ratio += ((rho.sum(-1) / n)[mask.sum(-1) > 0]).tolist()
        tok_ratio += rho[mask.bool()].tolist()
        entropy += out.entropy.double()[mask.bool()].tolist()
        lengths += mask.sum(-1).tolist()
        adv = _advantages(trainer, b, "group").double()
        size = -(-mask.shape[0] // minibatches)
        for start in range(0, mask.shape[0], size):  # the covariance is taken over one minibatch's tokens
            m = mask[start:start + size].bool()
            a = adv[start:start + size].unsqueeze(-1).expand_as(m)[m]
            lp = out.logp.double()[start:start + size][m]
            cov = (a - a.mean()) * (lp - lp.mean())
            per_minibatch.append(int(m.sum()))
            in_band.append(float(((cov > band_lo) & (cov < band_hi)).double().mean()) if cov.numel() else 0.0)
            for q in COV_QUANTILES:
                cov_q[f"{q:g}"].append(float(torch.quantile(cov, q)) if cov.numel() else math.nan)
    return {"seed": seed, "batches": batches, "updates_before_gradient": updates,
            "seq_ratio_sd": float(np.std(seq_ratio, ddof=1)), "token_ratio_sd": float(np.std(tok_ratio, ddof=1)),
            "entropy_mean": float(np.mean(entropy)), "length_mean": float(np.mean(lengths)),
            "tokens_per_minibatch": float(np.mean(per_minibatch)), "clip_cov_band_share": float(np.mean(in_band)),
            "cov_quantiles": {q: float(np.nanmean(v)) for q, v in cov_q.items()}}


def suggest(starts: list[dict], cells: list[dict], *, target_tokens: float = 10.0) -> dict[str, Any]:
    """The calibrated parameters from the measurements (rules in the module docstring), with their sources."""
    spread = float(np.mean([m["seq_ratio_sd"] for m in starts]))
    length = float(np.mean([m["length_mean"] for m in starts]))
    tokens = float(np.mean([m["tokens_per_minibatch"] for m in starts]))
    entropy_start = float(np.mean([c["metrics"]["entropy_start"] for c in cells]))
    ratio = target_tokens / tokens
    band = float(np.mean([m["clip_cov_band_share"] for m in starts]))
    # the quantile that leaves about target_tokens tokens of a minibatch above it
    level = min(starts[0]["cov_quantiles"], key=lambda q: abs(float(q) - (1.0 - target_tokens / tokens)))
    lb = float(np.mean([m["cov_quantiles"][level] for m in starts]))
    out = {
        "ptrw_sigma": {"value": 2.0 * spread, "from": f"2 × sequence-ratio sd {spread:.4g}"},
        "decay_gamma": {"value": 1.0 - 1.0 / length, "from": f"1 − 1/mean completion length {length:.3g}"},
        "entropy_target": {"value": entropy_start, "from": f"GRPO entropy_start {entropy_start:.4g}"},
        "clip_cov_ratio": {"value": ratio, "from": f"{target_tokens:g} / {tokens:.4g} valid tokens per minibatch"},
        "kl_cov_frac": {"value": ratio, "from": f"{target_tokens:g} / {tokens:.4g} valid tokens per minibatch"},
    }
    if band * tokens < target_tokens:  # too few candidates inside Clip-Cov's band: widen it from below
        out["clip_cov_lb"] = {"value": lb, "from": f"{float(level):.0%} quantile of the token covariance {lb:.3g} "
                                                   f"(only {band:.2%} of tokens, {band * tokens:.3g} per minibatch, "
                                                   "lie in the default band)"}
    return out


def calibrate(config: str, seeds: list[int], *, batches: int = 8, overrides: list[str] | None = None,
              target_tokens: float = 10.0, log=print) -> dict[str, Any]:
    """Run the baseline on the calibration seeds and measure (module docstring); returns the calibration."""
    from lmpo.lab.grid import plan_jobs
    from lmpo.lab.report import collect
    from lmpo.lab.runner import run_lab

    cfg = load_lab_config(config, overrides)
    study = set(cfg.grid.seeds)
    if study & set(seeds):
        raise ValueError(f"calibration seeds {sorted(study & set(seeds))} are seeds of the study; use others")
    root = Path(cfg.lab.dir + "_calibration")
    calib = replace_lab(cfg, lab={"dir": str(root)}, grid={"objectives": [{"preset": "grpo"}],
                                                                                "seeds": list(seeds), "tasks": []},
                        gradients={"enabled": False}, report={"claims": []})
    calib = replace_lab(calib, grid={"tasks": [t.__dict__ for t in cfg.grid.tasks][:1]}) if cfg.grid.tasks else calib
    run_lab(calib)
    jobs = plan_jobs(calib, root)
    collected = next(iter(collect(calib, jobs).values()))["summaries"]["grpo"]  # with pass@k gains
    cells = [collected[int(j.labels["seed"])] for j in jobs if j.kind == "train"]
    starts = []
    k = updates_before_gradient(calib)
    for job in jobs:
        if job.kind != "train":
            continue
        train = dict(job.spec["train"])
        train["logging"] = {**train["logging"], "run_dir": str(job.dir / "calibration_probe")}
        starts.append(measure_start(train, int(job.labels["seed"]), batches=batches, updates=k, log=log))
    result = {"seeds": list(seeds), "study_seeds": sorted(study), "start": starts,
              "cells": [{"seed": j.labels["seed"], **{m: c["metrics"][m] for m in (
                  "entropy_start", "entropy_end", "entropy_change", "accuracy_start", "accuracy", "length",
                  "clip_high_frac", "mask_frac", "pass_at_k_start", "pass_at_k", "avg_at_k_start", "avg_at_k")}}
                        for j, c in zip([j for j in jobs if j.kind == "train"], cells)],
              "parameters": suggest(starts, cells, target_tokens=target_tokens)}
    (root / "calibration.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lmpo.lab.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--seeds", type=int, nargs="+", required=True, help="calibration seeds (not the study's)")
    p.add_argument("--batches", type=int, default=8, help="off-policy batches measured per seed")
    p.add_argument("--target-tokens", type=float, default=10.0, help="tokens per minibatch Clip-Cov/KL-Cov aim at")
    args, rest = p.parse_known_args(argv)
    result = calibrate(args.config, args.seeds, batches=args.batches, overrides=rest,
                       target_tokens=args.target_tokens)
    print(json.dumps({"start": result["start"], "cells": result["cells"], "parameters": result["parameters"]},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
