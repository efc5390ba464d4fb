"""docs/scaling.md follows the registry and the adapters' actual behaviour (STYLE rule 2)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import ActorConfig

import lmpo.integrations.verl as lv
from lmpo.integrations import TESTED_VERSIONS
from lmpo.integrations.trl import TESTED_TRL_VERSION, check_trl_args
from lmpo.objectives import PRESETS, Objective

DOC = (Path(__file__).resolve().parents[2] / "docs" / "scaling.md").read_text(encoding="utf-8")


def support_matrix() -> dict[str, tuple[str, str]]:
    section = DOC.split("## Support matrix", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| (.*?) \| (.*?) \|$", section, re.M)
    return {name: (trl, verl) for name, trl, verl in rows}


def test_support_matrix_lists_exactly_the_registry():
    assert list(support_matrix()) == list(PRESETS)


@pytest.mark.parametrize("name", list(PRESETS))
def test_verl_column_matches_the_adapter(name):
    verl_cell = support_matrix()[name][1]
    mode = lv.AGGREGATION_TO_VERL[Objective.preset(name).aggregation]
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=mode)
    logp = torch.zeros(2, 3)
    args = (logp, logp.clone().requires_grad_(), torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool), mode, config)
    if verl_cell.startswith("refused"):
        with pytest.raises(NotImplementedError):
            get_policy_loss_fn(f"lmpo_{name}")(*args)
    else:
        assert verl_cell.startswith("yes")
        loss, _ = get_policy_loss_fn(f"lmpo_{name}")(*args)
        assert torch.isfinite(loss)


@pytest.mark.parametrize("name", list(PRESETS))
def test_trl_column_matches_the_adapter(name):
    from trl import GRPOConfig

    assert support_matrix()[name][0].startswith("yes")
    objective = Objective.preset(name)
    check_trl_args(objective, GRPOConfig(output_dir="unused", scale_rewards=objective.advantage_scale,
                                         use_cpu=True, report_to="none"))


def test_documented_preset_aggregations_match_the_registry():
    text = " ".join(DOC.split("### Aggregation: verl's `loss_agg_mode` wins", 1)[1].split("\n\n")[1].split())
    listed = re.search(r"preset's \((.*?)\) to reproduce", text).group(1)
    seen = []
    for names, mode in re.findall(r"((?:`[a-z_]+`,? ?)+): `([a-z-]+)`", listed):
        for name in re.findall(r"`([a-z_]+)`", names):
            assert lv.AGGREGATION_TO_VERL[Objective.preset(name).aggregation] == mode, name
            seen.append(name)
    supported = [name for name, (_, verl) in support_matrix().items() if not verl.startswith("refused")]
    assert sorted(seen) == sorted(supported)


def test_documented_versions_are_the_pinned_ones():
    assert TESTED_VERSIONS == {"trl": TESTED_TRL_VERSION, "verl": lv.TESTED_VERL_VERSION}
    assert f"TRL {TESTED_TRL_VERSION}.0" in DOC and f"verl {lv.TESTED_VERL_VERSION}" in DOC


def test_version_checks_warn_on_untested_versions():
    import trl
    import verl

    from lmpo.integrations.trl import check_trl_version

    assert check_trl_version(trl.__version__) and lv.check_verl_version(verl.__version__)  # the installed ones
    with pytest.warns(RuntimeWarning, match="tested with TRL 1.16.x, found TRL 1.17.0"):
        assert not check_trl_version("1.17.0")
    with pytest.warns(RuntimeWarning, match="tested with verl 0.9.1, found verl 0.10.0"):
        assert not lv.check_verl_version("0.10.0")


def test_documented_verl_command_composes_with_verl_config():
    """The complete `python3 -m verl.trainer.main_ppo ...` command of the guide is valid for verl's Hydra tree."""
    import os
    import shlex

    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    block = DOC.split("python3 -m verl.trainer.main_ppo \\\n", 1)[1].split("```", 1)[0]
    overrides = shlex.split(block.replace("\\\n", " "))
    assert "actor_rollout_ref.model.external_lib=lmpo.integrations.verl" in overrides
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=lmpo_gspo" in overrides
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (2, 8)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    objective = lv.objective_for_verl("gspo", actor.loss_agg_mode, actor)
    assert (objective.eps_low, objective.eps_high) == (3e-4, 4e-4)
