"""Shared fixtures: every test writes the lexicon cache under a temporary directory, never the user's."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _lexicon_cache_in_tmp(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("LMPO_CACHE_DIR", str(tmp_path_factory.mktemp("lmpo_cache")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def sample_chapters():
    from lmpo.textenv import load_sample_corpus

    return list(load_sample_corpus().chapters)


@pytest.fixture(scope="session")
def trained_encoder_env():
    """One environment on the whole sample text with an InfoNCE encoder trained 300 steps (≈1 s).

    Shuffled continuations may repeat a character, so the run rule is relaxed and illegal actions do not stop.
    """
    from lmpo.textenv import CharTextEnv, EnvConfig

    cfg = EnvConfig(split="all", nce_pretrain_steps=300, max_run_chars=1000, illegal_done=False)
    return CharTextEnv(config=cfg)
