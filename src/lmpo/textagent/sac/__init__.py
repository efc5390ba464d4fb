"""Discrete maximum-entropy SAC for the character-level text POMDP (docs/sac.md).

Layout: ``losses`` (pure loss functions), ``networks`` (encoder, policy, twin Q), ``replay`` (typed
samples, agent/demo buffers, ρ-mixing, DAgger schedule), ``config`` (frozen dataclasses and presets),
``agent`` (one update step), ``train`` (the loop), ``baseline`` (character n-gram model),
``evaluate`` / ``gate`` (held-out quality and the PASS/FAIL gate), ``sample`` and ``cli``.
"""

from lmpo.textagent.sac.config import (
    NetworkConfig,
    ReplayConfig,
    SACConfig,
    SACTrainConfig,
    TrainConfig,
    load_config,
)
from lmpo.textagent.sac.losses import TopPSet, masked_policy, top_p_set
from lmpo.textagent.sac.replay import ReplayBuffer, ReplaySample

__all__ = [
    "NetworkConfig", "ReplayConfig", "SACConfig", "SACTrainConfig", "TrainConfig", "load_config",
    "TopPSet", "masked_policy", "top_p_set", "ReplayBuffer", "ReplaySample",
]
