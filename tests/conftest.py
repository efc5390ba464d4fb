"""Suite-wide fixtures: no test writes to the user's cache directory (lexicon files, etc.)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _lmpo_cache_in_tmp(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("LMPO_CACHE_DIR", str(tmp_path_factory.mktemp("lmpo_cache")))
    yield
    mp.undo()
