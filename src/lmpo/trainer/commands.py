"""``lmpo train``, ``lmpo demo`` and ``lmpo plot``: argparse sub-commands registered by ``lmpo.cli``.

The commands' imports sit inside their functions on purpose: ``lmpo --help`` imports this module to build its
parser, and must not pay for torch, the trainer and the models (``lmpo.cli``'s docstring).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


class _OverridesParser(argparse.ArgumentParser):
    """A sub-parser that sets aside dotted ``--section.key value`` overrides before argparse sees them.

    Config overrides are open-ended (every field of every section), so they cannot be declared as options;
    ``lmpo.cli`` builds the sub-parser, and ``accept_overrides`` switches it to this class. Every token
    ``--a.b`` (or ``--a.b=v``) and the value after it go to ``namespace.overrides`` unparsed.
    """

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        rest: list[str] = []
        overrides: list[str] = []
        i = 0
        while i < len(args):
            tok = args[i]
            if tok.startswith("--") and "." in tok.split("=", 1)[0]:
                overrides.append(tok)
                if "=" not in tok and i + 1 < len(args):
                    overrides.append(args[i + 1])
                    i += 1
            else:
                rest.append(tok)
            i += 1
        ns, extras = super().parse_known_args(rest, namespace)
        ns.overrides = overrides
        return ns, extras


def accept_overrides(parser: argparse.ArgumentParser) -> None:
    parser.__class__ = _OverridesParser


def _presets_help() -> str:
    from lmpo.objectives import PRESETS

    return ", ".join(PRESETS)


def register_train(subparsers: argparse._SubParsersAction, name: str) -> None:
    p = subparsers.add_parser(
        name, help="train a causal LM with a GRPO-family objective from a YAML config",
        description="Train with a YAML config plus dotted overrides, e.g. "
                    "`lmpo train configs/addition_grpo.yaml --objective.preset dapo --optim.lr 1e-4`. "
                    "Config reference: docs/trainer.md. Objective presets: " + _presets_help() + ".",
    )
    p.add_argument("config", nargs="?", default=None, help="YAML config file (omit to use the defaults)")
    p.add_argument("--resume", nargs="?", const="auto", default=None, metavar="PATH",
                   help="continue from the newest complete checkpoint of the run directory (no value) or from "
                        "PATH (a checkpoint or run directory; without CONFIG, the run's stored config is used)")
    p.add_argument("--overwrite", action="store_true",
                   help="delete the run already in logging.run_dir and start again")
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: accept config changes beyond loop.steps, logging, eval and checkpoint keys")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--from-trl", default=None, metavar="FILE",
                   help="read a TRL GRPOConfig YAML first (CONFIG and overrides apply on top; it has no model or "
                        "data): print which keys were mapped, ignored or refused, then train")
    p.set_defaults(func=_run_train)
    accept_overrides(p)


def _run_train(args: argparse.Namespace) -> int:
    import yaml

    from lmpo.trainer.config import config_to_dict, load_config, validate_config

    config, stored_run = args.config, None
    if config is None and args.resume not in (None, "auto"):
        stored_run = _stored_run(args.resume)
        config = str(stored_run / "config.yaml") if stored_run is not None else None
    base = None
    if args.from_trl:
        from lmpo.config import read_yaml
        from lmpo.errors import InputError
        from lmpo.integrations.trl_names import translate_trl

        translation = translate_trl(read_yaml(args.from_trl, "TRL config"))
        print(translation.report())
        if translation.refused:
            raise InputError(f"--from-trl {args.from_trl}: lmpo cannot honour {', '.join(translation.refused)} (the "
                             "reasons are in the report above); remove these keys from the file or give them TRL's "
                             "default values.")
        base = translation.config
    cfg = load_config(config, overrides=list(args.overrides), base=base)
    if stored_run is not None:
        cfg = _as_stored_run(cfg, stored_run, args)
    validate_config(cfg, config)
    if args.print_config:
        print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        return 0
    from lmpo.trainer.run.loop import Trainer

    result = Trainer(cfg).train(resume=args.resume, overwrite=args.overwrite,
                                allow_config_change=args.allow_config_change)
    before = (result.eval_before or {}).get("eval/accuracy")
    after = (result.eval_after or {}).get("eval/accuracy")
    if after is not None:
        msg = f"held-out greedy accuracy: {after:.3f}"
        if before is not None:
            msg = f"held-out greedy accuracy: {before:.3f} -> {after:.3f}"
        print(msg)
    print(f"run directory: {result.run_dir}")
    return 0


def _stored_run(resume: str) -> Path | None:
    """The run directory that ``--resume PATH`` names (the run or one of its checkpoints) when it stored a config."""
    p = Path(resume)
    for candidate in (p, p.parent.parent):
        if (candidate / "config.yaml").is_file():
            return candidate
    return None


def _as_stored_run(cfg, run: Path, args: argparse.Namespace):
    """``lmpo train --resume RUN`` without CONFIG: the run's stored config, read as data. The run goes on in RUN (a
    copied or moved run directory writes to itself, not to the directory its config was first written for), and
    code the stored config names (a reward ``package.module:function``) is refused unless the command line names
    it too: a run directory never makes lmpo import anything."""
    from lmpo.config import parse_overrides
    from lmpo.errors import InputError
    from lmpo.trainer.config import code_references, config_to_dict, replace

    given = parse_overrides(list(args.overrides))
    mine = {key for key, _ in code_references(given)}
    for key, spec in code_references(config_to_dict(cfg)):
        if key not in mine:
            flag = key.split("[")[0]
            raise InputError(f"`{key}` = {spec!r} comes from {run / 'config.yaml'}, the stored config of the run "
                             "--resume continues, which lmpo reads as data: it imports no code a run directory names. "
                             "Give the config file you started the run with (`lmpo train CONFIG --resume "
                             f"{args.resume}`), or name the value yourself on the command line (--{flag} ...).")
    if "run_dir" not in (given.get("logging") or {}):
        cfg = replace(cfg, logging={"run_dir": str(run)})
    return cfg


def register_demo(subparsers: argparse._SubParsersAction, name: str) -> None:
    p = subparsers.add_parser(
        name, help="offline demo: tiny model, SFT warm-up then GRPO-family RL on addition (CPU, < 5 min)",
        description="Build the tiny model, warm it up briefly on addition, train it with RL and print held-out "
                    "greedy accuracy before and after RL. Extra `--section.key value` overrides apply to "
                    "configs/demo.yaml's settings (the embedded copy).",
    )
    p.add_argument("--run-dir", default="runs/demo",
                   help="run directory (default: runs/demo; a run already there is replaced)")
    p.add_argument("--seed", type=int, default=None, help="seed of data, sampling and initialisation")
    p.add_argument("--preset", default=None, help="objective preset (default: the demo's); one of " + _presets_help())
    p.set_defaults(func=_run_demo)
    accept_overrides(p)


def _run_demo(args: argparse.Namespace) -> int:
    from lmpo.trainer.demo import run_demo

    run_demo(run_dir=args.run_dir, seed=args.seed, preset=args.preset, overrides=list(args.overrides))
    return 0


def register_plot(subparsers: argparse._SubParsersAction, name: str) -> None:
    p = subparsers.add_parser(name, help="draw the training curves of runs (lmpo train or lmpo sac train) to PNG",
                              description="Plot the metrics.jsonl of one or more run directories, overlaid: "
                                          "reward, accuracy, entropy, clip fraction, KL, length and gradient norm "
                                          "of `lmpo train` runs; α, entropy, critic loss, top-p coverage, held-out "
                                          "top-1 and reward of `lmpo sac train` runs.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", default=None, help="output directory (default: FIRST_RUN_DIR/plots)")
    p.set_defaults(func=_run_plot)


def _run_plot(args: argparse.Namespace) -> int:
    from lmpo.plots import plot_runs

    paths = plot_runs(args.run_dirs, args.out)
    for p in paths:
        print(p)
    return 0
