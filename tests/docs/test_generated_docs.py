"""`make docs` regenerates every generated block (lmpo.generated_docs); a stale file fails with that command."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lmpo.generated_docs import COMMAND, GENERATED, main, render_blocks, stale_files

# ids other test modules register at import are not lmpo's (the docs list what lmpo ships)
pytestmark = pytest.mark.usefixtures("lmpo_envs_only")

ROOT = Path(__file__).resolve().parents[2]


def test_no_generated_file_is_stale():
    stale = stale_files(ROOT)
    assert not stale, f"stale generated files: {', '.join(stale)}; run `{COMMAND}`"


def test_a_stale_block_is_reported_and_regenerated(tmp_path, capsys):
    for rel in GENERATED:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    readme = tmp_path / "README.md"
    original = readme.read_text(encoding="utf-8")
    readme.write_text(original.replace("| `grpo` |", "| `grpo_renamed` |", 1), encoding="utf-8")
    assert stale_files(tmp_path) == ["README.md"]
    assert main([str(tmp_path), "--check"]) == 1
    assert "README.md: stale; run `make docs`" in capsys.readouterr().out
    assert main([str(tmp_path)]) == 0
    assert readme.read_text(encoding="utf-8") == original and stale_files(tmp_path) == []


def test_lost_markers_name_the_block_and_the_command():
    with pytest.raises(ValueError, match=r"README.md lost the markers of its generated block 'presets'.*make docs"):
        render_blocks("no markers here\n", GENERATED["README.md"], "README.md")


def test_makefile_docs_target_runs_the_generator_and_the_error_table():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    target = makefile[makefile.index("\ndocs:"):].split("\n\n")[0]
    assert "-m lmpo.generated_docs" in target and "tests/cli/test_bad_inputs.py" in target
