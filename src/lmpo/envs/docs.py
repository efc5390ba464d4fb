"""The generated parts of docs/multiturn.md: the registered environments and the episode budgets.

``make docs`` rewrites them (:mod:`lmpo.generated_docs`); a test checks that the file is up to date.
"""

from __future__ import annotations

from lmpo.config import render_reference
from lmpo.envs.base import ENVS, EpisodeBudget


def render_env_table() -> str:
    """One row per registered environment: its id, the summary line of its docstring (its card is the rest) and
    the optional extra it needs."""
    lines = ["| id | summary | needs |", "|---|---|---|"]
    for env_id, spec in sorted(ENVS.items()):
        summary = (spec.factory.__doc__ or "").strip().splitlines()[0].replace("``", "`")
        extra = f"`lmpo[{spec.requires}]`" if spec.requires else "—"
        lines.append(f"| `{env_id}` | {summary} | {extra} |")
    return "\n".join(lines) + "\n"


def render_budget_reference() -> str:
    return render_reference(EpisodeBudget, "budget")


BLOCKS = {"env-table": render_env_table, "budget-reference": render_budget_reference}
