"""``CharTextEnv``: the character-level text POMDP (docs/textenv.md), Gymnasium id ``lmpo/CharText-v0``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from lmpo.errors import InputError
from lmpo.textagent.env.alphabet import Alphabet
from lmpo.textagent.env.compliance import Compliance
from lmpo.textagent.env.config import TextEnvConfig
from lmpo.textagent.env.corpus import Corpus, load_corpus, load_sample_corpus
from lmpo.textagent.env.rewards import EmaStandardizer, NgramCoverage, ngram_keys

REWARD_KEYS = (
    "reward/cov",
    "reward/nce",
    "reward/cov_norm",
    "reward/nce_norm",
    "reward/bonus",
    "reward/garble",
    "reward/illegal",
    "reward/base",
    "reward/potential",
    "reward/soft",
)


def _chars(blacklist) -> frozenset[str]:
    out = set()
    for item in blacklist:
        out.update(item)
    return frozenset(out)


class CharTextEnv(gym.Env):
    """Character-level text continuation as a POMDP.

    ## Description
    The agent writes a chapter of a reference text one character at a time. An episode starts at a
    position of a chapter with the preceding m reference characters as its history; at step t the
    reference character ``c_t`` is the target. The agent sees only its own history (no reference
    characters ahead of the current step); the reference enters rewards, ``info`` and logs only.

    ## Action Space
    ``Discrete(A)``, A = ``len(alphabet)``: an id of the alphabet Σ (``<eos>`` ends the episode; ``<pad>`` and
    ``<unk>`` are never legal). The legal set is ``obs["legal_mask"]`` / ``action_masks()``.

    ## Observation Space
    ``Dict(window=Box(0, A-1, (m,), int64), legal_mask=MultiBinary(A) int8)``: the last m history ids,
    left-padded with ``<pad>`` (0), and the legal mask of the next action.

    ## Rewards
    ``r = λ_cov·N(cov) + λ_nce·N(nce) − λ_gar·garble − λ_ill·ill + bonus + potential``, reported in ``info``
    as ``reward/base`` (the first four terms), ``reward/soft`` (the lexical bigram bonus) and
    ``reward/potential`` (γΦ(s')−Φ(s)); formulas and defaults in ``docs/textenv.md``. An illegal action with
    ``illegal_done`` gives exactly ``−λ_ill``.

    ## Starting State
    ``reset(seed=…)``: a (chapter, position p ≥ m) drawn with ``self.np_random`` (``start='random'``) or
    position m of a random chapter (``'chapter_start'``); ``options={"chapter": i, "position": p}``
    chooses it (p ≥ 0; a history shorter than m is left-padded). A reset with a seed also restores the
    reward normaliser statistics and the InfoNCE negative queue, so a seeded episode is reproducible;
    a reset without a seed keeps running statistics.

    ## Episode End
    terminated: the agent emits ``<eos>``, the chapter's end is reached (the last target is ``<eos>``), or
    an illegal action with ``illegal_done``. truncated: ``max_steps`` steps taken without termination.

    ## Teacher override (DAgger hook)
    ``set_teacher(True)``: every following ``step(action)`` advances the history with ``c_t`` instead of
    the action, scores the rewards for ``c_t``, and reports ``info["is_teacher"] = True``,
    ``info["teacher_action"] = c_t``, ``info["agent_action"] = action``. Mask conflict: if ``c_t`` is not
    in the current legal mask (the run-length rule, a blacklisted or out-of-alphabet ``<unk>`` target),
    the environment still accepts it — the teacher is the reference — with no illegal penalty and no
    early stop, and reports ``info["mask_conflict"] = True``; the agent side decides to reject or relabel
    the demonstration.

    ## Arguments
    ``CharTextEnv(chapters=None, alphabet=None, config=TextEnvConfig(), *, text=None, lexicon=None,
    encoder=None, render_mode=None)``. ``chapters``: chapter texts or a ``Corpus``; if None, ``text`` (a
    path, list of paths or directory; default the bundled sample) is loaded and split by the config.
    ``alphabet``: default built from the chapters. ``gymnasium.make("lmpo/CharText-v0", text=…,
    config=TextEnvConfig(…))`` passes the same arguments.

    ## Version History
    - v0: first version.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        chapters: Sequence[str] | Corpus | None = None,
        alphabet: Alphabet | None = None,
        config: TextEnvConfig | None = None,
        *,
        text: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
        lexicon=None,
        encoder=None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__()
        cfg = config if config is not None else TextEnvConfig()
        self.config = cfg
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r}; supported: {self.metadata['render_modes']}")
        self.render_mode = render_mode
        source = "chapters"
        if chapters is None:
            corpus = load_corpus(text, cfg.corpus.separator) if text is not None else load_sample_corpus()
            source = str(text) if text is not None else "bundled sample text"
            train, heldout = corpus.split(cfg.corpus.heldout_fraction, cfg.corpus.split_seed)
            if alphabet is None:
                alphabet = Alphabet.from_texts(train, cfg.corpus.min_count)
            chapters = {"train": train, "heldout": heldout, "all": list(corpus.chapters)}[cfg.corpus.split]
        elif isinstance(chapters, Corpus):
            source = ", ".join(sorted(set(chapters.sources)))
            chapters = list(chapters.chapters)
        bad = [type(c).__name__ for c in chapters if not isinstance(c, str)]
        if bad:
            raise TypeError(f"CharTextEnv: chapters must be strings, got {bad[0]}; pass texts or a Corpus")
        chapters = list(chapters)
        if not chapters or not any(chapters):
            raise InputError(f"CharTextEnv: no chapters with text ({source}); bring a non-empty corpus")
        if alphabet is None:
            alphabet = Alphabet.from_texts(chapters, cfg.corpus.min_count)
        self.alphabet = alphabet
        self.chapters = list(chapters)
        A, m = len(alphabet), cfg.episode.window_chars
        self.num_actions = A

        # chapters long enough for a full history + one target; positions p in [m, len-1]
        lengths = np.array([len(c) for c in self.chapters])
        self._valid_starts = np.maximum(lengths - m, 0)
        if self._valid_starts.sum() == 0:
            raise InputError(
                f"CharTextEnv: window_chars={m} is longer than every chapter of {source} (longest: "
                f"{int(lengths.max())} characters; an episode needs m + 1); lower window_chars or bring longer chapters"
            )
        self._start_cum = np.cumsum(self._valid_starts)
        self._ref: list[list[int] | None] = [None] * len(self.chapters)
        self._ref_keys: list[list[int] | None] = [None] * len(self.chapters)

        cc = cfg.compliance
        self.compliance = Compliance(
            alphabet, cc.max_run_chars, _chars(cc.blacklist), cc.blacklist_path, cc.whitelist_size
        )
        # the whitelist holds the class-acceptable characters (the blacklist alone falls back to it)
        if int(self.compliance.whitelist_mask[alphabet.num_special :].sum()) == 0:
            raise InputError(
                f"CharTextEnv: no legal characters in the alphabet of {source} (every character is a control, "
                "format, private-use or unassigned code point); check the corpus encoding"
            )
        self._garble = alphabet.garble_mask(cfg.garble.min_count)
        self._lexicon = None
        self._pairs: set[int] = set()
        if cfg.lexical.enabled:
            if lexicon is None:
                from lmpo.textagent.env.lexicon import load_lexicon

                refs = self.chapters if cfg.lexical.augment_with_reference else ()
                lexicon = load_lexicon(refs, cfg.lexical.lexicon_dir, use_dictionary=cfg.lexical.use_jieba)
            self._lexicon = lexicon
            self._pairs = lexicon.pair_ids(alphabet)

        self._coverage = NgramCoverage(cfg.coverage.ngram_n, cfg.coverage.window_chars, A)
        nc = cfg.normalisation
        self.norm_cov = EmaStandardizer(nc.beta, nc.eps, warmup=nc.warmup)
        self.norm_nce = EmaStandardizer(nc.beta, nc.eps, warmup=nc.warmup)
        self.encoder = None
        self._scorer = None
        if cfg.infonce.enabled:
            self._setup_infonce(encoder)

        self.action_space = spaces.Discrete(A)
        self.observation_space = spaces.Dict(
            {
                "window": spaces.Box(0, A - 1, shape=(m,), dtype=np.int64),
                "legal_mask": spaces.MultiBinary(A),
            }
        )
        self._teacher = False
        self._done = False
        self._y: list[int] | None = None
        self._last_info: dict[str, Any] | None = None

    # -- InfoNCE ------------------------------------------------------------------------------------------
    def _setup_infonce(self, encoder) -> None:
        from lmpo.textagent.env.infonce import InfoNCEModel, InfoNCEScorer

        nce = self.config.infonce
        if encoder is None:
            encoder = InfoNCEModel(len(self.alphabet), nce, pad_id=self.alphabet.pad_id)
        elif encoder.num_chars != len(self.alphabet):
            raise ValueError(
                f"encoder was built for {encoder.num_chars} characters but the alphabet has {len(self.alphabet)}; "
                "build the encoder with len(alphabet)"
            )
        self.encoder = encoder
        ids = [np.asarray(self._chapter_ref(i), dtype=np.int64) for i in range(len(self.chapters))]
        if nce.pretrain_steps and encoder.steps_trained == 0:
            encoder.train(ids, nce.pretrain_steps)
        self._scorer = InfoNCEScorer(encoder, ids)

    def train_encoder(self, steps: int, chapters: Sequence[str] | None = None) -> dict[str, float]:
        """Train the InfoNCE encoder ``steps`` steps on reference pairs (default: the env's chapters)."""
        if self.encoder is None:
            raise RuntimeError("train_encoder: InfoNCE is off (TextEnvConfig infonce.enabled, flat name use_infonce=False)")
        if chapters is None:
            ids = self._scorer.chapters_ids
        else:
            ids = [
                np.asarray(self.alphabet.encode(c) + [self.alphabet.eos_id], dtype=np.int64) for c in chapters
            ]
        stats = self.encoder.train(ids, steps)
        self._scorer.sync()
        return stats

    # -- helpers --------------------------------------------------------------------------------------------
    def _chapter_ref(self, i: int) -> list[int]:
        ref = self._ref[i]
        if ref is None:
            ref = self.alphabet.encode(self.chapters[i]) + [self.alphabet.eos_id]
            self._ref[i] = ref
        return ref

    def _chapter_ref_keys(self, i: int) -> list[int]:
        keys = self._ref_keys[i]
        if keys is None:
            keys = ngram_keys(self._chapter_ref(i), self.config.coverage.ngram_n, len(self.alphabet))
            self._ref_keys[i] = keys
        return keys

    def _obs(self) -> dict[str, np.ndarray]:
        m = self.config.episode.window_chars
        tail = self._y[-m:]
        win = np.zeros(m, dtype=np.int64)
        if tail:
            win[m - len(tail) :] = tail
        return {"window": win, "legal_mask": self._mask.astype(np.int8)}

    def _update_mask(self) -> None:
        self._mask, self._fallback = self.compliance.mask(self._y)

    # -- public API -----------------------------------------------------------------------------------------
    def action_masks(self) -> np.ndarray:
        """(A,) bool legal mask of the next action."""
        if self._y is None:
            raise RuntimeError("call reset() before action_masks()")
        return self._mask.copy()

    def set_teacher(self, on: bool) -> None:
        """Teacher override on/off for the following steps (see class docstring)."""
        self._teacher = bool(on)

    @property
    def teacher(self) -> bool:
        return self._teacher

    def teacher_action(self) -> int:
        """Id of the reference character ``c_t`` of the current step (may be ``<unk>`` / ``<eos>``)."""
        if self._y is None:
            raise RuntimeError("call reset() before teacher_action()")
        return self._ref_cur[self._p + self._t]

    def reload_blacklist(self) -> None:
        """Re-read ``TextEnvConfig.compliance.blacklist_path``; the new rules apply from the next mask on."""
        self.compliance.reload_blacklist()
        if self._y is not None:
            self._update_mask()

    @property
    def lexicon(self):
        return self._lexicon

    @property
    def history(self) -> str:
        """The current history as text (reference start + appended characters)."""
        return self.alphabet.decode(self._y or [])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        cfg = self.config
        m = cfg.episode.window_chars
        if seed is not None:
            self.norm_cov.reset()
            self.norm_nce.reset()
            if self._scorer is not None:
                self._scorer.reset_queue()
        if self._scorer is not None:
            self._scorer.sync()  # the encoder may be shared and trained elsewhere: take its latest weights
        options = options or {}
        if "chapter" in options:
            ci = int(options["chapter"])
            if not 0 <= ci < len(self.chapters):
                raise ValueError(f"options['chapter']={ci} out of range [0, {len(self.chapters)})")
            default_p = min(m, len(self.chapters[ci]) - 1)
            p = int(options.get("position", default_p))
            if not 0 <= p < len(self.chapters[ci]):
                raise ValueError(
                    f"options['position']={p} out of range [0, {len(self.chapters[ci])}) for chapter {ci}"
                )
        elif cfg.episode.start == "random":
            flat = int(self.np_random.integers(0, self._start_cum[-1]))
            ci = int(np.searchsorted(self._start_cum, flat, side="right"))
            before = int(self._start_cum[ci - 1]) if ci > 0 else 0
            p = m + flat - before
        else:
            valid = np.flatnonzero(self._valid_starts)
            ci = int(valid[self.np_random.integers(0, len(valid))])
            p = m
        ref = self._chapter_ref(ci)
        self._ci, self._p, self._t = ci, p, 0
        self._ref_cur = ref
        h0 = min(m, p)
        self._y = ref[p - h0 : p]
        self._h0 = h0
        self._coverage.start(self._chapter_ref_keys(ci), p - h0, h0)
        self._phi = 0.0
        self._done = False
        self._update_mask()
        self._last_info = None
        info = {"chapter": ci, "position": p, "mask_fallback": self._fallback, "is_teacher": self._teacher}
        return self._obs(), info

    def step(self, action):
        if self._y is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode has ended (terminated or truncated); call reset() before step()")
        a = int(action)
        A = self.num_actions
        if not 0 <= a < A:
            raise ValueError(f"action={action!r} is outside Discrete({A})")
        cfg = self.config
        alph = self.alphabet
        ref = self._ref_cur
        pos = self._p + self._t  # chapter position of the target c_t
        target = ref[pos]
        prev_ref = ref[pos - 1] if pos >= 1 else -1
        teacher = self._teacher
        played = target if teacher else a
        legal = bool(self._mask[played])
        illegal = (not legal) and not teacher
        info: dict[str, Any] = {
            "step": self._t + 1,
            "chapter": self._ci,
            "position": pos,
            "is_teacher": teacher,
            "teacher_action": target,
            "agent_action": a,
            "action": played,
            "target_char": alph.chars[target],
            "prev_char": alph.chars[prev_ref] if prev_ref >= 0 else "",
            "action_char": alph.chars[played],
            "is_illegal": illegal,
            "mask_conflict": teacher and not legal,
            "mask_fallback": self._fallback,
        }
        if illegal and cfg.episode.illegal_done:
            r_ill = cfg.illegal.weight if cfg.illegal.enabled else 0.0
            for k in REWARD_KEYS:
                info[k] = 0.0
            info["reward/illegal"] = 1.0
            info["reward/base"] = -r_ill
            info["is_eos"] = False
            info["history_tail"] = alph.decode(self._y[-8:])
            self._last_info = info
            self._done = True
            return self._obs(), -r_ill, True, False, info

        self._y.append(played)
        self._t += 1
        y = self._y
        terminated = played == alph.eos_id or target == alph.eos_id
        truncated = (not terminated) and self._t >= cfg.episode.max_steps

        cov = self._coverage.push(y) if cfg.coverage.enabled else 0.0
        nce = self._scorer.score(y, self._ci, pos) if cfg.infonce.enabled else 0.0
        if cfg.normalisation.enabled:
            cov_n = self.norm_cov.update(cov) if cfg.coverage.enabled else 0.0
            nce_n = self.norm_nce.update(nce) if cfg.infonce.enabled else 0.0
        else:
            cov_n, nce_n = cov, nce
        bonus = 0.0
        if cfg.lexical.enabled:
            if prev_ref >= 0 and prev_ref * A + played in self._pairs:
                bonus = cfg.lexical.bigram_bonus
            elif played == target:
                bonus = cfg.lexical.match_bonus
        if played == target:
            bonus += cfg.lexical.target_bonus
        garble = float(self._garble[played]) if cfg.garble.enabled else 0.0
        ill = 1.0 if (illegal and cfg.illegal.enabled) else 0.0
        base = (
            cfg.coverage.weight * cov_n + cfg.infonce.weight * nce_n - cfg.garble.weight * garble - cfg.illegal.weight * ill
        )
        potential = 0.0
        if cfg.potential.coef > 0.0:
            phi_next = 0.0 if terminated else cfg.potential.coef * self._coverage.value
            potential = cfg.potential.gamma * phi_next - self._phi
            self._phi = phi_next
        reward = base + potential + bonus

        self._done = terminated or truncated
        self._update_mask()
        info.update(
            {
                "reward/cov": cov,
                "reward/nce": nce,
                "reward/cov_norm": cov_n,
                "reward/nce_norm": nce_n,
                "reward/bonus": bonus,
                "reward/garble": garble,
                "reward/illegal": 1.0 if illegal else 0.0,
                "reward/base": base,
                "reward/potential": potential,
                "reward/soft": bonus,
                "is_eos": played == alph.eos_id,
                "history_tail": alph.decode(y[-8:]),
            }
        )
        self._last_info = info
        return self._obs(), float(reward), terminated, truncated, info

    def render(self):
        if self.render_mode == "ansi":
            if self._last_info is None:
                return f'reset | history="…{self.alphabet.decode(self._y[-8:] if self._y else [])}"'
            return format_trace(self._last_info, reward=None)
        return None

    # -- checkpointing --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The env's mutable state as plain data: RNG, episode, coverage counters, normalisers, InfoNCE queue.

        The chapters, alphabet, lexicon and InfoNCE encoder are not included: :meth:`load_state_dict` expects
        an env built the same way (same chapters, alphabet, config; the shared encoder restored first with
        ``InfoNCEModel.load_state_dict``), after which stepping continues exactly as in the original.
        """
        episode = None
        if self._y is not None:
            episode = {"chapter": self._ci, "position": self._p, "t": self._t, "y": list(self._y), "h0": self._h0,
                       "phi": self._phi, "last_info": self._last_info, "coverage": self._coverage.state_dict()}
        return {
            "np_random": None if self._np_random is None else self._np_random.bit_generator.state,
            "np_random_seed": self._np_random_seed, "teacher": self._teacher, "done": self._done,
            "episode": episode, "norm_cov": self.norm_cov.state_dict(), "norm_nce": self.norm_nce.state_dict(),
            "scorer": None if self._scorer is None else self._scorer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["np_random"] is not None:
            if self._np_random is None:
                self._np_random = np.random.Generator(np.random.PCG64())
            self._np_random.bit_generator.state = state["np_random"]
            self._np_random_seed = state["np_random_seed"]
        self._teacher, self._done = bool(state["teacher"]), bool(state["done"])
        self.norm_cov.load_state_dict(state["norm_cov"])
        self.norm_nce.load_state_dict(state["norm_nce"])
        ep = state["episode"]
        if ep is None:
            self._y = None
        else:
            ci = int(ep["chapter"])
            if not 0 <= ci < len(self.chapters):
                raise ValueError(f"saved episode is in chapter {ci} but this env has {len(self.chapters)}")
            self._ci, self._p, self._t, self._h0 = ci, int(ep["position"]), int(ep["t"]), int(ep["h0"])
            self._ref_cur = self._chapter_ref(ci)
            self._y = [int(v) for v in ep["y"]]
            self._phi, self._last_info = float(ep["phi"]), ep["last_info"]
            self._coverage.load_state_dict(ep["coverage"], self._chapter_ref_keys(ci))
            self._update_mask()
        if self._scorer is not None and state["scorer"] is not None:
            self._scorer.load_state_dict(state["scorer"])

    def normaliser_stats(self) -> dict[str, float]:
        """``norm/{cov,nce}_{mean,std}`` for logging (docs/textenv.md)."""
        return {
            "norm/cov_mean": self.norm_cov.mean,
            "norm/cov_std": self.norm_cov.std,
            "norm/nce_mean": self.norm_nce.mean,
            "norm/nce_std": self.norm_nce.std,
        }


def trace_line(step: int, prev: str, target: str, action_char: str, source: str, history: str, reward: float,
               base: float = 0.0, potential: float = 0.0, soft: float = 0.0) -> str:
    """One trace line (docs/textenv.md); the one format of the environment's and the SAC trainer's traces."""
    return (
        f'Step {step:02d} | prev="{prev}" target="{target}" bigram="{prev}{action_char}" source={source} '
        f'action="{action_char}" -> history="…{history}" reward={reward:.3f} '
        f"(base={base:+.3f}, potential={potential:+.3f}, soft={soft:+.3f})"
    )


def format_trace(info: dict[str, Any], reward: float | None = None) -> str:
    """One trace line (docs/textenv.md) from a step's ``info``; ``reward`` None: the sum of its three terms."""
    base, pot, soft = info["reward/base"], info["reward/potential"], info["reward/soft"]
    total = base + pot + soft if reward is None else reward
    return trace_line(info["step"], info["prev_char"], info["target_char"], info["action_char"],
                      "teacher" if info["is_teacher"] else "agent", info["history_tail"], total, base, pot, soft)


def make_env(text=None, config: TextEnvConfig | None = None, **kwargs) -> CharTextEnv:
    """Entry point of ``lmpo/CharText-v0``: ``CharTextEnv(text=text, config=config, **kwargs)``."""
    return CharTextEnv(text=text, config=config, **kwargs)
