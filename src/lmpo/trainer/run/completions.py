"""Completion logs: sampled completions with their rewards, every N RL steps, and ``lmpo show RUN [--step N]``.

With ``logging.completions_every_steps`` = N > 0 the trainer writes, every N steps, the first
``logging.completions_per_step`` completions of the step's rollout (whole groups first: rows are prompt-major) to
``RUN_DIR/completions.jsonl``, one JSON record per completion::

    {"step": 10, "group": 0, "prompt": "12+7=", "completion": "19", "answer": "19", "reward": 1.0,
     "rewards": {"exact_match": 1.0}, "advantage": 0.87, "correct": true, "length": 3}

A multi-turn run's record (``env.id``) also holds the episode: ``"messages"`` (the whole conversation, opening
included, each ``{"role", "content"}`` with a tool message's ``"name"``), ``"turn_rewards"`` and ``"end_reason"``;
``lmpo show`` prints it turn by turn, every character, roles marked.

The rows also go as a table to TensorBoard's text tab (tag ``completions``) and to W&B (a ``wandb.Table``) when
those are on. A resumed run first drops the records of steps after its checkpoint, so the file never holds two
versions of a step. ``lmpo show RUN`` prints the newest logged step, ``--step N`` another one.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lmpo.checkpoints import replace_file
from lmpo.errors import InputError
from lmpo.runs import JsonlAppender, read_jsonl, read_jsonl_lines

FILE_NAME = "completions.jsonl"
COLUMNS = ("step", "group", "reward", "advantage", "correct", "length", "prompt", "completion", "answer")


def _number(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None  # JSON has no NaN: an undefined reward is null


def completion_records(step: int, examples: Sequence[Any], rollout, rewards, per_fn: Mapping[str, Any], correct,
                       advantages, count: int, episodes: Sequence[Any] | None = None) -> list[dict[str, Any]]:
    """The first ``count`` completions of a scored rollout as records (see the module docstring).

    examples: the P prompts' examples; rollout: a ``Rollout`` of B = P·G rows (``group_ids`` index ``examples``);
    rewards, correct, advantages: (B,); per_fn: reward name → (B,) values. ``episodes``: a multi-turn step's B
    episodes (``lmpo.generation.episodes.Episode``); each record then also holds the whole conversation
    (``messages``, roles and tool names kept), the reward of each turn and why the episode ended.
    """
    rows = min(count, len(rollout.completions))
    group = rollout.group_ids[:rows].tolist()
    lengths = rollout.completion_mask[:rows].sum(-1).tolist()
    reward = rewards[:rows].tolist()
    adv = advantages[:rows].tolist()
    ok = correct[:rows].tolist()
    parts = {name: values[:rows].tolist() for name, values in per_fn.items()}
    out = []
    for i in range(rows):
        example = examples[group[i]]
        out.append({"step": step, "group": group[i],
                    "prompt": example.messages if example.messages is not None else example.prompt,
                    "completion": rollout.completions[i], "answer": example.answer, "reward": _number(reward[i]),
                    "rewards": {name: _number(v[i]) for name, v in parts.items()}, "advantage": _number(adv[i]),
                    "correct": bool(ok[i]), "length": int(lengths[i])})
        if episodes is not None:
            e = episodes[i]
            out[-1].update({"messages": [dict(m) for m in e.messages], "turn_rewards": [_number(r) for r in e.rewards],
                            "end_reason": e.end_reason})
    return out


def markdown_table(records: Sequence[Mapping[str, Any]]) -> str:
    """The records as a Markdown table (TensorBoard's text tab renders it)."""
    def cell(x: Any) -> str:
        text = f"{x:.4g}" if isinstance(x, float) else str(x)
        return text.replace("|", "\\|").replace("\n", "⏎")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in COLUMNS) + " |" for r in records]
    return "\n".join(lines)


class CompletionLog:
    """Appends completion records to ``RUN_DIR/completions.jsonl`` every ``every_steps`` RL steps.

    ``start_step``: a resumed run's checkpoint step; records of later steps are dropped first (atomically).
    ``metrics``: the run's ``MetricsLogger``, whose TensorBoard / W&B writers also get each step's table.
    """

    def __init__(self, run_dir: str | Path, every_steps: int, per_step: int, *, start_step: int = 0,
                 metrics=None) -> None:
        self.path = Path(run_dir) / FILE_NAME
        self.every_steps, self.per_step, self.metrics = every_steps, per_step, metrics
        if self.path.exists():
            lines = read_jsonl_lines(self.path, on_torn=None)
            kept = b"".join(raw for raw, record in lines if int(record.get("step", 0)) <= start_step)
            if kept != self.path.read_bytes():
                replace_file(self.path, kept)
        self._out = JsonlAppender(self.path)

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0

    def log(self, step: int, records: Sequence[Mapping[str, Any]]) -> None:
        for record in records:
            self._out.append(record)
        if self.metrics is not None:
            self.metrics.log_table("completions", COLUMNS, [[r.get(c) for c in COLUMNS] for r in records],
                                   markdown_table(records), step)

    def close(self) -> None:
        self._out.close()


def read_completions(run: str | Path, step: int | None = None) -> tuple[int, list[dict[str, Any]]]:
    """``(step, records)`` of a run's completion log: step ``step``, or the newest logged one."""
    run = Path(run)
    path = run / FILE_NAME if run.is_dir() else run
    if not path.is_file():
        why = "does not exist" if not run.exists() else f"has no {FILE_NAME}"
        raise InputError(f"run {str(run)!r} {why}; completions are logged by runs with "
                         "logging.completions_every_steps > 0 (lmpo train ... --logging.completions_every_steps 10).")
    records = read_jsonl(path, on_torn=None)
    steps = sorted({int(r.get("step", 0)) for r in records})
    if not steps:
        raise InputError(f"{path} holds no completions yet; the run logs them every "
                         "logging.completions_every_steps steps.")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        near = ", ".join(map(str, steps[-10:]))
        raise InputError(f"--step {step}: {path} has no completions of that step; logged steps: "
                         f"{near}{' (the last 10)' if len(steps) > 10 else ''}.")
    return step, [r for r in records if int(r.get("step", 0)) == step]


def format_completions(step: int, records: Sequence[Mapping[str, Any]], width: int = 60) -> str:
    """Plain-text view of one step's completions (what ``lmpo show`` prints): one line per single-turn
    completion, prompt and completion cut to ``width`` characters; a multi-turn episode (a record with
    ``messages``) whole, one block per message with its role, every character of it."""
    def short(x: Any) -> str:
        text = str(x).replace("\n", "⏎")
        return text if len(text) <= width else text[: width - 1] + "…"

    kind = "episodes" if any("messages" in r for r in records) else "completions"
    lines = [f"step {step}: {len(records)} {kind}"]
    for r in records:
        reward = "—" if r.get("reward") is None else f"{r['reward']:+.3f}"
        adv = "—" if r.get("advantage") is None else f"{r['advantage']:+.3f}"
        head = f"[group {r.get('group')}] reward {reward} adv {adv} {'✓' if r.get('correct') else '✗'}"
        if "messages" not in r:
            lines.append(f"{head} len {r.get('length')} | {short(r.get('prompt'))} → {short(r.get('completion'))!s} "
                         f"(answer {short(r.get('answer'))})")
            continue
        lines.append("")
        lines.append(f"{head} {r.get('length')} policy tokens, ended: {r.get('end_reason')}, answer "
                     f"{r.get('answer')}")
        lines.extend(format_conversation(r["messages"], r.get("turn_rewards") or []))
    return "\n".join(lines)


def format_conversation(messages: Sequence[Mapping[str, Any]], turn_rewards: Sequence[float | None] = ()) -> list[str]:
    """An episode's messages as indented text lines, ``role: content`` (a tool's name after its role, each
    assistant turn numbered with the reward the environment gave it)."""
    lines, turn = [], 0
    for m in messages:
        role = str(m.get("role"))
        label = f"{role} ({m['name']})" if m.get("name") else role
        if role == "assistant":
            reward = turn_rewards[turn] if turn < len(turn_rewards) else None
            label = f"assistant, turn {turn}" + ("" if reward is None else f", reward {reward:+g}")
            turn += 1
        body = str(m.get("content", "")).split("\n")
        lines.append(f"  {label}: {body[0]}")
        lines.extend(f"  {' ' * len(label)}  {line}" for line in body[1:])
    return lines


def register_show(subparsers: argparse._SubParsersAction, name: str) -> None:
    p = subparsers.add_parser(name, help="print the completions a run logged, with their rewards",
                              description="Print the sampled completions, rewards, advantages and correctness a "
                                          "trainer run logged (logging.completions_every_steps > 0) at one step: "
                                          "the newest by default.")
    p.add_argument("run", metavar="RUN", help="run directory of `lmpo train` (or its completions.jsonl)")
    p.add_argument("--step", type=int, default=None, help="the RL step to show (default: the newest logged)")
    p.add_argument("--width", type=int, default=60, help="characters of a single-turn prompt / completion shown "
                                                            "(default 60; multi-turn episodes are shown whole)")
    p.set_defaults(func=_run_show)


def _run_show(args: argparse.Namespace) -> int:
    step, records = read_completions(args.run, args.step)  # an InputError becomes `lmpo show: …`, exit 2
    print(format_completions(step, records, max(8, args.width)))
    return 0


__all__ = ["COLUMNS", "FILE_NAME", "CompletionLog", "completion_records", "format_completions", "format_conversation",
           "markdown_table", "read_completions", "register_show"]
