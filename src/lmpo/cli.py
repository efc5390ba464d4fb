"""The ``lmpo`` command line.

Each subcommand lives beside the code it drives; this file only routes. A command is listed here as
``name -> "module:register"`` where ``register(subparsers, name)`` adds an ``argparse`` sub-parser whose
``func`` default runs it. Commands are imported lazily so that ``lmpo --help`` stays fast and a missing
optional dependency only affects its own command.

Every command reports failures in one style (:func:`main`): one paragraph on stderr naming the input, its
value and the fix, exit status 2 for bad input (:class:`lmpo.errors.InputError`), 1 for a run that failed
(:class:`lmpo.errors.RunError` or an unexpected error), 130 for Ctrl-C, and no traceback unless ``--debug``
(anywhere on the command line) or ``LMPO_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys

#: top-level commands: name -> "module:register function"
COMMANDS: dict[str, str] = {
    "train": "lmpo.trainer.commands:register_train",
    "demo": "lmpo.trainer.commands:register_demo",
    "plot": "lmpo.trainer.commands:register_plot",
    "eval": "lmpo.eval.command:register_eval",
    "export": "lmpo.trainer.run.export:register_export",
    "show": "lmpo.trainer.run.completions:register_show",
    "lab": "lmpo.lab.cli:register_lab",
}

#: ``lmpo sac <command>``: the text environment and SAC agent
SAC_COMMANDS: dict[str, str] = {
    "train": "lmpo.textagent.sac.cli:register_train",
    "reference": "lmpo.textagent.sac.cli:register_reference",
    "sample": "lmpo.textagent.sac.cli:register_sample",
    "gate": "lmpo.textagent.sac.cli:register_gate",
    "build-lexicon": "lmpo.textagent.env.cli:register_build_lexicon",
    "env-demo": "lmpo.textagent.env.cli:register_env_demo",
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


#: commands whose runs continue with ``--resume``
RESUMABLE_COMMANDS = ("lmpo train", "lmpo sac train")


def _command_name(argv: list[str]) -> str:
    words = [a for a in argv if not a.startswith("-")][:2]
    if words[:1] == ["sac"]:
        return "lmpo " + " ".join(words)
    return "lmpo " + words[0] if words else "lmpo"


def resume_command(argv: list[str]) -> str:
    """The command line that continues a stopped run: the same one with ``--resume`` (not ``--overwrite``)."""
    kept = [a for a in argv if a not in ("--overwrite", "--resume", "--debug")]
    return "lmpo " + shlex.join(kept + ["--resume"])


def _one_paragraph(text: str) -> str:
    return " ".join(text.split())


def main(argv: list[str] | None = None) -> int:
    from lmpo.errors import Interrupted, LmpoError

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("LMPO_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    name = _command_name(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except Interrupted as e:
        if debug:
            raise
        resumable = e.checkpoint is not None and name in RESUMABLE_COMMANDS
        hint = f" Continue with: {resume_command(argv)}" if resumable else ""
        print(f"{name}: {_one_paragraph(str(e))}{hint}", file=sys.stderr)
        return e.exit_code
    except LmpoError as e:
        if debug:
            raise
        print(f"{name}: {_one_paragraph(str(e))}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        if debug:
            raise
        hint = (f" Continue from the run's last checkpoint, if it has one, with: {resume_command(argv)}"
                if name in RESUMABLE_COMMANDS else "")
        print(f"{name}: interrupted.{hint}", file=sys.stderr)
        return 130
    except SystemExit as e:  # only code a command runs raises it (argparse has finished): never a silent exit 0
        if debug:
            raise
        print(f"{name}: stopped by SystemExit({e.code!r}) raised inside the command: code it ran (a reward function "
              "or a module named in the config) called sys.exit() or exit(). The run failed; remove that call.",
              file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - the one place that turns any failure into one paragraph
        if debug:
            raise
        print(f"{name}: failed with an unexpected {type(e).__name__}: {_one_paragraph(str(e))[:500]} "
              "(this is a bug or an unchecked input; rerun with --debug for the traceback and report it).",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
