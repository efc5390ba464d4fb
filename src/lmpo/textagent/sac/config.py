"""Configuration of the SAC agent and its training run: frozen dataclasses, YAML files, ``--key value``.

Built on the one config base (:mod:`lmpo.config`): every field carries its help text and its allowed range
in its metadata, so unknown keys are answered with the closest valid name, values are typed, and
``--sac.tau -0.5`` or ``--seed abc`` stop with a message naming the key, the value and the fix.

Defaults are the full-size settings of docs/sac.md except where the CPU preset says otherwise (``CPU_PRESET``); ``GPU_PRESET`` is the
seed's full-size setting (batch 2048).  Nested keys are written ``section.field`` on the command line,
e.g. ``--sac.top_p 0.99 --replay.agent_fraction 0.5 --seed 3``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpo.config import (
    ConfigError,
    check_fields,
    deep_merge,
    from_dict,
    merge_layers,
    parse_overrides,
    read_yaml,
    render_reference,
    to_dict,
)
from lmpo.config import option as _f
from lmpo.runs import CONFIG_FILE, LEGACY_CONFIG_FILE, read_json_object, stored_config_path
from lmpo.textagent.env.bundled import DEFAULT_CORPUS, resolve_corpus
from lmpo.textagent.env.config import TextEnvConfig

#: the keys ``--resume`` lets a run change: when it stops, how it logs, evaluates and checkpoints
RESUMABLE_KEYS = ("total_env_steps", "max_updates", "time_budget_s", "log_every_updates", "eval_every_updates",
                  "checkpoint_every_updates", "checkpoint_keep_last", "eval_max_positions", "eval_generations",
                  "eval_generation_chars", "eval_rollout_episodes", "eval_no_repeat_ngram", "trace_steps", "threads")


@dataclass(frozen=True)
class NetworkConfig:
    """Encoders and heads of the policy and the twin critic."""

    embed_dim: int = _f(128, "d: character-embedding width of both encoders.", ge=1)
    gru_hidden: int = _f(256, "H: GRU width (context vector c).", ge=1)
    gru_layers: int = _f(1, "GRU layers.", ge=1)
    policy_hidden: int = _f(256, "Hidden width of the policy head MLP.", ge=1)
    q_hidden: int = _f(256, "Hidden width of each Q head.", ge=1)
    action_embed_dim: int = _f(128, "Width of Emb_act(a) in Q(o, a) = MLP([c; Emb_act(a)]).", ge=1)
    dropout: float = _f(0.0, "Dropout on embeddings and context (policy and critic); helps held-out prediction "
                        "on small corpora.", ge=0, lt=1)


@dataclass(frozen=True)
class SACConfig:
    """The SAC update: discount, target critics, temperature, top-p backups, CQL and BC."""

    gamma: float = _f(0.995, "Discount γ.", gt=0, lt=1)
    tau: float = _f(0.005, "Polyak rate of the target critics.", gt=0, le=1)
    lr_policy: float = _f(3e-4, "Adam learning rate of the policy.", gt=0)
    lr_q: float = _f(3e-4, "Adam learning rate of the critics.", gt=0)
    lr_alpha: float = _f(1e-4, "η in log α ← log α + η (H_tgt − H).", gt=0)
    alpha_init: float = _f(0.05, "Initial temperature α.", gt=0)
    alpha_min: float = _f(1e-4, "Lower bound of α.", gt=0)
    alpha_max: float = _f(2.0, "Upper bound of α.", gt=0)
    autotune_alpha: bool = _f(True, "False = fixed α (the \"fixed α\" ablation).")
    entropy_kappa: float = _f(0.9, "κ in H_tgt = κ log |A(s)|.", ge=0, le=1)
    use_top_p: bool = _f(True, "False = expectations over the full legal set (the \"no top-p\" ablation).")
    top_p: float = _f(0.98, "Probability mass of the top-p candidate set of the backup.", gt=0, le=1)
    top_p_k_max: int = _f(64, "K_max: largest candidate set (raised by the coverage controller).", ge=1)
    top_p_k_limit: int = _f(512, "Ceiling the controller may raise K_max to.", ge=1)
    top_p_coverage_target: float = _f(0.95, "Mean coverage below which the controller raises K_max.", gt=0, le=1)
    top_p_auto_raise: bool = _f(True, "Let the coverage controller raise K_max.")
    policy_set: str = _f("top_p", "Policy loss over \"top_p\" (same set as the backup) or \"full\" (all legal "
                         "actions).", choices=("top_p", "full"))
    huber_delta: float = _f(1.0, "δ of the Huber critic loss.", gt=0)
    use_cql: bool = _f(True, "Conservative Q-learning regulariser on.")
    cql_weight: float = _f(0.5, "λ_CQL.", ge=0)
    cql_mode: str = _f("auto", "\"exact\" (all legal actions), \"sampled\" (uniform samples, log(|A|/S) "
                       "correction), \"auto\".", choices=("auto", "exact", "sampled"))
    cql_exact_max_actions: int = _f(256, "auto picks exact when |Σ| ≤ this.", ge=1)
    cql_samples: int = _f(64, "S: sampled actions per state of the sampled CQL term.", ge=1)
    bc_weight: float = _f(0.1, "λ_BC; 0 = the \"no BC\" ablation.", ge=0)
    anchor_weight: float = _f(0.0, "λ_anchor: weight of KL(π_ref ‖ π) on every batch state, π_ref the frozen "
                              "policy of ``init_policy`` (0 = no anchor). Keeps the RL stage from unlearning what "
                              "the supervised reference knows.", ge=0)
    lr_policy_schedule: str = _f("constant", "\"cosine\": the policy's learning rate decays to 0 on a cosine over "
                                 "``max_updates`` (Loshchilov & Hutter 2017), so a run ends on a settled policy "
                                 "rather than one still moving at full step size; \"constant\": no decay.",
                                 choices=("constant", "cosine"))
    lr_q_schedule: str = _f("constant", "\"cosine\": the critics' learning rate decays to 0 on a cosine over "
                            "``max_updates``, as ``lr_policy_schedule`` does for the policy; \"constant\": no "
                            "decay.", choices=("constant", "cosine"))
    policy_warmup_updates: int = _f(0, "Updates at the start of a run in which only the critics (and α) learn; "
                                    "the policy starts moving once the critics are no longer random.", ge=0)
    policy_warmup: str = _f("imitate", "What the policy does during ``policy_warmup_updates``: \"imitate\" (BC and "
                            "the anchor still train it, the Q term is off) or \"frozen\" (no policy step at "
                            "all: a policy started from the supervised twin stays exactly on it until the "
                            "critics can say something the twin does not already know).",
                            choices=("imitate", "frozen"))
    bc_text_batch: int = _f(0, "Windows of the training text (train chapters + extra text, every position, as the "
                            "supervised twin reads them) added to each update's BC term, λ_BC-weighted; 0 = BC "
                            "reads the replay rows only. Keeps the policy on the twin's data instead of the few "
                            "thousand demonstrations in the buffer.", ge=0)
    bc_rows: str = _f("demo", "Replay rows the BC loss reads: \"demo\" (teacher steps, the usual rule), \"all\" "
                      "(DAgger labelling: agent rows too, each labelled with the reference character c_t of its "
                      "step when the mask allows it) or \"none\" (BC is the text windows of ``bc_text_batch`` "
                      "alone, in the twin's mix of `corpus` and extra text: the demo rows, all from `corpus`, "
                      "would otherwise outweigh that mix).", choices=("demo", "all", "none"))
    grad_clip: float = _f(0.5, "Global gradient-norm clip of each network.", gt=0)
    max_nonfinite_in_row: int = _f(50, "Stop the run after this many consecutive skipped (non-finite) updates.",
                                   ge=1)

    def validate(self) -> None:
        check_fields(self, "sac")
        if not self.alpha_min <= self.alpha_init <= self.alpha_max:
            raise ConfigError(
                f"`sac.alpha_init` = {self.alpha_init}: must lie in [alpha_min, alpha_max] = "
                f"[{self.alpha_min}, {self.alpha_max}]; move it inside or widen the bounds."
            )
        if self.top_p_k_max > self.top_p_k_limit:
            raise ConfigError(f"`sac.top_p_k_max` = {self.top_p_k_max} is above `sac.top_p_k_limit` = "
                              f"{self.top_p_k_limit}; raise the limit or lower K_max.")
        if self.bc_rows == "none" and self.bc_text_batch == 0 and self.bc_weight > 0:
            raise ConfigError("`sac.bc_rows` = 'none' reads no replay row and `sac.bc_text_batch` = 0 adds no text "
                              "window, so the BC term would be empty; set `sac.bc_text_batch` > 0, another "
                              "`sac.bc_rows`, or `sac.bc_weight` 0.")


@dataclass(frozen=True)
class ReplayConfig:
    """Agent and demo replay buffers, their mixing and the DAgger teacher schedule."""

    agent_capacity: int = _f(200_000, "Transitions the agent buffer holds.", ge=1)
    demo_capacity: int = _f(200_000, "Transitions the demo (teacher) buffer holds.", ge=1)
    agent_fraction: float = _f(0.75, "ρ: share of agent transitions in a batch (the rest from the demo buffer).",
                               ge=0, le=1)
    transitions_per_batch: int = _f(256, "Transitions per gradient update.", ge=2)
    teacher_ratio_start: float = _f(1.0, "DAgger teacher ratio at the start.", ge=0, le=1)
    teacher_ratio_end: float = _f(0.1, "DAgger teacher ratio after the anneal.", ge=0, le=1)
    teacher_anneal_env_steps: int = _f(200_000, "DAgger: teacher ratio goes linearly from start to end over this "
                                       "many env steps.", ge=0)
    teacher_conflict: str = _f("relabel", "A teacher action the mask forbids: \"relabel\" (nearest legal code "
                               "point) or \"reject\" (agent acts).", choices=("relabel", "reject"))

    def validate(self) -> None:
        check_fields(self, "replay")


@dataclass(frozen=True)
class SACTrainConfig:
    """A SAC training run on the character-level text environment."""

    seed: int = _f(0, "Seed of the networks, the replay sampling, the environments and the teacher schedule.",
                   ge=0)
    device: str = _f("cpu", "cpu | cuda | cuda:N (bit-exact resume on cpu).")
    threads: int = _f(0, "torch intra-op threads (0 = leave torch's default).", ge=0, le=1024)
    corpus: str = _f(DEFAULT_CORPUS, "Text corpus: a .txt / .json file or a directory, or the name of a corpus "
                     "bundled with lmpo (default: the Analects, lunyu.simplified.json).")
    heldout_fraction: float = _f(0.2, "Share of chapters held out for evaluation.", gt=0, lt=1)
    extra_train_corpus: tuple[str, ...] = _f((), "Train-only text added after the split of ``corpus`` (files, "
                                              "directories or bundled names such as ``classical``): the "
                                              "environments, the alphabet and the supervised reference train on "
                                              "it, the held-out chapters and the n-gram baseline stay those of "
                                              "``corpus``.")
    corpus_share: float = _f(0.0, "Share of each supervised batch (the twin's, and ``sac.bc_text_batch``'s) drawn "
                             "from the train chapters of ``corpus``, the rest from ``extra_train_corpus``; 0 = every "
                             "training position equally likely (the Analects are ~5% of the text with the bundled "
                             "classical text). Raising it keeps the extra text as a regulariser while the model "
                             "fits the held-out chapters' own style.", ge=0, lt=1)
    leak_filter_chars: int = _f(10, "Drop every paragraph of ``extra_train_corpus`` that shares this many "
                                "consecutive Han characters with a held-out chapter (0 = no filter); the drop "
                                "count is logged and kept in summary.json.", ge=0)
    init_policy: str = _f("", "Run directory of ``lmpo sac reference`` (or its policy.safetensors): the policy "
                          "starts from the supervised reference and ``sac.anchor_weight`` anchors it there. Same "
                          "corpus settings needed (the alphabets must match).")
    split_seed: int = _f(0, "Seed of the train / held-out chapter split.", ge=0)
    env: dict[str, Any] = _f({}, "Keyword overrides of lmpo.textagent.env.TextEnvConfig (e.g. window length, episode "
                             "length); checked against its fields.")
    num_envs: int = _f(8, "Environments stepped in lock-step (one batched policy forward per step).", ge=1)
    total_env_steps: int = _f(50_000, "Stop after this many environment steps (all environments together).",
                              ge=0)
    time_budget_s: float = _f(0.0, "Stop training after this many seconds (0 = no limit), counted over the whole "
                              "run including the time before a ``--resume``; the run still evaluates and "
                              "checkpoints.  Raise it to resume a run it stopped.", ge=0)
    max_updates: int = _f(0, "Stop training after this many gradient updates (0 = no limit); the gate uses it to "
                          "compare the main runs and the ablations at equal updates rather than equal wall time.",
                          ge=0)
    learning_starts: int = _f(1_000, "Transitions collected before the first update.", ge=0)
    updates_per_iteration: int = _f(1, "Gradient updates after each lock-step of all environments.", ge=1)
    log_every_updates: int = _f(50, "Write a metrics row every N updates.", ge=1)
    eval_every_updates: int = _f(0, "Teacher-forced held-out top-1/top-3 every N updates, logged as "
                                 "``quality/heldout_top1`` and ``quality/heldout_top3`` (0 = only at the end).",
                                 ge=0)
    checkpoint_every_updates: int = _f(500, "Write a checkpoint every N updates (0 = only at the end).", ge=0)
    checkpoint_keep_last: int = _f(2, "Keep the newest N checkpoints (at least 1).", ge=1)
    eval_max_positions: int = _f(4000, "Teacher-forced held-out positions scored at evaluation (0 = all).", ge=0)
    eval_generations: int = _f(24, "Free-running continuations generated for 4-gram coverage / chrF / BLEU.",
                               ge=0)
    eval_generation_chars: int = _f(32, "Characters per free-running continuation.", ge=1)
    eval_no_repeat_ngram: int = _f(0, "Free-running evaluation: greedy decoding never repeats an n-gram of this "
                                   "many characters already in its output (0 = plain greedy).", ge=0)
    eval_rollout_episodes: int = _f(16, "Agent-only held-out episodes for the illegal-action and "
                                    "early-termination rates.", ge=0)
    trace_steps: int = _f(0, "Print the per-step trace (source, action, history, rewards) of the first N "
                          "environment steps.", ge=0)
    net: NetworkConfig = _f(NetworkConfig(), "Network section.")
    sac: SACConfig = _f(SACConfig(), "SAC update section.")
    replay: ReplayConfig = _f(ReplayConfig(), "Replay section.")

    def validate(self) -> None:
        """Ranges from the fields' metadata, then the checks that need code (device, corpus, env keys)."""
        check_fields(self)
        self.sac.validate()
        self.replay.validate()
        _check_device(self.device)
        resolve_corpus(self.corpus)
        for key in ("lr_policy_schedule", "lr_q_schedule"):
            if getattr(self.sac, key) == "cosine" and self.max_updates <= 0:
                raise ConfigError(f"`sac.{key}` = 'cosine' decays a learning rate over the run: set `max_updates` "
                                  "> 0, or use the constant schedule.")
        for i, spec in enumerate(self.extra_train_corpus):
            resolve_corpus(spec, f"extra_train_corpus[{i}]")
        if self.corpus_share > 0 and not self.extra_train_corpus:
            raise ConfigError(f"`corpus_share` = {self.corpus_share} weights `corpus` against `extra_train_corpus`, "
                              "which is empty: add extra text or set `corpus_share: 0`.")
        if self.init_policy:
            policy_file(self.init_policy)
        env = self.env_config()
        blacklist_path = env.compliance.blacklist_path
        if blacklist_path is not None and not Path(blacklist_path).is_file():
            raise ConfigError(f"`env.blacklist_path` = {blacklist_path!r} is not a file; give a text file of "
                              "characters to forbid, or leave it unset.")

    def env_config(self) -> TextEnvConfig:
        """The :class:`lmpo.textagent.env.TextEnvConfig` that ``env`` describes (keys and values checked)."""
        return from_dict(TextEnvConfig, self.env, "env")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


#: the weights file of a ``lmpo sac reference`` run
POLICY_FILE = "policy.safetensors"


def policy_file(spec: str | Path) -> Path:
    """The ``policy.safetensors`` that ``init_policy`` names (a reference run directory or the file itself)."""
    path = Path(spec)
    if path.is_dir():
        path = path / POLICY_FILE
    if not path.is_file():
        raise ConfigError(f"`init_policy` = {str(spec)!r}: no {POLICY_FILE} there. Give the --run-dir of a finished "
                          "`lmpo sac reference` run (or its policy.safetensors), or leave init_policy empty.")
    return path


def _check_device(device: str) -> None:
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", device):
        raise ConfigError(f"`device` = {device!r} is not a torch device this trainer supports; use cpu, cuda "
                          "or cuda:N.")


def check_device_available(device: str) -> None:
    """Refuse a CUDA device on a machine without one (checked when a run starts, so that GPU configs still
    load and validate anywhere)."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"`device` = {device!r} but no CUDA device is available to torch "
                              f"{torch.__version__}; use cpu (or the cpu preset: --preset cpu).")


#: the full-size settings of docs/sac.md (a GPU run)
GPU_PRESET: dict[str, Any] = {
    "device": "cuda",
    "num_envs": 64,
    "total_env_steps": 2_000_000,
    "learning_starts": 20_000,
    "replay": {"transitions_per_batch": 2048, "teacher_anneal_env_steps": 200_000,
               "agent_capacity": 1_000_000, "demo_capacity": 1_000_000},
}

#: small CPU setting: what `lmpo sac train` uses when no config file is given (= configs/sac_cpu.yaml minus
#: its time budget and evaluation settings; see docs/sac.md "Defaults" for why γ, τ, κ, λ_BC, the anchor, the
#: learning rates and dropout differ from the full-size settings)
CPU_PRESET: dict[str, Any] = {
    "device": "cpu",
    "num_envs": 8,
    "total_env_steps": 60_000,
    "learning_starts": 512,
    "updates_per_iteration": 2,
    "max_updates": 3000,
    "extra_train_corpus": ["classical"],
    "corpus_share": 0.25,
    "eval_no_repeat_ngram": 4,
    "env": {"window_chars": 16, "max_steps": 64, "lambda_target": 1.0},
    "net": {"embed_dim": 64, "gru_hidden": 128, "policy_hidden": 256, "q_hidden": 128,
            "action_embed_dim": 64, "dropout": 0.1},
    "sac": {"gamma": 0.9, "tau": 0.02, "entropy_kappa": 0.55, "bc_weight": 4.0, "anchor_weight": 8.0,
            "bc_text_batch": 128, "policy_warmup_updates": 500, "policy_warmup": "frozen",
            "lr_policy": 2e-5, "lr_policy_schedule": "cosine", "lr_q": 3e-4, "lr_q_schedule": "cosine",
            "top_p_k_max": 32, "top_p_k_limit": 128, "cql_samples": 32},
    "replay": {"transitions_per_batch": 128, "teacher_anneal_env_steps": 6_000,
               "agent_capacity": 100_000, "demo_capacity": 100_000},
}

PRESETS = {"cpu": CPU_PRESET, "gpu": GPU_PRESET}


def _nest(overrides: dict[str, Any]) -> dict[str, Any]:
    """{"sac.top_p": 0.99} → {"sac": {"top_p": 0.99}} (dotted keys as well as nested dicts)."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        head, _, rest = str(key).partition(".")
        if rest:
            value = _nest({rest: value})
        if isinstance(value, dict) and isinstance(out.get(head), dict):
            out[head] = deep_merge(out[head], value)
        else:
            out[head] = value
    return out


def apply_overrides(cfg: SACTrainConfig, overrides: dict[str, Any]) -> SACTrainConfig:
    """Return ``cfg`` with nested ``overrides`` ({"sac": {"top_p": 0.99}} or {"sac.top_p": 0.99}) applied.

    ``env`` is a free-form section: its keys are merged into the run's ``env`` dict as written (and checked
    against ``TextEnvConfig`` by :meth:`SACTrainConfig.validate`); a field set here under either of its names (flat,
    ``window_chars``, or in its section, ``episode.window_chars``) replaces the value ``cfg`` gives it under
    either name (:func:`lmpo.config.merge_layers`).
    """
    data, over = to_dict(cfg), _nest(overrides)
    if isinstance(over.get("env"), dict) and isinstance(data.get("env"), dict):
        data["env"] = merge_layers(TextEnvConfig, data["env"], over.pop("env"))
    return from_dict(SACTrainConfig, deep_merge(data, over))


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                preset: str = "cpu") -> SACTrainConfig:
    """Preset → YAML file (may name ``preset:``) → overrides, then validated."""
    data: dict[str, Any] = read_yaml(path) if path is not None else {}
    preset = data.pop("preset", preset)
    if preset not in PRESETS:
        raise ConfigError(f"`preset` = {preset!r} is not one of {', '.join(PRESETS)}.")
    cfg = apply_overrides(SACTrainConfig(), PRESETS[preset])
    cfg = apply_overrides(cfg, data)
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    cfg.validate()
    return cfg


def config_from_dict(data: dict[str, Any]) -> SACTrainConfig:
    """Inverse of :meth:`SACTrainConfig.to_dict` (used to reload a run's saved config)."""
    cfg = from_dict(SACTrainConfig, data)
    cfg.validate()
    return cfg


def run_config_dict(run_dir: str | Path) -> dict[str, Any]:
    """The resolved config a run stored in ``RUN_DIR/config.yaml`` (``config.json`` for runs written before;
    refused cleanly when missing or damaged)."""
    path = stored_config_path(run_dir)
    if path is None:
        raise ConfigError(f"{Path(run_dir) / CONFIG_FILE} does not exist: {str(run_dir)!r} is not a run directory "
                          "of `lmpo sac train` (or the run never started). Pass the directory the run wrote.")
    if path.name == LEGACY_CONFIG_FILE:
        return read_json_object(path, "a JSON config", "Restore the file, or start a new run.")
    return read_yaml(path, "stored config")


def parse_cli_overrides(tokens: list[str]) -> dict[str, Any]:
    """``["--sac.top_p", "0.99", "--seed", "3"]`` → {"sac": {"top_p": 0.99}, "seed": 3}; typed again by the
    fields in :func:`apply_overrides` (:func:`lmpo.config.parse_overrides`)."""
    return parse_overrides(tokens)


def render_config_reference() -> str:
    """Markdown tables of every key of ``lmpo sac train`` and of the ``env`` section (docs/sac.md)."""
    return render_reference(SACTrainConfig) + "\n" + render_reference(TextEnvConfig, "env")


TrainConfig = SACTrainConfig  # the name before 2026-11-28 (lmpo.trainer.TrainConfig is the GRPO run's), kept for scripts
