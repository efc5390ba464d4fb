"""A training run around the RL steps: ``loop`` (the ``Trainer``), ``build`` (every part of a run from its config),
``state`` (checkpoints: what they hold, saving and resuming), ``rundir`` (what a run directory holds), ``optim``
(AdamW + schedule), ``metrics`` (console, JSONL, TensorBoard, W&B), ``completions`` (``completions.jsonl``,
``lmpo show``), ``sft`` (supervised warm-up) and ``export`` (``lmpo export``: run directories as Hugging Face
models).
"""
