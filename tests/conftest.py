"""Suite-wide fixtures: no test writes to the user's cache directory (lexicon files, etc.)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _lmpo_cache_in_tmp(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("LMPO_CACHE_DIR", str(tmp_path_factory.mktemp("lmpo_cache")))
    yield
    mp.undo()


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test: on a shared 2-core CI machine, OpenMP threads that wait on each other are
    far slower than one thread for tiny models. Layers with tiny models make it autouse in their conftest."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
