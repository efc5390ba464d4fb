"""RLVCR tests run on one CPU thread: the models are tiny, and on a shared 2-core CI machine OpenMP threads
that wait on each other are far slower than one thread."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
