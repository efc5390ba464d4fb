"""Held-out top-1 / top-3 of policies interpolated in weight space between the supervised twin and RL runs.

    python examples/sac/interpolate_twin.py --reference runs/twin --weights 0.5,0.7,0.9 RUN_DIR [RUN_DIR ...]

For each finished ``lmpo sac train`` run and each weight w, the policy θ = (1 − w)·θ_twin + w·θ_RL (every
parameter; Wortsman et al. 2022, "Robust fine-tuning of zero-shot models") is scored on the run's held-out
chapters with the gate's teacher-forced protocol. w = 0 is the twin, w = 1 the run's own final policy.
"""

from __future__ import annotations

import argparse

import torch

from lmpo.checkpoints import load_state
from lmpo.textagent.sac.agent import SACAgent
from lmpo.textagent.sac.config import config_from_dict, run_config_dict
from lmpo.textagent.sac.evaluate import agent_teacher_forced, heldout_positions
from lmpo.textagent.sac.train import make_text_envs, resume_checkpoint
from lmpo.textagent.sac.weights import load_reference_policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--reference", required=True, help="the `lmpo sac reference` run the RL runs started from")
    ap.add_argument("--weights", default="0,0.5,0.7,0.9,1", help="comma-separated w in [0, 1]")
    args = ap.parse_args()
    weights = [float(w) for w in args.weights.split(",")]
    torch.set_num_threads(1)
    cfg = config_from_dict(run_config_dict(args.run_dirs[0]))
    bundle = make_text_envs(cfg)  # every run must share this split and alphabet (load_reference_policy checks)
    twin = load_reference_policy(args.reference, bundle.alphabet)
    agent = SACAgent(bundle.num_actions, bundle.pad_id, cfg.net, cfg.sac, total_updates=cfg.max_updates)
    positions = heldout_positions(bundle.heldout_chapters, cfg.eval_max_positions)
    compliance = bundle.envs[0].compliance
    for run in args.run_dirs:
        rl = load_state(resume_checkpoint(run), "agent")["policy"]
        cells = []
        for w in weights:
            agent.policy.load_state_dict({k: (1 - w) * twin[k] + w * v if v.is_floating_point() else v
                                          for k, v in rl.items()})
            r = agent_teacher_forced(agent, bundle.alphabet, compliance, bundle.heldout_chapters, positions,
                                     bundle.window)
            cells.append(f"w={w:g}: {100 * r['top1']:.2f}% / {100 * r['top3']:.2f}%")
        print(f"{run}  " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
