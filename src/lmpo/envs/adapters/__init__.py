"""Adapters that run third-party environment suites unchanged behind the ``lmpo.envs`` protocol, one file per
suite, each an optional extra: ``textarena`` (TextArena's single-player games, ``textarena/<Game>-vN``)."""
