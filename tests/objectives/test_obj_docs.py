"""docs/objectives.md shows the registries' tables exactly as the code renders them."""

import re
from pathlib import Path

import pytest

from lmpo.objectives import PRESETS
from lmpo.objectives.reference import GENERATED_SECTIONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "objectives.md"
REGENERATE = "`make docs`"


def _section(text: str, name: str) -> str:
    start = text.index("-->\n", text.index(f"<!-- {name}:start")) + 4
    return text[start:text.index(f"<!-- {name}:end -->")]


@pytest.mark.parametrize("name", list(GENERATED_SECTIONS))
def test_generated_sections_equal_the_registries(name):
    text = DOC.read_text(encoding="utf-8")
    assert f"<!-- {name}:start" in text and f"<!-- {name}:end -->" in text, f"{name} markers missing"
    assert _section(text, name) == GENERATED_SECTIONS[name](), f"docs/objectives.md {name} is stale; run {REGENERATE}"


def test_doc_mentions_every_preset_and_no_unknown_one():
    table = _section(DOC.read_text(encoding="utf-8"), "preset-table")
    rows = [line.split("|")[1].strip().strip("`") for line in table.splitlines()[2:] if line.startswith("| `")]
    assert rows == list(PRESETS)


def test_parity_table_names_existing_tests():
    """Every ✓ of lmpo in docs/objectives.md's parity table is backed by named tests, and each exists."""
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("<!-- parity:start -->"):text.index("<!-- parity:end -->")]
    defined = set()
    for path in (DOC.parents[1] / "tests").rglob("test_*.py"):
        defined.update(re.findall(r"^def (test_\w+)\(", path.read_text(encoding="utf-8"), re.M))
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| feature")]
    assert len(rows) >= 30
    for row in rows:
        cell = row.rstrip(" |").split(" | ")[-1]
        names = re.findall(r"`(test_\w+)`", cell)
        if cell.startswith("✓"):
            assert names, f"parity row without a test: {row}"
        missing = [name for name in names if name not in defined]
        assert not missing, f"parity table names tests that do not exist: {missing}"
