"""From a lab config to its jobs: warm-ups, training cells and gradient-study snapshots.

Layout of a lab directory (every job owns one directory; its result file marks it finished)::

    lab.yaml                                  the resolved lab config
    warmup/<task>/seed<s>/                    supervised warm-up shared by the seed's cells → warmup.json, model/
    cells/<task>/<objective>/seed<s>/         one trainer run in run/ (config.yaml, metrics.jsonl, …) → summary.json
    gradients/<task>/snapshot_<step>/         the gradient study at one snapshot → result.json
    lab.json, lab.md, plots/                  the report

A cell is an ordinary ``lmpo train`` run: its resolved trainer config is ``cells/…/config.yaml``. When the
train section has a warm-up (``sft.steps > 0``), it runs once per (task, seed) and the seed's cells start from
the saved model (``model.name`` = the warm-up's ``model/``, ``sft.steps = 0``), so every objective of a seed
starts from the same weights and the warm-up is paid once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmpo.config import check_fields
from lmpo.config import deep_merge as _deep_merge
from lmpo.lab.config import (
    _LABEL,
    _SHARED_SECTIONS,
    BUDGET_FIELDS,
    ConfigError,
    LabConfig,
    ObjectiveEntry,
    build_objective,
    objective_label,
    task_entries,
    task_label,
    trainer_objective_section,
    updates_before_gradient,
)
from lmpo.lab.jobs import RESULT_FILES, RUN_SUBDIR
from lmpo.lab.rules import claims_for, registry
from lmpo.lab.staleness import check_grid as check_staleness_grid
from lmpo.trainer.config import config_from_dict, config_to_dict, validate_config


@dataclass(frozen=True)
class Job:
    """One unit of work, run in its own process (or inline).

    ``spec`` is everything the job needs, as plain JSON data (written to ``DIR/job.json``); a finished job
    whose ``spec`` differs from the one a re-run plans is refused (its result belongs to another config).
    """

    kind: str
    key: str
    dir: Path
    spec: dict[str, Any]
    deps: tuple[str, ...] = ()
    labels: dict[str, Any] = field(default_factory=dict)

    @property
    def result_path(self) -> Path:
        return self.dir / RESULT_FILES[self.kind]

    def done(self) -> bool:
        return self.result_path.exists()


def _get(data: dict, section: str, key: str) -> Any:
    return data[section][key]


def _task_base(cfg: LabConfig, entry) -> dict:
    data = config_to_dict(cfg.train)
    data["task"] = {**data["task"], **entry.task}
    return _deep_merge(data, entry.train)


def _seeded(data: dict, seed: int) -> dict:
    return _deep_merge(data, {"loop": {"seed": seed}, "model": {"init_seed": seed}})


def _quiet(data: dict, run_dir: Path) -> dict:
    """A cell's console goes to its log file: no progress bar, no TensorBoard, no per-cell plots (metrics.jsonl
    is the record; the lab draws its own plots)."""
    return _deep_merge(data, {"logging": {"run_dir": str(run_dir), "progress_bar": False, "tensorboard": False,
                                          "print_every_steps": 0, "plots": False}})


def reference_seeds(cfg: LabConfig) -> list[int]:
    """Seeds of the gradient study's reference runs: ``gradients.reference_seeds``, or the grid's first three."""
    return list(cfg.gradients.reference_seeds) or list(cfg.grid.seeds[:3])


def snapshot_steps(cfg: LabConfig) -> list[int]:
    """RL steps of the reference run at which the gradient study takes its snapshots."""
    steps = cfg.train.loop.steps
    return sorted({int(round(f * steps)) for f in cfg.gradients.snapshots})


def gradient_objectives(cfg: LabConfig) -> list[ObjectiveEntry]:
    """The objective entries the gradient study measures."""
    if cfg.gradients.objectives:
        by_label = {objective_label(e): e for e in cfg.grid.objectives}
        return [by_label[name] for name in cfg.gradients.objectives]
    return [e for e in cfg.grid.objectives if not e.train]


def plan_jobs(cfg: LabConfig, lab_dir: str | Path | None = None) -> list[Job]:
    """Every job of the lab in a good start order (warm-ups, the reference run, its snapshots, the cells with
    trainer overrides, the rest).

    Builds and validates each cell's trainer config (ConfigError naming the cell) and checks that every
    objective of a task has the same budget (``BUDGET_FIELDS``)."""
    root = Path(lab_dir if lab_dir is not None else cfg.lab.dir)
    seeds = list(cfg.grid.seeds)
    ref_seeds = reference_seeds(cfg)
    warmups: list[Job] = []
    reference: list[Job] = []
    snapshots: list[Job] = []
    cells: list[Job] = []
    for tentry in task_entries(cfg):
        task = task_label(tentry, cfg)
        base = _task_base(cfg, tentry)
        has_warmup = int(base["sft"]["steps"]) > 0
        budget: dict[tuple[str, str], Any] | None = None
        for seed in seeds:
            seeded = _seeded(base, seed)
            warm_key = f"warmup/{task}/seed{seed}"
            warm_dir = root / "warmup" / task / f"seed{seed}"
            if has_warmup:
                warm = _deep_merge(_quiet(seeded, warm_dir / RUN_SUBDIR), {
                    "loop": {"steps": 0}, "eval": {"at_start": False, "every_steps": 0},
                    "checkpoint": {"at_end": False, "every_steps": 0, "final_model": False},
                    "objective": {"preset": "grpo", "overrides": {}}, "rlvcr": {"enabled": False}})
                _validated(warm, warm_key)
                warmups.append(Job("warmup", warm_key, warm_dir,
                                   {"train": warm, "sampled_eval_k": cfg.lab.sampled_eval_k},
                                   labels={"task": task, "seed": seed}))
            for entry in cfg.grid.objectives:
                if entry.seeds and seed not in entry.seeds:
                    continue
                label = objective_label(entry)
                key = f"train/{task}/{label}/seed{seed}"
                run_dir = root / "cells" / task / label / f"seed{seed}"
                data = _deep_merge(seeded, {"objective": trainer_objective_section(entry)})
                data = _deep_merge(data, entry.train)
                if has_warmup:
                    data = _deep_merge(data, {"model": {"name": str(warm_dir / "model")}, "sft": {"steps": 0}})
                is_reference = cfg.gradients.enabled and label == cfg.gradients.reference and seed in ref_seeds
                every = cfg.lab.checkpoint_every_steps
                keep = 1
                # a cell's result is its summary: no RUN/model/ copy of the policy per cell (disk)
                if is_reference:  # checkpoints at every snapshot step, all kept
                    for s in snapshot_steps(cfg):
                        if s > 0:
                            every = math.gcd(every, s) if every else s
                    keep = 0
                data = _deep_merge(_quiet(data, run_dir / RUN_SUBDIR), {"checkpoint": {"every_steps": every, "keep_last": keep,
                                                                           "at_end": True, "final_model": False}})
                _validated(data, key, stand_in=str(cfg.train.model.name))
                mine = {f: _get(data, *f) for f in BUDGET_FIELDS}
                if budget is None:
                    budget = mine
                elif mine != budget:
                    diff = [f"{s}.{k}: {budget[(s, k)]} vs {mine[(s, k)]}" for s, k in BUDGET_FIELDS
                            if budget[(s, k)] != mine[(s, k)]]
                    raise ConfigError(f"cell {key} does not have the budget of the other cells of task {task!r} "
                                      f"({'; '.join(diff)}); every objective of a task runs the same RL steps, "
                                      "prompts and completions: drop these keys from the entry's `train`.")
                job = Job("train", key, run_dir,
                          {"train": data, "keep_checkpoints": bool(cfg.lab.keep_checkpoints or is_reference),
                           "sampled_eval_k": cfg.lab.sampled_eval_k},
                          deps=(warm_key,) if has_warmup else (),
                          labels={"task": task, "objective": label, "seed": seed, "reference": is_reference})
                (reference if is_reference else cells).append(job)
        if cfg.gradients.enabled:
            for ref_seed in ref_seeds:
                snapshots += _gradient_jobs(cfg, root, task, _seeded(base, ref_seed), has_warmup, ref_seed)
    # entries with trainer overrides (RLVCR) cost several plain cells: start them first, so that the lab does
    # not end with one long cell on one core
    heavy = {objective_label(e) for e in cfg.grid.objectives if e.train}
    cells.sort(key=lambda j: j.labels["objective"] not in heavy)
    return warmups + reference + snapshots + cells


def _gradient_jobs(cfg: LabConfig, root: Path, task: str, seeded: dict, has_warmup: bool, ref_seed: int) -> list[Job]:
    ref_label = cfg.gradients.reference
    ref_key = f"train/{task}/{ref_label}/seed{ref_seed}"
    ref_dir = root / "cells" / task / ref_label / f"seed{ref_seed}" / RUN_SUBDIR
    warm_key = f"warmup/{task}/seed{ref_seed}"
    warm_model = root / "warmup" / task / f"seed{ref_seed}" / "model"
    base = _deep_merge(seeded, {"objective": {"preset": "grpo", "overrides": {}}, "rlvcr": {"enabled": False}})
    if has_warmup:
        base = _deep_merge(base, {"model": {"name": str(warm_model)}, "sft": {"steps": 0}})
    entries = [{"label": objective_label(e), "objective": trainer_objective_section(e)}
               for e in (*gradient_objectives(cfg), *cfg.gradients.controls)]
    measured = {e["label"] for e in entries}
    claims = claims_for(cfg.report.rule, cfg.report.claims)
    # the activity measure compares each objective's token gradient weights with those of its claims' baselines
    # (rule v2.1: with the matched ablation its activity gate names)
    compared = {c.baseline for c in claims} | {c.activity.against for c in claims if c.activity and c.activity.against}
    baselines = sorted(({cfg.report.baseline} | compared) & measured)
    gr = cfg.gradients
    jobs = []
    for step in snapshot_steps(cfg):
        for point in range(gr.points):
            key = f"gradients/{task}/seed{ref_seed}/snapshot_{step}/point_{point}"
            job_dir = root / "gradients" / task / f"seed{ref_seed}" / f"snapshot_{step}" / f"point_{point}"
            data = _quiet(base, job_dir / RUN_SUBDIR)
            _validated(data, key, stand_in=str(cfg.train.model.name))
            checkpoint = str(ref_dir / "checkpoints" / f"step_{step:08d}") if step > 0 else None
            deps = (ref_key,) if step > 0 else ((warm_key,) if has_warmup else ())
            spec = {"train": data, "checkpoint": checkpoint, "step": step, "objectives": entries,
                    "batches": gr.batches, "onpolicy_batches": gr.onpolicy_batches,
                    "updates_before_gradient": updates_before_gradient(cfg), "params": gr.params, "seed": gr.seed,
                    "reference_seed": ref_seed, "point": point, "baselines": baselines}
            jobs.append(Job("gradients", key, job_dir, spec, deps=deps,
                            labels={"task": task, "step": step, "reference_seed": ref_seed, "point": point}))
    return jobs


def _check_multiturn(cfg: LabConfig) -> None:
    """A lab on an environment (``train.env.id``): its cells train and evaluate on episodes, but the sampled
    evaluation and the gradient study sample single-turn completions, which an environment's task has no prompt
    string for; refuse them before any cell runs rather than fail after the cells."""
    env_id = cfg.train.env.id
    if not env_id:
        return
    if cfg.lab.sampled_eval_k:
        raise ConfigError(f"`lab.sampled_eval_k` = {cfg.lab.sampled_eval_k} with `train.env.id` = {env_id!r}: the "
                          "sampled pass@k evaluation plays single-turn completions, not episodes. Set "
                          "lab.sampled_eval_k: 0 (each cell's held-out success is eval/accuracy).")
    if cfg.gradients.enabled:
        raise ConfigError(f"`gradients.enabled` = true with `train.env.id` = {env_id!r}: the gradient study samples "
                          "single-turn rollouts, not episodes. Set gradients.enabled: false for a multi-turn lab.")


def _check_resources(resources: dict) -> None:
    """``lab.resources``: ``{kind: {cpus: N, gpus: N}}`` for the Ray launcher, every number ≥ 0."""
    for kind, spec in resources.items():
        if kind not in RESULT_FILES:
            raise ConfigError(f"`lab.resources` names job kind {kind!r}; the kinds are {', '.join(RESULT_FILES)}.")
        if not isinstance(spec, dict) or set(spec) - {"cpus", "gpus"}:
            raise ConfigError(f"`lab.resources.{kind}` = {spec!r}; give a mapping with `cpus` and/or `gpus`, "
                              "e.g. `{cpus: 1, gpus: 0.5}`.")
        for key, value in spec.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ConfigError(f"`lab.resources.{kind}.{key}` = {value!r}; give a number ≥ 0.")


def validate_lab_config(cfg: LabConfig) -> None:
    """Check the lab before any cell runs (each cell's trainer config is validated too). Raises ConfigError."""
    check_fields(cfg)  # ranges and choices of every field (the train section's too)
    _check_resources(cfg.lab.resources)
    if not cfg.grid.seeds:
        raise ConfigError("`grid.seeds` is empty; give at least one seed (five or more for intervals).")
    if len(set(cfg.grid.seeds)) != len(cfg.grid.seeds):
        raise ConfigError(f"`grid.seeds` = {list(cfg.grid.seeds)} repeats a seed; list each seed once.")
    if not cfg.grid.objectives:
        raise ConfigError("`grid.objectives` is empty; list at least one preset name.")
    labels = []
    for i, entry in enumerate(cfg.grid.objectives):
        label = objective_label(entry)
        if not label:
            raise ConfigError(f"`grid.objectives[{i}]` has neither a label nor a preset; give it `label: NAME`.")
        if not _LABEL.match(label):
            raise ConfigError(f"`grid.objectives[{i}].label` = {label!r} must be letters, digits, '_', '.' or '-' "
                              "(it names directories).")
        build_objective(entry)
        outside = [x for x in entry.seeds if x not in cfg.grid.seeds]
        if outside:
            raise ConfigError(f"grid objective {label!r}: `seeds` names {outside}, which are not in grid.seeds "
                              f"{list(cfg.grid.seeds)}; an entry runs on a subset of the grid's seeds.")
        bad = sorted(set(entry.train) & set(_SHARED_SECTIONS))
        if bad:
            raise ConfigError(f"grid objective {label!r}: `train` overrides section(s) {', '.join(bad)}, which "
                              "every objective of a seed shares (model, task, warm-up, logging); move them to the "
                              "train section.")
        own = sorted(set(entry.train.get("objective") or {}) & {"preset", "overrides"})
        if own:
            raise ConfigError(f"grid objective {label!r}: `train.objective` sets {', '.join(own)}, which the entry "
                              "sets itself; use the entry's `preset` and `overrides` keys.")
        labels.append(label)
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ConfigError(f"grid objective label(s) {', '.join(dup)} appear more than once; give entries that "
                          "share a preset distinct `label`s.")
    _check_multiturn(cfg)
    tasks = [task_label(t, cfg) for t in task_entries(cfg)]
    for t in tasks:
        if not _LABEL.match(t):
            raise ConfigError(f"task label {t!r} must be letters, digits, '_', '.' or '-' (it names directories).")
    if len(set(tasks)) != len(tasks):
        raise ConfigError(f"grid task labels {tasks} repeat; give each task entry a distinct `label`.")

    gr = cfg.gradients
    if gr.enabled:
        if gr.reference not in labels:
            raise ConfigError(f"`gradients.reference` = {gr.reference!r} is not an objective label of the grid "
                              f"({', '.join(labels)}).")
        ref_entry = cfg.grid.objectives[labels.index(gr.reference)]
        missing = [x for x in reference_seeds(cfg) if ref_entry.seeds and x not in ref_entry.seeds]
        if missing:
            raise ConfigError(f"`gradients.reference` = {gr.reference!r} does not run on the reference seeds "
                              f"{missing}; add them to its `seeds` or set `gradients.reference_seeds`.")
        if ref_entry.train:
            raise ConfigError(f"`gradients.reference` = {gr.reference!r} has trainer overrides; the reference run "
                              "must be a plain objective run.")
        missing = [x for x in gr.reference_seeds if x not in cfg.grid.seeds]
        if missing:
            raise ConfigError(f"`gradients.reference_seeds` names {missing}, which are not in grid.seeds "
                              f"{list(cfg.grid.seeds)}.")
        if not gr.snapshots or any(not 0.0 <= s <= 1.0 for s in gr.snapshots) or list(gr.snapshots) != sorted(
                set(gr.snapshots)):
            raise ConfigError(f"`gradients.snapshots` = {list(gr.snapshots)} must be distinct increasing fractions "
                              "in [0, 1] of the reference run (e.g. [0.0, 0.5, 1.0]).")
        if updates_before_gradient(cfg) < 1:
            raise ConfigError("the gradient study needs an off-policy regime (ratios different from 1): set "
                              "`gradients.updates_before_gradient` >= 1 or train with "
                              "`loop.minibatches_per_step` (or epochs) > 1.")
        for i, entry in enumerate(gr.controls):
            label = objective_label(entry)
            if not label or not _LABEL.match(label) or label in labels:
                raise ConfigError(f"`gradients.controls[{i}]` needs a label of letters, digits, '_', '.' or '-' that "
                                  f"is not an objective of the grid (got {label!r}).")
            if entry.train:
                raise ConfigError(f"`gradients.controls[{i}]` ({label}) has trainer overrides; a control is an "
                                  "objective measured on the study's batches, nothing else.")
            build_objective(entry)
        for name in gr.objectives:
            if name not in labels:
                raise ConfigError(f"`gradients.objectives` names {name!r}, which is not an objective label of the "
                                  f"grid ({', '.join(labels)}).")
        if gr.params:
            try:
                re.compile(gr.params)
            except re.error as e:
                raise ConfigError(f"`gradients.params` = {gr.params!r} is not a regular expression: {e}.") from e

    rp = cfg.report
    if rp.baseline not in labels:
        raise ConfigError(f"`report.baseline` = {rp.baseline!r} is not an objective label of the grid "
                          f"({', '.join(labels)}); every objective is compared with it.")
    known = registry(rp.rule)
    for name in rp.claims:
        if name not in known:
            raise ConfigError(f"`report.claims` names {name!r}, which is not a claim of rule {rp.rule}'s registry "
                              f"(lmpo.lab.claims.{'CLAIMS' if rp.rule == 'v2' else 'CLAIMS_V2_1'}: "
                              f"{', '.join(known)}).")
    check_staleness_grid(cfg)  # a k<K>_<correction> label must say what its cell does
    plan_jobs(cfg)  # builds and validates every cell's trainer config and checks the fixed budget


def _validated(data: dict, key: str, stand_in: str | None = None) -> None:
    """Validate a job's trainer config now; a model the lab's warm-up has not written yet is checked as the
    model it starts from (``stand_in``)."""
    if stand_in is not None and not Path(data["model"]["name"]).exists():
        data = _deep_merge(data, {"model": {"name": stand_in}})
    try:
        validate_config(config_from_dict(data))
    except ConfigError as e:
        raise ConfigError(f"cell {key}: {e}") from e


__all__ = ["RESULT_FILES", "Job", "gradient_objectives", "plan_jobs", "reference_seeds", "snapshot_steps",
           "validate_lab_config"]
