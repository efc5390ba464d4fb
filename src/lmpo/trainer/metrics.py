"""Metric sinks: console progress bar (tqdm), JSONL, TensorBoard and (when asked) Weights & Biases.

The trainer gathers per-step statistics as 0-dim tensors and moves them to the host once per step
(``to_host``); sinks only ever see plain floats. Keys are ``component/name`` (see ``METRIC_DOCS``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from lmpo.runs import JsonlAppender, truncate_jsonl
from lmpo.runs import read_jsonl as _read_jsonl

#: every metric the trainer logs, with its meaning (docs/trainer.md's metric table is built from this)
METRIC_DOCS: dict[str, str] = {
    "reward/mean": "mean total (weighted) reward of the step's completions",
    "reward/std": "standard deviation of the total reward over the step's completions",
    "reward/<fn>/mean": "mean of one reward function's (unweighted) score",
    "reward/<fn>/std": "standard deviation of one reward function's score",
    "reward/accuracy": "fraction of completions whose first (accuracy) reward is >= rewards.success_threshold",
    "reward/errors": "reward-function calls that raised and were skipped (rewards.on_error: skip)",
    "adv/mean": "mean advantage over the sequences trained on",
    "adv/std": "standard deviation of the advantages",
    "adv/abs_mean": "mean absolute advantage (the size of the learning signal)",
    "adv/zero_var_frac": "fraction of groups whose rewards are all equal (no GRPO signal); every group has G members",
    "adv/kept_frac": "fraction of sequences kept after zero-variance filtering (1 without filtering)",
    "completion/length_mean": "mean completion length in tokens (up to and including EOS)",
    "completion/length_max": "longest completion in tokens",
    "completion/truncated_frac": "fraction of completions that hit max_new_tokens without EOS",
    "loss/total": "objective value (all terms) averaged over the step's optimizer steps",
    "loss/policy": "the policy-gradient term of the objective",
    "loss/entropy": "the entropy term of the objective (when it has one)",
    "loss/kl_ref": "the reference-KL term of the objective (when kl_coef > 0)",
    "advantages/mean": "mean advantage from the estimator (before zero-variance filtering)",
    "advantages/std": "standard deviation of the estimator's advantages",
    "advantages/abs_max": "largest absolute advantage",
    "advantages/zero_variance_frac": "fraction of sequences in groups with equal rewards (the estimator's view)",
    "tokens/valid": "valid completion tokens per optimizer step (the objective's normaliser)",
    "ratio/clamped_tokens": "tokens whose log-ratio hit the clamp bound before exp",
    "clip/region_frac": "fraction of tokens outside the trust region [1-eps_low, 1+eps_high]",
    "clip/dual_frac": "fraction of tokens capped by dual clip (A<0, ratio > c)",
    "cov/clipped_tokens": "clip_cov: tokens whose loss term was zeroed",
    "cov/penalised_tokens": "kl_cov: tokens given the |logp - old_logp| penalty",
    "cov/mean": "clip_cov / kl_cov: mean covariance between advantage and log-prob",
    "cov/top_mean": "clip_cov / kl_cov: mean of the largest covariances",
    "credit/max": "largest token credit weight (temporal decay / gradient-adaptive)",
    "ptrw/phi_mean": "ptrw: mean Gaussian trust weight phi(rho)",
    "entropy/mean": "mean token entropy of the policy on sampled completions (when the objective needs it)",
    "entropy/coef": "entropy coefficient applied (adaptive controller's output when it is on)",
    "clip/low_frac": "fraction of tokens (sequences for sequence levels) clipped at 1-eps where it binds (A<0)",
    "clip/high_frac": "fraction clipped at 1+eps where it binds (A>0)",
    "ratio/mean": "mean importance weight pi/pi_old (1 on-policy)",
    "ratio/min": "minimum importance weight",
    "ratio/max": "maximum importance weight",
    "kl/behaviour_k3": "k3 estimate of KL(pi_old || pi) over the minibatch",
    "kl/ref": "KL estimate to the reference policy (when beta > 0)",
    "optim/grad_norm": "global gradient norm before clipping (mean over the step's optimizer steps)",
    "optim/lr": "learning rate of the last optimizer step",
    "optim/nonfinite_skipped": "optimizer steps skipped so far because the loss or gradient was non-finite",
    "perf/tokens_per_s": "completion tokens generated and trained on per second of step wall time",
    "perf/step_s": "wall time of the step in seconds",
    "time/generate_s": "seconds spent generating completions",
    "time/score_s": "seconds spent scoring rewards and computing advantages",
    "time/train_s": "seconds spent in forward/backward/optimizer (incl. behaviour/reference log-probs)",
    "eval/accuracy": "greedy accuracy on the held-out split",
    "eval/reward_mean": "mean total reward of the greedy completions on the held-out split",
    "eval/length_mean": "mean greedy completion length on the held-out split",
}


def to_host(stats: dict[str, torch.Tensor | float | int]) -> dict[str, float]:
    """One device→host transfer for every tensor statistic (stacked), then plain floats."""
    tensor_keys = [k for k, v in stats.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in stats.items() if not isinstance(v, torch.Tensor)}
    if tensor_keys:
        stacked = torch.stack([stats[k].detach().float().reshape(()) for k in tensor_keys]).cpu()
        out.update(zip(tensor_keys, stacked.tolist()))
    return out


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics file; a torn last line (a killed writer) is dropped with a note on stderr."""
    return _read_jsonl(path)


class MetricsLogger:
    """Writes per-step metrics to RUN_DIR/metrics.jsonl, TensorBoard and W&B, and drives the progress bar.

    ``keep_rows`` (a resumed run): cut metrics.jsonl back to its first ``keep_rows`` records first.
    """

    def __init__(self, run_dir: str | os.PathLike, total_steps: int, *, start_step: int = 0,
                 keep_rows: int | None = None, progress_bar: bool = True, tensorboard: bool = True, wandb: bool = False,
                 wandb_project: str = "lmpo", config: dict | None = None, print_every_steps: int = 0):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.run_dir / "metrics.jsonl"
        # append-only; a resumed run first cuts the file back to the rows its checkpoint counted (atomically)
        kept = truncate_jsonl(self.jsonl_path, keep_rows) if keep_rows is not None else 0
        self._jsonl = JsonlAppender(self.jsonl_path, rows=kept)
        self.print_every_steps = print_every_steps
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"), purge_step=start_step + 1)
        self._wandb = None
        if wandb:
            import wandb as _wandb

            self._wandb = _wandb.init(project=wandb_project, dir=str(self.run_dir), config=config,
                                      name=self.run_dir.name, resume="allow")
        self._bar = None
        if progress_bar and total_steps > start_step:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc="rl", dynamic_ncols=True,
                             leave=True)

    @property
    def rows(self) -> int:
        """Records in metrics.jsonl so far (a checkpoint stores this)."""
        return self._jsonl.rows

    def sync(self) -> None:
        """Force the records written so far to disk (before a checkpoint that counts them)."""
        self._jsonl.sync()

    def log(self, step: int, metrics: dict[str, float], kind: str = "train") -> None:
        record = {"step": step, "kind": kind, **{k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()}}
        self._jsonl.append(record)
        if self._tb is not None:
            for k, v in metrics.items():
                if math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        if kind == "train" and self._bar is not None:
            post = {}
            for key, short in (("reward/mean", "R"), ("reward/accuracy", "acc"), ("entropy/mean", "H"),
                               ("optim/grad_norm", "|g|")):
                if key in metrics:
                    post[short] = f"{metrics[key]:.3g}"
            self._bar.set_postfix(post, refresh=False)
            self._bar.update(1)
        if kind == "eval" and self._bar is not None:
            self._bar.write(f"step {step}: " + "  ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
        if kind == "train" and self.print_every_steps and step % self.print_every_steps == 0:
            msg = f"step {step}: " + "  ".join(
                f"{k}={metrics[k]:.4g}" for k in ("reward/mean", "reward/accuracy", "loss/total",
                                                 "optim/grad_norm") if k in metrics)
            (self._bar.write if self._bar is not None else print)(msg)

    def write(self, msg: str) -> None:
        if self._bar is not None:
            self._bar.write(msg)
        else:
            print(msg, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        self._jsonl.close()
