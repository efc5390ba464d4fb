"""Tiny models in this layer run on one torch thread (see ``one_torch_thread`` in the suite's conftest)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield
