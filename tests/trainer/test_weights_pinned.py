"""The trainer's weights and metrics after 3 off-policy RL steps, pinned bit for bit, for every preset and the loop's
optional paths (KL in the loss and in the reward, reference sync, ReMax, dynamic sampling, truncation masking,
zero-variance filtering, sampler log-probs on- and off-policy, two epochs, on-policy).

The pins were recorded before the trainer was cut into public stages (``lmpo.trainer.build`` / ``stages``) and
hold a refactor to "values must not change". Float results depend on the CPU's kernels and the torch build, so
they are compared only on the machine kind they were recorded on (the file's ``fingerprint``); elsewhere the test
skips, naming the command that records pins for that machine (run it on a commit whose values you trust)::

    PYTHONPATH=src python tests/trainer/test_weights_pinned.py --record
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from pathlib import Path

import pytest
import torch
from trainer_helpers import make_trainer

from lmpo.objectives import PRESETS

PINS = Path(__file__).parent / "data" / "weights_after_3_steps.json"

VARIANTS = {
    "kl_in_reward": ("grpo", {"objective": {"kl_in_reward": True}}),
    "remax": ("grpo", {"objective": {"advantage_estimator": "remax"}}),
    "dyn_sampling": ("grpo", {"rollout": {"dynamic_sampling": True}}),
    "mask_trunc": ("grpo", {"objective": {"mask_truncated_completions": True}}),
    "filter_zero": ("grpo", {"objective": {"filter_zero_variance": True}}),
    "kl_loss": ("grpo", {"objective": {"overrides": {"kl_coef": 0.05}}}),
    "kl_loss_and_reward": ("grpo", {"objective": {"kl_in_reward": True, "overrides": {"kl_coef": 0.05}}}),
    "ref_sync": ("grpo", {"objective": {"overrides": {"kl_coef": 0.05}, "ref_sync_steps": 1}}),
    "record_logp_off": ("grpo", {"rollout": {"record_logprobs": True}}),
    "record_logp_on": ("grpo", {"rollout": {"record_logprobs": True}, "loop": {"minibatches_per_step": 1}}),
    "epochs2": ("grpo", {"loop": {"epochs_per_step": 2}}),
    "on_policy": ("grpo", {"loop": {"minibatches_per_step": 1}}),
}
CASES = sorted(PRESETS) + sorted(VARIANTS)


def fingerprint() -> str:
    return f"torch {torch.__version__}, {platform.machine()}, {torch.backends.cpu.get_cpu_capability()}"


def run_case(name: str, run_dir) -> list[str]:
    """[sha256 of the weights, sha256 of the metrics without timings] after 3 RL steps of 2 minibatches each."""
    preset, sections = (name, {}) if name in PRESETS else VARIANTS[name]
    sections = {**sections, "loop": {"steps": 3, "minibatches_per_step": 2, **sections.get("loop", {})}}
    trainer = make_trainer(run_dir, preset, **sections)
    history = trainer.train().history
    weights = hashlib.sha256()
    for key, value in sorted(trainer.model.state_dict().items()):
        weights.update(key.encode())
        weights.update(value.detach().cpu().contiguous().numpy().tobytes())
    rows = [{k: v for k, v in row.items() if not k.startswith(("time/", "perf/"))} for row in history]
    metrics = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()
    return [weights.hexdigest(), metrics]


def _pins() -> dict:
    return json.loads(PINS.read_text()) if PINS.is_file() else {}


@pytest.mark.parametrize("name", CASES)
def test_weights_and_metrics_after_3_off_policy_steps_are_pinned(tmp_path, name):
    pins = _pins()
    if pins.get("fingerprint") != fingerprint():
        pytest.skip(f"pins recorded on {pins.get('fingerprint')!r}, this machine is {fingerprint()!r}; record "
                    "pins for it with: PYTHONPATH=src python tests/trainer/test_weights_pinned.py --record")
    assert name in pins["cases"], "a new preset or case: record the pins (see the module docstring)"
    assert run_case(name, tmp_path / "run") == pins["cases"][name], (
        f"{name}: the weights or metrics after 3 off-policy steps changed; a change that is meant to keep values "
        "must keep these bit for bit")


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    import tempfile

    torch.set_num_threads(1)  # as the trainer tests run (tests/trainer/conftest.py)
    with tempfile.TemporaryDirectory() as tmp:
        cases = {name: run_case(name, Path(tmp) / name) for name in CASES}
    PINS.write_text(json.dumps({"fingerprint": fingerprint(), "cases": cases}, indent=1) + "\n")
    print(f"{PINS}: {len(cases)} cases pinned on {fingerprint()}")
