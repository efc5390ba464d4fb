"""Configuration of the SAC agent and its training run: frozen dataclasses, YAML files, ``--key value``.

Defaults are seed 004 §9 except where the CPU preset says otherwise (``CPU_PRESET``); ``GPU_PRESET`` is the
seed's full-size setting (batch 2048).  Nested keys are written ``section.field`` on the command line,
e.g. ``--sac.top_p 0.99 --replay.agent_fraction 0.5 --seed 3``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from lmpo.overrides import parse_overrides

DEFAULT_CORPUS = "/work/shared/data/lunyu.simplified.json"


@dataclass(frozen=True)
class NetworkConfig:
    embed_dim: int = 128
    """d: character-embedding width of both encoders."""
    gru_hidden: int = 256
    """H: GRU width (context vector c)."""
    gru_layers: int = 1
    policy_hidden: int = 256
    """hidden width of the policy head MLP."""
    q_hidden: int = 256
    """hidden width of each Q head."""
    action_embed_dim: int = 128
    """width of Emb_act(a) in Q(o, a) = MLP([c; Emb_act(a)])."""
    dropout: float = 0.0
    """dropout on embeddings and context (policy and critic); helps held-out prediction on small corpora."""


@dataclass(frozen=True)
class SACConfig:
    gamma: float = 0.995
    tau: float = 0.005
    """Polyak rate of the target critics."""
    lr_policy: float = 3e-4
    lr_q: float = 3e-4
    lr_alpha: float = 1e-4
    """η in log α ← log α + η (H_tgt − H)."""
    alpha_init: float = 0.05
    alpha_min: float = 1e-4
    alpha_max: float = 2.0
    autotune_alpha: bool = True
    """False = fixed α (the "fixed α" ablation)."""
    entropy_kappa: float = 0.9
    """κ in H_tgt = κ log |A(s)|."""
    use_top_p: bool = True
    """False = expectations over the full legal set (the "no top-p" ablation)."""
    top_p: float = 0.98
    top_p_k_max: int = 64
    """K_max: largest candidate set (raised by the coverage controller)."""
    top_p_k_limit: int = 512
    """ceiling the controller may raise K_max to."""
    top_p_coverage_target: float = 0.95
    top_p_auto_raise: bool = True
    policy_set: str = "top_p"
    """policy loss over "top_p" (same set as the backup) or "full" (all legal actions)."""
    huber_delta: float = 1.0
    use_cql: bool = True
    cql_weight: float = 0.5
    cql_mode: str = "auto"
    """"exact" (all legal actions), "sampled" (uniform samples, log(|A|/S) correction), "auto"."""
    cql_exact_max_actions: int = 256
    """auto picks exact when |Σ| ≤ this."""
    cql_samples: int = 64
    bc_weight: float = 0.1
    """λ_BC; 0 = the "no BC" ablation."""
    bc_rows: str = "demo"
    """rows the BC loss reads: "demo" (teacher steps, the seed's rule) or "all" (DAgger labelling: agent rows
    too, each labelled with the reference character c_t of its step when the mask allows it)."""
    grad_clip: float = 0.5
    max_nonfinite_in_row: int = 50
    """stop the run after this many consecutive skipped (non-finite) updates."""

    def validate(self) -> None:
        if self.policy_set not in ("top_p", "full"):
            raise ValueError(f"sac.policy_set={self.policy_set!r}: use 'top_p' or 'full'")
        if self.bc_rows not in ("demo", "all"):
            raise ValueError(f"sac.bc_rows={self.bc_rows!r}: use 'demo' or 'all'")
        if self.cql_mode not in ("auto", "exact", "sampled"):
            raise ValueError(f"sac.cql_mode={self.cql_mode!r}: use 'auto', 'exact' or 'sampled'")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sac.top_p={self.top_p}: must be in (0, 1]")
        if not 0.0 < self.gamma < 1.0:
            raise ValueError(f"sac.gamma={self.gamma}: must be in (0, 1)")
        if not self.alpha_min <= self.alpha_init <= self.alpha_max:
            raise ValueError(
                f"sac.alpha_init={self.alpha_init}: must lie in [alpha_min, alpha_max] = "
                f"[{self.alpha_min}, {self.alpha_max}]"
            )


@dataclass(frozen=True)
class ReplayConfig:
    agent_capacity: int = 200_000
    demo_capacity: int = 200_000
    agent_fraction: float = 0.75
    """ρ: share of agent transitions in a batch (the rest from the demo buffer)."""
    transitions_per_batch: int = 256
    teacher_ratio_start: float = 1.0
    teacher_ratio_end: float = 0.1
    teacher_anneal_env_steps: int = 200_000
    """DAgger: teacher ratio goes linearly from start to end over this many env steps."""
    teacher_conflict: str = "relabel"
    """a teacher action the mask forbids: "relabel" (nearest legal code point) or "reject" (agent acts)."""

    def validate(self) -> None:
        if not 0.0 <= self.agent_fraction <= 1.0:
            raise ValueError(f"replay.agent_fraction={self.agent_fraction}: must be in [0, 1]")
        if self.teacher_conflict not in ("relabel", "reject"):
            raise ValueError(f"replay.teacher_conflict={self.teacher_conflict!r}: use 'relabel' or 'reject'")
        if self.transitions_per_batch < 2:
            raise ValueError(f"replay.transitions_per_batch={self.transitions_per_batch}: must be ≥ 2")


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    device: str = "cpu"
    threads: int = 0
    """torch intra-op threads (0 = leave torch's default)."""
    corpus: str = DEFAULT_CORPUS
    heldout_fraction: float = 0.2
    split_seed: int = 0
    env: dict[str, Any] = field(default_factory=dict)
    """keyword overrides of lmpo.textenv.EnvConfig (e.g. window length, episode length)."""
    num_envs: int = 8
    """environments stepped in lock-step (one batched policy forward per step)."""
    total_env_steps: int = 50_000
    time_budget_s: float = 0.0
    """stop training after this many seconds (0 = no limit), counted over the whole run including the time
    before a ``--resume``; the run still evaluates and checkpoints.  Raise it to resume a run it stopped."""
    max_updates: int = 0
    """stop training after this many gradient updates (0 = no limit); the gate uses it to compare the main
    runs and the ablations at equal updates rather than equal wall time."""
    learning_starts: int = 1_000
    """transitions collected before the first update."""
    updates_per_iteration: int = 1
    """gradient updates after each lock-step of all environments."""
    log_every_updates: int = 50
    eval_every_updates: int = 0
    """teacher-forced held-out top-1/top-3 every N updates, logged as ``quality/heldout_top1`` and
    ``quality/heldout_top3`` (0 = only at the end)."""
    checkpoint_every_updates: int = 500
    eval_max_positions: int = 4000
    """teacher-forced held-out positions scored at evaluation (0 = all)."""
    eval_generations: int = 24
    """free-running continuations generated for 4-gram coverage / chrF / BLEU."""
    eval_generation_chars: int = 32
    eval_rollout_episodes: int = 16
    """agent-only held-out episodes for the illegal-action and early-termination rates."""
    trace_steps: int = 0
    """print the seed-§15 trace for the first N environment steps."""
    net: NetworkConfig = field(default_factory=NetworkConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)

    def validate(self) -> None:
        self.sac.validate()
        self.replay.validate()
        if self.num_envs < 1:
            raise ValueError(f"num_envs={self.num_envs}: must be ≥ 1")
        for name in ("max_updates", "eval_every_updates", "checkpoint_every_updates"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}: must be ≥ 0 (0 switches it off)")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction={self.heldout_fraction}: must be in (0, 1)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: seed 004 §9 full-size settings (a GPU run)
GPU_PRESET: dict[str, Any] = {
    "device": "cuda",
    "num_envs": 64,
    "total_env_steps": 2_000_000,
    "learning_starts": 20_000,
    "replay": {"transitions_per_batch": 2048, "teacher_anneal_env_steps": 200_000,
               "agent_capacity": 1_000_000, "demo_capacity": 1_000_000},
}

#: small CPU setting: what `lmpo sac train` uses when no config file is given (= configs/sac_cpu.yaml minus
#: its corpus path, time budget and update cap; see docs/sac.md "Defaults" for why γ, λ_BC, lr_π and dropout
#: differ from §9)
CPU_PRESET: dict[str, Any] = {
    "device": "cpu",
    "num_envs": 8,
    "total_env_steps": 60_000,
    "learning_starts": 512,
    "updates_per_iteration": 2,
    "env": {"window_chars": 16, "max_steps": 64},
    "net": {"embed_dim": 64, "gru_hidden": 128, "policy_hidden": 256, "q_hidden": 128,
            "action_embed_dim": 64, "dropout": 0.3},
    "sac": {"gamma": 0.9, "bc_weight": 1.0, "lr_policy": 1e-3, "lr_q": 3e-4,
            "top_p_k_max": 32, "top_p_k_limit": 128, "cql_samples": 32},
    "replay": {"transitions_per_batch": 128, "teacher_anneal_env_steps": 6_000,
               "agent_capacity": 100_000, "demo_capacity": 100_000},
}

PRESETS = {"cpu": CPU_PRESET, "gpu": GPU_PRESET}


def _coerce(value: Any, current: Any, key: str) -> Any:
    if isinstance(current, bool):
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("1", "true", "yes", "on"):
            return True
        if str(value).lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{key}={value!r}: expected a boolean (true/false)")
    if isinstance(current, int) and not isinstance(current, bool):
        try:
            return int(value)
        except (TypeError, ValueError):
            f = float(value)
            if f != int(f):
                raise ValueError(f"{key}={value!r}: expected an integer") from None
            return int(f)
    if isinstance(current, float):
        return float(value)
    if isinstance(current, dict):
        if isinstance(value, str):
            value = json.loads(value)
        return dict(value)
    return value if not isinstance(current, str) else str(value)


def apply_overrides(cfg: Any, overrides: dict[str, Any], prefix: str = "") -> Any:
    """Return ``cfg`` with nested ``overrides`` ({"sac": {"top_p": 0.99}} or {"sac.top_p": 0.99}) applied."""
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        elif isinstance(value, dict) and head != "env":
            nested.setdefault(head, {}).update(value)
        else:
            nested[head] = value
    names = {f.name: f for f in fields(cfg)}
    changes: dict[str, Any] = {}
    for key, value in nested.items():
        full = f"{prefix}{key}"
        if key not in names:
            raise ValueError(f"unknown config key {full!r}; known keys: {', '.join(sorted(names))}")
        current = getattr(cfg, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ValueError(f"{full} is a section; set its fields as {full}.FIELD VALUE")
            changes[key] = apply_overrides(current, value, prefix=f"{full}.")
        elif key == "env":
            env = dict(current)
            env.update(value if isinstance(value, dict) else _coerce(value, {}, full))
            changes[key] = env
        else:
            changes[key] = _coerce(value, current, full)
    return replace(cfg, **changes)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                preset: str = "cpu") -> TrainConfig:
    """Preset → YAML file (may name ``preset:``) → overrides, then validated."""
    data: dict[str, Any] = {}
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"config file {path}: expected a mapping at top level")
        data = loaded
    preset = data.pop("preset", preset)
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r}: use one of {sorted(PRESETS)}")
    cfg = apply_overrides(TrainConfig(), PRESETS[preset])
    cfg = apply_overrides(cfg, data)
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    cfg.validate()
    return cfg


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """Inverse of :meth:`TrainConfig.to_dict` (used to reload a run's saved config)."""
    cfg = apply_overrides(TrainConfig(), data)
    cfg.validate()
    return cfg


def parse_cli_overrides(tokens: list[str]) -> dict[str, Any]:
    """``["--sac.top_p", "0.99", "--seed", "3"]`` → {"sac": {"top_p": 0.99}, "seed": 3}; typed again by the
    fields in :func:`apply_overrides` (:func:`lmpo.overrides.parse_overrides`)."""
    return parse_overrides(tokens)
