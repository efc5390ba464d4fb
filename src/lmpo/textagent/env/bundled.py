"""Corpora shipped inside the package, and the search order that finds a corpus named in a config.

Bundled (``lmpo/textagent/env/data/``):

- ``lunyu.simplified.json`` — the Analects (论语), simplified script, 20 chapters (~21.5k characters), as a
  JSON list of ``{"chapter": ..., "paragraphs": [...]}``. The text is in the public domain; the JSON file
  comes from the chinese-poetry collection (MIT licence, ``LICENSE.chinese-poetry`` beside it). It is the
  default corpus of ``lmpo sac train``.
- ``sample_zh.txt`` — a short original sample text written for lmpo (tests and the environment demo).
- ``classical/`` — 345k characters of further classical Chinese (``classical/sishu``: 孟子 (11 of 14 chapters),
  大学, 中庸; ``classical/extended``: 诗经, 楚辞, 幽梦影 and 11 蒙学 texts), simplified script, in the same JSON
  format, from the chinese-poetry collection (MIT licence, ``classical/LICENSE.chinese-poetry``). Train-only
  text for ``extra_train_corpus`` of ``lmpo sac train``; no paragraph shares 10 consecutive Han characters
  with the Analects chapters the default split holds out.

Search order of :func:`resolve_corpus` for a corpus value ``spec``:

1. ``spec`` as a path (file or directory; relative paths are relative to the working directory);
2. the bundled file or directory at that relative path (``classical/sishu``);
3. a bundled corpus with the same file name (so ``lunyu.simplified.json`` works anywhere, and a config
   written on a machine that keeps the same file elsewhere still runs).
"""

from __future__ import annotations

import os
from pathlib import Path

from lmpo.errors import InputError

DATA_DIR = Path(__file__).parent / "data"

#: the default corpus of ``lmpo sac train`` (a bundled file name, found by :func:`resolve_corpus`)
DEFAULT_CORPUS = "lunyu.simplified.json"


def bundled_corpora() -> list[str]:
    """File names of the corpora shipped with lmpo."""
    return sorted(p.name + ("/" if p.is_dir() else "") for p in DATA_DIR.iterdir()
                  if p.suffix in (".json", ".txt") or p.is_dir())


def resolve_corpus(spec: str | os.PathLike, where: str = "corpus") -> Path:
    """The file or directory a corpus value names (search order in the module docstring).

    Raises :class:`lmpo.errors.InputError` naming the value when neither step finds it.
    """
    path = Path(spec).expanduser()
    if str(spec) and path.exists():
        return path
    if str(spec) and not path.is_absolute() and ".." not in path.parts and (DATA_DIR / path).exists():
        return DATA_DIR / path
    bundled = DATA_DIR / path.name
    if path.name and bundled.is_file() and bundled.suffix in (".json", ".txt"):
        return bundled
    raise InputError(f"`{where}` = {str(spec)!r} is neither a file or directory here (working directory: "
                     f"{os.getcwd()}) nor a corpus bundled with lmpo ({', '.join(bundled_corpora())}). Give "
                     "the path of a UTF-8 .txt / .json file or a directory of them, or leave it unset for "
                     f"the bundled {DEFAULT_CORPUS}.")
