"""``TextEnvConfig``: the settings of ``CharTextEnv`` (docs/textenv.md), one section per concern.

A config of sections, each a frozen dataclass of :func:`lmpo.config.option` fields::

    episode        window, episode length, start positions, illegal action ends the episode
    corpus         the chapters the env loads itself (split, alphabet threshold, separator)
    compliance     the legal-action mask (run length, blacklist, whitelist fallback)
    coverage       reward 1: n-gram coverage of the aligned reference window (and its weight λ_cov)
    infonce        reward 2: the InfoNCE encoder, its training and its weight λ_nce (``InfoNCEConfig``, the
                   encoder's own config: no copy)
    lexical        the lexical bigram bonus and its lexicon
    garble         the garble penalty λ_gar
    illegal        the illegal-action penalty λ_ill
    normalisation  the EMA standardisation of cov and nce
    potential      potential-based shaping γΦ(s') − Φ(s)

The flat names of the earlier one-level config (``window_chars``, ``nce_tau``, ``lambda_cov``, …) stay valid in
YAML, on the command line (``--env.nce_tau 0.1``), as keyword arguments (``TextEnvConfig(nce_tau=0.1)``) and as
attributes: :data:`FLAT_NAMES` is their one table (:func:`lmpo.config.flat_aliases`). ``ngram_n`` sets the
n of both rewards, as it always did; ``coverage.ngram_n`` and ``infonce.ngram_n`` set one each.

This module imports no torch: the InfoNCE encoder (``lmpo.textagent.env.infonce``) does, when an env builds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmpo.config import ConfigError, check_fields, flat_aliases, option

START_MODES = ("random", "chapter_start")
SPLITS = ("train", "heldout", "all")


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(f"TextEnvConfig: {msg}")


@dataclass(frozen=True)
class EpisodeConfig:
    """The observation window and how an episode starts and ends."""

    window_chars: int = option(32, "m: history characters in the observation window (and the reference history "
                               "an episode starts with); at most 4,096 (the replay buffers store a window per "
                               "transition).", ge=1, le=4096)
    max_steps: int = option(64, "T: steps before the episode is truncated.", ge=1)
    start: str = option("random", "'random': uniform over every (chapter, position) with a full m-character "
                        "history; 'chapter_start': a random chapter at position m.", choices=START_MODES)
    illegal_done: bool = option(True, "An action outside the legal mask ends the episode (terminated) with reward "
                                "−λ_ill only.")

    def __post_init__(self) -> None:
        _need(self.start in START_MODES, f"start={self.start!r} must be 'random' or 'chapter_start'")


@dataclass(frozen=True)
class CorpusConfig:
    """The chapters the env loads itself when it is given ``text`` (or nothing: the bundled sample)."""

    split: str = option("train", "Which chapters the env plays when it loads ``text``: 'train', 'heldout' or "
                        "'all'.", choices=SPLITS)
    heldout_fraction: float = option(0.2, "Share of chapters held out when the env loads ``text``.", ge=0, lt=1)
    split_seed: int = option(0, "Seed of the train / held-out chapter split.", ge=0)
    min_count: int = option(1, "Alphabet: minimum training count of a character.", ge=1)
    separator: str | None = option(None, "Chapter separator for text files (None: blank-line headings; see "
                                   "``lmpo.textagent.env.corpus``).")

    def __post_init__(self) -> None:
        _need(self.split in SPLITS, f"split={self.split!r} must be 'train', 'heldout' or 'all'")


@dataclass(frozen=True)
class ComplianceConfig:
    """The legal-action mask: run length, blacklist and the whitelist it falls back to."""

    max_run_chars: int = option(3, "Longest run of one repeated character the mask allows.", ge=1)
    blacklist: tuple[str, ...] = option((), "Characters that are never legal actions.")
    blacklist_path: str | None = option(None, "File of blacklisted characters (re-read by ``reload_blacklist``).")
    whitelist_size: int = option(64, "Most frequent training characters that stay legal when every other "
                                 "character is masked.", ge=0)

    def __post_init__(self) -> None:
        _need(isinstance(self.blacklist, (tuple, list, frozenset, set, str)),
              f"blacklist must be a tuple of characters, got {type(self.blacklist).__name__}")


@dataclass(frozen=True)
class CoverageConfig:
    """Reward 1: n-gram coverage of the aligned reference window, weighted by λ_cov."""

    enabled: bool = option(True, "Reward 1 on: n-gram coverage of the aligned reference window.")
    ngram_n: int = option(3, "n of the coverage n-grams.", ge=1, le=6)
    window_chars: int = option(64, "W: the agent's last W characters are compared with the aligned reference "
                               "window (at least ``ngram_n``).", ge=1)
    weight: float = option(1.0, "λ_cov: weight of the coverage reward.")


@dataclass(frozen=True)
class InfoNCEConfig:
    """Reward 2: InfoNCE agreement of the history with the next reference n-gram — the encoder, its training
    and its weight λ_nce (``InfoNCEModel`` reads the encoder and training fields)."""

    enabled: bool = option(True, "Reward 2 on (in ``CharTextEnv``): InfoNCE agreement of the history with the "
                           "next reference n-gram.")
    weight: float = option(0.5, "λ_nce: weight of the InfoNCE reward in ``CharTextEnv``.")
    context_chars: int = option(8, "L: characters of the agent's recent window fed to the query encoder.", ge=1)
    ngram_n: int = option(3, "n: length of the reference n-gram encoded as the key.", ge=1, le=6)
    hidden_dim: int = option(64, "h: embedding / hidden width.", ge=1)
    embed_dim: int = option(32, "d: output (cosine) space width.", ge=1)
    tau: float = option(0.07, "τ: temperature of the cosine logits.", gt=0)
    momentum: float = option(0.99, "m: EMA momentum of the target encoder.", ge=0, lt=1)
    queue_size: int = option(64, "K: negative keys in the queue.", ge=1)
    lr: float = option(3e-3, "Adam learning rate of the encoder.", gt=0)
    pairs_per_step: int = option(128, "Reference (context, next n-gram) pairs per training step.", ge=1)
    pretrain_steps: int = option(300, "Training steps on the env's chapters when ``CharTextEnv`` builds the "
                                 "encoder (0: call ``train_encoder`` yourself).", ge=0)
    seed: int = option(0, "Seed of the encoder's initialisation and pair sampling.", ge=0)

    def __post_init__(self) -> None:
        for name in ("context_chars", "ngram_n", "hidden_dim", "embed_dim", "queue_size", "pairs_per_step"):
            if getattr(self, name) < 1:
                raise ConfigError(f"InfoNCEConfig.{name}={getattr(self, name)} must be >= 1")
        if self.tau <= 0:
            raise ConfigError(f"InfoNCEConfig.tau={self.tau} must be > 0")
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"InfoNCEConfig.momentum={self.momentum} must be in [0, 1)")


@dataclass(frozen=True)
class LexicalConfig:
    """The lexical bigram bonus: (previous reference character, action) in the lexicon L, and its lexicon."""

    enabled: bool = option(True, "Lexical bigram bonus on.")
    bigram_bonus: float = option(1.0, "λ_bigram: bonus when (previous reference character, action) is a lexicon "
                                 "bigram.")
    match_bonus: float = option(0.5, "Bonus when the bigram is not in the lexicon but the action equals the "
                                "target c_t.")
    target_bonus: float = option(0.0, "λ_target: bonus when the action equals the target c_t, on top of the "
                                 "lexicon bonus: ranks the reference character above the other lexicon hits.", ge=0)
    use_jieba: bool = option(True, "L includes jieba's two-character words and names (else only the reference "
                             "bigrams).")
    augment_with_reference: bool = option(True, "Add every bigram of the env's chapters to L; then the true next "
                                          "character always earns λ_bigram and the 0.5 fallback only applies to a "
                                          "lexicon without that bigram.")
    lexicon_dir: str | None = option(None, "Lexicon cache directory (default ``$LMPO_CACHE_DIR/lexicon`` or the "
                                     "user cache directory).")


@dataclass(frozen=True)
class GarbleConfig:
    """The penalty for rare (garble) characters, weighted by λ_gar."""

    enabled: bool = option(True, "Garble penalty on.")
    weight: float = option(0.1, "λ_gar: weight of the garble penalty.", ge=0)
    min_count: int = option(2, "Characters with a training count below this (and not punctuation) are garble.",
                            ge=0)


@dataclass(frozen=True)
class IllegalConfig:
    """The penalty for an action outside the legal mask, weighted by λ_ill."""

    enabled: bool = option(True, "Illegal-action penalty on.")
    weight: float = option(2.0, "λ_ill: weight of the illegal-action penalty.", ge=0)


@dataclass(frozen=True)
class NormalisationConfig:
    """The EMA standardisation N(·) of the coverage and InfoNCE rewards."""

    enabled: bool = option(True, "EMA standardisation of cov and nce (off: raw values enter the base reward).")
    beta: float = option(1e-3, "β of the EMA standardisation.", gt=0, le=1)
    eps: float = option(1e-8, "ε of the EMA standardisation.", gt=0)
    warmup: bool = option(True, "The EMA standardisation's first 1/β updates are a running average, so its "
                          "statistics are the sample's from the first step (off: they start from μ = 0, σ² = 1 "
                          "and settle after about 1/β steps per environment).")


@dataclass(frozen=True)
class PotentialConfig:
    """Potential-based shaping γΦ(s') − Φ(s) with the bounded potential Φ(s) = κ·cov(s)."""

    coef: float = option(0.0, "κ of the bounded potential Φ(s) = κ·cov(s) ∈ [0, κ]; 0 turns shaping off.", ge=0)
    gamma: float = option(0.995, "γ of the potential shaping γΦ(s') − Φ(s).", gt=0, le=1)


#: the flat names of the one-level TextEnvConfig → the section field(s) each stands for (YAML, CLI, keywords,
#: attributes); ``ngram_n`` sets the n of both rewards
FLAT_NAMES: dict[str, str | tuple[str, ...]] = {
    # episode
    "window_chars": "episode.window_chars",
    "max_steps": "episode.max_steps",
    "start": "episode.start",
    "illegal_done": "episode.illegal_done",
    # corpus
    "split": "corpus.split",
    "heldout_fraction": "corpus.heldout_fraction",
    "split_seed": "corpus.split_seed",
    "min_count": "corpus.min_count",
    "separator": "corpus.separator",
    # compliance
    "max_run_chars": "compliance.max_run_chars",
    "blacklist": "compliance.blacklist",
    "blacklist_path": "compliance.blacklist_path",
    "whitelist_size": "compliance.whitelist_size",
    # coverage
    "use_coverage": "coverage.enabled",
    "ngram_n": ("coverage.ngram_n", "infonce.ngram_n"),
    "coverage_window_chars": "coverage.window_chars",
    "lambda_cov": "coverage.weight",
    # infonce
    "use_infonce": "infonce.enabled",
    "lambda_nce": "infonce.weight",
    "nce_context_chars": "infonce.context_chars",
    "nce_hidden_dim": "infonce.hidden_dim",
    "nce_embed_dim": "infonce.embed_dim",
    "nce_tau": "infonce.tau",
    "nce_momentum": "infonce.momentum",
    "nce_queue_size": "infonce.queue_size",
    "nce_lr": "infonce.lr",
    "nce_pairs_per_step": "infonce.pairs_per_step",
    "nce_pretrain_steps": "infonce.pretrain_steps",
    "nce_seed": "infonce.seed",
    # lexical
    "use_bigram_bonus": "lexical.enabled",
    "lambda_bigram": "lexical.bigram_bonus",
    "bigram_match_bonus": "lexical.match_bonus",
    "lambda_target": "lexical.target_bonus",
    "use_jieba_lexicon": "lexical.use_jieba",
    "augment_lexicon_with_reference": "lexical.augment_with_reference",
    "lexicon_dir": "lexical.lexicon_dir",
    # garble, illegal
    "use_garble": "garble.enabled",
    "lambda_gar": "garble.weight",
    "garble_min_count": "garble.min_count",
    "use_illegal_penalty": "illegal.enabled",
    "lambda_ill": "illegal.weight",
    # normalisation, potential
    "use_normalisation": "normalisation.enabled",
    "norm_beta": "normalisation.beta",
    "norm_eps": "normalisation.eps",
    "norm_warmup": "normalisation.warmup",
    "potential_coef": "potential.coef",
    "potential_gamma": "potential.gamma",
}


@flat_aliases(FLAT_NAMES)
@dataclass(frozen=True)
class TextEnvConfig:
    """Settings of the character environment ``CharTextEnv``, one section per concern.

    The flat names of the one-level config are accepted too (``env.nce_tau`` is ``env.infonce.tau``; table
    below). Defaults: docs/textenv.md.
    """

    episode: EpisodeConfig = option(EpisodeConfig(), "Observation window, episode length and start.")
    corpus: CorpusConfig = option(CorpusConfig(), "The chapters the env loads itself.")
    compliance: ComplianceConfig = option(ComplianceConfig(), "The legal-action mask.")
    coverage: CoverageConfig = option(CoverageConfig(), "Reward 1: n-gram coverage.")
    infonce: InfoNCEConfig = option(InfoNCEConfig(), "Reward 2: InfoNCE encoder, training and weight.")
    lexical: LexicalConfig = option(LexicalConfig(), "Lexical bigram bonus and its lexicon.")
    garble: GarbleConfig = option(GarbleConfig(), "Garble penalty.")
    illegal: IllegalConfig = option(IllegalConfig(), "Illegal-action penalty.")
    normalisation: NormalisationConfig = option(NormalisationConfig(), "EMA standardisation of cov and nce.")
    potential: PotentialConfig = option(PotentialConfig(), "Potential-based shaping.")

    def __post_init__(self) -> None:
        check_fields(self, "env")
        cov = self.coverage
        _need(cov.window_chars >= cov.ngram_n,
              f"coverage_window_chars={cov.window_chars} must be >= ngram_n={cov.ngram_n} (`coverage.window_chars` "
              "must hold one n-gram of `coverage.ngram_n` characters)")


EnvConfig = TextEnvConfig  # the name before 2026-11-28 (lmpo.trainer.config.EnvConfig is a GRPO run's env section), kept for scripts
