"""Every generated part of the repository's Markdown, and the one command that regenerates them: ``make docs``.

A generated block sits between ``<!-- NAME:start … -->`` (or ``:begin``) and ``<!-- NAME:end -->`` markers and is
rendered from a registry or a config dataclass; ``GENERATED`` lists each file with the renderer of its blocks.
``python -m lmpo.generated_docs`` rewrites them (``--check``: lists the stale files and exits 1); a test fails
on a stale file with a message that says to run ``make docs``. docs/errors.md is generated too, by running the
bad-input cases of ``tests/cli/test_bad_inputs.py`` (``make docs`` runs that script as well).

What needs ``make docs`` after it changes: a preset, part, part parameter, advantage estimator or objective input
(README.md, docs/objectives.md); a trainer config field, metric or TRL alias (docs/trainer.md); a SAC config
field (docs/sac.md); a lab claim, metric or config field (docs/lab.md); an LM environment or an episode budget
field (docs/multiturn.md); a user-facing error (docs/errors.md).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from lmpo.envs.docs import BLOCKS as ENV_BLOCKS
from lmpo.integrations.trl_names import render_alias_table
from lmpo.lab.docs import BLOCKS as LAB_BLOCKS
from lmpo.objectives.reference import GENERATED_SECTIONS, preset_table_markdown
from lmpo.textagent.sac.config import render_config_reference as sac_config_reference
from lmpo.trainer.config import render_config_reference, render_metrics_reference

#: the command that regenerates every file below (and docs/errors.md)
COMMAND = "make docs"

#: file (relative to the repository root) → marker name → the function rendering that block's body
GENERATED: dict[str, dict[str, Callable[[], str]]] = {
    "README.md": {"presets": preset_table_markdown},
    "docs/objectives.md": dict(GENERATED_SECTIONS),
    "docs/trainer.md": {"config-reference": render_config_reference, "metrics": render_metrics_reference,
                        "trl-aliases": render_alias_table},
    "docs/sac.md": {"sac-config-reference": sac_config_reference},
    "docs/lab.md": dict(LAB_BLOCKS),
    "docs/multiturn.md": dict(ENV_BLOCKS),
}


def render_blocks(text: str, blocks: dict[str, Callable[[], str]], where: str = "the file") -> str:
    """``text`` with the body of every block in ``blocks`` re-rendered (markers and the rest kept as they are)."""
    for name, render in blocks.items():
        start = re.search(rf"<!-- {re.escape(name)}:(?:start|begin)[^>]*-->\n", text)
        end = text.find(f"<!-- {name}:end -->")
        if start is None or end < start.end():
            raise ValueError(f"{where} lost the markers of its generated block {name!r} "
                             f"(<!-- {name}:start --> … <!-- {name}:end -->); restore them and run `{COMMAND}`")
        body = render()
        text = text[:start.end()] + body + ("" if body.endswith("\n") else "\n") + text[end:]
    return text


def stale_files(root: Path) -> list[str]:
    """The files of ``GENERATED`` under ``root`` whose blocks differ from what the code renders now."""
    return [rel for rel, blocks in GENERATED.items()
            if render_blocks((root / rel).read_text(encoding="utf-8"), blocks, rel)
            != (root / rel).read_text(encoding="utf-8")]


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated blocks of every file (``--check``: only list the stale ones; exit 1 if any)."""
    argv = sys.argv[1:] if argv is None else argv
    root = Path(next((a for a in argv if not a.startswith("-")), "."))
    if "--check" in argv:
        stale = stale_files(root)
        for rel in stale:
            print(f"{rel}: stale; run `{COMMAND}`")
        return 1 if stale else 0
    for rel, blocks in GENERATED.items():
        path = root / rel
        text = path.read_text(encoding="utf-8")
        new = render_blocks(text, blocks, rel)
        if new != text:
            path.write_text(new, encoding="utf-8")
        print(f"{rel}: {'updated' if new != text else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
