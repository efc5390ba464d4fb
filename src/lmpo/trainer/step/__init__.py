"""One RL step of the trainer, stage by stage (``lmpo.trainer.run.loop.Trainer.rl_step`` calls them in order).

``collect`` (prompts → scored rollout: draws, dynamic sampling, the async worker, episodes), ``sampling`` (prompt
order, seeds, dynamic sampling, truncation masks), ``stages`` (public stage functions on a ``RolloutBatch``:
score, advantage inputs, advantages, KL in the reward, the batch trained on, log-probs), ``update`` (the optimizer
steps), ``multiturn`` (episodes → ``RolloutBatch``, per-turn credit), ``teacher`` (a distillation teacher's
forward), ``pipeline`` (rollout.async_staleness), ``mismatch`` (rollout / training log-prob mismatch) and
``ref_sync`` (TR-DPO's reference sync).
"""
