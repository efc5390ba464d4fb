"""The import paths before the move (lmpo.sac, lmpo.textenv) still work, as the new modules themselves, and warn."""

from __future__ import annotations

import sys
import warnings

import pytest

OLD = ("lmpo.sac", "lmpo.textenv")


def _old_modules() -> dict:
    return {k: sys.modules[k] for k in list(sys.modules) if k in OLD or k.startswith(tuple(o + "." for o in OLD))}


def test_old_import_paths_are_the_new_modules_and_warn_once_each():
    import gymnasium as gym

    import lmpo
    import lmpo.textagent.env as new_env
    import lmpo.textagent.env.cli as new_env_cli
    import lmpo.textagent.sac as new_sac
    import lmpo.textagent.sac.config as new_config
    import lmpo.textagent.sac.train as new_train

    saved = _old_modules()  # another test of this worker may have imported them: import afresh, then put back
    for k in saved:
        del sys.modules[k]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import lmpo.sac.train as old_train
            from lmpo.sac.config import TrainConfig

            import lmpo.sac
            import lmpo.textenv.cli
            from lmpo.textenv import ENV_ID, CharTextEnv
        moved = [w for w in caught if issubclass(w.category, DeprecationWarning)]
        assert [str(w.message).split(" has moved to ")[1].split(":")[0] for w in moved] == [
            "lmpo.textagent.sac", "lmpo.textagent.env"]
        assert {w.filename for w in moved} == {__file__}  # the warning points at the importing line
        assert TrainConfig is new_config.TrainConfig and old_train is new_train
        assert lmpo.textenv.cli.main is new_env_cli.main and CharTextEnv is new_env.CharTextEnv
        assert lmpo.sac.__all__ == new_sac.__all__
        assert all(getattr(lmpo.sac, n) is getattr(new_sac, n) for n in new_sac.__all__)
        assert ENV_ID == "lmpo/CharText-v0" and gym.spec(ENV_ID).entry_point == "lmpo.textagent.env.env:make_env"
    finally:
        for k in _old_modules():
            del sys.modules[k]
        sys.modules.update(saved)
        for name in OLD:
            leaf = name.split(".")[1]
            if name in saved:
                setattr(lmpo, leaf, saved[name])
            elif hasattr(lmpo, leaf):
                delattr(lmpo, leaf)


def test_python_m_on_the_old_cli_path_still_runs(capsys, monkeypatch):
    import runpy

    monkeypatch.setattr(sys, "argv", ["lmpo.textenv.cli", "env-demo", "--help"])
    with warnings.catch_warnings(), pytest.raises(SystemExit) as stop:
        warnings.simplefilter("ignore")
        runpy.run_module("lmpo.textenv.cli", run_name="__main__")
    assert stop.value.code == 0 and "--teacher-ratio" in capsys.readouterr().out


def test_the_sac_commands_route_to_the_new_paths():
    """``lmpo sac …`` imports lmpo.textagent directly (no deprecation warning on every command)."""
    from lmpo.cli import SAC_COMMANDS

    assert sorted(SAC_COMMANDS) == ["build-lexicon", "env-demo", "gate", "reference", "sample", "train"]
    assert {t.split(":")[0] for t in SAC_COMMANDS.values()} == {"lmpo.textagent.sac.cli", "lmpo.textagent.env.cli"}
