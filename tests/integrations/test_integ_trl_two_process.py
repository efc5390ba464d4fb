"""The TRL adapter under ``accelerate launch --num_processes 2`` (CPU, gloo) gives the loss and gradients of one
process on the same global batch, with lmpo's global token / sequence normalisers (grpo: a mean over sequences,
dapo: a mean over the global tokens, gspo: sequence-level ratios)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("accelerate")

from trl_two_process_worker import OBJECTIVES, build, loss_and_grads  # noqa: E402

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_give_the_loss_and_gradients_of_one(tmp_path):
    out = tmp_path / "two.pt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1] / "src"), str(HERE),
                                                        os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
           str(_free_port()), str(HERE / "trl_two_process_worker.py"), str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    two = torch.load(out, weights_only=True)
    assert two["num_processes"] == 2 and two["backend"] == "gloo"
    for objective in OBJECTIVES:
        loss, grads = loss_and_grads(build(objective))  # one process, the whole batch
        loss2, grads2 = two[objective]
        assert loss2 == pytest.approx(loss, rel=1e-5, abs=1e-7), objective
        assert len(grads) == len(grads2)
        for a, b in zip(grads2, grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
        assert any(g.abs().sum() > 0 for g in grads)
