"""The quality gate of docs/sac.md: PASS/FAIL rows computed from finished runs.

``lmpo sac gate RUN_DIR…`` reads each run's ``summary.json``.  A run whose config has BC, top-p and the
adaptive α switched on is a *main* run (one per seed); a run with exactly one of them off is the
corresponding ablation.  ``lmpo sac gate --config FILE --out DIR`` trains three seeds and the three
ablations first (two at a time), then judges them.  Every row states the measured numbers; a row whose
evidence is missing is a FAIL, never a PASS.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ABLATIONS = {
    "no_bc": {"sac.bc_weight": 0.0},
    "no_top_p": {"sac.use_top_p": False},
    "fixed_alpha": {"sac.autotune_alpha": False},
}
MARGIN_PP = 10.0
ABLATION_DROP_PP = 5.0
NGRAM_MARGIN_PP = 3.0
REPEAT_SLACK_PP = 5.0
REFERENCE = "reference"


def _kind(cfg: dict[str, Any]) -> str:
    sac = cfg["sac"]
    off = [name for name, flag in (("no_bc", sac["bc_weight"] <= 0), ("no_top_p", not sac["use_top_p"]),
                                   ("fixed_alpha", not sac["autotune_alpha"])) if flag]
    if not off:
        return "main"
    return off[0] if len(off) == 1 else "+".join(off)


def load_runs(run_dirs: list[str | Path]) -> list[dict[str, Any]]:
    runs = []
    for d in run_dirs:
        path = Path(d) / "summary.json"
        if not path.exists():
            raise FileNotFoundError(f"{d}: no summary.json (the run did not finish); train it or leave it out")
        s = json.loads(path.read_text(encoding="utf-8"))
        s["run_dir"] = str(d)
        s["kind"] = REFERENCE if s.get("kind") == REFERENCE else _kind(s["config"])
        runs.append(s)
    return runs


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _fmt(x: float, pct: bool = True) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{100 * x:.2f}%" if pct else f"{x:.4g}"


def _critic_trend(run: dict[str, Any]) -> dict[str, Any]:
    """Critic-loss trend of one run, judged on the log rows after the DAgger anneal has finished.

    While the teacher ratio anneals, the data mix moves from teacher to agent transitions and the TD targets'
    noise (the agent's rewards vary more) grows with it, so the Huber loss is not comparable across that
    phase; once the mix is fixed a critic that is learning has a falling loss.  The whole-run ratio (last
    quarter / second quarter) is printed beside it.
    """
    c = [x for x in run["critic_loss_curve"] if x is not None]
    ratios = run.get("teacher_ratio_curve") or []
    end = run["config"]["replay"]["teacher_ratio_end"]
    start = next((i for i, t in enumerate(ratios) if t is not None and t <= end + 1e-6), None)
    q = max(1, len(c) // 4)
    whole = _mean(c[-q:]) / _mean(c[q:2 * q]) if len(c) >= 4 else float("nan")
    post = c[start:] if start is not None else []
    if len(post) < 8:
        return {"ok": False, "measured": f"{len(post)} log rows after the anneal (need ≥ 8); whole run "
                                         f"{_fmt(whole, pct=False)}"}
    qp = len(post) // 4
    ratio = _mean(post[-qp:]) / _mean(post[:qp])
    return {"ok": ratio <= 1.0, "measured": f"{_fmt(ratio, pct=False)} over {len(post)} rows after the anneal "
                                             f"(whole run {_fmt(whole, pct=False)})"}


def judge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Compute the gate rows: each has criterion, measured, status ("PASS" / "FAIL")."""
    main = [r for r in runs if r["kind"] == "main"]
    rows: list[dict[str, str]] = []

    def row(name: str, criterion: str, measured: str, ok: bool) -> None:
        rows.append({"check": name, "criterion": criterion, "measured": measured, "status": "PASS" if ok else "FAIL"})

    # ---- stability
    seeds = sorted({r["config"]["seed"] for r in main})
    diverged = [r["config"]["seed"] for r in main
                if r["nonfinite_skips"] > 0 or not all(math.isfinite(x) for x in r["critic_loss_curve"] if x is not None)]
    row("stability: 3 seeds without divergence", "≥ 3 main seeds, 0 non-finite updates, finite critic loss",
        f"seeds {seeds}; diverged {diverged}; non-finite skips {[r['nonfinite_skips'] for r in main]}",
        len(seeds) >= 3 and not diverged)
    trends = [_critic_trend(r) for r in main]
    row("critic Huber loss trend",
        "after the DAgger anneal: last-quarter mean ≤ first-quarter mean (every seed)",
        "; ".join(f"seed {r['config']['seed']}: {t['measured']}" for r, t in zip(main, trends)) or "no main run",
        bool(trends) and all(t["ok"] for t in trends))
    alphas = [a for r in main for a in r["alpha_curve"] + [r["alpha_final"]] if a is not None]
    row("α inside [1e-4, 2]", "every logged α and the final α",
        f"min {_fmt(min(alphas), False)} max {_fmt(max(alphas), False)}" if alphas else "no α logged",
        bool(alphas) and all(1e-4 * (1 - 1e-6) <= a <= 2.0 * (1 + 1e-6) for a in alphas))

    # ---- held-out quality vs the n-gram baseline (the best order for each metric) and the supervised twin
    ev = [r["eval"] for r in main if "eval" in r]
    refs = [r for r in runs if r["kind"] == REFERENCE and "eval" in r]
    base = ev[0]["baseline"] if ev else None
    border = ev[0]["baseline_order"] if ev else None
    best = {key: baseline_for(ev, key) for key in ("top1", "top3", "coverage4", "chrf", "bleu")}
    for key, label in (("top1", "top-1"), ("top3", "top-3")):
        a = _mean([e["agent"][key] for e in ev])
        order, b = best[key]
        per_seed = ", ".join(_fmt(e["agent"][key]) for e in ev)
        row(f"held-out {label} character hit", f"agent ≥ {order}-gram baseline + {MARGIN_PP:.0f} pp",
            f"agent {_fmt(a)} (seeds {per_seed}) vs baseline {_fmt(b)}; Δ {100 * (a - b):+.2f} pp; "
            f"{ceiling(refs, key)}", bool(ev) and 100 * (a - b) >= MARGIN_PP)
    a_cov = _mean([e["generation"]["agent"]["coverage4"] for e in ev])
    b_cov = best["coverage4"][1]
    row("free-running 4-gram coverage", f"agent ≥ baseline + {MARGIN_PP:.0f} pp",
        f"agent {_fmt(a_cov)} vs baseline {_fmt(b_cov)}{_order_note(ev, 'coverage4', best)}; "
        f"Δ {100 * (a_cov - b_cov):+.2f} pp; {ceiling(refs, 'coverage4')}",
        bool(ev) and 100 * (a_cov - b_cov) >= MARGIN_PP)
    for key in ("chrf", "bleu"):
        a = _mean([e["generation"]["agent"][key] for e in ev])
        b = best[key][1]
        row(f"{key} (sacrebleu, char level)", "agent ≥ baseline",
            f"agent {a:.2f} vs baseline {b:.2f}{_order_note(ev, key, best)}", bool(ev) and a >= b)

    # ---- compliance
    ill = [e["compliance"]["illegal_rate"] for e in ev if "compliance" in e] + [r["illegal_rate_train"] for r in main]
    row("illegal-action rate", "< 0.1% (held-out rollouts and training agent steps)",
        f"max {_fmt(max(ill)) if ill else 'n/a'}", bool(ill) and max(ill) < 1e-3)
    early = [e["compliance"]["early_termination_rate"] for e in ev if "compliance" in e]
    row("early-termination rate", "< 1% of held-out agent episodes",
        f"max {_fmt(max(early)) if early else 'n/a'} over {sum(e['compliance']['episodes'] for e in ev if 'compliance' in e)} episodes",
        bool(early) and max(early) < 0.01)

    # ---- the supervised twin, a fixed n-gram margin and repetition
    for key, label in (("top1", "top-1"), ("top3", "top-3")):
        a = _mean([e["agent"][key] for e in ev])
        per_seed = ", ".join(_fmt(e["agent"][key]) for e in ev)
        crit = "mean over main seeds ≥ the supervised twin's (`lmpo sac reference` run)"
        if not ev:
            row(f"held-out {label} ≥ supervised twin", crit, "no main run with an evaluation", False)
        elif not refs:
            row(f"held-out {label} ≥ supervised twin", crit, f"agent {_fmt(a)} (seeds {per_seed}); no reference run "
                "given (pass the run directory of `lmpo sac reference` among RUN_DIRs)", False)
        else:
            t = _mean([r["eval"]["agent"][key] for r in refs])
            row(f"held-out {label} ≥ supervised twin", crit,
                f"agent {_fmt(a)} (seeds {per_seed}) vs twin {_fmt(t)}; Δ {100 * (a - t):+.2f} pp", a >= t)
    for key, label in (("top1", "top-1"), ("top3", "top-3")):
        a = _mean([e["agent"][key] for e in ev])
        order, b = best[key]
        deltas = ", ".join(f"{100 * (e['agent'][key] - b):+.2f}" for e in ev)
        row(f"held-out {label} ≥ n-gram + {NGRAM_MARGIN_PP:.0f} pp",
            f"mean over main seeds ≥ best-order n-gram for {label} ({order}-gram, fitted on the base corpus's "
            f"train chapters) + {NGRAM_MARGIN_PP:.0f} pp",
            f"agent {_fmt(a)} vs {order}-gram {_fmt(b)}; Δ {100 * (a - b):+.2f} pp (seeds {deltas} pp)"
            if ev else "no main run with an evaluation", bool(ev) and 100 * (a - b) >= NGRAM_MARGIN_PP)
    reps = [e["generation"]["agent"].get("repeat4") for e in ev]
    ref_rep = [e["generation"].get("reference", {}).get("repeat4") for e in ev]
    crit = f"agent's mean repeat4 ≤ the true continuations' + {REPEAT_SLACK_PP:.0f} pp"
    if not ev or None in reps or None in ref_rep:
        row("free-running repeated 4-grams", crit, "no main run with an evaluation" if not ev else
            "not measured (a summary without repeat4: re-evaluate with `lmpo sac train --resume --eval-only`)", False)
    else:
        a, t = _mean(reps), _mean(ref_rep)
        b = _mean([e["generation"]["baseline"].get("repeat4", float("nan")) for e in ev])
        row("free-running repeated 4-grams", crit,
            f"agent {_fmt(a)} (seeds {', '.join(_fmt(x) for x in reps)}) vs true continuations {_fmt(t)}; "
            f"Δ {100 * (a - t):+.2f} pp; baseline {_fmt(b)}", 100 * (a - t) <= REPEAT_SLACK_PP)

    # ---- ablations: each switch must matter (key metric: held-out top-1)
    main_top1 = _mean([e["agent"]["top1"] for e in ev])
    main_speed = _mean([r["updates"] / r["train_seconds"] for r in main if r.get("train_seconds")])
    for name in ABLATIONS:
        abl = [r for r in runs if r["kind"] == name and "eval" in r]
        if not abl:
            row(f"ablation {name}", f"top-1 drops ≥ {ABLATION_DROP_PP:.0f} pp", "not run", False)
            continue
        t = _mean([r["eval"]["agent"]["top1"] for r in abl])
        drop = 100 * (main_top1 - t)
        speed = _mean([r["updates"] / r["train_seconds"] for r in abl if r.get("train_seconds")])
        row(f"ablation {name}", f"top-1 drops ≥ {ABLATION_DROP_PP:.0f} pp",
            f"top-1 {_fmt(t)} vs main {_fmt(main_top1)}; drop {drop:+.2f} pp; updates "
            f"{'/'.join(str(r['updates']) for r in abl)} vs main {'/'.join(str(r['updates']) for r in main)}; "
            f"{speed:.2f} vs {main_speed:.2f} updates/s", drop >= ABLATION_DROP_PP)

    overall = all(r["status"] == "PASS" for r in rows)
    out = {"overall": "PASS" if overall else "FAIL", "rows": rows,
           "runs": [{"run_dir": r["run_dir"], "kind": r["kind"], "seed": r["config"]["seed"],
                     "updates": r["steps"] if r["kind"] == REFERENCE else r["updates"],
                     "env_steps": None if r["kind"] == REFERENCE else r["env_steps"],
                     "train_seconds": round(r.get("train_seconds", 0.0), 1),
                     "top1": r.get("eval", {}).get("agent", {}).get("top1"),
                     "top3": r.get("eval", {}).get("agent", {}).get("top3")} for r in runs],
           "baseline": {"order": border, **(base or {})},
           "baseline_best": {k: {"order": o, "value": v} for k, (o, v) in best.items()}}
    if refs:
        out["reference"] = {"runs": [r["run_dir"] for r in refs],
                            **{k: _mean([r["eval"]["agent"][k] for r in refs]) for k in ("top1", "top3")},
                            "interpolation": {k: _mean([r["eval"].get("interpolation", {}).get(k, float("nan"))
                                                        for r in refs]) for k in ("top1", "top3")},
                            "coverage4": _mean([r["eval"]["generation"]["agent"]["coverage4"] for r in refs])}
    return out


def baseline_for(ev: list[dict[str, Any]], key: str) -> tuple[int | None, float]:
    """(order, value) of the n-gram baseline the gate compares ``key`` against: the best order for that metric
    (``eval.baseline_best``), or, in summaries written before it existed, the best-by-top-1 order as before.

    Teacher-forced values are the first main run's (every seed scores the same positions); free-running ones
    are the mean over the main runs, as before.
    """
    if not ev:
        return None, float("nan")
    if key in ("top1", "top3"):
        bb = ev[0].get("baseline_best", {}).get(key)
        return (bb["order"], bb["value"]) if bb else (ev[0]["baseline_order"], ev[0]["baseline"][key])
    bbs = [e.get("baseline_best", {}).get(key) for e in ev]
    if all(bbs):
        return bbs[0]["order"], _mean([b["value"] for b in bbs])
    return ev[0]["baseline_order"], _mean([e["generation"]["baseline"][key] for e in ev])


def _order_note(ev: list[dict[str, Any]], key: str, best: dict[str, tuple[int | None, float]]) -> str:
    """" (k-gram)" when the summaries name the best order per metric (new summaries), else nothing."""
    return f" ({best[key][0]}-gram)" if ev and all("baseline_best" in e for e in ev) else ""


def ceiling(refs: list[dict[str, Any]], key: str) -> str:
    """The supervised twin's number beside a "+10 pp" row (what imitation alone reaches with this network)."""
    if not refs:
        return "ceiling: no reference run given"
    if key == "coverage4":
        return f"ceiling: supervised twin {_fmt(_mean([r['eval']['generation']['agent']['coverage4'] for r in refs]))}" \
               " (free-running)"
    twin = _mean([r["eval"]["agent"][key] for r in refs])
    inter = [r["eval"].get("interpolation", {}).get(key) for r in refs]
    text = f"ceiling: supervised twin {_fmt(twin)}"
    if None not in inter:
        text += f", twin+n-gram interpolation {_fmt(_mean(inter))} (λ picked on held-out: upper bound)"
    return text


def to_markdown(result: dict[str, Any]) -> str:
    lines = [f"**Gate: {result['overall']}**", ""]
    if "heldout" in result:
        lines += [heldout_text(result["heldout"]), ""]
    lines += ["| check | criterion | measured | status |", "|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['check']} | {r['criterion']} | {r['measured']} | {r['status']} |")
    lines += ["", "| run | kind | seed | updates | env steps | train s | top-1 | top-3 |", "|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        env_steps = "—" if r["env_steps"] is None else r["env_steps"]
        lines.append(f"| {r['run_dir']} | {r['kind']} | {r['seed']} | {r['updates']} | {env_steps} | "
                     f"{r['train_seconds']} | {_fmt(r['top1'])} | {_fmt(r['top3'])} |")
    return "\n".join(lines) + "\n"


def print_table(result: dict[str, Any]) -> None:
    w = max(len(r["check"]) for r in result["rows"])
    for r in result["rows"]:
        print(f"{r['status']:4s}  {r['check']:<{w}}  {r['measured']}   [{r['criterion']}]")
    print(f"GATE {result['overall']}")


def run_gate(run_dirs: list[str | Path], out_dir: str | Path, heldout: str | Path | None = None) -> dict[str, Any]:
    """Judge the runs (on their own held-out chapters, or re-scored on ``heldout``'s); write gate.json / .md."""
    runs = load_runs(run_dirs)
    report = None
    if heldout is not None:
        runs, report = rescore_on_file(runs, heldout)
    result = judge(runs)
    if report is not None:
        result["heldout"] = report
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gate.json").write_text(json.dumps(result, indent=2, ensure_ascii=False))
    (out / "gate.md").write_text(to_markdown(result), encoding="utf-8")
    if report is not None:
        print(heldout_text(report))
    print_table(result)
    return result


# ---------------------------------------------------------------------------------------- --heldout FILE
LEAK_CHARS = 10


def load_heldout_file(path: str | Path):
    """FILE's chapters and paragraphs (``lmpo.textagent.env.load_corpus`` formats); an InputError names the fix."""
    from lmpo.errors import InputError
    from lmpo.textagent.env import load_corpus
    from lmpo.textagent.env.corpus import CorpusError

    fix = ('give a held-out text: a JSON list of {"chapter": str, "paragraphs": [str, ...]} objects, a UTF-8 '
           "text file or a directory of them")
    if not Path(path).exists():
        raise InputError(f"--heldout {str(path)!r}: no such file or directory; {fix}.")
    try:
        corpus = load_corpus(path)
        paragraphs = file_paragraphs(path)
    except CorpusError as e:
        raise InputError(f"--heldout {str(path)!r}: {e}; {fix}.") from None
    except OSError as e:
        raise InputError(f"--heldout {str(path)!r}: cannot be read ({type(e).__name__}: {e.strerror or e}); {fix}.") \
            from None
    return list(corpus.chapters), paragraphs


def file_paragraphs(path: str | Path) -> list[str]:
    """FILE's paragraphs as the ``extra_train_corpus`` leak filter reads them: each JSON ``paragraphs`` entry, each
    chapter of a text file (:func:`lmpo.textagent.env.corpus.load_extra_text`)."""
    from lmpo.textagent.env.corpus import paragraph_units

    return [p for paras in paragraph_units(path) for p in paras]


def check_scorable(runs: list[dict[str, Any]]) -> None:
    """Every run has weights to score: a valid checkpoint (SAC run) or policy.safetensors (reference run)."""
    from lmpo.checkpoints import latest_valid_checkpoint, list_checkpoints
    from lmpo.errors import InputError
    from lmpo.textagent.sac.config import POLICY_FILE

    for r in runs:
        d = Path(r["run_dir"])
        if r["kind"] == REFERENCE:
            if not (d / POLICY_FILE).is_file():
                raise InputError(f"--heldout: reference run {str(d)!r} has no {POLICY_FILE}; re-run `lmpo sac "
                                 "reference --run-dir RUN_DIR --overwrite`, or leave the run out.")
        elif latest_valid_checkpoint(d) is None:
            what = "only damaged checkpoints" if list_checkpoints(d) else "no checkpoint"
            raise InputError(f"--heldout: run {str(d)!r} has {what} to score; continue it with `lmpo sac train "
                             "--resume --run-dir RUN_DIR` (it writes one at the end), or leave the run out.")


def _load_policy(run: dict[str, Any]):
    """(agent, cfg, text split) of a finished run: the newest valid checkpoint, or the reference's weights."""
    from lmpo.runs import stored_config_path
    from lmpo.textagent.sac.agent import SACAgent
    from lmpo.textagent.sac.config import config_from_dict, run_config_dict
    from lmpo.textagent.sac.sample import load_agent
    from lmpo.textagent.sac.train import text_split
    from lmpo.textagent.sac.weights import load_reference_policy

    d = Path(run["run_dir"])
    cfg = config_from_dict(run_config_dict(d) if stored_config_path(d) is not None else run["config"])
    split = text_split(cfg)
    if run["kind"] == REFERENCE:
        agent = SACAgent(len(split.alphabet), split.alphabet.pad_id, cfg.net, cfg.sac, seed=cfg.seed, device="cpu")
        agent.policy.load_state_dict(load_reference_policy(d, split.alphabet))
    else:
        agent = load_agent(d)[0]
    return agent, cfg, split


def rescore_on_file(runs: list[dict[str, Any]], path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each run's summary with ``eval`` recomputed on FILE's chapters (the gate's protocol), plus the report.

    Same protocol as :func:`lmpo.textagent.sac.evaluate.evaluate_run` with the run's own evaluation settings: teacher-forced
    top-1 / top-3, free-running generations, compliance rollouts, n-gram baselines fitted on the run's base
    corpus train chapters. FILE's characters outside the run's alphabet count as misses. The report counts, per
    run, FILE's paragraphs that share a run of ``LEAK_CHARS`` Han characters with the run's training text.
    """
    from types import SimpleNamespace

    import numpy as np

    from lmpo.textagent.env import CharTextEnv, Compliance
    from lmpo.textagent.sac.evaluate import evaluate_run, heldout_positions
    from lmpo.textagent.sac.reference import interpolation
    from lmpo.textagent.sac.train import EnvBundle

    chapters, paragraphs = load_heldout_file(path)
    check_scorable(runs)
    report: dict[str, Any] = {"file": str(path), "chapters": len(chapters), "paragraphs": len(paragraphs),
                              "chars": sum(len(c) for c in chapters), "leak_chars": LEAK_CHARS, "runs": {}}
    out = []
    for run in runs:
        agent, cfg, split = _load_policy(run)
        alphabet, env_cfg = split.alphabet, cfg.env_config()
        cc = env_cfg.compliance
        compliance = Compliance(alphabet, cc.max_run_chars, frozenset("".join(cc.blacklist)),
                                cc.blacklist_path, cc.whitelist_size)
        bundle = EnvBundle(
            envs=[SimpleNamespace(compliance=compliance)], num_actions=len(alphabet), pad_id=alphabet.pad_id,
            eos_id=alphabet.eos_id, window=env_cfg.episode.window_chars, decode=alphabet.decode,
            code_points=np.zeros(0, dtype=np.int64), alphabet=alphabet, train_chapters=split.train,
            heldout_chapters=chapters, extra_chapters=split.extra,
            make_eval_env=lambda ch, a=alphabet, c=env_cfg: CharTextEnv(ch, a, c))
        ev = evaluate_run(agent, bundle, cfg)
        if run["kind"] == REFERENCE:
            positions = heldout_positions(chapters, cfg.eval_max_positions)
            ev["interpolation"] = interpolation(agent, bundle, positions, ev["baseline_order"])
        known = set(alphabet.chars)
        report["runs"][run["run_dir"]] = {
            "leaked_paragraphs": leaked_paragraphs(paragraphs, split.train + split.extra, LEAK_CHARS),
            "chars_outside_alphabet": sum(ch not in known for c in chapters for ch in c)}
        out.append({**run, "eval": ev, "eval_source": str(path)})
    return out, report


def leaked_paragraphs(paragraphs: list[str], training: list[str], n: int = LEAK_CHARS) -> int:
    """How many ``paragraphs`` share a run of ``n`` Han characters with ``training`` (the rule of the
    ``extra_train_corpus`` leak filter, :func:`lmpo.textagent.env.corpus.load_extra_text`; the paragraphs' runs are
    indexed, so the training text is scanned once)."""
    from lmpo.textagent.env.corpus import han_ngrams

    owner: dict[str, list[int]] = {}
    for i, p in enumerate(paragraphs):
        for g in han_ngrams(p, n):
            owner.setdefault(g, []).append(i)
    hit: set[int] = set()
    for text in training:
        for g in han_ngrams(text, n):
            hit.update(owner.get(g, ()))
    return len(hit)


def heldout_text(report: dict[str, Any]) -> str:
    """One paragraph: what FILE holds and how much of it the runs' training text already contains."""
    per = "; ".join(f"{d}: {v['leaked_paragraphs']} of {report['paragraphs']} paragraphs share a "
                    f"{report['leak_chars']}-Han-character run with its training text, {v['chars_outside_alphabet']} "
                    "characters outside its alphabet (scored as misses)" for d, v in report["runs"].items())
    return (f"Held-out text {report['file']}: {report['chapters']} chapters, {report['paragraphs']} paragraphs, "
            f"{report['chars']} characters. {per}.")


def _ablation_job(out: Path, name: str, seed: int) -> tuple[Path, list[str]]:
    sw = [t for k, v in ABLATIONS[name].items() for t in (f"--{k}", str(v))]
    return out / f"{name}_seed{seed}", ["--seed", str(seed), *sw]


def train_gate_runs(config: str | None, out_dir: str | Path, seeds: list[int], ablations: list[str],
                    parallel: int, extra: list[str]) -> list[Path]:
    """Train the main seeds and the ablations (seed of the first main run) as ``lmpo sac train`` processes."""
    out = Path(out_dir)
    jobs: list[tuple[Path, list[str]]] = []
    base = [sys.executable, "-m", "lmpo.cli", "sac", "train"] + (["--config", config] if config else [])
    for name in ablations:
        if name not in ABLATIONS:
            raise ValueError(f"unknown ablation {name!r}; use {sorted(ABLATIONS)}")
    # no_top_p evaluates Q on every legal action, several times slower per update than the others: starting
    # it first lets the other runs fill the remaining slots while it trains
    slow_first = [n for n in ablations if n == "no_top_p"]
    jobs += [_ablation_job(out, n, seeds[0]) for n in slow_first]
    jobs += [(out / f"seed{s}", ["--seed", str(s)]) for s in seeds]
    jobs += [_ablation_job(out, n, seeds[0]) for n in ablations if n not in slow_first]
    running: list[tuple[subprocess.Popen, Path]] = []
    pending = list(jobs)
    while pending or running:
        while pending and len(running) < max(1, parallel):
            d, args = pending.pop(0)
            d.mkdir(parents=True, exist_ok=True)
            log = open(d / "train.log", "w")
            cmd = base + ["--run-dir", str(d), "--quiet", *args, *extra]
            print("[gate] " + " ".join(cmd[2:]), flush=True)
            running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), d))
        time.sleep(2)
        for p, d in list(running):
            if p.poll() is not None:
                running.remove((p, d))
                print(f"[gate] finished {d} (exit {p.returncode})", flush=True)
    return [d for d, _ in jobs if (d / "summary.json").exists()]
