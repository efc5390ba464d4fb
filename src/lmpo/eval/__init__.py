"""Evaluation of a policy on held-out examples (docs/trainer.md).

``greedy`` (greedy completions judged by the task's accuracy reward, Wilson intervals), ``passk`` (pass@k and
avg@k of sampled completions), ``held_out`` (what a training run logs as ``eval/*``, multi-turn episodes included)
and ``command`` (``lmpo eval`` on a model, a checkpoint or a run directory).
"""
