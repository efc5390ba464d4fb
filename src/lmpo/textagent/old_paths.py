"""The text agent's import paths before it moved into ``lmpo.textagent``, kept for scripts written against them.

``lmpo.textenv`` is now ``lmpo.textagent.env`` and ``lmpo.sac`` is ``lmpo.textagent.sac``. Each old package
re-exports the new one's names and serves each of its submodules under the old name (``from lmpo.sac.config
import TrainConfig`` still works); the objects are the new modules themselves, so a class, a registry or a
monkeypatched function is one object whichever path reached it. The first import of an old path warns once.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings
from types import ModuleType


def alias_old_path(old: str, new: str) -> ModuleType:
    """Serve every submodule of package ``new`` as ``old.<name>`` too (but for a module file the old package
    keeps) and warn once that ``old`` moved.

    Called from the old package's ``__init__``; returns the new package, whose public names that module
    re-exports. The warning points at the line that imported the old path.
    """
    package = importlib.import_module(new)
    old_package = sys.modules[old]
    # a module the old package still has as a file of its own (a ``python -m`` entry point) stays that file
    own = {old + "." + m.name for m in pkgutil.iter_modules(old_package.__path__)}
    for info in pkgutil.walk_packages(package.__path__, new + "."):
        old_name = old + info.name[len(new):]
        if old_name in own:
            continue
        module = importlib.import_module(info.name)
        sys.modules[old_name] = module
        parent, _, leaf = old_name.rpartition(".")
        if parent == old:
            setattr(old_package, leaf, module)
    warnings.warn(f"{old} has moved to {new}: import {new} instead ({old} is an alias that will be removed)",
                  DeprecationWarning, stacklevel=3)
    return package
