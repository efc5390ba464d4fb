"""Every user-visible name list comes from, or is checked against, its registry (STYLE rule 2)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lmpo import cli
from lmpo.objectives import PRESETS, preset_table_markdown

ROOT = Path(__file__).resolve().parents[2]


def _block(text: str, name: str) -> str:
    match = re.search(rf"<!-- {name}:begin -->\n(.*?)\n<!-- {name}:end -->", text, re.S)
    assert match, f"README.md lost its <!-- {name}:begin/end --> markers"
    return match.group(1).strip()


def test_readme_preset_table_is_generated_from_registry():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert _block(readme, "presets") == preset_table_markdown().strip(), "README.md's preset table is stale: run `make docs`"


def test_readme_preset_table_lists_exactly_the_registry():
    block = _block((ROOT / "README.md").read_text(encoding="utf-8"), "presets")
    listed = re.findall(r"^\| `([a-z_]+)` \|", block, re.M)
    assert listed == list(PRESETS)
    assert len(listed) >= 14


def test_train_help_lists_exactly_the_registry(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    match = re.search(r"Objective presets: ([a-z_, ]+)\.", text)
    assert match, "`lmpo train --help` no longer lists the objective presets"
    assert [n.strip() for n in match.group(1).split(",")] == list(PRESETS)


def test_readme_commands_exist_in_cli():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    top = set(re.findall(r"^\| `lmpo ([a-z-]+)", readme, re.M))
    registered = set(cli.COMMANDS) | ({"sac"} if cli.SAC_COMMANDS else set())
    assert top == registered
    sac_listed = re.search(r"`lmpo sac …` \| [^(]*\(([^)]*)\)", readme)
    assert sac_listed, "README no longer lists the `lmpo sac` subcommands"
    assert set(re.findall(r"`([a-z-]+)`", sac_listed.group(1))) == set(cli.SAC_COMMANDS)


def test_every_readme_doc_link_exists():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for link in re.findall(r"\]\(((?:docs/)?[A-Za-z_./-]+\.md)\)", readme):
        assert (ROOT / link).is_file(), f"README links to missing {link}"
