"""Metric sinks: the console, JSONL, TensorBoard and (when asked) Weights & Biases.

The trainer gathers per-step statistics as 0-dim tensors and moves them to the host once per step
(``to_host``); sinks only ever see plain floats. Keys are ``component/name`` (see ``METRIC_DOCS``).

The console gets a tqdm progress bar only when it is a terminal; piped into a file or a log collector it
gets one plain line per interval instead (``console_line``), so a log holds no carriage-return updates.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import torch

from lmpo.runs import TENSORBOARD_DIR, JsonlAppender, truncate_jsonl
from lmpo.runs import read_jsonl as _read_jsonl


def _objective_stat_docs() -> dict[str, str]:
    from lmpo.objectives.advantages import ADVANTAGE_STATS
    from lmpo.objectives.kl_reward import KL_REWARD_STATS
    from lmpo.objectives.reference import all_stat_docs

    return {**ADVANTAGE_STATS, **all_stat_docs(), **KL_REWARD_STATS}


#: every metric the trainer logs, with its meaning (docs/trainer.md's metric table is built from this); the
#: objective's and the advantage estimator's keys come from their registries
METRIC_DOCS: dict[str, str] = {
    "reward/mean": "mean total (weighted) reward of the step's completions",
    "reward/std": "standard deviation of the total reward over the step's completions",
    "reward/<fn>/mean": "mean of one reward function's (unweighted) score",
    "reward/<fn>/std": "standard deviation of one reward function's score",
    "reward/accuracy": "fraction of completions whose first (accuracy) reward is >= rewards.success_threshold",
    "reward/errors": "reward-function calls that raised and were skipped (rewards.on_error: skip)",
    "reward/nonfinite": "reward values that were NaN, ±inf or beyond ±1e9, scored as undefined (0 in the total) "
                        "with a warning line (rewards.on_error: skip; with raise they stop the run)",
    "reward/overlong/mean": "mean DAPO soft overlong penalty (<= 0) added to the rewards (rewards.overlong_buffer_len)",
    **_objective_stat_docs(),
    "adv/mean": "mean advantage over the sequences trained on (after zero-variance filtering)",
    "adv/std": "standard deviation of the advantages trained on",
    "adv/abs_mean": "mean absolute advantage trained on (the size of the learning signal)",
    "adv/kept_frac": "fraction of sequences kept after zero-variance filtering (1 without filtering)",
    "completion/length_mean": "mean completion length in tokens (up to and including EOS)",
    "completion/length_max": "longest completion in tokens",
    "completion/truncated_frac": "fraction of completions that hit max_new_tokens without EOS",
    "rollout/draws": "dynamic sampling: batches of prompts_per_step prompts drawn this step to fill the batch "
                     "with groups of non-zero variance",
    "rollout/groups_kept": "dynamic sampling: groups trained on this step (always prompts_per_step: a batch "
                           "that cannot be filled stops the run)",
    "rollout/groups_dropped": "dynamic sampling: groups drawn this step whose rewards (or accuracies) were all "
                              "equal, discarded",
    "rollout/groups_surplus": "dynamic sampling: informative groups drawn beyond prompts_per_step, discarded",
    "rollout/zero_var_frac": "dynamic sampling: fraction of all groups drawn this step with zero variance",
    "completion/truncated_masked_frac": "fraction of the sequences trained on whose loss mask was zeroed because "
                                        "they hit max_new_tokens without EOS (objective.mask_truncated_completions)",
    "mismatch/kl": "k1 estimate of KL(sampler || trainer): mean over valid tokens of rollout − training log-prob "
                   "(verl rollout_corr/kl; ~0 when the sampler is the training model)",
    "mismatch/k3_kl": "k3 estimate of KL(sampler || trainer): mean of e^Δ − Δ − 1, Δ = training − rollout "
                      "log-prob (verl rollout_corr/k3_kl)",
    "mismatch/abs_logp_diff_mean": "mean |training − rollout log-prob| over valid tokens",
    "mismatch/abs_logp_diff_max": "largest |training − rollout log-prob| over valid tokens",
    "mismatch/training_ppl": "mean over sequences of the training model's perplexity of the completion",
    "mismatch/rollout_ppl": "mean over sequences of the sampler's perplexity of the completion",
    "mismatch/log_ppl_diff": "mean over sequences of (mean rollout − mean training log-prob) = log(training_ppl / "
                             "rollout_ppl) per sequence (verl rollout_corr/log_ppl_diff)",
    "mismatch/log_ppl_abs_diff": "mean over sequences of |log_ppl_diff|",
    "mismatch/ppl_ratio": "mean over sequences of training / rollout perplexity (1 = no mismatch)",
    "mismatch/chi2_token": "token-level chi-squared divergence mean(ρ²) − 1, ρ = π_train / π_rollout",
    "mismatch/chi2_seq": "sequence-level chi-squared divergence mean_b(Π_t ρ_t)² − 1",
    "loss/total": "objective value (all terms) averaged over the step's optimizer steps",
    "optim/grad_norm": "global gradient norm before clipping (mean over the step's optimizer steps)",
    "optim/lr": "learning rate of the last optimizer step",
    "optim/nonfinite_skipped": "optimizer steps skipped so far because the loss or gradient was non-finite",
    "perf/tokens_per_s": "completion tokens generated and trained on per second of step wall time",
    "perf/step_s": "wall time of the step in seconds",
    "time/generate_s": "seconds spent generating completions",
    "time/score_s": "seconds spent scoring rewards and computing advantages",
    "time/train_s": "seconds spent in forward/backward/optimizer (incl. behaviour/reference log-probs)",
    "episodes/return_mean": "multi-turn (`env.id`): mean episode return (the sum of the turn rewards), the "
                            "sequences' reward",
    "episodes/turns_mean": "multi-turn: mean policy turns per episode (a turn cut by a budget counts)",
    "episodes/policy_tokens_mean": "multi-turn: mean tokens the policy sampled per episode (loss mask 1)",
    "episodes/env_tokens_mean": "multi-turn: mean observation / tool-output tokens per episode (loss mask 0)",
    "episodes/truncated_fraction": "multi-turn: fraction of episodes cut by a budget, `max_turns`, the environment "
                                   "or an environment error",
    "episodes/end_<reason>": "multi-turn: fraction of episodes ending for each reason (`terminated`, "
                             "`env_truncated`, `max_turns`, `max_total_tokens`, `max_new_tokens_per_turn`, "
                             "`env_error`)",
    "episodes/tool_calls_mean": "multi-turn: tool calls per episode",
    "episodes/tool_call_valid_rate": "multi-turn: fraction of tool calls that ran without error (present when "
                                     "there were calls)",
    "episodes/success_rate": "multi-turn: fraction of episodes with a turn the environment judged correct "
                             "(`info[\"correct\"]`; else a positive return)",
    "eval/accuracy": "greedy accuracy on the held-out split (multi-turn: the greedy episodes' success rate, with "
                     "`eval/episodes/*` as above)",
    "eval/reward_mean": "mean total reward of the greedy completions on the held-out split",
    "eval/length_mean": "mean greedy completion length on the held-out split",
    "eval/pass@k": "unbiased pass@k (Chen et al. 2021) over the held-out split from `eval.samples_per_prompt` = n "
                   "sampled completions per problem, for k = 1, 2, 4, … n; `_low` / `_high`: its 95% interval "
                   "over problems",
    "eval/avg@n": "mean accuracy of the n sampled completions per held-out problem; `_low` / `_high`: its 95% "
                  "interval over problems",
}


def to_host(stats: dict[str, torch.Tensor | float | int]) -> dict[str, float]:
    """One device→host transfer for every tensor statistic (stacked), then plain floats."""
    tensor_keys = [k for k, v in stats.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in stats.items() if not isinstance(v, torch.Tensor)}
    by_device: dict[torch.device, list[str]] = {}
    for k in tensor_keys:  # statistics computed on the host (accuracy from reward functions) sit beside GPU ones
        by_device.setdefault(stats[k].device, []).append(k)
    for keys in by_device.values():
        stacked = torch.stack([stats[k].detach().float().reshape(()) for k in keys]).cpu()
        out.update(zip(keys, stacked.tolist()))
    return {k: out[k] for k in stats}  # the caller's key order


def console_is_terminal() -> bool:
    """Whether a progress bar can redraw itself: stdout and stderr (where tqdm writes) are both terminals."""
    return all(getattr(stream, "isatty", lambda: False)() for stream in (sys.stdout, sys.stderr))


def line_interval(total_steps: int, lines: int = 20) -> int:
    """A round step interval (1, 2, 5, 10, 20, 25, 50, 100, …) giving at most about ``lines`` lines."""
    target = max(1, math.ceil(total_steps / lines))
    scale = 1
    while True:
        for base in (1, 2, 2.5, 5):
            step = int(base * scale)
            if step >= target and base * scale == step:
                return step
        scale *= 10


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


#: (metric key, label, format) of the plain console line of a training step, in order
# (no loss: a GRPO-family loss is about 0 on-policy whatever the progress, it tells a reader nothing)
CONSOLE_FIELDS = (("reward/mean", "reward", ".3f"), ("reward/accuracy", "acc", ".3f"),
                  ("completion/length_mean", "len", ".1f"), ("entropy/mean", "H", ".3f"),
                  ("kl/ref", "KL", ".3g"), ("optim/grad_norm", "|g|", ".3g"))
EVAL_FIELDS = (("eval/accuracy", "accuracy", ".3f"), ("eval/reward_mean", "reward", ".3f"),
               ("eval/length_mean", "length", ".1f"))


def console_line(step: int, total_steps: int, metrics: dict[str, float], kind: str = "train",
                 seconds_per_step: float | None = None) -> str:
    """``step  50/600 | reward 0.512 | acc 0.281 | … | 0.21 s/step, ETA 1m45s`` (eval: ``eval step 100/600 | …``)."""
    width = len(str(total_steps))
    parts = [f"{'eval ' if kind == 'eval' else ''}step {step:>{width}}/{total_steps}"]
    for key, label, fmt in EVAL_FIELDS if kind == "eval" else CONSOLE_FIELDS:
        if key in metrics and math.isfinite(metrics[key]):
            parts.append(f"{label} {metrics[key]:{fmt}}")
    if seconds_per_step is not None:
        parts.append(f"{seconds_per_step:.2f} s/step, ETA {_duration(seconds_per_step * (total_steps - step))}")
    return " | ".join(parts)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics file; a torn last line (a killed writer) is dropped with a note on stderr."""
    return _read_jsonl(path)


class MetricsLogger:
    """Writes per-step metrics to RUN_DIR/metrics.jsonl, TensorBoard and W&B, and reports them on the console.

    Console: a tqdm bar when ``progress_bar`` and the console is a terminal (``console_is_terminal``), else
    a plain line every ``print_every_steps`` steps (None: a round interval giving about 20 lines; 0: none)
    and at the last step. Evaluations always get a line. ``keep_rows`` (a resumed run): cut metrics.jsonl back
    to its first ``keep_rows`` records first.
    """

    def __init__(self, run_dir: str | os.PathLike, total_steps: int, *, start_step: int = 0,
                 keep_rows: int | None = None, progress_bar: bool = True, tensorboard: bool = True,
                 wandb: bool = False, wandb_project: str = "lmpo", config: dict | None = None,
                 print_every_steps: int | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.run_dir / "metrics.jsonl"
        # append-only; a resumed run first cuts the file back to the rows its checkpoint counted (atomically)
        kept = truncate_jsonl(self.jsonl_path, keep_rows) if keep_rows is not None else 0
        self._jsonl = JsonlAppender(self.jsonl_path, rows=kept)
        self.total_steps, self.start_step = total_steps, start_step
        use_bar = progress_bar and console_is_terminal() and total_steps > start_step
        if print_every_steps is None:
            print_every_steps = 0 if use_bar else line_interval(total_steps - start_step)
        self.print_every_steps = print_every_steps
        self._t_start = time.perf_counter()
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD_DIR), purge_step=start_step + 1)
        self._wandb = None
        if wandb:
            import wandb as _wandb

            self._wandb = _wandb.init(project=wandb_project, dir=str(self.run_dir), config=config,
                                      name=self.run_dir.name, resume="allow")
        self._bar = None
        if use_bar:
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
        if kind == "eval":
            self.write(console_line(step, self.total_steps, metrics, kind="eval"))
        elif self.print_every_steps and (step % self.print_every_steps == 0 or step == self.total_steps):
            per_step = (time.perf_counter() - self._t_start) / max(1, step - self.start_step)
            self.write(console_line(step, self.total_steps, metrics, seconds_per_step=per_step))

    def log_table(self, tag: str, columns, rows, markdown: str, step: int) -> None:
        """A table of one step: Markdown text to TensorBoard, a ``wandb.Table`` to W&B (the JSONL has the rows)."""
        if self._tb is not None:
            self._tb.add_text(tag, markdown, step)
        if self._wandb is not None:
            import wandb as _wandb

            self._wandb.log({tag: _wandb.Table(columns=list(columns), data=[[str(x) for x in r] for r in rows])},
                            step=step)

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
