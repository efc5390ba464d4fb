"""`lmpo sac train` ends with its plots, which `lmpo plot` draws from the same metrics."""

from __future__ import annotations

import numpy as np
from sac_echo_env import EchoEnv

from lmpo.textagent.sac.config import TrainConfig, apply_overrides
from lmpo.textagent.sac.train import EnvBundle, train


def test_a_sac_run_writes_its_plots(tmp_path):
    A = 8
    bundle = EnvBundle(envs=[EchoEnv(A) for _ in range(2)], num_actions=A, pad_id=0, eos_id=1, window=3,
                       decode=lambda ids: "".join(chr(0x4e00 + i) for i in ids),
                       code_points=np.array([-1, -1, -1] + [0x4e00 + i for i in range(3, A)]))
    cfg = apply_overrides(TrainConfig(), {
        "num_envs": 2, "learning_starts": 32, "log_every_updates": 10, "checkpoint_every_updates": 0, "threads": 1,
        "net": {"embed_dim": 8, "gru_hidden": 16, "policy_hidden": 16, "q_hidden": 16, "action_embed_dim": 8},
        "sac": {"top_p_k_max": 4}, "replay": {"transitions_per_batch": 16},
    })
    train(cfg, tmp_path, bundle=bundle, progress=False, max_updates=30)
    written = sorted(p.name for p in (tmp_path / "plots").iterdir())
    # no held-out chapters in the echo environment: no held-out top-1 panel
    assert written == ["alpha.png", "coverage.png", "critic_loss.png", "entropy.png", "reward.png"]
