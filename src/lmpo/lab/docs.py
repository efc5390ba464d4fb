"""The generated parts of docs/lab.md: the claims table, the metric tables and the config reference.

``python -m lmpo.lab.docs docs/lab.md`` rewrites them from the code (``CLAIMS``, the report's metric
dictionaries, the config dataclasses); a test checks that the file is up to date.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from lmpo.lab.stats import fmt


def _claims_table() -> str:
    from lmpo.lab.claims import claims_table_markdown

    return claims_table_markdown()


def _claims_table_v21() -> str:
    from lmpo.lab.claims import CLAIMS_V2_1, REFUSED, claims_table_markdown

    refused = "".join(f"- `{name}`: {why}\n" for name, why in REFUSED.items())
    return claims_table_markdown(CLAIMS_V2_1) + "\nScaleRL's recipe claims the lab does not define:\n\n" + refused


def _config_reference() -> str:
    from lmpo.lab.config import render_lab_reference

    return render_lab_reference()


def metric_tables_markdown() -> str:
    """Two tables: the training study's per-cell metrics and the gradient study's per-objective metrics."""
    from lmpo.lab.report import GRADIENT_METRICS, TRAIN_METRICS

    rows = ["| training study (per cell; mean and interval over seeds) | meaning |", "|---|---|"]
    rows += [f"| `{k}` | {v} |" for k, v in TRAIN_METRICS.items()]
    rows += ["", "| gradient study (per objective and snapshot) | meaning |", "|---|---|"]
    rows += [f"| `{k}` | {v} |" for k, v in GRADIENT_METRICS.items()]
    return "\n".join(rows) + "\n"


DOCS = Path(__file__).resolve().parents[3] / "docs"
"""The repository's docs/ (the published labs' lab.json files the result tables are generated from)."""
LABS = {"cpu": ("v2/cpu", "The CPU lab on `thinking_addition`"), "explore": ("v2/explore", "The exploration lab on "
                                                                                           "`countdown`")}


def _stored(rel: str) -> dict:
    return json.loads((DOCS / "lab" / rel / "lab.json").read_text(encoding="utf-8"))


def _num(x) -> str:
    return fmt(x, 3) if isinstance(x, (int, float)) or x is None else str(x)


def _interval(c: dict) -> str:
    lo, hi = (c.get("ci") or [None, None])[:2]
    return f"{_num(c.get('diff'))} [{_num(lo)}, {_num(hi)}]"


def check_text(c: dict) -> str:
    """One check record of a stored verdict in a sentence: Δ [interval], δ (with its interval under v2.1), MDE,
    power of a non-inferiority part, Holm p (raw p for a check that did not enter the family) and its call."""
    if c.get("metric") == "diverged":
        counts = ", ".join(f"`{k}` {v[0]} of {v[1]} seeds" for k, v in c["diverged"].items())
        return (f"diverged: {counts}; Fisher p {_num(c.get('p_test'))}, Holm p {_num(c.get('p_holm'))} → "
                f"{c.get('verdict')}")
    if c.get("not_run"):
        return f"`{c['metric']}`: not run ({c['not_run']})"
    if "diff" not in c:
        return f"`{c['metric']}`: —"
    pair = f" `{c['objective']}` − `{c['baseline']}`" if "objective" in c else ""
    replicate = f" over {c['runs']} reference runs" if c.get("runs") else ""
    if c.get("groups_undefined"):
        replicate += f" (undefined in {c['groups_undefined']} of {c['groups']} groups; none is left out)"
    delta = f"δ {_num(c.get('delta'))}"
    if "delta_lo" in c:
        delta += f" [{_num(c['delta_lo'])}, {_num(c['delta_hi'])}]"
    extra = f", power {_num(c['power'])}" if c.get("power") is not None else ""
    p = f"Holm p {_num(c['p_holm'])}" if c.get("p_holm") is not None else f"p {_num(c.get('p_test'))} (no family)"
    return (f"`{c['metric']}`{pair} Δ {_interval(c)}{replicate}, {delta}, MDE {_num(c.get('mde'))}{extra}, {p} → "
            f"{c.get('verdict')}")


def _verdict_cell(v: dict) -> str:
    return f"**{v['verdict']}**" + (f" ({v['reason']})" if v.get("reason") else "")


def v2_results_markdown(lab: str) -> str:
    """The published v2 verdicts of one lab (docs/lab/v2/<lab>/lab.json), every number from the file."""
    report = _stored(LABS[lab][0])
    rows = ["| claim | objective vs baseline | v2 verdict | primary check (Δ [95% interval], δ, MDE, Holm p) | "
            "secondary checks (do not vote) |", "|---|---|---|---|---|"]
    for data in report["tasks"].values():
        for v in data["verdicts"]:
            primary = [check_text(c) for c in v["checks"] if c.get("primary")]
            secondary = [check_text(c) for c in v["checks"] if not c.get("primary")]
            rows.append(f"| `{v['claim']}` | `{v['objective']}` vs `{v['baseline']}` | {_verdict_cell(v)} | "
                        f"{'; '.join(primary) or '—'} | {'; '.join(secondary) or '—'} |")
    return "\n".join(rows) + "\n"


def _why(old: dict, new: dict) -> str:
    """What rule v2.1 changed for a claim, from the two stored verdicts and the two registries."""
    from lmpo.lab.claims import CLAIMS, CLAIMS_V2_1

    a, b = CLAIMS[old["claim"]], CLAIMS_V2_1[new["claim"]]
    why = []
    if a.baseline != b.baseline:
        why.append(f"matched ablation `{b.baseline}` instead of `{a.baseline}`")
    if a.primary.metric != b.primary.metric:
        why.append(f"primary `{b.primary.metric}` instead of `{a.primary.metric}`")
    if b.parts:
        why.append("every part votes")
    if "diverged" in old.get("reason", "") and new["verdict"] != old["verdict"]:
        why.append("divergence is the outcome (robustness claim)" if b.robustness else
                   "the divergence gate reaches only the runs the claim uses")
    if any(c.get("runs") for c in new["checks"] if c.get("votes")):
        why.append("the reference run is the replicate")
    return "; ".join(why) or "—"


def without_matched_ablation(names, results) -> list:
    """Rule v2.1's claims where a stored lab lacks the matched ablation: the v2 baseline (and v2 activity gate)
    instead, every other item of v2.1 kept. A reading of what the stored runs say, not a v2.1 verdict."""
    from lmpo.lab.claims import CLAIMS, CLAIMS_V2_1
    from lmpo.lab.rules import _gate_v21, _missing

    out = []
    for name in names:
        claim, old = CLAIMS_V2_1[name], CLAIMS[name]
        if _missing(claim.primary, claim, results):
            claim = replace(claim, baseline=old.baseline, activity=old.activity)
        elif _gate_v21(claim, results, SimpleNamespace(alpha=0.05))[0] == "not run":
            claim = replace(claim, activity=old.activity)
        out.append(claim)
    return out


def v21_results_markdown() -> str:
    """The published v2 labs' verdicts rebuilt under rule v2.1 from their stored lab.json (``lmpo.lab.rules``):
    old → new per claim, the deciding parts, what changed, and, where the matched ablation was not run, the
    reading on v2's baseline."""
    from lmpo.lab.report import rejudge
    from lmpo.lab.rules import judge_all_v21, stored_results

    rows = ["| lab | claim | v2 → v2.1 | v2.1's voting parts | what v2.1 changes | v2.1's reason | without the matched "
            "ablation: v2.1 on v2's baseline (a reading, not a verdict) |", "|---|---|---|---|---|---|---|"]
    unrecomputable = []
    for lab, (rel, _) in LABS.items():
        stored = _stored(rel)
        new = rejudge(stored, "v2.1")
        rp = SimpleNamespace(**{k: stored["config"]["report"][k] for k in ("alpha", "confidence", "power")})
        for task, data in stored["tasks"].items():
            results = stored_results(stored, task)
            names = [v["claim"] for v in data["verdicts"]]
            readings = judge_all_v21(without_matched_ablation(names, results), results, rp)
            for old, v, reading in zip(data["verdicts"], new["tasks"][task]["verdicts"], readings):
                parts = [check_text(c) for c in v["checks"] if c.get("votes")]
                arrow = old["verdict"] if old["verdict"] == v["verdict"] else f"{old['verdict']} → **{v['verdict']}**"
                other = "—"
                if v["verdict"] == "not run" and reading.verdict == old["verdict"] and reading.reason:
                    other = f"vs `{reading.baseline}`: **{reading.verdict}**, by v2's gate"
                elif v["verdict"] == "not run" and reading.verdict != "not run":
                    other = f"vs `{reading.baseline}`: **{reading.verdict}**" + (
                        f" ({reading.reason})" if reading.reason else "") + ": " + "; ".join(
                        check_text(c) for c in reading.checks if c.get("votes"))
                rows.append(f"| {lab} | `{v['claim']}` | {arrow} | {'; '.join(parts) or '—'} | {_why(old, v)} | "
                            f"{v.get('reason') or '—'} | {other} |")
                if v["verdict"] == "not run":
                    unrecomputable.append(f"- {lab}, `{v['claim']}`: {v['reason']}")
    stored = json.loads((DOCS / "lab" / "staleness" / "lab.json").read_text(encoding="utf-8"))
    new = rejudge(stored, "v2.1")
    for task, data in stored["tasks"].items():
        for old, v in zip(data["staleness"]["verdicts"], new["tasks"][task]["staleness"]["verdicts"]):
            parts = [check_text(c) for c in v["checks"] if c.get("votes")]
            arrow = old["verdict"] if old["verdict"] == v["verdict"] else f"{old['verdict']} → **{v['verdict']}**"
            why = "δ's interval and the power of non-inferiority" if old["verdict"] != v["verdict"] else "—"
            rows.append(f"| staleness | `{v['objective']}` | {arrow} | {'; '.join(parts) or '—'} | {why} | "
                        f"{v.get('reason') or '—'} | — |")
    out = "\n".join(rows) + "\n"
    if unrecomputable:
        out += ("\nNot recomputable from the stored lab.json (the cells or measurements v2.1 needs were not in the "
                "v2 runs; they are v3's):\n\n" + "\n".join(unrecomputable) + "\n")
    return out


def staleness_family_markdown() -> str:
    """The Holm family of the published staleness study: how many of its cells' primary checks entered it."""
    report = json.loads((DOCS / "lab" / "staleness" / "lab.json").read_text(encoding="utf-8"))
    lines = []
    for data in report["tasks"].values():
        verdicts = data["staleness"]["verdicts"]
        family = [v for v in verdicts if v["checks"] and v["checks"][0].get("p_holm") is not None]
        gated: dict[str, int] = {}
        for v in verdicts:
            if v not in family:
                gated[v["verdict"]] = gated.get(v["verdict"], 0) + 1
        names = ", ".join(f"`{v['objective']}`" for v in family)
        lines.append(f"Holm's family in this run: the primary checks of {len(family)} of the {len(verdicts)} stale "
                     f"cells ({names}); the other "
                     f"{len(verdicts) - len(family)} were gated before any test ("
                     + ", ".join(f"{n} {k}" for k, n in sorted(gated.items())) + ").")
    return "\n".join(lines) + "\n"


BLOCKS = {"claims-table": _claims_table, "claims-table-v2.1": _claims_table_v21, "lab-metrics": metric_tables_markdown,
          "lab-config-reference": _config_reference, "lab-v2-cpu": lambda: v2_results_markdown("cpu"),
          "lab-v2-explore": lambda: v2_results_markdown("explore"), "lab-v2-under-v2.1": v21_results_markdown,
          "lab-staleness-family": staleness_family_markdown}
"""Marker name → the function that renders the block (``<!-- name:start -->`` … ``<!-- name:end -->``)."""


def render(text: str) -> str:
    """``text`` with every generated block replaced by its current content."""
    for name, make in BLOCKS.items():
        start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
        i, j = text.index(start) + len(start), text.index(end)
        text = text[:i] + make() + text[j:]
    return text


def update(path: str | os.PathLike) -> bool:
    """Rewrite the generated blocks of ``path``; returns whether the file changed."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    new = render(text)
    if new != text:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(new)
    return new != text


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(f"{p}: {'updated' if update(p) else 'up to date'}")
