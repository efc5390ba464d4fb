"""The SAC training loop (CleanRL-style, top to bottom): act → step (DAgger teacher override) → store
(agent / demo buffer) → ρ-mixed batch → :meth:`SACAgent.update` → metrics, checkpoints, evaluation.

Run directory layout (the convention of :mod:`lmpo.runs`, shared with ``lmpo train``): ``config.yaml`` (resolved
config), ``metrics.jsonl`` (one line per log interval, append-only), ``tensorboard/`` (TensorBoard), ``checkpoints/step_XXXXXXXX/`` (by update count: ``agent.*`` the
networks, optimisers and temperature, ``state.*`` replay buffers, RNGs, counters and the environments' state,
as safetensors + JSON with a ``manifest.json``; see :mod:`lmpo.checkpoints`), ``eval.json`` (held-out
quality), ``summary.json`` (what the gate reads), ``plots/`` (training curves), ``trace.log`` (with ``--trace N``).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmpo.checkpoints import (
    CheckpointError,
    latest_valid_checkpoint,
    list_checkpoints,
    load_state,
    replace_file,
    save_state,
    verify_checkpoint,
    write_checkpoint,
)
from lmpo.errors import InputError, Interrupted
from lmpo.plots import plot_runs
from lmpo.runs import (
    CONFIG_FILE,
    LEGACY_CONFIG_FILE,
    TENSORBOARD_DIR,
    JsonlAppender,
    RunLock,
    check_resume_config,
    open_append,
    prepare_run_dir,
    stop_on_sigint,
    stored_config_path,
    truncate_jsonl,
    write_run_config,
)
from lmpo.textagent.env.env import trace_line
from lmpo.textagent.sac.agent import SACAgent
from lmpo.textagent.sac.config import RESUMABLE_KEYS, SACTrainConfig, check_device_available, run_config_dict
from lmpo.textagent.sac.replay import ReplayBuffer, nearest_legal, sample_mixed, teacher_ratio
from lmpo.textagent.sac.textdata import TextPairs


@dataclass
class EnvBundle:
    """Environments plus what the loop needs to know about their action space."""

    envs: list[Any]
    num_actions: int
    pad_id: int
    eos_id: int
    window: int
    decode: Callable[[list[int]], str]
    code_points: np.ndarray
    """(A,) code point of each action id, −1 for special ids (used to relabel forbidden teacher actions)."""
    alphabet: Any = None
    train_chapters: list[str] = field(default_factory=list)
    """Train chapters of ``corpus`` only (what the n-gram baseline is fitted on)."""
    heldout_chapters: list[str] = field(default_factory=list)
    extra_chapters: list[str] = field(default_factory=list)
    """Train-only chapters of ``extra_train_corpus`` after the leak filter."""
    extra_report: dict[str, int] = field(default_factory=dict)
    make_eval_env: Callable[[list[str]], Any] | None = None


@dataclass(frozen=True)
class TextSplit:
    """The chapters and the alphabet of a run: ``corpus`` split into train / held-out, then the extra text."""

    train: list[str]
    heldout: list[str]
    extra: list[str]
    extra_report: dict[str, int]
    alphabet: Any

    @property
    def training_text(self) -> list[str]:
        return self.train + self.extra


def text_split(cfg: SACTrainConfig) -> TextSplit:
    """Split ``cfg.corpus``, then add ``cfg.extra_train_corpus`` through the leak filter; Σ covers both."""
    from lmpo.textagent.env import Alphabet, load_corpus
    from lmpo.textagent.env.bundled import resolve_corpus
    from lmpo.textagent.env.corpus import load_extra_text

    corpus = load_corpus(resolve_corpus(cfg.corpus))
    train_ch, heldout_ch = corpus.split(heldout_fraction=cfg.heldout_fraction, seed=cfg.split_seed)
    extra, report = [], {}
    if cfg.extra_train_corpus:
        paths = [resolve_corpus(s, f"extra_train_corpus[{i}]") for i, s in enumerate(cfg.extra_train_corpus)]
        loaded = load_extra_text(paths, heldout_ch, cfg.leak_filter_chars)
        extra, report = loaded.chapters, loaded.report()
    return TextSplit(train_ch, heldout_ch, extra, report, Alphabet.from_texts(train_ch + extra))


def make_text_envs(cfg: SACTrainConfig, split: TextSplit | None = None) -> EnvBundle:
    """Build ``num_envs`` :class:`lmpo.textagent.env.CharTextEnv` on the training text (train chapters of
    ``cfg.corpus`` plus the filtered ``extra_train_corpus``)."""
    from lmpo.textagent.env import CharTextEnv

    split = split or text_split(cfg)
    train_ch, heldout_ch, alphabet = split.train, split.heldout, split.alphabet
    if split.extra_report:
        r = split.extra_report
        print(f"extra_train_corpus: {r['chars_kept']:,} characters in {r['paragraphs_kept']:,} paragraphs kept, "
              f"{r['paragraphs_dropped']} paragraphs ({r['chars_dropped']:,} characters) dropped by the "
              f"{cfg.leak_filter_chars}-character leak filter; |Σ| = {len(alphabet):,}", file=sys.stderr)
    env_cfg = cfg.env_config()
    first = CharTextEnv(split.training_text, alphabet, env_cfg)
    # the lexicon and the (pre-trained) InfoNCE encoder are shared: built once, not once per environment
    envs = [first] + [CharTextEnv(split.training_text, alphabet, env_cfg, lexicon=first.lexicon,
                                  encoder=first.encoder) for _ in range(cfg.num_envs - 1)]
    code_points = np.array(
        [ord(c) if i >= alphabet.num_special and len(c) == 1 else -1 for i, c in enumerate(alphabet.chars)],
        dtype=np.int64,
    )
    window = int(envs[0].observation_space["window"].shape[0])
    return EnvBundle(
        envs=envs, num_actions=len(alphabet), pad_id=alphabet.pad_id, eos_id=alphabet.eos_id, window=window,
        decode=alphabet.decode, code_points=code_points, alphabet=alphabet, train_chapters=train_ch,
        heldout_chapters=heldout_ch, extra_chapters=split.extra, extra_report=split.extra_report,
        make_eval_env=lambda chapters: CharTextEnv(chapters, alphabet, env_cfg),
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class RunningStats:
    """Sums over one log interval: ``add(key, x)`` then ``means()`` (mean and variance per key)."""

    def __init__(self) -> None:
        self.s: dict[str, float] = defaultdict(float)
        self.s2: dict[str, float] = defaultdict(float)
        self.n: dict[str, int] = defaultdict(int)

    def add(self, key: str, x: float, with_var: bool = False) -> None:
        self.s[key] += x
        self.n[key] += 1
        if with_var:
            self.s2[key] += x * x

    def state_dict(self) -> dict[str, dict]:
        return {"s": dict(self.s), "s2": dict(self.s2), "n": dict(self.n)}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        self.s = defaultdict(float, {k: float(v) for k, v in state["s"].items()})
        self.s2 = defaultdict(float, {k: float(v) for k, v in state["s2"].items()})
        self.n = defaultdict(int, {k: int(v) for k, v in state["n"].items()})

    def means(self) -> dict[str, float]:
        out = {}
        for k, n in self.n.items():
            mean = self.s[k] / n
            out[k] = mean
            if k in self.s2:
                out[k.replace("/", "/var_", 1) if "/" in k else k + "_var"] = max(0.0, self.s2[k] / n - mean**2)
        return out


def _shared_encoders(envs) -> list[Any]:
    """The environments' InfoNCE encoders, each once (by identity: a shared one is stored and restored once), in
    the order the environments first use them."""
    encoders: list[Any] = []
    for env in envs:
        enc = getattr(env, "encoder", None)
        if enc is not None and all(enc is not e for e in encoders):
            encoders.append(enc)
    return encoders


class SACTrainer:
    """Holds the loop state so that a run can be checkpointed and resumed bit-for-bit on CPU."""

    def __init__(self, cfg: SACTrainConfig, run_dir: str | Path, bundle: EnvBundle | None = None,
                 trace_steps: int | None = None, progress: bool = True) -> None:
        cfg.validate()
        check_device_available(cfg.device)
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        seed_everything(cfg.seed)
        self.bundle = bundle if bundle is not None else make_text_envs(cfg)
        b = self.bundle
        if len(b.envs) != cfg.num_envs:
            raise ValueError(f"num_envs={cfg.num_envs} but {len(b.envs)} environments were given")
        self.agent = SACAgent(b.num_actions, b.pad_id, cfg.net, cfg.sac, seed=cfg.seed, device=cfg.device,
                              total_updates=cfg.max_updates)
        if cfg.init_policy:
            from lmpo.textagent.sac.weights import load_reference_policy

            if b.alphabet is None:
                raise InputError("`init_policy` needs the run's alphabet to check the reference against; this "
                                 "environment bundle has none.")
            self.agent.init_from_reference(load_reference_policy(cfg.init_policy, b.alphabet))
        self.agent_buf = ReplayBuffer(cfg.replay.agent_capacity, b.window, b.num_actions, is_demo=False)
        self.demo_buf = ReplayBuffer(cfg.replay.demo_capacity, b.window, b.num_actions, is_demo=True)
        self.rng = np.random.default_rng(cfg.seed)
        self.text_pairs = None
        if cfg.sac.bc_text_batch > 0:
            if b.alphabet is None:
                raise InputError("`sac.bc_text_batch` needs the run's text; this environment bundle has none.")
            self.text_pairs = TextPairs(b.train_chapters, b.extra_chapters, b.alphabet, b.envs[0].compliance,
                                        b.window)
        self.obs = [env.reset(seed=cfg.seed * 1000 + i)[0] for i, env in enumerate(b.envs)]
        self.env_steps = 0
        self.episodes = 0
        self.counters: dict[str, int] = defaultdict(int)
        self.trace_steps = cfg.trace_steps if trace_steps is None else trace_steps
        self.progress = progress
        self.history: list[dict[str, float]] = []
        # training seconds are counted across resumes (checkpointed), so time_budget_s and the logged
        # step/seconds describe the whole run, not the current process
        self.seconds_before = 0.0
        self._start: float | None = None
        self._roll, self._upd = RunningStats(), RunningStats()
        self._metrics: JsonlAppender | None = None
        write_run_config(self.run_dir, cfg.to_dict())

    # ------------------------------------------------------------------ checkpoint
    def _envs_state(self) -> dict[str, Any]:
        """The environments' state as plain data; a shared InfoNCE encoder is stored once."""
        envs = self.bundle.envs
        if not all(hasattr(env, "state_dict") for env in envs):
            raise TypeError(f"{type(envs[0]).__name__} has no state_dict(); a SAC checkpoint needs the "
                            "environments' state as data (see CharTextEnv.state_dict)")
        return {"encoders": [e.state_dict() for e in _shared_encoders(envs)], "envs": [env.state_dict() for env in envs]}

    def _load_envs_state(self, state: dict[str, Any]) -> None:
        envs = self.bundle.envs
        if len(state["envs"]) != len(envs):
            raise ValueError(f"the checkpoint holds {len(state['envs'])} environments, this run has {len(envs)}")
        for enc, saved in zip(_shared_encoders(envs), state["encoders"], strict=True):
            enc.load_state_dict(saved)
        for env, saved in zip(envs, state["envs"]):
            env.load_state_dict(saved)

    def save(self) -> Path:
        """Write checkpoint ``checkpoints/step_<updates>`` atomically (see :mod:`lmpo.checkpoints`)."""
        agent_state = self.agent.state_dict()
        state = {
            "agent_buf": self.agent_buf.state_dict(), "demo_buf": self.demo_buf.state_dict(),
            "rng": self.rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
            "py_rng": random.getstate(), "np_global": np.random.get_state(),
            "env_steps": self.env_steps, "episodes": self.episodes, "counters": dict(self.counters),
            "obs": self.obs, "history": self.history,
            "train_seconds": time.time() - self._start if self._start is not None else self.seconds_before,
            "envs": self._envs_state(),
            "running": {"roll": self._roll.state_dict(), "upd": self._upd.state_dict()},
        }
        if self._metrics is not None:
            self._metrics.sync()  # the rows this checkpoint counts reach the disk first

        def write(tmp: Path) -> None:
            save_state(tmp, "agent", agent_state)
            save_state(tmp, "state", state)

        return write_checkpoint(self.run_dir, self.agent.updates, write, keep_last=self.cfg.checkpoint_keep_last)

    def load(self, path: str | Path | None = None) -> Path:
        """Restore the run from checkpoint ``path`` (default: the newest complete one of the run directory)
        and cut ``metrics.jsonl`` back to the rows that checkpoint had seen. Returns the checkpoint used."""
        path = Path(path) if path is not None else resume_checkpoint(self.run_dir)
        verify_checkpoint(path)
        agent_state, state = load_state(path, "agent"), load_state(path, "state")
        try:
            self.agent.load_state_dict(agent_state)
            self.agent_buf.load_state_dict(state["agent_buf"])
            self.demo_buf.load_state_dict(state["demo_buf"])
            self.rng.bit_generator.state = state["rng"]
            torch.set_rng_state(state["torch_rng"])
            random.setstate(state["py_rng"])
            np.random.set_state(state["np_global"])
            self.env_steps, self.episodes = int(state["env_steps"]), int(state["episodes"])
            self.counters = defaultdict(int, state["counters"])
            self.obs, self.history = state["obs"], state["history"]
            self.seconds_before = float(state["train_seconds"])
            self._load_envs_state(state["envs"])
            self._roll.load_state_dict(state["running"]["roll"])
            self._upd.load_state_dict(state["running"]["upd"])
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint {path} does not fit this run ({type(e).__name__}: "
                                  f"{' '.join(str(e).split())[:200]}): it was written with another config "
                                  "(network sizes, corpus, environments). Resume with the run's own config.") from None
        truncate_jsonl(self.run_dir / "metrics.jsonl", len(self.history))
        return path

    # ------------------------------------------------------------------ one lock-step of all environments
    def collect(self, roll: RunningStats, trace) -> None:
        cfg, b = self.cfg, self.bundle
        ratio = teacher_ratio(self.env_steps, cfg.replay.teacher_ratio_start, cfg.replay.teacher_ratio_end,
                              cfg.replay.teacher_anneal_env_steps)
        use_teacher = self.rng.random(len(b.envs)) < ratio
        windows = np.stack([o["window"] for o in self.obs])
        legals = np.stack([np.asarray(o["legal_mask"], dtype=bool) for o in self.obs])
        agent_actions, max_probs = self.agent.act(windows, legals)
        roll.add("data/teacher_ratio", ratio)
        if hasattr(b.envs[0], "normaliser_stats"):
            for k, v in b.envs[0].normaliser_stats().items():
                roll.add(k, float(v))
        for i, env in enumerate(b.envs):
            legal = legals[i]
            teacher = int(env.teacher_action())
            action, source, relabeled, teacher_on = int(agent_actions[i]), "agent", False, False
            if use_teacher[i]:
                if legal[teacher]:
                    action, source, teacher_on = teacher, "teacher", True
                elif cfg.replay.teacher_conflict == "relabel":
                    alt = nearest_legal(teacher, legal, b.code_points, b.eos_id)
                    if alt is not None:  # the relabelled character is stepped as an ordinary action
                        action, source, relabeled = alt, "teacher", True
                        self.counters["relabeled"] += 1
                    else:
                        self.counters["rejected"] += 1
                else:
                    self.counters["rejected"] += 1
            if teacher_on:
                env.set_teacher(True)
            next_obs, reward, terminated, truncated, info = env.step(action)
            if teacher_on:
                env.set_teacher(False)
            buf = self.demo_buf if source == "teacher" else self.agent_buf
            buf.add(self.obs[i]["window"], legal, action, float(reward), next_obs["window"],
                    np.asarray(next_obs["legal_mask"], dtype=bool), bool(terminated), bool(truncated),
                    teacher, relabeled)
            # ---- rollout statistics
            roll.add("reward/step", float(reward), with_var=True)
            for k, v in info.items():
                if k.startswith(("reward/", "norm/")) and isinstance(v, (int, float, np.floating)):
                    roll.add(k, float(v), with_var=k.startswith("reward/"))
            if source == "agent":
                self.counters["agent_steps"] += 1
                roll.add("policy/rollout_max_prob", float(max_probs[i]))
                roll.add("policy/illegal_rate", float(bool(info.get("is_illegal", not legal[action]))))
                roll.add("data/agent_matches_teacher", float(action == teacher))
                self.counters["illegal"] += int(bool(info.get("is_illegal", not legal[action])))
            else:
                self.counters["teacher_steps"] += 1
            roll.add("data/relabel_rate", float(relabeled))
            if trace is not None and self.counters["traced"] < self.trace_steps and i == 0:
                self.counters["traced"] += 1
                if "history_tail" in info and "step" in info:  # the text environment's own fields
                    action_char, hist = info["action_char"], info["history_tail"]
                else:
                    action_char, hist = b.decode([action]), b.decode([int(x) for x in next_obs["window"][-8:]])
                line = trace_line(self.counters["traced"], info.get("prev_char", ""), info.get("target_char", ""),
                                  action_char, source, hist, float(reward), info.get("reward/base", 0.0),
                                  info.get("reward/potential", 0.0), info.get("reward/soft", 0.0))
                trace(line)
            if terminated or truncated:
                self.episodes += 1
                # early = terminated before the chapter's end: an illegal action or an <eos> the reference
                # does not have (reaching the chapter's end, target <eos>, is the natural end)
                early = bool(terminated) and int(info.get("teacher_action", -1)) != b.eos_id
                self.counters["early_terminations"] += int(early)
                self.counters["episodes"] += 1
                roll.add("policy/early_termination_rate", float(early))
                next_obs, _ = env.reset()
            self.obs[i] = next_obs
        self.env_steps += len(b.envs)

    # ------------------------------------------------------------------ the loop
    def run(self, max_updates: int | None = None) -> dict[str, Any]:
        cfg = self.cfg
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(self.run_dir / TENSORBOARD_DIR))
        metrics_f = self._metrics = JsonlAppender(self.run_dir / "metrics.jsonl", rows=len(self.history))
        trace_f = open_append(self.run_dir / "trace.log") if self.trace_steps else None

        def trace(line: str) -> None:
            print(line, flush=True)
            trace_f.write(line + "\n")

        roll, upd = self._roll, self._upd  # checkpointed: a resume between two log rows continues the sums
        start = self._start = time.time() - self.seconds_before
        last_log = time.time()
        stop_reason = "total_env_steps"
        sigint = contextlib.ExitStack()  # a first Ctrl-C stops the loop at its next iteration, with a checkpoint
        stop = sigint.enter_context(stop_on_sigint(lambda m: print(f"[sac] {m}", file=sys.stderr, flush=True)))
        try:
            while self.env_steps < cfg.total_env_steps:
                if stop.requested:
                    stop_reason = "interrupted"
                    break
                if cfg.time_budget_s and time.time() - start > cfg.time_budget_s:
                    stop_reason = "time_budget_s"
                    break
                limit = max_updates if max_updates is not None else cfg.max_updates
                if limit and self.agent.updates >= limit:
                    stop_reason = "max_updates"
                    break
                self.collect(roll, trace if trace_f else None)
                if len(self.agent_buf) + len(self.demo_buf) < cfg.learning_starts:
                    continue
                save_due = False
                for _ in range(cfg.updates_per_iteration):
                    batch = sample_mixed(self.agent_buf, self.demo_buf, cfg.replay.transitions_per_batch,
                                         cfg.replay.agent_fraction, self.rng, cfg.device)
                    stats = self.agent.update(batch, self._text_batch())
                    for k, v in stats.items():
                        upd.add(k, float(v))
                    if self.agent.updates % cfg.log_every_updates == 0 and self.agent.updates > 0:
                        quality = self._quality() if self._eval_due() else {}
                        row = self._log(roll, upd, start, last_log, writer, metrics_f, quality)
                        last_log = time.time()
                        roll, upd = self._roll, self._upd = RunningStats(), RunningStats()
                        self.history.append(row)
                    save_due |= bool(cfg.checkpoint_every_updates) and \
                        self.agent.updates % cfg.checkpoint_every_updates == 0
                if save_due:  # at the end of the iteration, where a resumed run picks up exactly
                    self.save()
                    save_due = False
        finally:
            sigint.close()
            writer.flush()
            writer.close()
            metrics_f.close()
            if trace_f:
                trace_f.close()
        self.seconds_before, self._start = time.time() - start, None
        path = self.save()
        if stop_reason == "interrupted":
            raise Interrupted(f"stopped by Ctrl-C after {self.agent.updates} updates ({self.env_steps} env steps); "
                              f"checkpoint written to {path}.", checkpoint=path)
        return {"stop_reason": stop_reason, "train_seconds": self.seconds_before}

    def _text_batch(self):
        """``sac.bc_text_batch`` windows of the training text, drawn with the run's (checkpointed) generator."""
        if self.text_pairs is None:
            return None
        idx = self.text_pairs.sample(self.cfg.sac.bc_text_batch, self.cfg.corpus_share,
                                     lambda lo, hi, n: self.rng.integers(lo, hi, size=n))
        return tuple(t.to(self.cfg.device) for t in self.text_pairs.batch(idx))

    def _eval_due(self) -> bool:
        # called on log rows (multiples of log_every_updates); [k·n, k·n + log_every) holds exactly one of
        # them, so this fires once per multiple of n, at the first log row at or after it
        n = self.cfg.eval_every_updates
        return bool(n) and self.agent.updates % n < self.cfg.log_every_updates and self.bundle.alphabet is not None \
            and bool(self.bundle.heldout_chapters)

    def _quality(self) -> dict[str, float]:
        """Teacher-forced held-out top-1 / top-3 of the current policy (eval mode; the RNGs are untouched)."""
        from lmpo.textagent.sac.evaluate import agent_teacher_forced, heldout_positions

        b = self.bundle
        positions = heldout_positions(b.heldout_chapters, self.cfg.eval_max_positions)
        res = agent_teacher_forced(self.agent, b.alphabet, b.envs[0].compliance, b.heldout_chapters, positions,
                                   b.window)
        return {"quality/heldout_top1": res["top1"], "quality/heldout_top3": res["top3"]}

    def _log(self, roll: RunningStats, upd: RunningStats, start: float, last_log: float, writer,
             metrics_f, quality: dict[str, float] | None = None) -> dict[str, float]:
        row: dict[str, float] = {"step/updates": self.agent.updates, "step/env_steps": self.env_steps,
                                 "step/episodes": self.episodes, "step/seconds": time.time() - start,
                                 "step/updates_per_s": self.cfg.log_every_updates / max(1e-9, time.time() - last_log)}
        row.update(upd.means())
        row.update(roll.means())
        row["data/demo_buffer"] = len(self.demo_buf)
        row["data/agent_buffer"] = len(self.agent_buf)
        row["data/relabeled_total"] = self.counters["relabeled"]
        row["data/rejected_total"] = self.counters["rejected"]
        row.update(quality or {})
        for k, v in row.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                writer.add_scalar(k, v, self.agent.updates)
        metrics_f.append(row)
        if self.progress:
            print(
                f"[sac] upd {self.agent.updates:6d} env {self.env_steps:7d} "
                f"{row['step/updates_per_s']:5.1f} upd/s | Lq {row.get('losses/critic', float('nan')):.3f} "
                f"Lbc {row.get('losses/bc', float('nan')):.3f} H {row.get('policy/entropy', float('nan')):.2f} "
                f"α {row.get('policy/alpha', float('nan')):.4f} cov {row.get('policy/top_p_coverage', float('nan')):.3f} "
                f"top1(batch) {row.get('data/batch_teacher_top1', float('nan')):.3f} "
                f"teacher {row.get('data/teacher_ratio', float('nan')):.2f}"
                + (f" | held-out top1 {row['quality/heldout_top1']:.3f}" if "quality/heldout_top1" in row else ""),
                file=sys.stderr, flush=True,
            )
        return row


def resume_checkpoint(run_dir: str | Path) -> Path:
    """The newest complete checkpoint of a run; an error naming the problem when there is none."""
    path = latest_valid_checkpoint(run_dir, log=lambda m: print(f"[sac] {m}", file=sys.stderr))
    if path is not None:
        return path
    found = list_checkpoints(run_dir)
    if found:
        verify_checkpoint(found[-1])  # raises, naming what is wrong with the newest
    raise InputError(f"--resume: {str(run_dir)!r} has no checkpoint (the run stopped before its first one; see "
                     "checkpoint_every_updates). Start it again with --overwrite.")


#: what a SAC run directory holds (``--overwrite`` deletes these and nothing else; the last four are what
#: earlier lmpo versions wrote: config.json and tb/ before the one convention, and pickled checkpoint files,
#: never read)
RUN_ENTRIES = (CONFIG_FILE, "metrics.jsonl", TENSORBOARD_DIR, "checkpoints", "eval.json", "summary.json",
               "trace.log", LEGACY_CONFIG_FILE, "tb", "checkpoint.pt", "envs.pkl")


def train(cfg: SACTrainConfig, run_dir: str | Path, *, bundle: EnvBundle | None = None, resume: bool = False,
          trace_steps: int | None = None, progress: bool = True, evaluate: bool = True,
          max_updates: int | None = None, eval_only: bool = False, overwrite: bool = False,
          allow_config_change: bool = False) -> dict[str, Any]:
    """Train (or resume) a run in ``run_dir``; evaluate on held-out chapters; write ``summary.json``.

    A directory that already holds a run needs ``resume`` (continue from its newest complete checkpoint,
    with the stored config compared against ``cfg``: only ``RESUMABLE_KEYS`` may differ unless
    ``allow_config_change``) or ``overwrite``. ``eval_only`` (with ``resume``): load the checkpoint and only
    evaluate and summarise. A Ctrl-C writes a checkpoint and raises :class:`lmpo.errors.Interrupted`. The run
    directory is locked for the whole call (:class:`lmpo.runs.RunLock`): a second writer is refused.
    """
    if eval_only and not resume:
        raise InputError("--eval-only evaluates a run's checkpoint: it needs --resume (and the run's --run-dir).")
    with RunLock(run_dir, dir_option="--run-dir"):  # one writer per run directory (lmpo.runs)
        prepare_run_dir(run_dir, RUN_ENTRIES, resume=resume, overwrite=overwrite, dir_option="--run-dir")
        checkpoint = None
        if resume:
            stored = stored_config_path(run_dir)
            if stored is not None:
                check_resume_config(run_config_dict(run_dir), cfg.to_dict(), RESUMABLE_KEYS,
                                    allow_change=allow_config_change, stored_path=stored,
                                    schema=SACTrainConfig)
            checkpoint = resume_checkpoint(run_dir)  # before the environments are built: fail fast
        trainer = SACTrainer(cfg, run_dir, bundle=bundle, trace_steps=trace_steps, progress=progress)
        if checkpoint is not None:
            trainer.load(checkpoint)
        if eval_only:
            last = trainer.history[-1] if trainer.history else {}
            info = {"stop_reason": "evaluated from checkpoint (--eval-only)",
                    "train_seconds": trainer.seconds_before or float(last.get("step/seconds", 0.0))}
        else:
            info = trainer.run(max_updates=max_updates)
        summary: dict[str, Any] = {
            "config": cfg.to_dict(), **info,
            "updates": trainer.agent.updates, "env_steps": trainer.env_steps, "episodes": trainer.episodes,
            "nonfinite_skips": trainer.agent.nonfinite_skips, "counters": dict(trainer.counters),
            "alpha_final": float(trainer.agent.alpha), "top_p_controller": trainer.agent.controller.state_dict(),
            "critic_loss_curve": [r.get("losses/critic") for r in trainer.history],
            "alpha_curve": [r.get("policy/alpha") for r in trainer.history],
            "teacher_ratio_curve": [r.get("data/teacher_ratio") for r in trainer.history],
            "heldout_top1_curve": [[r["step/updates"], r["quality/heldout_top1"]] for r in trainer.history
                                   if "quality/heldout_top1" in r],
            "extra_text": trainer.bundle.extra_report, "num_actions": trainer.bundle.num_actions,
        }
        c = trainer.counters
        summary["illegal_rate_train"] = c["illegal"] / max(1, c["agent_steps"])
        summary["early_termination_rate_train"] = c["early_terminations"] / max(1, c["episodes"])
        if evaluate and trainer.bundle.alphabet is not None and trainer.bundle.heldout_chapters:
            from lmpo.textagent.sac.evaluate import evaluate_run

            summary["eval"] = evaluate_run(trainer.agent, trainer.bundle, cfg)
            replace_file(Path(run_dir) / "eval.json", json.dumps(summary["eval"], indent=2, ensure_ascii=False).encode())
        replace_file(Path(run_dir) / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False).encode())
        if trainer.history:  # RUN_DIR/plots/*.png, as `lmpo plot RUN_DIR` draws them
            plot_runs([run_dir])
        return summary


Trainer = SACTrainer  # the name before 2026-11-28 (lmpo.trainer.Trainer is the GRPO loop), kept for scripts
