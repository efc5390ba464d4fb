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


@pytest.fixture(autouse=True, scope="session")
def _rollout_workers_from_a_forkserver():
    """Async rollout workers start from a forkserver that imported lmpo once, not by spawn (the default): the
    suite starts dozens of workers, and each spawned one re-imports torch and transformers (~5 s of CPU).
    ``test_no_orphaned_worker`` runs a fresh interpreter, so the default spawn path stays tested."""
    from lmpo.generation import worker

    old, worker.START_METHOD = worker.START_METHOD, "forkserver"
    yield
    worker.START_METHOD = old


def pytest_collection_modifyitems(config, items):
    """The tests marked ``slow`` run first (in their collected order), the rest after them. ``make test``'s
    pytest-xdist workers each take a contiguous share of this order and steal from each other's tails, so the
    slow tests start early and the many short ones fill in around them: the run does not end on one core
    finishing a 40-second test while the other idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: order kept within each group


@pytest.fixture
def lmpo_envs_only(monkeypatch, request):
    """The environment registry as lmpo ships it, plus the test's own module's: ids that other test modules
    register when they are imported (tests/worker_env.py) are hidden, so that generated tables and messages listing
    every id match the docs whatever ran before in this process."""
    from lmpo.envs.base import ENVS

    for env_id, spec in list(ENVS.items()):
        module = getattr(spec.factory, "__module__", "")
        if not (module.startswith("lmpo.") or module == request.module.__name__):
            monkeypatch.delitem(ENVS, env_id)
