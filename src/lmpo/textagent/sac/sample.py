"""Generate text from a trained SAC checkpoint: ``lmpo sac sample RUN_DIR --prompt "子曰"``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lmpo.checkpoints import (
    CheckpointError,
    latest_valid_checkpoint,
    list_checkpoints,
    load_state,
    step_of,
    verify_checkpoint,
)
from lmpo.errors import InputError
from lmpo.textagent.sac.agent import SACAgent
from lmpo.textagent.sac.config import config_from_dict, run_config_dict


def load_agent(run_dir: str | Path):
    """Rebuild the agent, alphabet and compliance rules of a run from its ``config.yaml`` + newest checkpoint.

    ``run_dir`` may also be one checkpoint (``RUN_DIR/checkpoints/step_XXXXXXXX``). Only JSON and safetensors
    are read; the checkpoint is verified against its manifest first.
    """
    from lmpo.textagent.env import Compliance
    from lmpo.textagent.sac.train import text_split

    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise InputError(f"RUN_DIR {str(run_dir)!r} does not exist; pass the --run-dir of a `lmpo sac train` run.")
    checkpoint = None
    if step_of(run_dir) is not None:
        checkpoint, run_dir = run_dir, run_dir.parent.parent
    cfg = config_from_dict(run_config_dict(run_dir))
    if checkpoint is None:
        checkpoint = latest_valid_checkpoint(run_dir)
        if checkpoint is None:
            found = list_checkpoints(run_dir)
            if found:
                verify_checkpoint(found[-1])  # raises, naming what is wrong with the newest
            raise InputError(f"{str(run_dir)!r} has no checkpoint to sample from yet (the run stopped before its "
                             "first one); continue it with `lmpo sac train --resume --run-dir RUN_DIR`, or pass "
                             "another run.")
    verify_checkpoint(checkpoint)
    alphabet = text_split(cfg).alphabet
    env_cfg = cfg.env_config()
    cc = env_cfg.compliance
    compliance = Compliance(alphabet, cc.max_run_chars, frozenset("".join(cc.blacklist)),
                            cc.blacklist_path, cc.whitelist_size)
    agent = SACAgent(len(alphabet), alphabet.pad_id, cfg.net, cfg.sac, seed=cfg.seed, device="cpu")
    try:
        agent.load_state_dict(load_state(checkpoint, "agent"))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{checkpoint}: the agent state does not fit the run's config ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:200]}).") from None
    return agent, alphabet, compliance, env_cfg.episode.window_chars


def generate(run_dir: str | Path, prompt: str, num_chars: int = 64, greedy: bool = False, seed: int = 0) -> str:
    agent, alphabet, compliance, m = load_agent(run_dir)
    agent.gen.manual_seed(seed)
    ids = alphabet.encode(prompt)
    out: list[int] = []
    for _ in range(num_chars):
        hist = ids + out
        tail = hist[-m:]
        win = np.full((1, m), alphabet.pad_id, dtype=np.int64)
        if tail:
            win[0, m - len(tail):] = tail
        mask = compliance.mask(hist)[0].astype(bool)[None]
        a, _ = agent.act(win, mask, greedy=greedy)
        if int(a[0]) == alphabet.eos_id:
            break
        out.append(int(a[0]))
    return alphabet.decode(out)
