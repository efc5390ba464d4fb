"""Environments from outside lmpo: a user's module or file (``env.import``) and installed packages (the
``lmpo.envs`` entry-point group).

A module registers its environments when it is imported (``@register_env`` runs at import), so bringing one in
is importing it before the id is looked up:

* ``import_env_modules(["my_envs", "envs/unit_convert.py"])``: each item a dotted module name (imported from
  ``sys.path``) or the path of a ``.py`` file (relative to the current directory), imported once per process
  however many times it is named. A training config lists them under ``env.import``; ``lmpo train``,
  ``lmpo lab``, ``lmpo eval RUN`` and every job the lab starts import them before resolving ``env.id``.
* A package declares entry points in the group ``lmpo.envs`` (``pyproject.toml``)::

      [project.entry-points."lmpo.envs"]
      my_envs = "my_package.envs"              # a module: importing it registers its environments
      more = "my_package.more:register_all"    # or a callable, called once with no arguments

  ``load_env_plugins()`` loads every one of them, once per process; ``make_env`` calls it when an id is not
  registered yet, so an installed package's environments need no configuration at all.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from lmpo.errors import InputError

ENTRY_POINT_GROUP = "lmpo.envs"

#: how to bring an environment that is not registered, appended to every unknown-id message
HOW_TO_REGISTER = (
    "To use your own environment, decorate its class with @lmpo.envs.register_env('Name-v0', task=YourTask) in a "
    "module and name that module or its .py file in `env.import` (a list, imported before the id is looked up), "
    f"or install a package that declares it in the {ENTRY_POINT_GROUP!r} entry-point group "
    "(docs/multiturn.md, \"Writing an environment\")."
)

_imported: dict[str, str] = {}  # the resolved spelling of each import → the module it gave
_plugins: dict[str, str | None] = {}  # entry point → None when it loaded, else why it failed


def _import_file(path: Path, item: str, where: str) -> str:
    name = path.stem
    if not name.isidentifier():
        raise InputError(f"`{where}` names {item!r}, whose file name is not a Python identifier ({name!r}); rename "
                         "the file (letters, digits and '_').")
    loaded = sys.modules.get(name)
    if loaded is not None:
        if getattr(loaded, "__file__", None) and Path(loaded.__file__).resolve() == path:
            return name
        raise InputError(f"`{where}` names {item!r}, but a module called {name!r} is already imported from "
                         f"{getattr(loaded, '__file__', None) or 'elsewhere'}; rename the file so that its name is "
                         "not taken.")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # registered first, as `import` does: the module may import itself (pickling)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return name


def names_a_file(item: str) -> bool:
    """Whether an ``env.import`` item is a ``.py`` file (a path) rather than a dotted module name."""
    return item.endswith(".py") or os.sep in item or "/" in item


def import_env_modules(items: Sequence[str], where: str = "env.import") -> list[str]:
    """Import each item (a dotted module name or a ``.py`` file), once per process; the module names.

    Raises InputError naming ``where`` and the item: a file that does not exist, a module that is not found, or
    any exception the module raises while it is imported (its type and message).
    """
    names = []
    for item in items:
        item = str(item)
        is_file = names_a_file(item)
        key = str(Path(item).resolve()) if is_file else item
        if key in _imported:
            names.append(_imported[key])
            continue
        try:
            if is_file:
                path = Path(key)
                if not path.is_file():
                    raise InputError(f"`{where}` names the file {item!r}, which does not exist (paths are relative to "
                                     f"the current directory, {os.getcwd()}); give the path of a .py file or a "
                                     "dotted module name on PYTHONPATH.")
                name = _import_file(path, item, where)
            else:
                name = importlib.import_module(item).__name__
        except InputError:
            raise
        except ModuleNotFoundError as e:
            if is_file or e.name is None or not (item == e.name or item.startswith(e.name + ".")):
                raise _import_failed(where, item, e) from e
            raise InputError(f"`{where}` names the module {item!r}, which is not found ({e}); put its directory on "
                             "PYTHONPATH or give the path of its .py file instead.") from e
        except Exception as e:  # noqa: BLE001 - whatever the user's module raises is reported the same way
            raise _import_failed(where, item, e) from e
        _imported[key] = name
        names.append(name)
    return names


def _import_failed(where: str, item: str, e: BaseException) -> InputError:
    detail = " ".join(str(e).split())[:300]
    return InputError(f"`{where}` names {item!r}, whose import raised {type(e).__name__}: {detail}. Fix the module "
                      "(run `python -c \"import ...\"` or `python FILE` to see the traceback) or remove it from "
                      f"`{where}`.")


def load_env_plugins() -> dict[str, str | None]:
    """Load every entry point of the ``lmpo.envs`` group once per process: ``{entry point: None or why it
    failed}``. A plugin that fails is recorded, not raised, so that one broken package does not stop the others;
    the unknown-id message lists the failures."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        label = f"{ep.name} = {ep.value}"
        if label in _plugins:
            continue
        try:
            loaded = ep.load()
            if ep.attr is not None and callable(loaded):
                loaded()
            _plugins[label] = None
        except Exception as e:  # noqa: BLE001 - a broken plugin is reported with the unknown id, not raised here
            _plugins[label] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return dict(_plugins)


def plugin_failures() -> str:
    """The entry points that failed to load, as a sentence for an error message ('' when none did)."""
    failed = [f"{label} ({why})" for label, why in _plugins.items() if why is not None]
    return f" Entry points of {ENTRY_POINT_GROUP!r} that failed to load: {'; '.join(failed)}." if failed else ""
