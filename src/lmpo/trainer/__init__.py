"""Single-machine GRPO-family trainer for Hugging Face causal LMs (docs/trainer.md).

>>> from lmpo.trainer import Trainer, load_config
>>> result = Trainer(load_config("configs/addition_grpo.yaml", ["--optim.lr", "1e-4"])).train()

By role: ``config`` (one frozen dataclass per section, validation, YAML); ``step`` (one RL step, stage by stage:
``collect``, ``stages``, ``update``, ``multiturn`` …); ``run`` (the ``Trainer`` in ``run.loop`` and what surrounds
the steps: ``build``, ``state`` (checkpoints), ``rundir``, ``optim``, ``metrics``, ``sft``, ``export``); ``commands``
(``lmpo train``, ``lmpo demo``, ``lmpo plot``) and ``demo``. Evaluation is ``lmpo.eval``; the TRL ``GRPOConfig``
names are ``lmpo.integrations.trl_names``. ``lmpo.trainer.stages`` and ``lmpo.trainer.build`` name the step's
stages and the run's construction here too, as the lab and the benchmarks use them.
"""

from lmpo.trainer.config import ConfigError, TrainConfig, load_config, validate_config
from lmpo.trainer.run import build
from lmpo.trainer.run.loop import NonFiniteError, Trainer, TrainResult
from lmpo.trainer.step import stages

__all__ = ["ConfigError", "NonFiniteError", "TrainConfig", "TrainResult", "Trainer", "build", "load_config", "stages",
           "validate_config"]
