"""Markdown tables generated from the registries: presets, parts of every kind, statistics.

README.md and docs/objectives.md hold these tables between markers; tests check that they equal what this
module renders, so a new part or preset shows up in the docs by being registered.
"""

from __future__ import annotations

import dataclasses

from .advantages import ADVANTAGE_ESTIMATORS, ADVANTAGE_INPUTS
from .keywords import DEFAULT_PARTS, SELECTORS, General, owners_by_keyword
from .objective import COMMON_STATS, Objective
from .parts import INPUTS, KINDS
from .presets import PRESETS


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def preset_table_markdown() -> str:
    """Markdown table of every preset (name, parts, description, formula, source) from the registry."""
    lines = [
        "| preset | level · trust region · aggregation | what it is for | objective | source |",
        "|---|---|---|---|---|",
    ]
    for preset in PRESETS.values():
        obj = Objective.preset(preset.name)
        parts = f"`{obj.level}` · `{obj.trust_region}` · `{obj.aggregation}`"
        extras = [f"`{obj.parts[kind].name}`" for kind in ("credit", "correction", "rejection", "cov_control")
                  if obj.parts[kind].name != "none"]
        if obj.adaptive_entropy:
            extras.append("`adaptive_entropy`")
        if obj.advantage_scale != "group":
            extras.append(f"advantages `{obj.advantage_scale}`")
        if extras:
            parts += " · " + " · ".join(extras)
        lines.append(f"| `{preset.name}` | {parts} | {_cell(preset.description)} | `{_cell(preset.formula)}` | "
                     f"{_cell(preset.paper)} |")
    return "\n".join(lines) + "\n"


def _default(value: object) -> str:
    return "None" if value is None else repr(value)


def parts_table_markdown() -> str:
    """One table per kind of part: name, parameters with defaults, inputs it needs, formula, source."""
    out: list[str] = []
    for kind, registry in KINDS.items():
        keyword = "adaptive_entropy" if kind == "entropy_control" else kind
        out += [f"#### {registry.title} (`{keyword}`)", "", "| name | parameters (default) | needs | formula | "
                "source |", "|---|---|---|---|---|"]
        for name, cls in registry.items():
            params = ", ".join(f"`{f.name}`={_default(f.default)}" for f in dataclasses.fields(cls)) or "—"
            needs = ", ".join(f"`{n}`" for n in sorted(cls.needs)) or "—"
            out.append(f"| `{name}` | {_cell(params)} | {needs} | `{_cell(cls.formula)}` | {_cell(cls.source)} |")
        out.append("")
    return "\n".join(out)


def parameter_table_markdown() -> str:
    """Every keyword ``Objective(...)`` takes: which part reads it, its default and its help text."""
    rows = ["| keyword | read by | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(General):
        rows.append(f"| `{f.name}` | the objective | {_default(f.default)} | {_cell(f.metadata['help'])} |")
    for keyword in SELECTORS:
        rows.append(f"| `{keyword}` | selects the {KINDS[keyword].title.lower()} | "
                    f"`{DEFAULT_PARTS[keyword]}` | one of {', '.join(f'`{n}`' for n in KINDS[keyword])} |")
    rows.append("| `adaptive_entropy` | selects the entropy control | False | True: `adaptive`, False: `static` |")
    for keyword, owners in sorted(owners_by_keyword().items()):
        kind = owners[0][0]
        fields = [next(x for x in dataclasses.fields(KINDS[kind][name]) if x.name == keyword) for _, name in owners]
        readers = ", ".join(f"`{name}`" for _, name in owners)
        defaults = {_default(f.default) for f in fields}
        default = defaults.pop() if len(defaults) == 1 else ", ".join(
            f"{name}: {_default(f.default)}" for (_, name), f in zip(owners, fields))
        rows.append(f"| `{keyword}` | {kind} {readers} | {default} | {_cell(fields[-1].metadata['help'])} |")
    return "\n".join(rows) + "\n"


def _stat_origins() -> dict[str, tuple[str, list[str]]]:
    seen: dict[str, tuple[str, list[str]]] = {k: (v, ["every objective"]) for k, v in COMMON_STATS.items()}
    for kind, registry in KINDS.items():
        for name, cls in registry.items():
            for key, doc in cls.stats.items():
                seen.setdefault(key, (doc, []))[1].append(f"{kind} `{name}`")
    return seen


def all_stat_docs() -> dict[str, str]:
    """Every statistic key an objective can return → its meaning (from the registries)."""
    return {key: doc for key, (doc, _) in _stat_origins().items()}


def stats_table_markdown() -> str:
    """Every statistic an objective can return, with the parts that add it."""
    rows = ["| key | meaning | from |", "|---|---|---|"]
    for key, (doc, origin) in _stat_origins().items():
        rows.append(f"| `{key}` | {_cell(doc)} | {', '.join(origin)} |")
    return "\n".join(rows) + "\n"


def inputs_table_markdown() -> str:
    rows = ["| keyword | what | needed by |", "|---|---|---|"]
    for key, doc in INPUTS.items():
        users = [f"{kind} `{name}`" for kind, reg in KINDS.items() for name, cls in reg.items() if key in cls.needs]
        if key == "ref_logp":
            users.append("`kl_coef` > 0")
        if key == "entropy":
            users.append("`entropy_coef` ≠ 0")
        rows.append(f"| `{key}` | {_cell(doc)} | {', '.join(users) or '—'} |")
    return "\n".join(rows) + "\n"


def advantage_table_markdown() -> str:
    rows = ["| estimator | parameters (default) | inputs (with the defaults) | formula | source |",
            "|---|---|---|---|---|"]
    for name, cls in ADVANTAGE_ESTIMATORS.items():
        params = ", ".join(f"`{f.name}`={_default(f.default)}" for f in dataclasses.fields(cls)) or "—"
        inputs = ", ".join(f"`{k}`" for k in ADVANTAGE_INPUTS if k in cls().required_inputs()) or "—"
        rows.append(f"| `{name}` | {_cell(params)} | {inputs} | `{_cell(cls.formula)}` | {_cell(cls.source)} |")
    return "\n".join(rows) + "\n"


def advantage_inputs_table_markdown() -> str:
    """The inputs an advantage estimator may take beyond (rewards, group_ids), and which estimators need them."""
    rows = ["| keyword | what | needed by (with the defaults) |", "|---|---|---|"]
    for key, doc in ADVANTAGE_INPUTS.items():
        users = [f"`{name}`" for name, cls in ADVANTAGE_ESTIMATORS.items() if key in cls().required_inputs()]
        if key == "reward_weights":
            users = ["optional with `reward_components`"]
        rows.append(f"| `{key}` | {_cell(doc)} | {', '.join(users) or '—'} |")
    return "\n".join(rows) + "\n"


GENERATED_SECTIONS = {
    "preset-table": preset_table_markdown,
    "parts-table": parts_table_markdown,
    "keywords-table": parameter_table_markdown,
    "inputs-table": inputs_table_markdown,
    "stats-table": stats_table_markdown,
    "advantage-table": advantage_table_markdown,
    "advantage-inputs-table": advantage_inputs_table_markdown,
}
"""docs/objectives.md marker name → the function that renders what sits between its markers."""
