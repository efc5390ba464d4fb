"""``lmpo sac train | reference | sample | gate`` — registered in ``lmpo.cli.SAC_COMMANDS``.

Overrides are ``--key value`` pairs after the known options, nested keys dotted:
``lmpo sac train --config configs/sac_cpu.yaml --seed 1 --sac.top_p 0.99 --env.window_chars 16``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from lmpo.errors import InputError, RunError
from lmpo.runs import read_json_object, stored_config_path
from lmpo.textagent.sac.config import (
    apply_overrides,
    config_from_dict,
    load_config,
    parse_cli_overrides,
    run_config_dict,
)


def _swallow_overrides(parser: argparse.ArgumentParser) -> None:
    """Let the sub-parser keep unknown ``--key value`` tokens as config overrides instead of failing."""
    original = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        ns, rest = original(args, namespace)
        ns.overrides = list(getattr(ns, "overrides", None) or []) + list(rest)
        return ns, []

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def register_train(subparsers: argparse._SubParsersAction, name: str) -> None:
    p = subparsers.add_parser(
        name, help="train the discrete SAC agent on a text corpus",
        description="Train discrete max-entropy SAC (top-p expected backups, CQL, BC, DAgger) on the "
        "character-level text environment. Any config field can be overridden with --key value "
        "(e.g. --seed 1 --sac.top_p 0.99 --replay.agent_fraction 0.5 --env.window_chars 16).",
    )
    p.add_argument("--config", help="YAML config file (default: the built-in CPU preset)")
    p.add_argument("--preset", default="cpu", choices=["cpu", "gpu"], help="preset under the config file")
    p.add_argument("--run-dir", default=None, help="output directory (default runs/sac-<time>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in RUN_DIR from its newest complete checkpoint (its stored config, plus "
                        "any overrides given)")
    p.add_argument("--overwrite", action="store_true", help="delete the run already in RUN_DIR and start again")
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: accept config changes beyond the stopping, logging, evaluation and "
                        "checkpoint keys")
    p.add_argument("--trace", type=int, default=None, metavar="N", help="print the trace of the first N steps")
    p.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation at the end")
    p.add_argument("--eval-only", action="store_true",
                   help="with --resume: evaluate the run's checkpoint and rewrite summary.json, no training")
    p.add_argument("--quiet", action="store_true", help="no console progress lines")
    p.set_defaults(func=_train)
    _swallow_overrides(p)


def _train(args: argparse.Namespace) -> int:
    from lmpo.textagent.sac.train import train

    if args.resume and not args.run_dir:
        raise InputError("--resume needs --run-dir RUN_DIR: the directory of the run to continue.")
    run_dir = args.run_dir or f"runs/sac-{time.strftime('%Y%m%d-%H%M%S')}"
    overrides = parse_cli_overrides(args.overrides)
    if args.resume and args.config is None and stored_config_path(run_dir) is not None:
        # the run's own config, with the overrides of this command line on top
        cfg = apply_overrides(config_from_dict(run_config_dict(run_dir)), overrides)
        cfg.validate()
    else:
        cfg = load_config(args.config, overrides, preset=args.preset)
    try:
        summary = train(cfg, run_dir, resume=args.resume, trace_steps=args.trace, progress=not args.quiet,
                        evaluate=not args.no_eval, eval_only=args.eval_only, overwrite=args.overwrite,
                        allow_config_change=args.allow_config_change)
    except FloatingPointError as e:  # the agent stopped a run that kept producing non-finite losses
        raise RunError(f"{e}. Checkpoints already written in {run_dir}/checkpoints are intact.") from None
    ev = summary.get("eval")
    print(f"[sac] {summary['updates']} updates, {summary['env_steps']} env steps in "
          f"{summary['train_seconds']:.0f}s ({summary['stop_reason']}); run dir {run_dir}")
    if ev:
        print(f"[sac] held-out top-1 {ev['agent']['top1']:.4f} top-3 {ev['agent']['top3']:.4f} | "
              f"{ev['baseline_order']}-gram baseline top-1 {ev['baseline']['top1']:.4f} top-3 {ev['baseline']['top3']:.4f}")
    return 0


def register_reference(subparsers: argparse._SubParsersAction, name: str) -> None:
    p = subparsers.add_parser(
        name, help="train the supervised twin of the SAC policy (the imitation reference)",
        description="Train the SAC policy network by cross-entropy on the same training text (corpus train "
        "chapters + extra_train_corpus), score it with the gate's held-out protocol, and save its weights "
        "(RUN_DIR/policy.safetensors) for `lmpo sac train --init_policy RUN_DIR`. Config and overrides as for "
        "`lmpo sac train`.",
    )
    p.add_argument("--config", help="YAML config file (default: the built-in CPU preset)")
    p.add_argument("--preset", default="cpu", choices=["cpu", "gpu"], help="preset under the config file")
    p.add_argument("--run-dir", required=True, help="output directory")
    p.add_argument("--overwrite", action="store_true", help="replace what RUN_DIR holds")
    p.add_argument("--steps", type=int, default=6000, help="optimizer steps (default 6000)")
    p.add_argument("--batch", type=int, default=256, help="windows per step (default 256)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (default 0.01)")
    p.add_argument("--eval-every", type=int, default=500, help="log held-out top-1 every N steps (default 500)")
    p.add_argument("--quiet", action="store_true", help="no console progress lines")
    p.set_defaults(func=_reference)
    _swallow_overrides(p)


def _reference(args: argparse.Namespace) -> int:
    from lmpo.textagent.sac.reference import train_reference

    for flag, value, low in (("--steps", args.steps, 1), ("--batch", args.batch, 1), ("--eval-every", args.eval_every, 1)):
        if value < low:
            raise InputError(f"{flag} {value}: must be ≥ {low}.")
    if not args.lr > 0 or args.weight_decay < 0:
        raise InputError(f"--lr {args.lr} must be > 0 and --weight-decay {args.weight_decay} ≥ 0.")
    cfg = load_config(args.config, parse_cli_overrides(args.overrides), preset=args.preset)
    s = train_reference(cfg, args.run_dir, steps=args.steps, batch=args.batch, lr=args.lr,
                        weight_decay=args.weight_decay, eval_every=args.eval_every, overwrite=args.overwrite,
                        progress=not args.quiet)
    ev = s["eval"]
    print(f"[reference] {s['steps']} steps in {s['train_seconds']:.0f}s; held-out top-1 {ev['agent']['top1']:.4f} "
          f"top-3 {ev['agent']['top3']:.4f} | {ev['baseline_order']}-gram baseline top-1 {ev['baseline']['top1']:.4f} "
          f"top-3 {ev['baseline']['top3']:.4f} | interpolation bound top-1 {ev['interpolation']['top1']:.4f}; "
          f"weights in {args.run_dir}/policy.safetensors")
    return 0


def register_sample(subparsers: argparse._SubParsersAction, name: str) -> None:
    p = subparsers.add_parser(name, help="generate text from a trained SAC run",
                              description="Continue PROMPT character by character with a trained policy.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory (or one of its checkpoints/step_* directories)")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-chars", type=int, default=64, help="characters to generate")
    p.add_argument("--greedy", action="store_true", help="argmax instead of sampling from π")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_sample)


def _sample(args: argparse.Namespace) -> int:
    from lmpo.textagent.sac.sample import generate

    text = generate(args.run_dir, args.prompt, args.max_new_chars, greedy=args.greedy, seed=args.seed)
    print(args.prompt + text)
    return 0


def register_gate(subparsers: argparse._SubParsersAction, name: str) -> None:
    p = subparsers.add_parser(
        name, help="quality gate: PASS/FAIL table over seeds, baseline and ablations",
        description="Judge finished runs (RUN_DIR…) or, with --train, train three seeds and the ablations "
        "(no BC / no top-p / fixed α) first. A `lmpo sac reference` run among RUN_DIRs gives the supervised-twin "
        "rows and ceilings. --heldout FILE re-scores the runs on FILE's chapters first. Writes gate.json and "
        "gate.md to --out.",
    )
    p.add_argument("run_dirs", nargs="*", metavar="RUN_DIR")
    p.add_argument("--train", action="store_true", help="train the seeds and ablations into --out first")
    p.add_argument("--config", default=None, help="config file for --train")
    p.add_argument("--out", default=None,
                   help="output directory (default: RUN_DIR/../gate of the first RUN_DIR, or "
                        "RUN_DIR/../gate_<FILE stem> with --heldout)")
    p.add_argument("--heldout", default=None, metavar="FILE",
                   help="score the finished runs on FILE's chapters (JSON list of {chapter, paragraphs}, a text "
                        "file or a directory) with the gate's protocol, then judge them")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds for --train")
    p.add_argument("--ablations", default="no_bc,no_top_p,fixed_alpha", help="comma-separated, or 'none'")
    p.add_argument("--parallel", type=int, default=2, help="training processes at a time")
    p.add_argument("--reference", default=None, metavar="DIR",
                   help="a finished `lmpo sac reference` run: judged as the supervised-twin reference, and with "
                        "--train every run starts from it (--init_policy DIR)")
    p.add_argument("--train-reference", action="store_true",
                   help="with --train: train the reference into OUT/reference first (same config and overrides), "
                        "then use it as --reference")
    p.add_argument("--reference-steps", type=int, default=6000, help="steps of --train-reference (default 6000)")
    p.set_defaults(func=_gate)
    _swallow_overrides(p)


def _gate(args: argparse.Namespace) -> int:
    from lmpo.textagent.sac.gate import ABLATIONS, run_gate, train_gate_runs

    run_dirs = list(args.run_dirs)
    reference = args.reference
    if args.train_reference and not args.train:
        raise InputError("--train-reference trains the reference before the gate's runs: it needs --train.")
    if args.reference and args.train_reference:
        raise InputError("give either --reference DIR (an existing reference run) or --train-reference, not both.")
    if reference is not None and not (Path(reference) / "summary.json").is_file():
        raise InputError(f"--reference {reference!r} holds no finished `lmpo sac reference` run (no summary.json); "
                         "train one with `lmpo sac reference --run-dir DIR` or use --train-reference.")
    if args.train:
        if not args.out:
            raise InputError("--train needs --out DIR: the directory its runs and reports go to.")
        try:
            seeds = [int(s) for s in args.seeds.split(",") if s]
        except ValueError:
            raise InputError(f"--seeds {args.seeds!r} must be comma-separated integers, e.g. 0,1,2.") from None
        abl = [] if args.ablations == "none" else [a for a in args.ablations.split(",") if a]
        unknown = [a for a in abl if a not in ABLATIONS]
        if unknown or not seeds:
            raise InputError(f"--ablations {args.ablations!r} / --seeds {args.seeds!r}: give at least one seed and "
                             f"ablations among {', '.join(ABLATIONS)} (or 'none').")
        if args.reference_steps < 1:
            raise InputError(f"--reference-steps {args.reference_steps}: must be ≥ 1.")
        overrides = list(args.overrides)
        if args.train_reference:
            reference = str(Path(args.out) / "reference")
            _train_reference_process(args.config, reference, args.reference_steps, overrides)
        if reference is not None:
            overrides += ["--init_policy", reference]
        run_dirs += [str(d) for d in train_gate_runs(args.config, args.out, seeds, abl, args.parallel, overrides)]
    elif args.overrides:
        raise InputError(f"unexpected arguments {' '.join(args.overrides)}: config overrides only apply with --train.")
    if reference is not None and reference not in run_dirs:
        run_dirs.append(reference)
    if not run_dirs:
        raise InputError("no finished runs to judge; give RUN_DIRs or --train --out DIR.")
    if args.heldout is not None and not Path(args.heldout).exists():
        raise InputError(f"--heldout {args.heldout!r}: no such file or directory; give a held-out text: a JSON list "
                         'of {"chapter": str, "paragraphs": [str, ...]} objects, a UTF-8 text file or a directory '
                         "of them.")
    _check_summaries(run_dirs)
    if args.heldout is not None:
        out = args.out or str(Path(run_dirs[0]).parent / f"gate_{Path(args.heldout).stem}")
    else:
        out = args.out or str(Path(run_dirs[0]).parent / "gate")
    result = run_gate(run_dirs, out, heldout=args.heldout)
    print(f"[gate] wrote {out}/gate.json and {out}/gate.md")
    print(json.dumps({"overall": result["overall"]}))
    return 0 if result["overall"] == "PASS" else 1


def _train_reference_process(config: str | None, run_dir: str, steps: int, overrides: list[str]) -> None:
    """``lmpo sac reference`` in a child process, as the gate trains its runs (its log in RUN_DIR/../reference.log)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "lmpo.cli", "sac", "reference", *(["--config", config] if config else []),
           "--run-dir", run_dir, "--overwrite", "--steps", str(steps), "--quiet", *overrides]
    Path(run_dir).parent.mkdir(parents=True, exist_ok=True)
    print("[gate] " + " ".join(cmd[2:]), flush=True)
    with open(Path(run_dir).parent / "reference.log", "w") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RunError(f"the reference run failed (exit {code}); see {Path(run_dir).parent / 'reference.log'}.")


def _check_summaries(run_dirs: list[str]) -> None:
    """Every run the gate judges has a readable summary.json (plain JSON), or one message names the file."""
    for d in run_dirs:
        path = Path(d) / "summary.json"
        if not path.is_file():
            raise InputError(f"{d}: no summary.json (the run did not finish); train it to the end or leave it out.")
        data = read_json_object(path, "a JSON summary",
                                "Re-create it with `lmpo sac train --resume --eval-only --run-dir RUN_DIR`.")
        if not isinstance(data.get("config"), dict):
            raise InputError(f"{path} is not a summary written by `lmpo sac train` (no config mapping).")
