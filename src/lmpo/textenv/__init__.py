"""Deprecated alias of :mod:`lmpo.textagent.env` (the text environment moved there; docs/textagent.md)."""

from lmpo.textagent.old_paths import alias_old_path

_new = alias_old_path(__name__, "lmpo.textagent.env")
__all__ = list(_new.__all__)
globals().update({name: getattr(_new, name) for name in __all__})
