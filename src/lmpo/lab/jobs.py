"""Running one job: a warm-up, a training cell or a gradient-study snapshot.

``run_job(job_dir)`` reads ``job_dir/job.json`` and runs it in this process; ``python -m lmpo.lab.worker`` is the
same call in a process of its own. Every job writes its result file last and atomically (temporary file +
rename), so a job is finished exactly when that file exists, whatever killed an earlier attempt.

A training cell resumes from its newest checkpoint when it has one (a CPU run resumed this way equals the
uninterrupted run bit for bit, docs/trainer.md) and otherwise starts over in a clean run directory.
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lmpo.lab import stats as st
from lmpo.trainer.config import config_from_dict

JOB_FILE = "job.json"
RUN_SUBDIR = "run"
"""A job's trainer run directory, below its job directory (the job's own files stay outside it)."""

RESULT_FILES = {"warmup": "warmup.json", "train": "summary.json", "gradients": "result.json"}
"""Job kind → the file whose presence marks the job finished (written last, atomically)."""


def write_json_atomic(path: Path, data: Any, indent: int | None = 1) -> None:
    """Write JSON to a temporary file and rename it into place: readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=indent, allow_nan=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _cpu_seconds() -> float:
    # children too: a cell with rollout.async_staleness >= 1 generates in its rollout worker process, which the
    # trainer joins before the job ends (its time is in RUSAGE_CHILDREN then); without it an async cell would
    # report only its training half
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def run_job(job_dir: str | os.PathLike, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the job described by ``job_dir/job.json`` here; returns its result (also written to its file)."""

    job_dir = Path(job_dir)
    job = read_json(job_dir / JOB_FILE)
    log = log or (lambda msg: print(msg, flush=True))
    t0, c0 = time.perf_counter(), _cpu_seconds()
    kind = job["kind"]
    if kind == "warmup":
        result = run_warmup(job_dir, job["spec"], log)
    elif kind == "train":
        result = run_cell(job_dir, job["spec"], log)
    elif kind == "gradients":
        from lmpo.lab.gradients import gradient_study

        result = gradient_study(job["spec"], log)
    else:
        raise ValueError(f"{job_dir / JOB_FILE}: unknown job kind {kind!r}")
    result["wall_seconds"] = time.perf_counter() - t0
    result["cpu_seconds"] = _cpu_seconds() - c0
    write_json_atomic(job_dir / RESULT_FILES[kind], result)
    return result


def _fresh(run_dir: Path) -> None:
    if run_dir.exists():
        shutil.rmtree(run_dir)


def run_warmup(job_dir: Path, spec: dict, log: Callable[[str], None]) -> dict[str, Any]:
    """The supervised warm-up of one (task, seed); saves the model to ``job_dir/model``."""
    from lmpo.trainer import Trainer

    cfg = config_from_dict(spec["train"])
    _fresh(Path(cfg.logging.run_dir))  # a warm-up has no checkpoints: an interrupted one starts over
    trainer = Trainer(cfg, log=log)
    result = trainer.train()
    tmp, final = job_dir / ".model.tmp", job_dir / "model"
    _fresh(tmp)
    trainer.model.save_pretrained(tmp)
    trainer.tokenizer.save_pretrained(tmp)
    _fresh(final)
    os.replace(tmp, final)
    out = {"eval": result.eval_after or {}, "sft_steps": len(result.sft_losses),
           "sft_loss_last": result.sft_losses[-1] if result.sft_losses else None}
    k = int(spec.get("sampled_eval_k", 0))
    if k > 0:  # pass@k / avg@k at the start of RL: what the exploration precondition compares the end with
        out["sampled_eval"] = sampled_evaluation(trainer, k, seed=cfg.loop.seed)
    return out


def run_cell(job_dir: Path, spec: dict, log: Callable[[str], None]) -> dict[str, Any]:
    """One training cell: resume from its newest checkpoint or start clean; summarise its metrics."""
    from lmpo.trainer import Trainer
    from lmpo.trainer.run.state import checkpoint_dir, latest_checkpoint

    cfg = config_from_dict(spec["train"])
    run_dir = Path(cfg.logging.run_dir)
    resume = latest_checkpoint(run_dir)
    if resume is None:
        _fresh(run_dir)
    else:
        log(f"resuming {run_dir} from {resume.name}")
    trainer = Trainer(cfg, log=log)
    result = trainer.train(resume="auto" if resume is not None else None)
    summary = summarise_run(run_dir)
    summary["nonfinite_skipped"] = result.nonfinite_skipped
    k = int(spec.get("sampled_eval_k", 0))
    if k > 0:  # pass@k / avg@k for the entropy and exploration claims (sampled, not greedy)
        summary["sampled_eval"] = sampled_evaluation(trainer, k, seed=cfg.loop.seed)
        summary["metrics"]["pass_at_k"] = summary["sampled_eval"]["pass_at_k"]
        summary["metrics"]["avg_at_k"] = summary["sampled_eval"]["avg_at_k"]
    summary["resumed_from_step"] = int(resume.name.split("_")[-1]) if resume is not None else 0
    if not spec.get("keep_checkpoints", False):
        shutil.rmtree(checkpoint_dir(run_dir), ignore_errors=True)
    return summary


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, arXiv 2107.03374):
    ``1 − C(n − c, k) / C(n, k)``; with k = n it is 1 when any sample is correct."""
    if not 0 < k <= n:
        raise ValueError(f"pass_at_k: need 0 < k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    out = 1.0
    for i in range(n - c + 1, n + 1):  # Π (1 − k/i): the product form of C(n−c, k)/C(n, k)
        out *= 1.0 - k / i
    return 1.0 - out


def sampled_evaluation(trainer, k: int, *, seed: int) -> dict[str, Any]:
    """k completions per held-out problem, sampled like the training rollout (its temperature, top-p, top-k):
    ``pass_at_k`` (some sample is right, unbiased with n = k) and ``avg_at_k`` (mean share right)."""
    from lmpo.eval.greedy import judge
    from lmpo.generation import HFRollout

    cfg = trainer.cfg
    engine = HFRollout(trainer.model, trainer.tokenizer, max_new_tokens=cfg.rollout.max_new_tokens,
                       temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k)
    examples = list(trainer.eval_examples)
    per_batch = max(1, cfg.eval.seqs_per_batch // k)
    passed, shares = [], []
    trainer.model.eval()
    with torch.no_grad():
        for start in range(0, len(examples), per_batch):
            chunk = examples[start:start + per_batch]
            ro = engine.generate([e.prompt for e in chunk], k, seed=seed * 1_000_003 + start)
            rows = [chunk[g] for g in ro.group_ids.tolist()]
            correct = judge(rows, ro.completions, trainer.accuracy_fn)
            for j in range(len(chunk)):
                c = sum(correct[j * k:(j + 1) * k])
                passed.append(pass_at_k(k, c, k))
                shares.append(c / k)
    return {"k": k, "problems": len(examples), "pass_at_k": sum(passed) / max(1, len(passed)),
            "avg_at_k": sum(shares) / max(1, len(shares))}


# ----------------------------------------------------------------------------------------------------
# What a cell contributes to the report
# ----------------------------------------------------------------------------------------------------

SERIES = {
    "reward": "reward/mean",
    "train_accuracy": "reward/accuracy",
    "entropy": "entropy/mean",
    "clip_frac": "clip/region_frac",
    "clip_low_frac": "clip/low_frac",
    "clip_high_frac": "clip/high_frac",
    "length": "completion/length_mean",
    "kl_behaviour": "kl/behaviour_k3",
    "step_s": "perf/step_s",
    "entropy_coef": "entropy/coef",
    "rlvcr_expanded": "rlvcr/expanded_samples",
    "rlvcr_rows": "rlvcr/batch_seqs",
    "rlvcr_acting": "rlvcr/acting_rows",
    "rlvcr_trained": "rlvcr/trained_rows",
    "zero_var": "adv/zero_var_frac",
    "phi_mean": "ptrw/phi_mean",
    "mismatch_kl": "mismatch/k3_kl",
    "is_truncated_frac": "rollout/truncated_frac",
    "is_masked_frac": "rollout/masked_frac",
    "rejected_frac": "rollout/rejected_frac",
}
"""Per-step series kept from a cell's metrics.jsonl: name → trainer metric key (docs/trainer.md)."""

ENDPOINT_EVALS = 3
"""Held-out evaluations averaged into a cell's endpoint accuracy (the last ones of the run)."""


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _pooled_share(counts: list[float], totals: list[float]) -> float:
    """Σ count / Σ total over the steps that logged a positive total (0 when none did)."""
    pairs = [(c, n) for c, n in zip(counts, totals) if n == n and n > 0]
    return sum(c for c, _ in pairs) / sum(n for _, n in pairs) if pairs else 0.0


def summarise_run(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A cell's series (per RL step and per evaluation) and its scalar metrics, from ``metrics.jsonl``.

    Scalar metrics (docs/lab.md, "The training study"): ``accuracy`` (held-out greedy accuracy: the mean of the
    last ``ENDPOINT_EVALS`` evaluations after the start), ``accuracy_start``, ``accuracy_gain``, ``eval_length``
    (same endpoint), ``reward_auc`` (mean training reward over the run: the area under
    the reward curve per step), ``train_accuracy_auc``, ``entropy_start`` / ``entropy_min`` / ``entropy_end`` /
    ``entropy_change`` (windowed, ``lmpo.lab.stats.window_trajectory``), ``clip_frac`` (and its low / high
    parts), ``mask_frac`` (Clip-Cov / KL-Cov token fraction), ``length`` (mean sampled completion length),
    ``kl_behaviour``, ``steps_per_s`` (RL steps per second of step time, evaluation excluded) and the staleness
    study's ``mismatch_kl``, ``is_truncated_frac``, ``is_masked_frac`` and ``rejected_frac``.
    """
    from lmpo.trainer.run.metrics import read_jsonl

    rows = read_jsonl(Path(run_dir) / "metrics.jsonl")
    train = sorted((r for r in rows if r.get("kind") == "train"), key=lambda r: r["step"])
    evals = sorted((r for r in rows if r.get("kind") == "eval"), key=lambda r: r["step"])
    series: dict[str, list[float]] = {name: [_float(r.get(key)) for r in train] for name, key in SERIES.items()}
    series["step"] = [int(r["step"]) for r in train]
    mask = []
    for r in train:
        masked = _float(r.get("cov/clipped_tokens", 0.0)) + _float(r.get("cov/penalised_tokens", 0.0))
        tokens = _float(r.get("tokens/valid"))
        mask.append(masked / tokens if tokens and tokens > 0 else 0.0)
    series["mask_frac"] = mask
    ev = {"step": [int(r["step"]) for r in evals], "accuracy": [_float(r.get("eval/accuracy")) for r in evals],
          # a multi-turn cell's held-out length is the policy's tokens per greedy episode (its turns together)
          "length": [_float(r.get("eval/length_mean", r.get("eval/episodes/policy_tokens_mean"))) for r in evals],
          "reward": [_float(r.get("eval/reward_mean")) for r in evals]}
    ent = st.window_trajectory(series["entropy"])
    rew = st.window_trajectory(series["reward"])
    step_time = sum(v for v in series["step_s"] if v == v)
    accuracy_start = ev["accuracy"][0] if len(ev["accuracy"]) > 1 else float("nan")
    after = ev["accuracy"][1:] if len(ev["accuracy"]) > 1 else ev["accuracy"]
    endpoint = min(ENDPOINT_EVALS, len(after))  # docs/lab.md: a lab schedules at least ENDPOINT_EVALS
    accuracy = st.last_mean(after, endpoint) if endpoint else float("nan")
    coef = [v for v in series["entropy_coef"] if v == v]
    nonfinite = sum(1 for name in ("reward", "entropy") for v in series[name] if not math.isfinite(v) and v == v)
    metrics = {
        "accuracy": accuracy,
        "accuracy_last": ev["accuracy"][-1] if ev["accuracy"] else float("nan"),
        "accuracy_start": accuracy_start,
        "accuracy_gain": accuracy - accuracy_start,
        "accuracy_min": min(ev["accuracy"][1:]) if len(ev["accuracy"]) > 1 else float("nan"),
        "eval_length": st.last_mean(ev["length"][-endpoint:], endpoint) if endpoint else float("nan"),
        "endpoint_evals": float(endpoint),
        "reward_auc": st.curve_area(series["reward"]),
        "reward_start": rew["start"], "reward_end": rew["end"], "reward_gain": rew["end"] - rew["start"],
        "train_accuracy_auc": st.curve_area(series["train_accuracy"]),
        "entropy_start": ent["start"], "entropy_min": ent["min"], "entropy_end": ent["end"],
        "entropy_change": ent["end"] - ent["start"],
        "clip_frac": st.curve_area(series["clip_frac"]),
        "clip_low_frac": st.curve_area(series["clip_low_frac"]),
        "clip_high_frac": st.curve_area(series["clip_high_frac"]),
        "mask_frac": st.curve_area(series["mask_frac"]),
        "zero_var_frac": st.curve_area(series["zero_var"]),
        "entropy_coef_active": sum(1 for v in coef if v > 0) / len(coef) if coef else 0.0,
        "rlvcr_expanded_frac": _pooled_share(series["rlvcr_expanded"], series["rlvcr_rows"]),
        "rlvcr_acting_frac": _pooled_share(series["rlvcr_acting"], series["rlvcr_trained"]),
        "ptrw_phi_gap": 1.0 - st.curve_area(series["phi_mean"]) if any(v == v for v in series["phi_mean"])
        else float("nan"),
        "length": st.curve_area(series["length"]),
        "kl_behaviour": st.curve_area(series["kl_behaviour"]),
        # the staleness study (lmpo.lab.staleness): nan where the cell logs no sampler log-probs / no correction
        "mismatch_kl": st.curve_area(series["mismatch_kl"]),
        "is_truncated_frac": st.curve_area(series["is_truncated_frac"]),
        "is_masked_frac": st.curve_area(series["is_masked_frac"]),
        "rejected_frac": st.curve_area(series["rejected_frac"]),
        "steps_per_s": len(train) / step_time if step_time > 0 else float("nan"),
        "nonfinite_values": float(nonfinite),
        "pass_at_k": float("nan"),
        "avg_at_k": float("nan"),
    }
    return {"steps": len(train), "metrics": metrics, "series": series, "eval": ev}


__all__ = ["ENDPOINT_EVALS", "JOB_FILE", "RUN_SUBDIR", "SERIES", "pass_at_k", "sampled_evaluation", "read_json", "run_cell", "run_job", "run_warmup", "summarise_run",
           "write_json_atomic"]
