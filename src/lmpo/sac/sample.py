"""Generate text from a trained SAC checkpoint: ``lmpo sac sample RUN_DIR --prompt "子曰"``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from lmpo.sac.agent import SACAgent
from lmpo.sac.config import config_from_dict


def load_agent(run_dir: str | Path):
    """Rebuild the agent, alphabet and compliance rules of a run from its ``config.json`` + checkpoint."""
    from lmpo.textenv import Alphabet, Compliance, load_corpus
    from lmpo.textenv.bundled import resolve_corpus

    run_dir = Path(run_dir)
    if run_dir.is_file():
        run_dir = run_dir.parent
    if not (run_dir / "checkpoint.pt").exists():
        raise FileNotFoundError(f"{run_dir}: no checkpoint.pt; pass the run directory written by `lmpo sac train`")
    cfg = config_from_dict(json.loads((run_dir / "config.json").read_text(encoding="utf-8")))
    corpus = load_corpus(resolve_corpus(cfg.corpus))
    train_ch, _ = corpus.split(heldout_fraction=cfg.heldout_fraction, seed=cfg.split_seed)
    alphabet = Alphabet.from_texts(train_ch)
    env_cfg = cfg.env_config()
    compliance = Compliance(alphabet, env_cfg.max_run_chars, frozenset("".join(env_cfg.blacklist)),
                            env_cfg.blacklist_path, env_cfg.whitelist_size)
    agent = SACAgent(len(alphabet), alphabet.pad_id, cfg.net, cfg.sac, seed=cfg.seed, device="cpu")
    state = torch.load(run_dir / "checkpoint.pt", weights_only=False, map_location="cpu")
    agent.load_state_dict(state["agent"])
    return agent, alphabet, compliance, env_cfg.window_chars


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
