"""Configuration of a lab: one frozen dataclass per section, documented in one place (field help).

A lab is a YAML file with five sections::

    lab:        where it writes, how many cells run at once
    grid:       objectives × seeds (× tasks)
    train:      the trainer config every cell starts from (the sections of `lmpo train`, docs/trainer.md)
    gradients:  the paired gradient study
    report:     baseline, confidence level, margins, which claims the verdict table judges

built with :func:`load_lab_config` (YAML + ``--section.key value`` overrides, unknown keys refused with close
matches) and checked by :func:`lmpo.lab.grid.validate_lab_config` before anything runs. ``docs/lab.md``'s reference tables
are rendered from these classes (:func:`render_lab_reference`; a test keeps them equal).

The sections are built on the one config base, :mod:`lmpo.config` (ranges and choices in the field metadata,
closest-name errors), like the trainer's.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any

from lmpo.config import (
    ConfigError,
    deep_merge,
    from_dict,
    parse_overrides,
    read_yaml,
    render_reference,
)
from lmpo.config import option as _f
from lmpo.trainer.config import TrainConfig

# ----------------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LabSection:
    """Where the lab writes and how it runs its cells."""

    dir: str = _f("runs/lab", "Lab directory: cells/, warmup/, gradients/, lab.json, lab.md, plots/.")
    jobs: int = _f(1, "Cells (and gradient-study snapshots) run at once, each in its own process.", ge=1)
    checkpoint_every_steps: int = _f(10, "Each cell writes a checkpoint every N RL steps, so that a killed lab "
                                     "resumes a cell where it stopped (0: only at the end).", ge=0)
    keep_checkpoints: bool = _f(False, "Keep a finished cell's checkpoints (they are deleted once its summary is "
                                "written; the gradient study's snapshots are always kept).")
    sampled_eval_k: int = _f(0, "After its last step each cell samples k completions per held-out problem "
                             "(the rollout's temperature) for pass@k and avg@k (0: off).", ge=0)
    progress: str = _f("auto", "auto (a live status line on a terminal, plain lines otherwise) | lines | quiet "
                       "(nothing).", choices=("auto", "lines", "quiet"))
    launcher: str = _f("local", "local (each job a worker process on this machine) | ray (each job a Ray task: "
                       "the lab's jobs spread over a Ray cluster; docs/lab.md, 'Running on a Ray cluster').",
                       choices=("local", "ray"))
    ray_address: str = _f("", "With launcher ray: the cluster to submit to ('auto': the one this machine belongs to, "
                          "or 'ray://HEAD:10001'); empty: start a Ray instance on this machine (127.0.0.1 only) "
                          "for the lab's duration.")
    resources: dict = _f({}, "With launcher ray: what one job of each kind reserves, "
                         "`{warmup|train|gradients: {cpus: N, gpus: N}}` (default 1 CPU, 0 GPUs each).")
    max_retries: int = _f(2, "With launcher ray: how many times a job whose worker process or node was lost is "
                          "started again (it resumes from its newest checkpoint).", ge=0)


@dataclass(frozen=True)
class ObjectiveEntry:
    """One objective of the grid: a preset with overrides, or any `Objective(...)` keywords."""

    label: str = _f("", "Name of the row in tables and of its cell directories (default: the preset).")
    preset: str = _f("", "A preset of `lmpo.objectives.PRESETS`; empty: `Objective(**overrides)` from the "
                     "objective defaults.")
    overrides: dict = _f({}, "`Objective` keywords applied to the preset (or, without a preset, all of them).")
    seeds: tuple[int, ...] = _f((), "The seeds this objective runs on, a subset of `grid.seeds` (empty: all of them); "
                                "e.g. an arm kept to show that the papers' default does not act, or the second stage "
                                "of a lab whose first stage gated a claim out (docs/lab.md, 'Sizing').")
    train: dict = _f({}, "Trainer overrides for this objective's cells only (e.g. `{rlvcr: {enabled: true}}` or "
                     "`{objective: {advantage_estimator: rloo}}`); they may not change the budget, the model, the "
                     "task or the warm-up.")


@dataclass(frozen=True)
class TaskEntry:
    """One task of the grid (optional: by default the train section's task is the only one)."""

    label: str = _f("", "Name of the task in tables and directories (default: the task name).")
    task: dict = _f({}, "Fields of the trainer's `task` section for this task (e.g. `{name: countdown}`).")
    train: dict = _f({}, "Other trainer overrides for this task's cells (e.g. a longer `rollout.max_new_tokens`).")


@dataclass(frozen=True)
class GridConfig:
    """The grid: every objective × every seed (× every task) is one cell, one trainer run."""

    objectives: tuple[ObjectiveEntry, ...] = _f((ObjectiveEntry(preset="grpo"),), "Objective entries: a preset "
                                                "name, or a mapping with the keys of an objective entry.")
    seeds: tuple[int, ...] = _f((0, 1, 2, 3, 4), "Seeds; a seed sets `loop.seed` and `model.init_seed` of its cells "
                                "(data order, sampling, initial weights and warm-up).")
    tasks: tuple[TaskEntry, ...] = _f((), "Task entries (a task name or a mapping); empty: the train section's task.")


@dataclass(frozen=True)
class GradientConfig:
    """The paired gradient study (docs/lab.md, "The gradient study")."""

    enabled: bool = _f(True, "Run the study (it needs the reference run's cells).")
    reference: str = _f("grpo", "Objective label whose run provides the policy snapshots.")
    reference_seeds: tuple[int, ...] = _f((), "Seeds of the reference runs (default: the first three seeds of the "
                                          "grid); every snapshot of every reference run is studied.")
    points: int = _f(4, "Off-policy points per snapshot: independent update batches, each giving its own θ' "
                     "(and its own R behaviour batches).", ge=1)
    snapshots: tuple[float, ...] = _f((0.0, 0.5, 1.0), "Snapshot positions as fractions of the reference run's "
                                      "RL steps (0: after the warm-up).")
    batches: int = _f(16, "R: independent behaviour-policy rollout batches per snapshot (every objective's "
                      "gradient is taken on the same R batches).", ge=2, hint="A variance needs two batches.")
    onpolicy_batches: int = _f(16, "On-policy batches whose mean policy gradient is the reference direction.", ge=1)
    updates_before_gradient: int = _f(0, "k: minibatch updates from the snapshot before the gradient is taken "
                                      "(0: the train section's epochs × minibatches − 1, the last update of an "
                                      "RL step).", ge=0)
    objectives: tuple[str, ...] = _f((), "Objective labels to measure (empty: every entry without trainer "
                                     "overrides).")
    controls: tuple[ObjectiveEntry, ...] = _f((), "Objectives measured in the gradient study only (not trained), "
                                              "e.g. GRPO without its clip: `{label: grpo_noclip, preset: grpo, "
                                              "overrides: {trust_region: none}}`, the control that tells whether an "
                                              "SNR gap is clip activity.")
    params: str = _f("", "Regular expression on parameter names: only these enter the gradient vectors "
                     "(empty: every trainable parameter).")
    seed: int = _f(0, "Seed of the study's prompts and sampling.")


@dataclass(frozen=True)
class ReportConfig:
    """Statistics and the verdict table."""

    baseline: str = _f("grpo", "Objective label every objective is compared with (paired by seed).")
    confidence: float = _f(0.95, "Level of every interval.", gt=0.5, lt=1, hint="e.g. 0.95.")
    alpha: float = _f(0.05, "Significance level of the paired tests in the verdict rule.", gt=0, lt=0.5,
                      hint="e.g. 0.05.")
    power: float = _f(0.8, "Power at which every check's minimum detectable effect is given.", gt=0, lt=1,
                      hint="e.g. 0.8.")
    divergence_margin: float = _f(0.1, "A cell diverged (its runs are invalid for every claim that uses them) when "
                                  "its held-out accuracy at an evaluation after the start falls more than this "
                                  "below its start (absolute).", gt=0)
    claims: tuple[str, ...] = _f((), "Claims of `lmpo.lab.claims.CLAIMS` to judge (empty: all).")
    rule: str = _f("v2", "Verdict rule (docs/lab.md): v2 (the rule the v2 labs were published under) | v2.1 "
                   "(matched ablations, the run as the replicate, every part of a claim voting; "
                   "`lmpo.lab.rules`). Recorded in lab.json.", choices=("v2", "v2.1"))


@dataclass(frozen=True)
class LabConfig:
    """A complete lab."""

    lab: LabSection = _f(LabSection(), "Lab section.")
    grid: GridConfig = _f(GridConfig(), "Grid section.")
    train: TrainConfig = _f(TrainConfig(), "The trainer config every cell starts from (docs/trainer.md).")
    gradients: GradientConfig = _f(GradientConfig(), "Gradient-study section.")
    report: ReportConfig = _f(ReportConfig(), "Report section.")


# ----------------------------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------------------------

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

BUDGET_FIELDS = (("loop", "steps"), ("loop", "prompts_per_step"), ("loop", "epochs_per_step"),
                 ("loop", "minibatches_per_step"), ("rollout", "completions_per_prompt"),
                 ("rollout", "max_new_tokens"))
"""Trainer fields that make a cell's budget: equal for every objective of a task."""

_SHARED_SECTIONS = ("model", "task", "sft", "logging")
"""Trainer sections an objective entry may not override (the warm-up and the data are shared by seed)."""


def _normalise(data: dict) -> dict:
    """Shorthands of the YAML file: an objective given as a preset name, a task given as a task name."""
    data = dict(data)
    grid = dict(data.get("grid") or {})
    if "objectives" in grid and isinstance(grid["objectives"], (list, tuple)):
        grid["objectives"] = [{"preset": o} if isinstance(o, str) else o for o in grid["objectives"]]
    if "tasks" in grid and isinstance(grid["tasks"], (list, tuple)):
        grid["tasks"] = [{"task": {"name": t}} if isinstance(t, str) else t for t in grid["tasks"]]
    if grid:
        data["grid"] = grid
    return data


def lab_config_from_dict(data: dict | None) -> LabConfig:
    """A LabConfig from a nested dict (unknown keys raise ConfigError with close matches)."""
    return from_dict(LabConfig, _normalise(data or {}))


def load_lab_config(path: str | os.PathLike | None = None, overrides: list[str] | dict | None = None) -> LabConfig:
    """YAML file (optional) + overrides (``--grid.seeds '[0,1]'`` list or nested dict) → LabConfig."""
    data = read_yaml(path, "lab config") if path is not None else {}
    if overrides:
        over = parse_overrides(list(overrides)) if isinstance(overrides, (list, tuple)) else overrides
        data = deep_merge(_normalise(data), _normalise(over))
    return lab_config_from_dict(data)


def lab_config_to_dict(cfg: Any) -> Any:
    """Nested plain dict (tuples as lists, entries as mappings) suitable for YAML and JSON."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: lab_config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (tuple, list)):
        return [lab_config_to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: lab_config_to_dict(v) for k, v in cfg.items()}
    return cfg


def replace_lab(cfg: LabConfig, **sections: dict) -> LabConfig:
    """``replace_lab(cfg, lab={"jobs": 2})``: a copy with some fields of some sections changed."""
    return lab_config_from_dict(deep_merge(lab_config_to_dict(cfg), sections))


def objective_label(entry: ObjectiveEntry) -> str:
    return entry.label or entry.preset


def _train_task_name(cfg: LabConfig) -> str:
    """The train section's task as a directory name: the environment's id on a multi-turn lab (``env.id``; its
    examples come from the environment's task, so ``task.name`` is unused there), else ``task.name``."""
    if cfg.train.env.id:
        return cfg.train.env.id.replace("/", "_")  # textarena/Game-v0 names one directory, not two
    return cfg.train.task.name


def task_entries(cfg: LabConfig) -> tuple[TaskEntry, ...]:
    """The grid's tasks; without any, the train section's task (or environment) under its own name."""
    if cfg.grid.tasks:
        return cfg.grid.tasks
    return (TaskEntry(label=_train_task_name(cfg), task={}),)


def task_label(entry: TaskEntry, cfg: LabConfig) -> str:
    return entry.label or str(entry.task.get("name", _train_task_name(cfg)))


def build_objective(entry: ObjectiveEntry):
    """The ``Objective`` an entry describes (ConfigError naming the entry when it is invalid)."""
    from lmpo.objectives import PRESETS, Objective

    label = objective_label(entry) or "(no label)"
    try:
        if entry.preset:
            if entry.preset not in PRESETS:
                import difflib

                close = difflib.get_close_matches(entry.preset, list(PRESETS), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"grid objective {label!r}: preset {entry.preset!r} is not one of "
                                  f"{', '.join(PRESETS)}.{hint}")
            return Objective.preset(entry.preset, **entry.overrides)
        return Objective(**{"name": label, **entry.overrides})
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"grid objective {label!r}: {e}") from e


def trainer_objective_section(entry: ObjectiveEntry) -> dict:
    """The trainer's ``objective`` section (preset + overrides) that builds the entry's objective.

    The trainer starts from a preset; an entry without one is expressed on ``grpo``, whose keywords are the
    objective defaults, and the two are checked to build equal objectives."""
    from lmpo.objectives import Objective

    if entry.preset:
        return {"preset": entry.preset, "overrides": dict(entry.overrides)}
    wanted = build_objective(entry)
    via = Objective.preset("grpo", **entry.overrides)
    if via != wanted:  # pragma: no cover - only if the grpo preset stops being the defaults
        raise ConfigError(f"grid objective {objective_label(entry)!r}: its keywords cannot be expressed on the "
                          "trainer's preset 'grpo'; give the entry a `preset`.")
    return {"preset": "grpo", "overrides": dict(entry.overrides)}


def updates_before_gradient(cfg: LabConfig) -> int:
    """k of the gradient study: the configured value, or the last update of a training RL step."""
    if cfg.gradients.updates_before_gradient:
        return cfg.gradients.updates_before_gradient
    return cfg.train.loop.epochs_per_step * cfg.train.loop.minibatches_per_step - 1


# ----------------------------------------------------------------------------------------------------
# Reference documentation rendered from the dataclasses
# ----------------------------------------------------------------------------------------------------

LAB_DOC_START = "<!-- lab-config-reference:start -->\n"
LAB_DOC_END = "<!-- lab-config-reference:end -->"


def render_lab_reference() -> str:
    """Markdown tables of every lab section except `train` (which is docs/trainer.md's config)."""
    sections = ((LabSection, "lab"), (GridConfig, "grid"), (GradientConfig, "gradients"), (ReportConfig, "report"))
    return "\n".join(render_reference(cls, prefix) for cls, prefix in sections)


__all__ = ["BUDGET_FIELDS", "GradientConfig", "GridConfig", "LabConfig", "LabSection", "ObjectiveEntry",
           "ReportConfig", "TaskEntry", "build_objective", "lab_config_from_dict", "lab_config_to_dict",
           "load_lab_config", "objective_label", "render_lab_reference", "replace_lab", "task_entries",
           "task_label", "trainer_objective_section", "updates_before_gradient"]
