"""The errors every lmpo command reports in one style.

A command that fails because of its input (a config value, a path, a flag) raises :class:`InputError`; one
whose run fails for another reason raises :class:`RunError`. Both carry a one-paragraph message that names
the input, the value it had and how to fix it. ``lmpo.cli`` prints that message without a traceback (unless
``--debug``) and exits with the error's ``exit_code``: 2 for bad input, 1 for a failed run.

Library code raises these too, so that a caller can tell a bad argument from a broken run::

    try:
        Trainer(cfg).train()
    except InputError as e:      # fix the config and try again
        ...
"""

from __future__ import annotations


class LmpoError(Exception):
    """An error lmpo reports as one paragraph, without a traceback."""

    exit_code = 1


class InputError(LmpoError, ValueError):
    """Bad input: the message names the input, the value and the fix. Exit status 2."""

    exit_code = 2


class RunError(LmpoError, RuntimeError):
    """A run that could not continue (non-finite training, a broken checkpoint, …). Exit status 1."""

    exit_code = 1


class UnsupportedError(InputError, NotImplementedError):
    """A host (TRL, verl, …) cannot give an objective what it needs, or runs with a setting the objective cannot
    honour. The message lists each problem with what to do instead. Exit status 2."""

class Interrupted(LmpoError):
    """The user stopped a run (Ctrl-C / SIGINT). ``checkpoint`` is what it wrote to resume from (or None).

    Exit status 130, the shell's convention for a run stopped by SIGINT.
    """

    exit_code = 130

    def __init__(self, message: str, checkpoint=None):
        super().__init__(message)
        self.checkpoint = checkpoint
