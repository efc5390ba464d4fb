"""Character-level text POMDP (docs/textenv.md): corpus, alphabet, compliance, rewards, lexicon, env.

Importing this package registers the Gymnasium id ``lmpo/CharText-v0``::

    import gymnasium as gym
    import lmpo.textagent.env
    env = gym.make("lmpo/CharText-v0", text="my_corpus.txt")
"""

from __future__ import annotations

import gymnasium as gym

from lmpo.textagent.env.alphabet import Alphabet
from lmpo.textagent.env.compliance import Compliance, char_class_ok
from lmpo.textagent.env.config import EnvConfig, TextEnvConfig
from lmpo.textagent.env.corpus import Corpus, CorpusError, load_corpus, load_sample_corpus, sample_text_path
from lmpo.textagent.env.env import REWARD_KEYS, CharTextEnv, format_trace, make_env, trace_line
from lmpo.textagent.env.rewards import EmaStandardizer, NgramCoverage, coverage_from_scratch

ENV_ID = "lmpo/CharText-v0"

if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="lmpo.textagent.env.env:make_env")

__all__ = [
    "ENV_ID",
    "REWARD_KEYS",
    "Alphabet",
    "CharTextEnv",
    "Compliance",
    "Corpus",
    "CorpusError",
    "EmaStandardizer",
    "EnvConfig",
    "TextEnvConfig",
    "NgramCoverage",
    "char_class_ok",
    "coverage_from_scratch",
    "format_trace",
    "load_corpus",
    "load_sample_corpus",
    "make_env",
    "sample_text_path",
    "trace_line",
]
