"""The Ray launcher (`lab.launcher: ray`): a lab on a Ray instance the lab starts on 127.0.0.1 gives the report of
the same lab run inline, also when the Ray worker running a cell is killed mid-cell (Ray retries the task, the
cell resumes from its checkpoint)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from lab_helpers import smoke_config, without_timings

from lmpo.lab import lab_config_from_dict, run_lab
from lmpo.trainer.config import ConfigError

pytest.importorskip("ray")
TASK = "thinking_addition"


def _sections(**lab):
    return {"lab": {"jobs": 2, "checkpoint_every_steps": 2, "sampled_eval_k": 0, **lab},
            "grid": {"objectives": ["grpo", "gspo"], "seeds": [0]},
            "gradients": {"enabled": False}}


def _comparable(report: dict) -> dict:
    report = without_timings(report)
    for key in ("dir", "launcher", "max_retries"):
        report["config"]["lab"][key] = None
    return report


def _worker_pids(cell: Path) -> list[int]:
    """The `lmpo.lab.worker` processes running ``cell``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"lmpo.lab.worker" in cmd and str(cell).encode() in cmd:
                pids.append(int(entry.name))
    return pids


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.slow
def test_ray_launcher_survives_a_killed_worker_and_reports_what_the_local_launcher_does(tmp_path, small_model_dir):
    train = {**smoke_config(tmp_path, small_model_dir)["train"], "sft": {"steps": 0}, "eval": {"every_steps": 3}}
    train["loop"] = {**train["loop"], "steps": 6}  # a checkpoint every 2 steps: the kill lands mid-cell
    ray_cfg = smoke_config(tmp_path / "ray", small_model_dir, **_sections(launcher="ray", max_retries=2), train=train)
    path = tmp_path / "lab_ray.yaml"
    path.write_text(yaml.safe_dump(ray_cfg))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "lmpo.cli", "lab", str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    cell = tmp_path / "ray" / "cells" / TASK / "grpo" / "seed0"
    killed = None
    try:
        deadline = time.monotonic() + 240
        while killed is None and time.monotonic() < deadline and proc.poll() is None:
            if list(cell.glob("run/checkpoints/step_*")) and _worker_pids(cell):
                killed = _parent(_worker_pids(cell)[0])  # the Ray worker process that runs the cell's task
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.1)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.decode(errors="replace")
    assert killed is not None, f"the cell never wrote a checkpoint while its worker ran:\n{text[-2000:]}"
    assert proc.returncode == 0, text[-3000:]
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["resumed_from_step"] >= 2, "the retried task started the cell again instead of resuming it"
    assert (cell / "log.txt").read_text().count("(ray task)") >= 2  # the first attempt, then Ray's retry

    ray_report = json.loads((tmp_path / "ray" / "lab.json").read_text())
    inline = run_lab(lab_config_from_dict(smoke_config(tmp_path / "inline", small_model_dir, **_sections(),
                                                       train=train)), inline=True)
    assert _comparable(ray_report) == _comparable(json.loads(json.dumps(inline.report)))


@pytest.mark.parametrize(("resources", "match"), [
    ({"eval": {"cpus": 1}}, "job kind 'eval'"),
    ({"train": {"cores": 1}}, "cpus"),
    ({"train": {"gpus": -1}}, "number ≥ 0"),
])
def test_bad_ray_resources_are_refused_naming_the_key(tmp_path, small_model_dir, resources, match):
    cfg = lab_config_from_dict(smoke_config(tmp_path, small_model_dir, **_sections(launcher="ray", resources=resources)))
    with pytest.raises(ConfigError, match=match):
        run_lab(cfg, inline=True)
