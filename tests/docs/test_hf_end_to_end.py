"""docs/trainer.md's Qwen2 end-to-end block (= examples/hf/qwen2_end_to_end.sh) runs as written, in-process."""

from __future__ import annotations

import io
import re
import runpy
import shlex
import sys
from contextlib import redirect_stdout
from pathlib import Path

import torch

from lmpo.cli import main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "hf" / "qwen2_end_to_end.sh"


def _doc_block() -> list[str]:
    doc = (ROOT / "docs" / "trainer.md").read_text(encoding="utf-8")
    [block] = [b for b in re.findall(r"```bash\n(.*?)```", doc, re.S) if "make_tiny_qwen2.py" in b]
    return [line for line in block.splitlines() if line.strip()]


def _script_lines() -> list[str]:
    return [line for line in SCRIPT.read_text().splitlines()
            if line.strip() and not line.startswith(("#", "set "))]


def test_doc_block_is_the_script():
    assert _doc_block() == _script_lines()


def _run(line: str, monkeypatch) -> str:
    """One line of the block: `lmpo …` through lmpo.cli.main, `python FILE …` through runpy (same process)."""
    argv = shlex.split(line)
    out = io.StringIO()
    with redirect_stdout(out):
        if argv[0] == "lmpo":
            assert main(argv[1:]) == 0, line
        else:
            assert argv[0] == "python"
            script = str(ROOT / argv[1])
            monkeypatch.setattr(sys, "argv", [script, *argv[2:]])
            runpy.run_path(script, run_name="__main__")
    return out.getvalue()


def test_qwen2_build_train_export_reload_eval(tmp_path, monkeypatch, one_torch_thread):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the block runs from the repository root
    outputs = [_run(line, monkeypatch) for line in _doc_block()]
    exported = tmp_path / "runs" / "qwen2" / "exported"
    model = AutoModelForCausalLM.from_pretrained(exported)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    trained = load_file(str(tmp_path / "runs" / "qwen2" / "run" / "checkpoints" / "step_00000002" /
                            "model.safetensors"))
    start = AutoModelForCausalLM.from_pretrained(tmp_path / "runs" / "qwen2" / "policy")
    for k, v in trained.items():  # the export is the trained policy, and training changed it
        assert torch.equal(model.state_dict()[k], v), k
    assert any(not torch.equal(start.state_dict()[k], v) for k, v in trained.items())
    tok = AutoTokenizer.from_pretrained(exported)
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    assert "Qwen2ForCausalLM from runs/qwen2/exported: '3+4=' -> " in outputs[3]
    for text in outputs[4:]:
        assert re.search(r"accuracy \d\.\d{3} \(\d+/20\), 95% CI \[\d\.\d{3}, \d\.\d{3}\]", text), text
