"""Deprecated alias of :mod:`lmpo.textagent.sac` (the discrete SAC agent moved there; docs/textagent.md)."""

from lmpo.textagent.old_paths import alias_old_path

_new = alias_old_path(__name__, "lmpo.textagent.sac")
__all__ = list(_new.__all__)
globals().update({name: getattr(_new, name) for name in __all__})
