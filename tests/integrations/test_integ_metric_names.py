"""One naming scheme: lmpo's trainer, the TRL adapter and the verl adapter log an objective's statistics under the
same keys (the objective's own, merged by the one driver), for the same objective.

verl's policy-loss hook receives no token entropies (verl logs its own ``actor/entropy``), so ``entropy/mean`` is
the one key the verl adapter cannot report; it is checked to be exactly that difference.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lmpo.objectives import Objective
from lmpo.objectives.reference import all_stat_docs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_integ_trl import make_trainer as make_trl_trainer  # noqa: E402
from trainer_helpers import make_trainer  # noqa: E402

verl_adapter = pytest.importorskip("lmpo.integrations.verl")
from verl.trainer.ppo.core_algos import get_policy_loss_fn  # noqa: E402

OBJECTIVE_KEYS = set(all_stat_docs())


def _trainer_keys(tmp_path, name: str) -> set[str]:
    # two epochs: off-policy, so every objective's ratio and clip statistics are live
    trainer = make_trainer(tmp_path / name, name, loop={"steps": 1, "epochs_per_step": 2})
    result = trainer.train()
    return set(result.history[-1]) & OBJECTIVE_KEYS


def _trl_keys(name: str) -> set[str]:
    trainer = make_trl_trainer(Objective.preset(name, advantage_scale="group"), max_steps=1)
    trainer.train()
    return set(trainer.state.log_history[0]) & OBJECTIVE_KEYS


def _verl_keys(name: str) -> set[str]:
    from test_integ_verl import actor_config, batch

    old, logp, adv, mask, _ = batch(seed=3)
    mode = verl_adapter.AGGREGATION_TO_VERL[Objective.preset(name).aggregation]
    _, metrics = get_policy_loss_fn(f"lmpo_{name}")(old, logp.requires_grad_(), adv, mask, mode, actor_config(mode))
    return set(metrics) & OBJECTIVE_KEYS


@pytest.mark.parametrize("name", ["grpo", "clip_cov"])
def test_trainer_and_adapters_log_the_same_objective_keys(tmp_path, name):
    torch.manual_seed(0)
    trainer_keys = _trainer_keys(tmp_path, name)
    trl_keys = _trl_keys(name)
    verl_keys = _verl_keys(name)
    assert {"loss/policy", "ratio/mean", "clip/low_frac", "kl/behaviour_k3", "entropy/mean"} <= trainer_keys
    assert trainer_keys == trl_keys
    assert trainer_keys - verl_keys == {"entropy/mean"} and verl_keys <= trainer_keys
