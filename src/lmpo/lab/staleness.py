"""The staleness study: which behaviour-policy corrections keep learning intact as rollouts go stale.

A lab whose grid holds the baseline ``k0_none`` and cells labelled ``k<K>_<correction>`` (``K`` the cell's
``rollout.async_staleness``, docs/async.md; ``correction`` one of :data:`CORRECTIONS`) gets a study-level claim per
cell, judged by the lab's verdict rule v2 (:mod:`lmpo.lab.claims`) as one Holm family of its own:

- **primary**: held-out accuracy not worse than ``k0_none``'s, margin δ = 25% of ``k0_none``'s own RL accuracy gain
  (the lab's declared margin style, docs/lab.md);
- **gates**: a diverged cell (held-out accuracy below its start by more than ``report.divergence_margin``) or one
  that logged non-finite values is an **invalid run**; a correction that never acts at that K (its truncated /
  masked / rejected share below :data:`ACTIVITY_THRESHOLD`, or, without a correction, stale rollouts whose
  mismatch to the trainer is at the k = 0 floor) is **not testable here**;
- **reported beside it**: the mismatch metrics (``mismatch_kl``: k3 KL(sampler ‖ trainer) of the rollouts) and the
  correction's activity.

The claims are built from the grid's labels rather than kept in ``CLAIMS``: that registry holds claims papers
make for named objectives, judged in every lab; these are a grid's cells, one claim per (K, correction) the
config chooses, and their Holm family is the study's own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from lmpo.config import ConfigError
from lmpo.lab.claims import Activity, Check, Claim, Sesoi
from lmpo.lab.rules import judge_rule
from lmpo.lab.stats import fmt as _f

BASELINE = "k0_none"
"""The synchronous (on-policy) baseline every staleness cell is compared with."""

CORRECTIONS = ("none", "tis", "mis", "seq_mask")
"""The columns of the study: no correction, truncated IS, masked IS, the off-policy sequence mask."""

LABEL = re.compile(r"^k(\d+)_(none|tis|mis|seq_mask)$")

ACTIVITY_THRESHOLD = 0.005
"""Smallest share of weights (tokens; sequences for the sequence mask) a correction must change for its cell to
be testable: the threshold the lab's registry uses for masks (Clip-Cov / KL-Cov, docs/lab.md)."""

MISMATCH_THRESHOLD = 1e-3
"""Smallest mean k3 KL(sampler ‖ trainer) per token for stale uncorrected rollouts to count as off-policy. Declared
before any study run; the synchronous loop's own mismatch is exactly 0 on CPU (the in-process sampler scores the
tokens as the trainer does; tests/lab/test_lab_staleness.py), so any real staleness shows above it."""

ACTIVITY = {
    "none": Activity("training", "mismatch_kl", MISMATCH_THRESHOLD,
                     "k3 KL(sampler ‖ trainer) per token of the stale rollouts"),
    "tis": Activity("training", "is_truncated_frac", ACTIVITY_THRESHOLD, "share of token weights truncated (TIS)"),
    "mis": Activity("training", "is_masked_frac", ACTIVITY_THRESHOLD, "share of token weights masked (MIS)"),
    "seq_mask": Activity("training", "rejected_frac", ACTIVITY_THRESHOLD,
                         "share of sequences masked (off-policy sequence mask)"),
}
"""The activity gate of each column (training metrics of ``lmpo.lab.jobs.summarise_run``, means over seeds)."""

_SOURCES = {
    "none": "docs/async.md (stale rollouts, uncorrected)",
    "tis": "Yao et al. 2025, TIS; docs/async.md",
    "mis": "IcePop (Ling Team 2025, Ring-1T report); docs/async.md",
    "seq_mask": "DeepSeek-V3.2 (arXiv 2512.02556) eq. 9; docs/async.md",
}
_PARTS = {"none": ("none", "none"), "tis": ("tis", "none"), "mis": ("mis", "none"), "seq_mask": ("none", "off_policy_seq")}
"""(objective.correction, objective.rejection) a column's cells must have."""


def parse_label(label: str) -> tuple[int, str] | None:
    """``"k2_tis"`` → ``(2, "tis")``; None for a label outside the study."""
    m = LABEL.match(label)
    return (int(m.group(1)), m.group(2)) if m else None


def applies(labels) -> bool:
    """Whether a grid with these objective labels is a staleness study: the baseline and a stale cell."""
    labels = list(labels)
    return BASELINE in labels and any(parse_label(x) and x != BASELINE for x in labels)


def check_grid(cfg: Any) -> None:
    """A staleness label must say what its cell does: ``k<K>`` = its ``rollout.async_staleness`` and the
    correction = its objective's correction / rejection (ConfigError naming the entry otherwise)."""
    from lmpo.lab.config import build_objective, objective_label

    labels = [objective_label(e) for e in cfg.grid.objectives]
    if not applies(labels):
        return
    for entry in cfg.grid.objectives:
        label = objective_label(entry)
        parsed = parse_label(label)
        if parsed is None:
            continue
        k, column = parsed
        staleness = (entry.train.get("rollout") or {}).get("async_staleness", cfg.train.rollout.async_staleness)
        if int(staleness) != k:
            raise ConfigError(f"grid objective {label!r}: its label says staleness k = {k} but its cells have "
                              f"rollout.async_staleness = {staleness}; set `train: {{rollout: {{async_staleness: {k}}}}}` "
                              "or rename the entry.")
        obj = build_objective(entry).to_dict()
        have = (obj.get("correction", "none"), obj.get("rejection", "none"))
        if have != _PARTS[column]:
            raise ConfigError(f"grid objective {label!r}: its label says correction {column!r}, which needs "
                              f"correction={_PARTS[column][0]!r} and rejection={_PARTS[column][1]!r}, but the "
                              f"objective has correction={have[0]!r} and rejection={have[1]!r}; fix the overrides "
                              "or rename the entry.")


def staleness_claims(labels) -> list[Claim]:
    """One claim per staleness cell other than the baseline, in (K, column) order."""
    cells = sorted((parse_label(x), x) for x in labels if parse_label(x) and x != BASELINE)
    out = []
    for (k, column), label in cells:
        what = "uncorrected" if column == "none" else f"corrected by {column}"
        out.append(Claim(
            f"staleness_{label}", f"GRPO on rollouts {k} step(s) stale, {what}, keeps held-out accuracy.",
            _SOURCES[column], label, BASELINE,
            Check("training", "accuracy", "not_worse", Sesoi(0.25, "accuracy_gain"),
                  f"keeps held-out accuracy of `{BASELINE}`"),
            activity=ACTIVITY[column]))
    return out


def _mean(training: Mapping[str, Any], label: str, metric: str) -> float:
    entry = (training.get("metrics") or {}).get(label, {}).get(metric) or {}
    v = entry.get("mean")
    return float(v) if v is not None else math.nan


def staleness_study(training: Mapping[str, Any] | None, objectives: Mapping[str, Any], report: Any) -> dict | None:
    """The study's verdicts (one Holm family) and its table: ``{"verdicts": [...], "rows": {K: {column: cell}}}``;
    None when the grid is not a staleness study or nothing finished."""
    if not training or not applies(training.get("metrics") or {}):
        return None
    labels = list(training["metrics"])
    claims = staleness_claims(labels)
    rule = getattr(report, "rule", "v2")  # the lab's verdict rule (lmpo.lab.rules), its registry aside
    verdicts = judge_rule(rule, claims, {"training": training, "objectives": objectives}, report)
    by_label = {v.objective: v for v in verdicts}
    rows: dict[int, dict[str, Any]] = {}
    for label in labels:
        parsed = parse_label(label)
        if parsed is None:
            continue
        k, column = parsed
        validity = (training.get("validity") or {}).get(label) or {}
        cell: dict[str, Any] = {
            "label": label, "accuracy": _mean(training, label, "accuracy"),
            "mismatch_kl": _mean(training, label, "mismatch_kl"),
            "activity": _mean(training, label, ACTIVITY[column].metric),
            "activity_metric": ACTIVITY[column].metric,
            "diverged_seeds": list(validity.get("diverged_seeds") or []),
            "seeds": len((training["metrics"][label] or {}).get("seeds") or []),
        }
        v = by_label.get(label)
        if v is not None:
            primary = v.checks[0] if v.checks else {}
            cell.update({"verdict": v.verdict, "reason": v.reason, "diff": primary.get("diff"),
                         "ci": primary.get("ci"), "delta": primary.get("delta"), "p_holm": primary.get("p_holm")})
        else:
            cell["verdict"] = "baseline"
        rows.setdefault(k, {})[column] = cell
    return {"baseline": BASELINE, "rule": rule, "verdicts": [v.__dict__ for v in verdicts],
            "rows": {k: rows[k] for k in sorted(rows)}}


def table_markdown(study: Mapping[str, Any]) -> list[str]:
    """The staleness table: rows K, columns corrections; each cell the accuracy difference to the baseline
    [95% t interval], the verdict, the mismatch KL and the correction's activity."""
    out = ["| k | " + " | ".join(CORRECTIONS) + " |", "|---|" + "---|" * len(CORRECTIONS)]
    for k, row in study["rows"].items():
        cells = []
        for column in CORRECTIONS:
            c = row.get(column)
            if c is None:
                cells.append("— (on-policy: a correction is a no-op)" if int(k) == 0 else "—")
                continue
            mism = f"KL {_f(c.get('mismatch_kl'))}"
            if c["verdict"] == "baseline":
                cells.append(f"baseline: accuracy {_f(c['accuracy'])}; {mism}")
                continue
            ci = c.get("ci") or [None, None]
            act = f"{c['activity_metric']} {_f(c.get('activity'))}"
            div = f"; diverged seeds {c['diverged_seeds']}" if c["diverged_seeds"] else ""
            cells.append(f"Δ {_f(c.get('diff'))} [{_f(ci[0])}, {_f(ci[1])}] → **{c['verdict']}**; {mism}; {act}{div}")
        out.append(f"| {k} | " + " | ".join(cells) + " |")
    return out


__all__ = ["ACTIVITY", "ACTIVITY_THRESHOLD", "BASELINE", "CORRECTIONS", "MISMATCH_THRESHOLD", "applies", "check_grid",
           "parse_label", "staleness_claims", "staleness_study", "table_markdown"]
