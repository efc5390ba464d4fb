"""`loop.pack_sequences`: a packed run trains as the padded one (lmpo.generation.packing)."""

from __future__ import annotations

import pytest
from trainer_helpers import make_trainer


def test_a_packed_run_equals_a_padded_run(tmp_path):
    runs = {}
    for pack_sequences in (False, True):
        trainer = make_trainer(tmp_path / str(pack_sequences), loop={"pack_sequences": pack_sequences,
                                                                     "share_prompt_prefix": False, "steps": 2})
        runs[pack_sequences] = trainer.train().history
    for a, b in zip(runs[False], runs[True]):
        for key in ("loss/total", "optim/grad_norm", "entropy/mean", "reward/mean", "completion/length_mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
