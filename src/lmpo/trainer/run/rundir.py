"""A trainer run directory: what it holds, what ``--resume`` may change, and its preparation at the start of
``Trainer.train`` (the rules of :mod:`lmpo.runs`, shared with ``lmpo sac train``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lmpo.config import read_yaml
from lmpo.runs import CONFIG_FILE, TENSORBOARD_DIR, check_resume_config, prepare_run_dir, write_run_config
from lmpo.trainer.config import TrainConfig, config_to_dict
from lmpo.trainer.run.export import FINAL_MODEL_DIR
from lmpo.trainer.run.state import resolve_resume

#: what a trainer run directory holds (``--overwrite`` deletes these and nothing else)
RUN_ENTRIES = (CONFIG_FILE, "metrics.jsonl", "checkpoints", FINAL_MODEL_DIR, TENSORBOARD_DIR, "wandb",
               "completions.jsonl")

#: config keys ``--resume`` may change without ``--allow-config-change``
RESUMABLE_KEYS = ("loop.steps", "logging.*", "eval.*", "checkpoint.*")


def prepare_train_dir(cfg: TrainConfig, resume, overwrite: bool, allow_config_change: bool,
                      log: Callable[[str], None]) -> Path | None:
    """``logging.run_dir`` made ready for ``Trainer.train``: one run per directory, the config check of
    ``--resume``, then the resolved config saved as ``config.yaml``. Returns the checkpoint to resume from, or
    None for a new run (``resume``: None, ``"auto"`` or a checkpoint / run directory, as ``Trainer.train``)."""
    run_dir = Path(cfg.logging.run_dir)
    resume_path = None
    if resume in (None, False):
        prepare_run_dir(run_dir, RUN_ENTRIES, resume=False, overwrite=overwrite, dir_option="logging.run_dir")
    else:
        target = run_dir if resume in (True, "auto", "latest") else Path(resume)
        own = run_dir.resolve() in (target.resolve(), *target.resolve().parents)
        # a checkpoint of another run starts this directory from it (a new run); otherwise it continues
        prepare_run_dir(run_dir, RUN_ENTRIES, resume=own, overwrite=overwrite, dir_option="logging.run_dir")
        stored = run_dir / CONFIG_FILE
        if own and stored.is_file():
            check_resume_config(read_yaml(stored, "stored config"), config_to_dict(cfg), RESUMABLE_KEYS,
                                allow_change=allow_config_change, stored_path=stored, schema=TrainConfig)
        resume_path = resolve_resume(target, run_dir, log=log)
    write_run_config(run_dir, config_to_dict(cfg))
    return resume_path
