"""examples/minimal_grpo.py, the single-file GRPO loop a researcher reads first, runs as written, stays short and
uses only lmpo's public parts (its measured run is in its docstring)."""

from __future__ import annotations

import ast
import io
import runpy
import sys
from contextlib import redirect_stdout
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minimal_grpo.py"


def _run(*argv: str) -> str:
    old_argv, threads = sys.argv, torch.get_num_threads()
    sys.argv = [str(EXAMPLE), *argv]
    out = io.StringIO()
    try:
        with redirect_stdout(out):
            runpy.run_path(str(EXAMPLE), run_name="__main__")
    finally:
        sys.argv = old_argv
        torch.set_num_threads(threads)
    return out.getvalue()


def test_the_example_runs_its_steps_and_reports_held_out_accuracy():
    text = _run("--steps", "2", "--sft-steps", "3", "--prompts-per-step", "4", "--completions-per-prompt", "4",
                "--eval-examples", "8")
    assert "held-out greedy accuracy after the warm-up:" in text
    assert "step    2  reward" in text
    assert "after 2 RL steps (grpo)" in text


def test_the_example_is_short_and_uses_only_public_parts():
    source = EXAMPLE.read_text()
    assert len(source.splitlines()) <= 200
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lmpo"):
            assert node.module.count(".") <= 1, f"{node.module}: import the public package, not a module inside it"
            assert not any(alias.name.startswith("_") for alias in node.names), node.module
