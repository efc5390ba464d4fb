"""Single-machine GRPO-family trainer for Hugging Face causal LMs (docs/trainer.md).

>>> from lmpo.trainer import Trainer, load_config
>>> result = Trainer(load_config("configs/addition_grpo.yaml", ["--optim.lr", "1e-4"])).train()

Modules: ``config`` (frozen dataclass sections, validation, YAML), ``loop`` (the ``Trainer``; generation and
log-probs come from ``lmpo.generation``), its stages ``build`` (construction), ``collect`` (scored rollouts),
``stages`` (rewards, advantages, log-probs), ``update`` (optimizer steps) and ``held_out`` (evaluation),
``optim`` (AdamW + schedule),
``checkpoint`` (atomic checkpoints), ``metrics`` (progress bar, JSONL, TensorBoard, W&B), ``sft``
(supervised warm-up), ``evaluate`` (greedy held-out accuracy), ``plot``, ``demo`` and ``cli``.
"""

from lmpo.trainer.config import ConfigError, TrainConfig, load_config, validate_config
from lmpo.trainer.loop import NonFiniteError, Trainer, TrainResult

__all__ = ["ConfigError", "NonFiniteError", "TrainConfig", "TrainResult", "Trainer", "load_config", "validate_config"]
