"""Shared fixtures of the text-environment tests (the lexicon cache is redirected by tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def sample_chapters():
    from lmpo.textagent.env import load_sample_corpus

    return list(load_sample_corpus().chapters)


@pytest.fixture(scope="session")
def trained_encoder_env():
    """One environment on the whole sample text with an InfoNCE encoder trained 300 steps (≈1 s).

    Shuffled continuations may repeat a character, so the run rule is relaxed and illegal actions do not stop.
    """
    from lmpo.textagent.env import CharTextEnv, EnvConfig

    cfg = EnvConfig(split="all", nce_pretrain_steps=300, max_run_chars=1000, illegal_done=False)
    return CharTextEnv(config=cfg)
