"""The variant lab: objectives × seeds (× tasks) under one budget, a paired gradient study, and a verdict on
each claim made for an objective variant (docs/lab.md).

    from lmpo.lab import load_lab_config, run_lab
    result = run_lab(load_lab_config("configs/lab_cpu.yaml", ["--lab.jobs", "2"]))
    result.report["tasks"]["thinking_addition"]["verdicts"]

Layout: ``config.py`` (the lab's sections), ``grid.py`` (config → jobs), ``jobs.py`` (one job: warm-up, cell,
snapshot), ``gradients.py`` (the gradient study), ``runner.py`` (processes, resume, progress), ``stats.py``,
``claims.py`` (the claims and the verdict rule), ``report.py`` and ``plots.py`` (lab.json, lab.md, PNGs),
``cli.py`` (``lmpo lab``).
"""

from lmpo.lab.claims import CLAIMS, Check, Claim
from lmpo.lab.config import LabConfig, lab_config_from_dict, load_lab_config
from lmpo.lab.grid import Job, plan_jobs, validate_lab_config
from lmpo.lab.runner import LabResult, run_lab

__all__ = ["CLAIMS", "Check", "Claim", "Job", "LabConfig", "LabResult", "lab_config_from_dict", "load_lab_config",
           "plan_jobs", "run_lab", "validate_lab_config"]
