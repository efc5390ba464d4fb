"""The ``lmpo`` command line.

Each subcommand lives beside the code it drives; this file only routes. A command is listed here as
``name -> "module:register"`` where ``register(subparsers, name)`` adds an ``argparse`` sub-parser whose
``func`` default runs it. Commands are imported lazily so that ``lmpo --help`` stays fast and a missing
optional dependency only affects its own command.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: top-level commands: name -> "module:register function"
COMMANDS: dict[str, str] = {
    "train": "lmpo.trainer.cli:register_train",
    "demo": "lmpo.trainer.cli:register_demo",
    "plot": "lmpo.trainer.cli:register_plot",
    "lab": "lmpo.lab.cli:register_lab",
}

#: ``lmpo sac <command>``: the text environment and SAC agent
SAC_COMMANDS: dict[str, str] = {
    "train": "lmpo.sac.cli:register_train",
    "sample": "lmpo.sac.cli:register_sample",
    "gate": "lmpo.sac.cli:register_gate",
    "build-lexicon": "lmpo.textenv.cli:register_build_lexicon",
    "env-demo": "lmpo.textenv.cli:register_env_demo",
}


def _add(subparsers: argparse._SubParsersAction, name: str, target: str) -> None:
    module_name, func_name = target.split(":")
    register = getattr(importlib.import_module(module_name), func_name)
    register(subparsers, name)


def build_parser() -> argparse.ArgumentParser:
    from lmpo import __version__

    parser = argparse.ArgumentParser(
        prog="lmpo",
        description="Language-model policy optimisation: GRPO-family objectives, trainer, engines, text SAC.",
    )
    parser.add_argument("--version", action="version", version=f"lmpo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, target in COMMANDS.items():
        _add(sub, name, target)
    if SAC_COMMANDS:
        sac = sub.add_parser("sac", help="character-level text environment and discrete SAC agent")
        sac_sub = sac.add_subparsers(dest="sac_command", metavar="SAC_COMMAND")
        for name, target in SAC_COMMANDS.items():
            _add(sac_sub, name, target)
        sac.set_defaults(func=lambda args: (sac.print_help(), 2)[1])
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
