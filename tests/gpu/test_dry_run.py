"""The GPU check's script on the CPU (``run.sh --dry-run``): every section runs and reports, so the script
cannot rot between the rare runs on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_dry_run_reports_every_section(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu/run.sh"), "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert report["dry_run"] and report["errors"] == {}
    sections = [r["section"] for r in report["rows"]]
    assert sections.count("decode") == 2 and sections.count("mfu") == 2
    assert "step" in sections and "memory" in sections
    decode = [r for r in report["rows"] if r["section"] == "decode"]
    assert all(r["lmpo_decode_mode"] == "static" for r in decode)  # the graphs' fixed-shape step, eagerly
    step = next(r for r in report["rows"] if r["section"] == "step")
    assert step["pairs"] >= 2 and step["lmpo_step_s"] > 0 and step["trl_step_s"] > 0
    table = (tmp_path / "gpu.md").read_text()
    assert "| decode tokens/s" in table and "| GRPO step" in table and "| update MFU" in table
    assert (tmp_path / "bench.log").exists()
