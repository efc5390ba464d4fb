"""Lab configs: YAML shorthands, refusals that name the fix, the fixed budget, the shipped configs, the docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from lab_helpers import smoke_config

from lmpo import cli
from lmpo.lab import lab_config_from_dict, load_lab_config, plan_jobs, validate_lab_config
from lmpo.lab.config import (
    build_objective,
    lab_config_to_dict,
    render_lab_reference,
    trainer_objective_section,
)
from lmpo.lab.docs import render
from lmpo.objectives import Objective
from lmpo.trainer.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _cfg(tmp_path, **sections):
    return lab_config_from_dict(smoke_config(tmp_path / "lab", "tiny", **sections))


def test_yaml_shorthands_and_overrides(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(smoke_config(tmp_path / "lab", "tiny")))
    cfg = load_lab_config(path, ["--grid.objectives", "[grpo, {label: wide, preset: gspo, overrides: {eps_high: "
                                 "0.001}}]", "--lab.jobs", "2", "--train.loop.steps", "6"])
    assert [(o.label, o.preset) for o in cfg.grid.objectives] == [("", "grpo"), ("wide", "gspo")]
    assert cfg.lab.jobs == 2 and cfg.train.loop.steps == 6
    assert build_objective(cfg.grid.objectives[1]) == Objective.preset("gspo", eps_high=1e-3)
    validate_lab_config(cfg)


def test_unknown_key_is_refused_with_a_close_match(tmp_path):
    with pytest.raises(ConfigError, match="Did you mean `jobs`"):
        lab_config_from_dict({"lab": {"jobz": 2}})
    with pytest.raises(ConfigError, match="seeds"):
        lab_config_from_dict({"grid": {"sedes": [0]}})


def test_an_objective_without_preset_is_any_objective_keywords(tmp_path):
    cfg = _cfg(tmp_path, grid={"objectives": ["grpo", {"label": "soft", "overrides": {
        "level": "sequence_arith", "trust_region": "gaussian", "ptrw_sigma": 0.3}}], "seeds": [0]})
    validate_lab_config(cfg)
    entry = cfg.grid.objectives[1]
    wanted = Objective(level="sequence_arith", trust_region="gaussian", ptrw_sigma=0.3)
    assert build_objective(entry) == wanted
    section = trainer_objective_section(entry)
    assert Objective.preset(section["preset"], **section["overrides"]) == wanted


@pytest.mark.parametrize("grid, match", [
    ({"objectives": ["grpo", "grpo"]}, "more than once"),
    ({"objectives": ["grpo", "nope"]}, "not one of"),
    ({"objectives": ["grpo", {"preset": "gspo", "overrides": {"eps_hgh": 0.1}}]}, "eps_hgh"),
    ({"objectives": ["grpo", {"overrides": {"level": "sequence"}}]}, "neither a label nor a preset"),
    ({"objectives": ["grpo", {"label": "a/b", "preset": "gspo"}]}, "directories"),
    ({"seeds": [0, 0]}, "repeats a seed"),
    ({"objectives": ["grpo", {"label": "x", "preset": "gspo", "train": {"model": {"name": "tiny"}}}]},
     "every objective of a seed shares"),
])
def test_bad_grids_are_refused(tmp_path, grid, match):
    with pytest.raises(ConfigError, match=match):
        validate_lab_config(_cfg(tmp_path, grid=grid))


def test_an_entry_that_changes_the_budget_is_refused(tmp_path):
    grid = {"objectives": ["grpo", {"label": "longer", "preset": "gspo", "train": {"loop": {"steps": 9}}}]}
    with pytest.raises(ConfigError, match=r"loop\.steps: 4 vs 9"):
        validate_lab_config(_cfg(tmp_path, grid=grid))


def test_an_entry_may_change_what_is_not_the_budget(tmp_path):
    grid = {"objectives": ["grpo", {"label": "rlvcr", "preset": "grpo", "train": {"rlvcr": {"enabled": True}}},
                           {"label": "rloo", "preset": "grpo", "train": {"objective": {"advantage_estimator": "rloo"}}}],
            "seeds": [0]}
    cfg = _cfg(tmp_path, grid=grid)
    validate_lab_config(cfg)
    jobs = {j.key: j for j in plan_jobs(cfg)}
    assert jobs["train/thinking_addition/rlvcr/seed0"].spec["train"]["rlvcr"]["enabled"] is True
    rloo = jobs["train/thinking_addition/rloo/seed0"].spec["train"]["objective"]
    assert rloo["advantage_estimator"] == "rloo" and rloo["preset"] == "grpo"
    bad = {"objectives": ["grpo", {"label": "x", "preset": "grpo", "train": {"objective": {"preset": "gspo"}}}]}
    with pytest.raises(ConfigError, match="sets itself"):
        validate_lab_config(_cfg(tmp_path, grid=bad))


def test_gradient_study_needs_an_off_policy_regime_and_a_known_reference(tmp_path):
    with pytest.raises(ConfigError, match="off-policy"):
        validate_lab_config(_cfg(tmp_path, train={**smoke_config(tmp_path, "tiny")["train"],
                                                  "loop": {"steps": 4, "prompts_per_step": 2}}))
    with pytest.raises(ConfigError, match="gradients.reference"):
        validate_lab_config(_cfg(tmp_path, gradients={"reference": "gspo_token"}))
    with pytest.raises(ConfigError, match="report.baseline"):
        validate_lab_config(_cfg(tmp_path, report={"baseline": "dapo"}))


def test_plan_orders_dependencies_first_and_shares_the_warm_up(tmp_path):
    jobs = plan_jobs(_cfg(tmp_path))
    keys = [j.key for j in jobs]
    assert keys[:2] == ["warmup/thinking_addition/seed0", "warmup/thinking_addition/seed1"]
    # the reference runs (the first three seeds by default: here both), before their snapshots
    assert keys[2:4] == ["train/thinking_addition/grpo/seed0", "train/thinking_addition/grpo/seed1"]
    g = "gradients/thinking_addition"
    assert keys[4:12] == [f"{g}/seed{s}/snapshot_{t}/point_{p}" for s in (0, 1) for t in (0, 4) for p in (0, 1)]
    for job in jobs:
        assert all(keys.index(dep) < keys.index(job.key) for dep in job.deps)
    cell = jobs[keys.index("train/thinking_addition/gspo/seed1")]
    assert cell.deps == ("warmup/thinking_addition/seed1",)
    assert cell.spec["train"]["model"]["name"].endswith("warmup/thinking_addition/seed1/model")


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("lab_*.yaml")), ids=lambda p: p.name)
def test_shipped_lab_configs_validate(path):
    import torch

    cfg = load_lab_config(path)
    if cfg.train.loop.device == "cuda" and not torch.cuda.is_available():
        # the GPU lab on a CPU machine: everything but the device is still checked
        cfg = load_lab_config(path, ["--train.loop.device", "cpu"])
    validate_lab_config(cfg)
    if cfg.train.env.id:
        # a multi-turn comparison lab (grpo against gspo on episodes): it judges no claim of its own, and its
        # cells are episode runs, sized for CPU minutes rather than rule v2's 16 seeds x 500 problems
        assert {"grpo", "gspo"} <= {o.label or o.preset for o in cfg.grid.objectives}
        assert not cfg.gradients.enabled and cfg.lab.sampled_eval_k == 0
        return
    labels = [o.label or o.preset for o in cfg.grid.objectives]
    from lmpo.lab.staleness import applies, parse_label

    if applies(labels):  # the staleness study (docs/lab.md): its own claims, ≥ 8 seeds, no pass@k
        assert all(parse_label(x) for x in labels) and {parse_label(x)[0] for x in labels} == {0, 1, 2, 4}
        assert len(cfg.grid.seeds) >= 8
        assert cfg.train.task.eval_examples >= 500 and cfg.train.loop.steps // cfg.train.eval.every_steps >= 3
        return
    from lmpo.lab.rules import claims_for

    measured = set(labels) | {c.label or c.preset for c in cfg.gradients.controls}
    for claim in claims_for(cfg.report.rule, cfg.report.claims):  # every claim the lab judges can be judged
        for check in claim.checks:  # rule v2.1: a part may compare another pair (AMIC's unclipped pair)
            for label in (check.objective or claim.objective, check.baseline or claim.baseline):
                assert label in (labels if check.study == "training" else measured), \
                    f"{path.name} lacks {label} ({claim.name})"
        if claim.activity and claim.activity.against:  # the matched ablation the activity is measured against
            assert claim.activity.against in measured, f"{path.name} lacks {claim.activity.against} ({claim.name})"
    # rule v2: ≥ 16 seeds, endpoints on ≥ 500 held-out problems averaged over ≥ 3 evaluations, pass@k
    assert len(cfg.grid.seeds) >= 16
    assert cfg.train.task.eval_examples >= 500 and cfg.train.task.options.get("num_eval", 0) >= 500
    assert cfg.train.loop.steps // cfg.train.eval.every_steps >= 3
    assert cfg.lab.sampled_eval_k >= 2
    for rlvcr in [o for o in cfg.grid.objectives if (o.label or o.preset) == "rlvcr"]:
        # docs/rlvcr.md, "The third cause, and the fix": the calibrated arm the lab judges
        assert {k: rlvcr.train["rlvcr"].get(k) for k in ("family_action", "expansion_loss", "instruction")} == {
            "family_action": "original", "expansion_loss": "sampled", "instruction": "{prompt}"}
    assert cfg.train.loop.minibatches_per_step * cfg.train.loop.epochs_per_step > 1  # off-policy
    assert cfg.train.rollout.max_new_tokens >= 16


def test_docs_generated_blocks_are_up_to_date():
    text = (ROOT / "docs" / "lab.md").read_text(encoding="utf-8")
    assert render(text) == text, "docs/lab.md is stale: run `make docs`"
    assert "### `gradients`" in render_lab_reference()


def test_lab_help_and_plan(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert re.search(r"^\s+lab\s", capsys.readouterr().out, re.M)
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(smoke_config(tmp_path / "lab", "tiny")))
    assert cli.main(["lab", str(path), "--plan", "--grid.seeds", "[3]"]) == 0
    out = capsys.readouterr().out
    # a warm-up, two cells, and 2 snapshots × 2 off-policy points of the reference run
    assert "to run  train/thinking_addition/gspo/seed3" in out and "0/7 jobs finished" in out
    assert cli.main(["lab", str(path), "--plan", "--lab.jobs", "0"]) == 2
    assert "lab.jobs" in capsys.readouterr().err


def test_gradient_controls_are_measured_but_not_trained(tmp_path):
    control = {"label": "grpo_noclip", "preset": "grpo", "overrides": {"trust_region": "none"}}
    cfg = _cfg(tmp_path, gradients={"controls": [control]})
    validate_lab_config(cfg)
    jobs = plan_jobs(cfg)
    assert not any("grpo_noclip" in j.key for j in jobs if j.kind == "train")
    for job in (j for j in jobs if j.kind == "gradients"):
        assert [e["label"] for e in job.spec["objectives"]][-1] == "grpo_noclip"
    with pytest.raises(ConfigError, match="controls"):
        validate_lab_config(_cfg(tmp_path, gradients={"controls": [{"label": "gspo", "preset": "gspo"}]}))


def test_an_objective_may_run_on_a_subset_of_the_seeds(tmp_path):
    cfg = _cfg(tmp_path, grid={"objectives": ["grpo", {"preset": "gspo", "seeds": [1]}], "seeds": [0, 1]})
    validate_lab_config(cfg)
    cells = [j.key for j in plan_jobs(cfg) if j.kind == "train"]
    assert sorted(cells) == ["train/thinking_addition/grpo/seed0", "train/thinking_addition/grpo/seed1",
                             "train/thinking_addition/gspo/seed1"]
    with pytest.raises(ConfigError, match="not in grid.seeds"):
        validate_lab_config(_cfg(tmp_path, grid={"objectives": ["grpo", {"preset": "gspo", "seeds": [7]}]}))
    with pytest.raises(ConfigError, match="reference seeds"):
        validate_lab_config(_cfg(tmp_path, grid={"objectives": [{"preset": "grpo", "seeds": [1]}, "gspo"]}))


def test_a_staged_lab_reuses_the_first_stage_jobs():
    # docs/lab.md, "Sizing": a first stage on the first three seeds plans exactly the jobs (same specs, so the
    # same finished results) that the full lab plans for those seeds
    root = ROOT / "configs" / "lab_cpu.yaml"
    full = {j.key: j.spec for j in plan_jobs(load_lab_config(root, ["--lab.dir", "/tmp/staged"]))}
    first = {j.key: j.spec for j in plan_jobs(load_lab_config(root, ["--lab.dir", "/tmp/staged",
                                                                      "--grid.seeds", "[0, 1, 2]"]))}
    assert set(first) < set(full)
    assert all(first[k] == full[k] for k in first)
    # the second stage narrows gated claims' objectives to those seeds: the other jobs keep their specs
    data = lab_config_to_dict(load_lab_config(root, ["--lab.dir", "/tmp/staged"]))
    for entry in data["grid"]["objectives"]:
        if entry["label"] in ("decay", "cispo"):
            entry["seeds"] = [0, 1, 2]
    second = {j.key: j.spec for j in plan_jobs(lab_config_from_dict(data))}
    assert "train/thinking_addition/decay/seed5" in full and "train/thinking_addition/decay/seed5" not in second
    assert set(first) < set(second) and all(second[k] == full[k] for k in second)
