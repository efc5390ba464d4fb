"""Generation tests run on one CPU thread (tiny models; see `one_torch_thread` in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield
