"""The lab's report: ``lab.json`` (every number), ``lab.md`` (the tables) and ``plots/``.

Built only from the jobs' result files (``summary.json``, ``result.json``, ``warmup.json``), never from the run
directories, so that the report of a finished lab can be rebuilt, and compared, after its run directories
are gone. Every interval and p-value is seeded (``report.seed``): the same results give the same report.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from lmpo.lab import stats as st
from lmpo.lab.claims import FAILS, HOLDS, INVALID, NO_EFFECT, NOT_RUN, NOT_TESTABLE
from lmpo.lab.config import (
    LabConfig,
    build_objective,
    lab_config_to_dict,
    objective_label,
    task_entries,
    task_label,
)
from lmpo.lab.fits import fit_study
from lmpo.lab.grid import Job
from lmpo.lab.jobs import read_json, write_json_atomic
from lmpo.lab.rules import UNDECIDABLE, claims_for, judge_rule, stored_results
from lmpo.lab.staleness import staleness_study
from lmpo.lab.staleness import table_markdown as staleness_table
from lmpo.lab.stats import fmt as _f

TRAIN_METRICS: dict[str, str] = {
    "accuracy": "held-out greedy accuracy: mean of the last 3 evaluations (the endpoint)",
    "accuracy_last": "held-out greedy accuracy at the last evaluation",
    "accuracy_start": "held-out greedy accuracy before the first RL step",
    "accuracy_gain": "accuracy − accuracy_start (the RL gain)",
    "accuracy_min": "lowest held-out accuracy after the start (divergence shows here)",
    "pass_at_k": "sampled pass@k on the held-out problems after the last step (k = lab.sampled_eval_k)",
    "avg_at_k": "sampled avg@k: mean share of the k samples that are right",
    "pass_at_k_start": "sampled pass@k of the warm-up model (the start of RL)",
    "avg_at_k_start": "sampled avg@k of the warm-up model",
    "pass_at_k_gain": "pass_at_k − pass_at_k_start",
    "avg_at_k_gain": "avg_at_k − avg_at_k_start (the sampled pass@1 gain)",
    "reward_auc": "area under the training reward curve per step (mean reward over the run)",
    "reward_start": "mean training reward over the first tenth of the steps",
    "reward_end": "mean training reward over the last tenth of the steps",
    "reward_gain": "reward_end − reward_start",
    "reward_steps": "RL steps until the moving average of the reward (a tenth of the run) first reaches the "
                    "baseline's mean reward_start + half its mean reward_gain (the last step + 1 if never): rule "
                    "v2.1's \"faster\"",
    "train_accuracy_auc": "mean sampled training accuracy over the run",
    "entropy_start": "mean token entropy over the first tenth of the steps",
    "entropy_min": "lowest moving average (a tenth of the steps) of the token entropy",
    "entropy_end": "mean token entropy over the last tenth of the steps",
    "entropy_change": "entropy_end − entropy_start",
    "clip_frac": "mean fraction clipped by the trust region (tokens; sequences for sequence levels)",
    "clip_low_frac": "… at the lower bound (A < 0)",
    "clip_high_frac": "… at the upper bound (A > 0)",
    "mask_frac": "mean fraction of tokens masked (Clip-Cov) or penalised (KL-Cov)",
    "zero_var_frac": "mean share of sampled completions in groups whose rewards are all equal (no advantage; what "
                     "zero-variance filtering drops)",
    "entropy_coef_active": "share of steps with a non-zero entropy coefficient (adaptive entropy control)",
    "rlvcr_expanded_frac": "share of trained rows that are RLVCR thinking-level expansions",
    "rlvcr_acting_frac": "share of trained rows (with at least one trained token) that carry an RLVCR thinking "
                         "advantage",
    "ptrw_phi_gap": "1 − mean Gaussian trust-region factor φ (PTRW; 0 = the soft region never acts)",
    "length": "mean sampled completion length (tokens)",
    "eval_length": "mean held-out greedy completion length over the endpoint evaluations (tokens)",
    "endpoint_evals": "evaluations averaged into the endpoint",
    "kl_behaviour": "mean k3 KL(behaviour ‖ policy) over the optimizer steps",
    "mismatch_kl": "mean k3 KL(sampler ‖ trainer) per token of the rollouts (`mismatch/k3_kl`; stale rollouts "
                   "show it, docs/async.md)",
    "is_truncated_frac": "mean share of token weights truncated by a `tis` correction",
    "is_masked_frac": "mean share of token weights masked by a `mis` correction",
    "rejected_frac": "mean share of sequences (or tokens) dropped by a rejection (e.g. the off-policy sequence mask)",
    "nonfinite_values": "non-finite reward or entropy values logged",
    "steps_per_s": "RL steps per second of step time (evaluation excluded)",
}
"""Per-cell metrics of the training study (``lmpo.lab.jobs.summarise_run``) with their meaning."""

GRADIENT_METRICS: dict[str, str] = {
    "snr": "gradient signal-to-noise ratio ‖E g‖² / E‖g − E g‖² over the R batches (bias-corrected)",
    "cos_onpolicy": "cosine of the mean gradient to the on-policy policy-gradient direction (both norms "
                    "bias-corrected for their batches' noise)",
    "weight_var": "variance over valid tokens of the importance weight applied to each token's gradient",
    "clip_frac": "fraction clipped by the trust region",
    "mask_frac": "fraction of tokens masked (Clip-Cov) or penalised (KL-Cov)",
    "ratio_max": "largest importance weight",
    "grad_norm": "gradient norm",
    "weight_diff_frac": "share of valid tokens whose gradient weight ∂loss/∂logp_t differs from the claim "
                        "baseline's on the same batch by more than 1% (relative): the mechanism-activity measure",
}
"""Per-objective metrics of the gradient study, per snapshot."""

ONE_SAMPLE = ("entropy_change", "accuracy_gain", "pass_at_k_gain", "avg_at_k_gain")
"""Per-objective changes over the run tested against 0 (the preconditions' trends)."""

PER_BATCH = ("weight_var", "clip_frac", "mask_frac", "ratio_max", "grad_norm")
"""Gradient metrics measured per batch (paired over batches); snr and cos_onpolicy are per snapshot."""


def clean(x: Any) -> Any:
    """JSON-safe copy: non-finite floats become null, numpy scalars plain numbers."""
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(float(x)) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def _num(x: Any) -> float:
    return float(x) if x is not None else math.nan


# ----------------------------------------------------------------------------------------------------
# The training study
# ----------------------------------------------------------------------------------------------------


def _baselines(cfg: LabConfig) -> set[str]:
    """Every label some claim of the lab's rule compares with (each check's baseline; rule v2.1's may differ)."""
    names = {cfg.report.baseline}
    for claim in _claims(cfg):
        names.add(claim.baseline)
        names.update(c.baseline for c in claim.checks if c.baseline)
    return names


def _claims(cfg: LabConfig):
    return claims_for(cfg.report.rule, cfg.report.claims)


STEPS_SHARE = 0.5
"""``reward_steps``' threshold: the reference's mean starting reward plus this share of its mean reward gain."""


def add_reward_steps(summaries: dict[str, dict[int, dict]], reference: str) -> float:
    """Add ``reward_steps`` to every cell's metrics (rule v2.1's "faster"); returns the threshold (nan: none).

    Threshold ``T = mean reward_start + STEPS_SHARE · mean reward_gain`` of ``reference``'s cells, the same for every
    objective; a cell's value is the RL step at which the moving average of its reward over a tenth of the run
    (``stats.window_size``) first reaches T, and the last step + 1 when it never does (a run that is not faster
    within the budget). No threshold (a reference without a reward gain): nan."""
    ref = summaries.get(reference) or {}
    starts = [c["metrics"].get("reward_start", math.nan) for c in ref.values()]
    gains = [c["metrics"].get("reward_gain", math.nan) for c in ref.values()]
    threshold = float(np.mean(starts) + STEPS_SHARE * np.mean(gains)) if ref else math.nan
    if not (math.isfinite(threshold) and np.mean(gains) > 0):
        threshold = math.nan
    for by_seed in summaries.values():
        for cell in by_seed.values():
            series = cell.get("series") or {}
            reward, steps = series.get("reward") or [], series.get("step") or []
            value = math.nan
            if math.isfinite(threshold) and reward and len(steps) == len(reward):
                w = st.window_size(len(reward))
                moving = np.convolve(np.asarray(reward, dtype=float), np.ones(w) / w, mode="valid")
                hit = np.flatnonzero(moving >= threshold)
                value = float(steps[hit[0] + w - 1]) if hit.size else float(steps[-1] + 1)
            cell["metrics"]["reward_steps"] = value
    return threshold


def training_study(cfg: LabConfig, summaries: dict[str, dict[int, dict]]) -> dict[str, Any]:
    """Per-objective statistics over seeds (t intervals), paired comparisons with the baselines (t intervals,
    paired t-tests, minimum detectable effects), the validity of every objective's runs, curves with bands, and
    the compute–performance fits (``lmpo.lab.fits``)."""
    rp = cfg.report
    kw = {"confidence": rp.confidence}
    labels = list(summaries)
    threshold = add_reward_steps(summaries, rp.baseline)
    per_objective: dict[str, Any] = {}
    for label in labels:
        seeds = sorted(summaries[label])
        per_objective[label] = {"seeds": seeds, **{
            m: st.describe([summaries[label][s]["metrics"].get(m, math.nan) for s in seeds], **kw)
            for m in TRAIN_METRICS}}
    comparisons: dict[str, dict[str, dict[str, Any]]] = {}
    for label in labels:
        for base in sorted(_baselines(cfg)):
            if base == label or base not in summaries:
                continue
            common = sorted(set(summaries[label]) & set(summaries[base]))
            comparisons.setdefault(label, {})[base] = {m: st.paired_comparison(
                [summaries[label][s]["metrics"].get(m, math.nan) for s in common],
                [summaries[base][s]["metrics"].get(m, math.nan) for s in common], alpha=rp.alpha, power=rp.power, **kw)
                for m in TRAIN_METRICS}
    one_sample = {label: {m: st.paired_comparison(
        [summaries[label][s]["metrics"].get(m, math.nan) for s in sorted(summaries[label])],
        [0.0] * len(summaries[label]), alpha=rp.alpha, power=rp.power, **kw) for m in ONE_SAMPLE}
        for label in labels}
    validity = {label: run_validity(summaries[label], rp.divergence_margin) for label in labels}
    return {"metrics": per_objective, "comparisons": comparisons, "one_sample": one_sample, "validity": validity,
            "reward_threshold": threshold,
            "curves": {label: _curves(summaries[label], rp) for label in labels},
            "fits": fit_study(summaries, sorted(_baselines(cfg)), confidence=rp.confidence)}


def run_validity(by_seed: dict[int, dict], margin: float) -> dict[str, Any]:
    """The seeds whose run diverged (held-out accuracy at any evaluation after the start more than ``margin``
    below its start) or logged non-finite values (skipped steps, non-finite rewards or entropies)."""
    diverged, nonfinite = [], []
    for seed, summary in sorted(by_seed.items()):
        m = summary["metrics"]
        start, low = m.get("accuracy_start", math.nan), m.get("accuracy_min", math.nan)
        if start is not None and low is not None and math.isfinite(start) and math.isfinite(low) \
                and low < start - margin:
            diverged.append(seed)
        if (summary.get("nonfinite_skipped") or 0) > 0 or (m.get("nonfinite_values") or 0) > 0:
            nonfinite.append(seed)
    return {"margin": margin, "diverged_seeds": diverged, "nonfinite_seeds": nonfinite}


def _curves(by_seed: dict[int, dict], rp) -> dict[str, Any]:
    seeds = sorted(by_seed)
    out: dict[str, Any] = {}
    first = by_seed[seeds[0]]
    for name in ("reward", "entropy", "clip_frac", "length"):
        rows = [by_seed[s]["series"][name] for s in seeds]
        n = min(len(r) for r in rows)
        out[name] = {"step": first["series"]["step"][:n],
                     **st.band([r[:n] for r in rows], confidence=rp.confidence)}
    rows = [by_seed[s]["eval"]["accuracy"] for s in seeds]
    n = min(len(r) for r in rows)
    out["eval_accuracy"] = {"step": first["eval"]["step"][:n],
                            **st.band([r[:n] for r in rows], confidence=rp.confidence)}
    return out


# ----------------------------------------------------------------------------------------------------
# The gradient study
# ----------------------------------------------------------------------------------------------------


def gradient_report(cfg: LabConfig, snapshots: list[dict]) -> dict[str, Any]:
    """Per snapshot and objective: SNR and cosine with delete-one jackknife intervals over the batches, per-batch
    means with t intervals; pooled paired comparisons with the baselines."""
    rp = cfg.report
    per_snapshot = []
    for snap in snapshots:
        rows = {}
        for label, res in snap["objectives"].items():
            row = {"snr": st.jackknife_interval(_snr_fn(snap, label), snap["batches"], confidence=rp.confidence),
                   "cos_onpolicy": st.jackknife_interval(_cos_fn(snap, label), snap["batches"],
                                                         confidence=rp.confidence)}
            for m in PER_BATCH:
                row[m] = st.describe([_num(v) for v in res["per_batch"][m]], confidence=rp.confidence)
            row["weight_diff_frac"] = st.describe(
                [_num(v) for v in (res.get("weight_diff_frac") or {}).get(rp.baseline, [])], confidence=rp.confidence)
            rows[label] = row
        per_snapshot.append({"step": snap["step"], "reference_seed": snap.get("reference_seed"),
                             "point": snap.get("point"), "optimizer_state_carried": snap.get("optimizer_state_carried"),
                             "batches": snap["batches"],
                             "updates_before_gradient": snap["updates_before_gradient"],
                             "kl_behaviour": snap["kl_behaviour"],
                             "onpolicy_snr": snap["onpolicy"]["snr"], "num_params": snap["num_params"],
                             "objectives": rows})
    labels = list(snapshots[0]["objectives"]) if snapshots else []
    comparisons: dict[str, dict[str, dict[str, Any]]] = {}
    for label in labels:
        for base in sorted(_baselines(cfg)):
            if base == label or base not in labels:
                continue
            out = {}
            for metric, fn in (("snr", _snr_fn), ("cos_onpolicy", _cos_fn)):
                out[metric] = st.paired_jackknife_difference(
                    [fn(s, label) for s in snapshots], [fn(s, base) for s in snapshots],
                    [s["batches"] for s in snapshots], confidence=rp.confidence, alpha=rp.alpha, power=rp.power)
            for metric in PER_BATCH:
                a = [_num(v) for s in snapshots for v in s["objectives"][label]["per_batch"][metric]]
                b = [_num(v) for s in snapshots for v in s["objectives"][base]["per_batch"][metric]]
                out[metric] = st.paired_comparison(a, b, confidence=rp.confidence, alpha=rp.alpha, power=rp.power)
            comparisons.setdefault(label, {})[base] = out
    activity: dict[str, dict[str, Any]] = {}
    for label in labels:
        for base in labels:
            values = [_num(v) for s in snapshots
                      for v in (s["objectives"][label].get("weight_diff_frac") or {}).get(base, [])]
            if values:
                activity.setdefault(label, {})[base] = st.describe(values, confidence=rp.confidence)
    return {"snapshots": per_snapshot, "by_step": _by_step(cfg, snapshots, per_snapshot, labels),
            "comparisons": comparisons, "activity": activity}


def _by_step(cfg: LabConfig, snapshots: list[dict], rows: list[dict], labels: list[str]) -> list[dict]:
    """Per RL step: each metric's mean over the (reference seed, off-policy point) groups with a t interval over
    them, and the paired differences to the baselines pooled over that step's groups (jackknife, as above)."""
    rp = cfg.report
    out = []
    for step in sorted({s["step"] for s in snapshots}):
        idx = [i for i, s in enumerate(snapshots) if s["step"] == step]
        objectives = {label: {m: st.describe([_num(rows[i]["objectives"][label][m]["mean"]) for i in idx],
                                             confidence=rp.confidence)
                              for m in ("snr", "cos_onpolicy", "weight_var", "clip_frac", "mask_frac",
                                        "weight_diff_frac")} for label in labels}
        comparisons: dict[str, dict[str, Any]] = {}
        for label in labels:
            for base in sorted(_baselines(cfg)):
                if base == label or base not in labels:
                    continue
                group = [snapshots[i] for i in idx]
                comparisons.setdefault(label, {})[base] = {metric: st.paired_jackknife_difference(
                    [fn(s, label) for s in group], [fn(s, base) for s in group], [s["batches"] for s in group],
                    confidence=rp.confidence, alpha=rp.alpha, power=rp.power)
                    for metric, fn in (("snr", _snr_fn), ("cos_onpolicy", _cos_fn))}
        out.append({"step": step, "groups": len(idx), "objectives": objectives, "comparisons": comparisons,
                    "kl_behaviour": float(np.nanmean([_num(snapshots[i]["kl_behaviour"]) for i in idx]))})
    return out


def _snr_fn(snap: dict, label: str):
    gram = np.asarray(snap["objectives"][label]["gram"])
    return lambda idx: st.gram_snr(gram, idx)


def _cos_fn(snap: dict, label: str):
    res = snap["objectives"][label]
    gram, dots, ref = np.asarray(res["gram"]), np.asarray(res["dots"]), snap["onpolicy"]["sq_norm"]
    noise = st.mean_noise(np.asarray(snap["onpolicy"]["gram"]))  # g* is a mean of on-policy batches too
    return lambda idx: st.gram_cosine(gram, dots, ref, idx, ref_noise=noise)


# ----------------------------------------------------------------------------------------------------
# The whole report
# ----------------------------------------------------------------------------------------------------


def collect(cfg: LabConfig, jobs: list[Job]) -> dict[str, Any]:
    """The finished jobs' results, by task: ``summaries[label][seed]``, ``warmups[seed]``, ``snapshots``."""
    out: dict[str, Any] = {}
    for tentry in task_entries(cfg):
        out[task_label(tentry, cfg)] = {"summaries": {objective_label(e): {} for e in cfg.grid.objectives},
                                        "warmups": {}, "snapshots": [], "cpu_seconds": 0.0}
    for job in jobs:
        if not job.done():
            continue
        task = out[job.labels["task"]]
        result = read_json(job.result_path)
        task["cpu_seconds"] += float(result.get("cpu_seconds") or 0.0)
        if job.kind == "train":
            task["summaries"][job.labels["objective"]][job.labels["seed"]] = result
        elif job.kind == "warmup":
            task["warmups"][job.labels["seed"]] = result
        else:
            task["snapshots"].append(result)
    for task in out.values():
        task["snapshots"].sort(key=lambda s: (s["step"], s.get("reference_seed", 0), s.get("point", 0)))
        task["summaries"] = {k: v for k, v in task["summaries"].items() if v}
        for by_seed in task["summaries"].values():  # pass@k and avg@k gains over the run, from the warm-up's
            for seed, summary in by_seed.items():
                start = (task["warmups"].get(seed) or {}).get("sampled_eval") or {}
                m = summary["metrics"]
                for name in ("pass_at_k", "avg_at_k"):
                    m[f"{name}_start"] = float(start.get(name, math.nan))
                    m[f"{name}_gain"] = m.get(name, math.nan) - m[f"{name}_start"]
    return out


def build_report(cfg: LabConfig, jobs: list[Job]) -> dict[str, Any]:
    """Everything ``lab.json`` holds (see docs/lab.md, "How a lab runs")."""
    results = collect(cfg, jobs)
    tasks: dict[str, Any] = {}
    for task, data in results.items():
        training = training_study(cfg, data["summaries"]) if data["summaries"] else None
        gradients = gradient_report(cfg, data["snapshots"]) if data["snapshots"] else None
        studies = {"training": training, "gradients": gradients,
                   "objectives": {objective_label(e): build_objective(e).to_dict() for e in cfg.grid.objectives}}
        verdicts = [v.__dict__ for v in judge_rule(cfg.report.rule, _claims(cfg), studies, cfg.report)]
        warm = {s: w["eval"].get("eval/accuracy") for s, w in sorted(data["warmups"].items())}
        tasks[task] = {"training": training, "gradients": gradients, "verdicts": verdicts,
                       "staleness": staleness_study(training, studies["objectives"], cfg.report),
                       "warmup_accuracy": warm, "cpu_seconds": data["cpu_seconds"]}
    return {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "rule": cfg.report.rule, "config": lab_config_to_dict(cfg),
            "objectives": {objective_label(e): {"objective": build_objective(e).to_dict(), "train": dict(e.train)}
                           for e in cfg.grid.objectives},
            "metrics": {"training": TRAIN_METRICS, "gradients": GRADIENT_METRICS}, "tasks": tasks}


def write_report(cfg: LabConfig, root: Path, jobs: list[Job]) -> dict[str, Any]:
    """Write ``lab.json``, ``lab.md`` and ``plots/`` into the lab directory; returns the report."""
    from lmpo.lab.plots import draw_plots

    report = clean(build_report(cfg, jobs))
    root = Path(root)
    plots = draw_plots(report, root / "plots")
    report["plots"] = [str(p.relative_to(root)) for p in plots]
    write_json_atomic(root / "lab.json", report, indent=None)  # compact: the published file is committed
    (root / "lab.md").write_text(render_markdown(report), encoding="utf-8")
    return report


def rejudge(report: dict[str, Any], rule: str) -> dict[str, Any]:
    """A stored ``lab.json`` with every task's verdicts (and staleness study) rebuilt under ``rule`` from its stored
    studies (nothing else changes; the rule is recorded as ``report["rule"]`` and ``config.report.rule``). The
    studies are shared with ``report``, not copied."""
    out = {**report, "config": {**report["config"]}, "tasks": {t: dict(d) for t, d in report["tasks"].items()}}
    rp = dict(out["config"]["report"])
    settings = SimpleNamespace(alpha=rp["alpha"], confidence=rp.get("confidence", 0.95), power=rp.get("power", 0.8),
                               rule=rule)
    for task, data in out["tasks"].items():
        results = stored_results(out, task)
        verdicts = judge_rule(rule, claims_for(rule, rp.get("claims") or ()), results, settings)
        data["verdicts"] = clean([v.__dict__ for v in verdicts])
        if data.get("staleness"):
            data["staleness"] = clean(staleness_study(results["training"], results["objectives"], settings))
    out["rule"] = rule
    out["config"]["report"] = {**rp, "rule": rule}
    return out


# ----------------------------------------------------------------------------------------------------
# Markdown
# ----------------------------------------------------------------------------------------------------


def _ci(d: dict | None, digits: int = 3) -> str:
    if not d:
        return "—"
    lo, hi = d.get("ci", [None, None])
    return f"{_f(d.get('mean', d.get('diff')), digits)} [{_f(lo, digits)}, {_f(hi, digits)}]"


def _cmp(d: dict | None, digits: int = 3) -> str:
    if not d:
        return "—"
    lo, hi = d["ci"]
    return f"{_f(d['diff'], digits)} [{_f(lo, digits)}, {_f(hi, digits)}] p={_f(d['p'], 3)}"


_MARK = {HOLDS: "**holds**", FAILS: "**does not hold**", NO_EFFECT: "no material effect", INVALID: "invalid run",
         NOT_TESTABLE: "not testable here", UNDECIDABLE: "cannot be decided at this budget"}


def _check_cell(c: dict) -> str:
    """One check in the verdict table: Δ [t interval], δ, the minimum detectable effect, p (Holm) and its call."""
    if c.get("metric") == "diverged":
        counts = ", ".join(f"`{k}` {v[0]} of {v[1]} seeds" for k, v in c["diverged"].items())
        return f"{c['says']}: diverged {counts}, Fisher p={_f(c.get('p_test'))}, Holm p={_f(c.get('p_holm'))} → " \
               f"{c.get('verdict', '—')}"
    if "diff" not in c or c.get("not_run"):
        return f"{c['says']}: {'not run (' + c['not_run'] + ')' if c.get('not_run') else '—'}"
    p = f"p={_f(c.get('p_test'))}"
    if c.get("p_holm") is not None:
        p += f", Holm p={_f(c['p_holm'])}"
    pair = f" `{c['objective']}` − `{c['baseline']}`" if "objective" in c else ""
    runs = f", {c['runs']} runs" if c.get("runs") else ""
    if c.get("groups_undefined") or c.get("seeds_unfit"):  # undefined, not computed on a selection
        runs += f" (undefined in {c.get('groups_undefined') or c.get('seeds_unfit')} of {c.get('groups') or c['seeds']} " \
                f"{'groups' if c.get('groups_undefined') else 'seeds: fit not converged'})"
    delta = f"δ={_f(c.get('delta'))}" + (f" [{_f(c['delta_lo'])}, {_f(c['delta_hi'])}]" if "delta_lo" in c else "")
    power = f", power={_f(c['power'], 2)}" if c.get("power") is not None else ""
    return (f"{c['says']}: {c['study']} `{c['metric']}`{pair} Δ {_f(c['diff'])} [{_f(c['ci'][0])}, {_f(c['ci'][1])}]"
            f"{runs}, {delta}, MDE={_f(c.get('mde'))}{power}, {p} → {c.get('verdict', '—')}")


def _gates_cell(v: dict) -> str:
    parts = []
    for g in v.get("gates") or []:
        if g["gate"] == "activity":
            parts.append(f"activity {g['metric']} {_f(g['value'])} (≥ {g['threshold']:g}: {'yes' if g['met'] else 'no'})")
        else:
            parts.append(f"{g['says']}: {'met' if g['met'] else 'unmet'} ({g.get('measured', '')})")
    return "; ".join(parts) or "—"


def _scope(cfg: dict, data: dict) -> str:
    train = cfg["train"]
    return (f"model `{train['model']['name']}`, task `{train['task']['name']}`, {train['loop']['steps']} RL steps × "
            f"{train['loop']['prompts_per_step']} prompts × {train['rollout']['completions_per_prompt']} completions, "
            f"{len(cfg['grid']['seeds'])} seeds, {train['task']['eval_examples']} held-out problems, device "
            f"{train['loop']['device']}")


def _verdict_table(cfg: dict, data: dict) -> list[str]:
    out: list[str] = []
    rule = cfg["report"].get("rule", "v2")
    votes = ("Primary checks are Holm-corrected across the testable claims; secondary checks are reported and do "
             "not vote." if rule == "v2" else "Every part of a claim votes (listed first) and enters Holm's family; "
             "gradient checks have the reference run as the replicate; δ [its interval].")
    out += [f"### Verdicts (rule {rule})", "",
            f"Scope: {_scope(cfg, data)}. {votes} δ: the smallest effect of interest; MDE: the "
            "smallest difference this run detects at 80% power.", "",
            "| claim | objective vs baseline | gates | primary check | secondary checks | verdict |",
            "|---|---|---|---|---|---|"]
    for v in data["verdicts"]:
        primary = [c for c in v["checks"] if c.get("votes", c.get("primary"))]
        secondary = [c for c in v["checks"] if not c.get("votes", c.get("primary"))]
        verdict = _MARK.get(v["verdict"], v["verdict"]) + (f" ({v['reason']})" if v["reason"] else "")
        out.append(f"| {v['text']} ({v['source']}) | `{v['objective']}` vs `{v['baseline']}` | {_gates_cell(v)} | "
                   f"{'; '.join(_check_cell(c) for c in primary) or '—'} | "
                   f"{'; '.join(_check_cell(c) for c in secondary) or '—'} | {verdict} |")
    out.append("")
    return out


def _fit_cell(d: dict | None, digits: int = 3) -> str:
    if not d:
        return "—"
    if d.get("ci") is None:
        return f"not fitted ({d.get('reason') or 'no interval'})"
    return f"{_f(d['mean'], digits)} [{_f(d['ci'][0], digits)}, {_f(d['ci'][1], digits)}]"


def _fit_table(fits: dict | None, baseline: str) -> list[str]:
    """The compute–performance fits (ScaleRL's sigmoid): ceiling A and efficiency B per objective with t intervals
    over seeds, and their paired differences to the baseline; a fit that did not converge says so, with no number."""
    if not fits:
        return []
    out = ["### Compute–performance fits", "",
           f"R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) per seed, held-out accuracy against C = {fits['unit']}; "
           f"mean over seeds [t interval]; Δ: paired difference to `{baseline}` (docs/lab.md, \"Compute–performance "
           "fits\").", "",
           "| objective | ceiling A | efficiency B | C_mid | Δ A | Δ B |", "|---|---|---|---|---|---|"]
    for label, f in fits["objectives"].items():
        comp = fits["comparisons"].get(label, {}).get(baseline) or {}
        out.append(f"| `{label}` | {_fit_cell(f['a'])} | {_fit_cell(f['b'], 2)} | {_fit_cell(f['c_mid'], 1)} | "
                   f"{_fit_cell(comp.get('a'))} | {_fit_cell(comp.get('b'), 2)} |")
    return out + [""]


def render_markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    baseline = cfg["report"]["baseline"]
    out = [f"# Lab report: {cfg['lab']['dir']}", "",
           f"Created {report['created']}. Objectives: {', '.join(f'`{k}`' for k in report['objectives'])}; seeds "
           f"{cfg['grid']['seeds']}; intervals: {int(cfg['report']['confidence'] * 100)}% t intervals; paired t-tests vs "
           f"`{baseline}`. Every number is in `lab.json`; the method and the verdict rule are in docs/lab.md.", ""]
    for task, data in report["tasks"].items():
        out += [f"## Task `{task}`", "", f"CPU time of the finished jobs: {data['cpu_seconds'] / 60:.1f} min.", ""]
        if data["warmup_accuracy"]:
            accs = ", ".join(f"seed {s}: {_f(a)}" for s, a in data["warmup_accuracy"].items())
            out += [f"Held-out accuracy after the warm-up (the RL start): {accs}.", ""]
        stale = data.get("staleness")
        if stale:
            out += [f"### Staleness study (rule {stale.get('rule', 'v2')})", "",
                    f"Rows: staleness k (`rollout.async_staleness`); columns: the correction. Each cell: held-out "
                    f"accuracy Δ vs `{stale['baseline']}` [95% t interval, paired by seed] → verdict of the "
                    "non-inferiority check (δ = 25% of the baseline's RL accuracy gain; Holm across this table's "
                    "checks); KL: mean k3 KL(sampler ‖ trainer) per token; the correction's activity (its gate). "
                    "A diverged cell (held-out accuracy below its start by more than the margin) is an invalid run; "
                    "a correction that does not act is not testable here.", "",
                    *staleness_table(stale), ""]
            gated = [v for v in stale["verdicts"] if v["reason"]]
            out += [f"- `{v['objective']}`: {v['verdict']} ({v['reason']})" for v in gated] + ([""] if gated else [])
        if stale and all(v["verdict"] == NOT_RUN for v in data["verdicts"]):
            # a staleness grid names none of the registry's objectives: a table of "not run" rows says nothing
            out += ["The registry's claims (docs/lab.md) are not run: none of their objectives is in this grid.", ""]
        else:
            out += _verdict_table(cfg, data)
        tr = data["training"]
        if tr:
            out += ["### Training study", "",
                    f"Mean over seeds [{int(cfg['report']['confidence'] * 100)}% t interval]; Δ: paired "
                    f"difference to `{baseline}` [interval] and paired t-test p.", "",
                    "| objective | held-out accuracy | Δ accuracy | reward AUC | Δ reward AUC | entropy start → min → end "
                    "| pass@k start → end | avg@k start → end | clip frac | mask frac | length (sampled / held-out) "
                    "| steps/s |",
                    "|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for label, m in tr["metrics"].items():
                comp = tr["comparisons"].get(label, {}).get(baseline, {})
                out.append(
                    f"| `{label}` | {_ci(m['accuracy'])} | {_cmp(comp.get('accuracy'))} | {_ci(m['reward_auc'])} | "
                    f"{_cmp(comp.get('reward_auc'))} | {_f(m['entropy_start']['mean'])} → {_f(m['entropy_min']['mean'])}"
                    f" → {_f(m['entropy_end']['mean'])} | {_f(m['pass_at_k_start']['mean'])} → {_f(m['pass_at_k']['mean'])} | "
                    f"{_f(m['avg_at_k_start']['mean'])} → {_f(m['avg_at_k']['mean'])} | "
                    f"{_f(m['clip_frac']['mean'])} | {_f(m['mask_frac']['mean'])} | "
                    f"{_f(m['length']['mean'], 1)} / {_f(m['eval_length']['mean'], 1)} | {_f(m['steps_per_s']['mean'], 2)} |")
            out.append("")
            out += _fit_table(tr.get("fits"), baseline)
        gr = data["gradients"]
        if gr:
            out += ["### Gradient study", "",
                    "Per snapshot of the reference run: every objective's gradient on the same R off-policy batches "
                    "(SNR and cosine: estimate [jackknife interval over batches]; per-batch metrics: mean [t interval]).", ""]
            first = gr["snapshots"][0]
            out += [f"{len(gr['snapshots'])} groups: every (reference seed, off-policy point) at each snapshot; R = "
                    f"{first['batches']} batches and k = {first['updates_before_gradient']} update(s) each, "
                    f"{first['num_params']} parameters. Per RL step, the mean over its groups [t interval over them] "
                    "and the paired SNR / cosine differences pooled over them (jackknife over batches).", ""]
            for snap in gr.get("by_step") or []:
                out += [f"RL step {snap['step']} ({snap['groups']} groups, KL(behaviour ‖ policy) on the batches "
                        f"{_f(snap['kl_behaviour'])}):", "",
                        f"| objective | SNR | cosine to on-policy | importance-weight variance | clip frac | mask frac | "
                        f"tokens whose gradient weight differs from `{baseline}`'s | Δ SNR | Δ cosine |",
                        "|---|---|---|---|---|---|---|---|---|"]
                for label, row in snap["objectives"].items():
                    c = snap["comparisons"].get(label, {}).get(baseline) or {}
                    out.append(f"| `{label}` | {_ci(row['snr'])} | {_ci(row['cos_onpolicy'])} | "
                               f"{_ci(row['weight_var'])} | {_f(row['clip_frac']['mean'])} | "
                               f"{_f(row['mask_frac']['mean'])} | {_f(row['weight_diff_frac']['mean'])} | "
                               f"{_cmp(c.get('snr'))} | {_cmp(c.get('cos_onpolicy'))} |")
                out.append("")
            out += [f"Pooled over snapshots, paired differences to `{baseline}`:", "",
                    "| objective | Δ SNR | Δ cosine | Δ weight variance |", "|---|---|---|---|"]
            for label, comps in gr["comparisons"].items():
                c = comps.get(baseline)
                if c:
                    out.append(f"| `{label}` | {_cmp(c['snr'])} | {_cmp(c['cos_onpolicy'])} | "
                               f"{_cmp(c['weight_var'])} |")
            out.append("")
    if report.get("plots"):
        out += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in report["plots"]] + [""]
    return "\n".join(out)


__all__ = ["GRADIENT_METRICS", "PER_BATCH", "TRAIN_METRICS", "build_report", "clean", "collect", "rejudge",
           "render_markdown",
           "training_study", "write_report"]
