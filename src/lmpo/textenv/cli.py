"""Deprecated: ``python -m lmpo.textagent.env.cli`` (or ``lmpo sac build-lexicon`` / ``env-demo``); this file
keeps ``python -m lmpo.textenv.cli`` running."""

from lmpo.textagent.env.cli import main, register_build_lexicon, register_env_demo

__all__ = ["main", "register_build_lexicon", "register_env_demo"]

if __name__ == "__main__":
    raise SystemExit(main())
