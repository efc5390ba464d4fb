"""The generated parts of docs/lab.md: the claims table, the metric tables and the config reference.

``python -m lmpo.lab.docs docs/lab.md`` rewrites them from the code (``CLAIMS``, the report's metric
dictionaries, the config dataclasses); a test checks that the file is up to date.
"""

from __future__ import annotations

import os
import sys


def _claims_table() -> str:
    from lmpo.lab.claims import claims_table_markdown

    return claims_table_markdown()


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


BLOCKS = {"claims-table": _claims_table, "lab-metrics": metric_tables_markdown,
          "lab-config-reference": _config_reference}
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
