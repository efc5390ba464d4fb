"""Corpus loading and the deterministic train / held-out chapter split.

Accepted inputs (``load_corpus(path_or_paths)``):

- a UTF-8 ``.txt`` file (any suffix other than ``.json`` is read as text),
- a ``.json`` file holding a list of ``{"chapter": str, "paragraphs": [str, ...]}`` objects (the format of
  the chinese-poetry collections such as ``lunyu.simplified.json``),
- a directory: every ``.txt`` and ``.json`` file below it, in sorted path order,
- a list of any of the above.

Chapter rule for text files. If ``separator`` is given, the text is split at every occurrence of it
(e.g. ``separator="\\n===\\n"``) and each part is a chapter whose first non-empty line is its title when
that line is a heading (see below). Otherwise the text is cut into *blocks* at blank lines; a block that is
a single line of at most ``HEADING_MAX_CHARS`` characters and does not end with sentence punctuation
(``。！？；…”」』.!?;``) and is not the only block is a *heading* that starts a new chapter; a Markdown heading
line (``# title``) is always a heading. Blocks before the first heading form a chapter of their own. Chapter
text = its paragraphs with every line stripped and joined with ``""`` (Chinese needs no spaces, and line
breaks are control characters that the compliance rules reject as actions). The heading is the chapter's
title and not part of its text.

Split: ``Corpus.split(heldout_fraction, seed)`` permutes chapter indices with ``numpy`` seeded by
``seed``, takes ``round(heldout_fraction * n)`` chapters (at least one when the fraction is positive and
there are at least two chapters; never all of them) as held-out, and keeps the original order inside
each part, so the split depends only on (number of chapters, fraction, seed).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lmpo.errors import InputError

HEADING_MAX_CHARS = 40
_SENTENCE_END = tuple("。！？；…”」』.!?;")
_MD_HEADING = re.compile(r"^#{1,6}\s+(.*\S)\s*$")


class CorpusError(InputError):
    """A corpus file cannot be used; the message names the file, the problem and the fix."""


@dataclass(frozen=True)
class Corpus:
    """Chapters of one or more source files.

    Attributes:
        chapters: chapter texts (no titles, no line breaks).
        titles: one title per chapter ("" when the source had none).
        sources: the file each chapter came from.
    """

    chapters: list[str]
    titles: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.titles:
            object.__setattr__(self, "titles", [""] * len(self.chapters))
        if not self.sources:
            object.__setattr__(self, "sources", ["<memory>"] * len(self.chapters))
        if not (len(self.chapters) == len(self.titles) == len(self.sources)):
            raise ValueError(
                f"Corpus: chapters ({len(self.chapters)}), titles ({len(self.titles)}) and sources "
                f"({len(self.sources)}) must have the same length"
            )

    def __len__(self) -> int:
        return len(self.chapters)

    @property
    def num_chars(self) -> int:
        return sum(len(c) for c in self.chapters)

    def split_indices(self, heldout_fraction: float = 0.2, seed: int = 0) -> tuple[list[int], list[int]]:
        """Chapter indices of the (train, held-out) parts; see the module docstring for the rule."""
        if not 0.0 <= heldout_fraction < 1.0:
            raise ValueError(
                f"heldout_fraction={heldout_fraction!r} must be in [0, 1); use 0 to keep every chapter for training"
            )
        n = len(self.chapters)
        num_heldout = int(round(heldout_fraction * n))
        if heldout_fraction > 0 and n >= 2:
            num_heldout = max(1, num_heldout)
        num_heldout = min(num_heldout, n - 1) if n >= 1 else 0
        order = np.random.default_rng(seed).permutation(n)
        heldout = sorted(int(i) for i in order[:num_heldout])
        held = set(heldout)
        train = [i for i in range(n) if i not in held]
        return train, heldout

    def split(self, heldout_fraction: float = 0.2, seed: int = 0) -> tuple[list[str], list[str]]:
        """Deterministic (train, held-out) lists of chapter texts."""
        train, heldout = self.split_indices(heldout_fraction, seed)
        return [self.chapters[i] for i in train], [self.chapters[i] for i in heldout]


def _read_utf8(path: Path) -> str:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorpusError(
            f"{path}: not valid UTF-8 (byte offset {err.start}: {data[err.start : err.start + 4]!r}, {err.reason}); "
            "re-encode the file as UTF-8, e.g. `iconv -f GB18030 -t UTF-8`"
        ) from None
    return text.lstrip("\ufeff")


def _is_heading(block: list[str], only_block: bool) -> str | None:
    if len(block) != 1:
        return None
    line = block[0]
    md = _MD_HEADING.match(line)
    if md:
        return md.group(1)
    if only_block or len(line) > HEADING_MAX_CHARS or line.endswith(_SENTENCE_END):
        return None
    return line


def split_text_chapters(text: str, separator: str | None = None) -> list[tuple[str, str]]:
    """Split a text into ``(title, chapter_text)`` pairs by the module's chapter rule (empty ones dropped)."""
    if separator is not None:
        if separator == "":
            raise ValueError(
                "separator='' would split between every character; pass None or a non-empty string"
            )
        out = []
        for part in text.split(separator):
            lines = [ln.strip() for ln in part.splitlines() if ln.strip()]
            if not lines:
                continue
            title = ""
            head = _is_heading(lines[:1], only_block=len(lines) == 1)
            if head is not None:
                title, lines = head, lines[1:]
            body = "".join(lines)
            if body:
                out.append((title, body))
        return out
    blocks: list[list[str]] = []
    current: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line:
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    chapters: list[tuple[str, list[str]]] = []
    title, body = "", []
    for block in blocks:
        head = _is_heading(block, only_block=len(blocks) == 1)
        if head is not None:
            if body:
                chapters.append((title, body))
            title, body = head, []
        else:
            body.extend(block)
    if body:
        chapters.append((title, body))
    return [(t, "".join(b)) for t, b in chapters if "".join(b)]


def _load_json(path: Path, paragraphs: bool = False) -> list[tuple[str, str]] | list[tuple[str, list[str]]]:
    try:
        data = json.loads(_read_utf8(path))
    except json.JSONDecodeError as err:
        raise CorpusError(
            f"{path}: invalid JSON at line {err.lineno} column {err.colno}: {err.msg}"
        ) from None
    if not isinstance(data, list):
        raise CorpusError(
            f'{path}: expected a JSON list of {{"chapter": str, "paragraphs": [str, ...]}} objects, '
            f"got {type(data).__name__}"
        )
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("paragraphs"), list):
            raise CorpusError(
                f'{path}: item {i} must be an object with a "paragraphs" list (and optionally "chapter"); '
                f"got {str(item)[:80]!r}"
            )
        paras = item["paragraphs"]
        if not all(isinstance(p, str) for p in paras):
            raise CorpusError(f"{path}: item {i}: every paragraph must be a string")
        parts = ["".join(ln.strip() for ln in p.splitlines()) for p in paras]
        parts = [p for p in parts if p]
        if parts:
            out.append((str(item.get("chapter", "")), parts if paragraphs else "".join(parts)))
    return out


def _expand(paths: Iterable[str | os.PathLike]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(
                q for q in path.rglob("*") if q.is_file() and q.suffix.lower() in (".txt", ".json")
            )
            if not found:
                raise CorpusError(f"{path}: directory holds no .txt or .json files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise CorpusError(f"{path}: no such file or directory")
    return files


def load_corpus(
    path_or_paths: str | os.PathLike | Sequence[str | os.PathLike],
    separator: str | None = None,
) -> Corpus:
    """Load chapters from text / JSON files or directories (rules in the module docstring).

    Raises:
        CorpusError: a missing path, a non-UTF-8 file (with the byte offset), malformed JSON, a file with no
            chapters, or a file with no character that the compliance rules accept.
    """
    from lmpo.textagent.env.compliance import char_class_ok

    if isinstance(path_or_paths, (str, os.PathLike)):
        path_or_paths = [path_or_paths]
    files = _expand(path_or_paths)
    if not files:
        raise CorpusError("load_corpus: no paths given; pass a .txt/.json file or a directory")
    chapters, titles, sources = [], [], []
    for f in files:
        pairs = (
            _load_json(f) if f.suffix.lower() == ".json" else split_text_chapters(_read_utf8(f), separator)
        )
        if not pairs:
            raise CorpusError(f"{f}: empty corpus (no chapter with any non-blank text)")
        if not any(char_class_ok(ch) for _, body in pairs for ch in body):
            raise CorpusError(
                f"{f}: no legal characters (every character is a control, format, private-use, unassigned "
                "or replacement code point); check the file's encoding"
            )
        for t, body in pairs:
            titles.append(t)
            chapters.append(body)
            sources.append(str(f))
    return Corpus(chapters, titles, sources)


def sample_text_path() -> Path:
    """Path of the bundled original sample text (written for lmpo; a few short chapters)."""
    return Path(__file__).parent / "data" / "sample_zh.txt"


def load_sample_corpus() -> Corpus:
    """The bundled sample text as a ``Corpus``."""
    return load_corpus(sample_text_path())


_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\U00020000-\U0002ffff]")


def han_ngrams(text: str, n: int) -> set[str]:
    """Every run of ``n`` consecutive Han characters of ``text`` once everything but Han characters is removed
    (so punctuation or spacing cannot hide a quotation): the unit of the leak filter."""
    h = "".join(_HAN.findall(text))
    return {h[i:i + n] for i in range(len(h) - n + 1)}


def paragraph_units(path: str | os.PathLike) -> list[list[str]]:
    """The paragraphs of a corpus path, one list per chapter: each JSON ``paragraphs`` entry, or each chapter
    of a text file (as one paragraph); files in the order :func:`load_corpus` reads them."""
    units: list[list[str]] = []
    for f in _expand([path]):
        if f.suffix.lower() == ".json":
            units += [paras for _, paras in _load_json(f, paragraphs=True)]
        else:
            units += [[b] for _, b in split_text_chapters(_read_utf8(f))]
    return units


@dataclass(frozen=True)
class ExtraText:
    """Train-only text added after the split, with what the leak filter removed.

    Attributes:
        chapters: the kept text, one chapter per file that kept at least one paragraph.
        paragraphs_kept / paragraphs_dropped: paragraphs of the extra files kept and dropped by the filter.
        chars_kept / chars_dropped: their characters.
    """

    chapters: list[str]
    paragraphs_kept: int = 0
    paragraphs_dropped: int = 0
    chars_kept: int = 0
    chars_dropped: int = 0

    def report(self) -> dict[str, int]:
        return {"chapters": len(self.chapters), "paragraphs_kept": self.paragraphs_kept,
                "paragraphs_dropped": self.paragraphs_dropped, "chars_kept": self.chars_kept,
                "chars_dropped": self.chars_dropped}


def load_extra_text(paths: Sequence[str | os.PathLike], heldout: Sequence[str], leak_chars: int = 10) -> ExtraText:
    """Load train-only text and drop every paragraph that could leak the held-out chapters.

    A paragraph (a JSON ``paragraphs`` entry; a blank-line block of a text file) is dropped when it shares a run
    of ``leak_chars`` consecutive Han characters with any held-out chapter, both read with everything but Han
    characters removed (so punctuation or spacing differences cannot hide a quotation). ``leak_chars = 0``
    turns the filter off. Call it after the split, with the split's held-out chapters: the held-out set
    stays exactly the one the base corpus defines.

    Each file becomes one chapter (its kept paragraphs in order): the environment ends an episode with
    ``<eos>`` at a chapter's end, and the hundreds of short poems and sections of a collection would otherwise
    teach the agent to stop after almost any full stop.
    """
    if leak_chars < 0:
        raise ValueError(f"leak_chars={leak_chars} must be >= 0 (0 turns the filter off)")
    n = leak_chars
    seen: set[str] = set()
    if n:
        for text in heldout:
            seen |= han_ngrams(text, n)
    chapters: list[str] = []
    kept = dropped = ckept = cdropped = 0
    for f in _expand(paths):
        keep = []
        for paras in paragraph_units(f):
            for p in paras:
                if n and not seen.isdisjoint(han_ngrams(p, n)):
                    dropped, cdropped = dropped + 1, cdropped + len(p)
                else:
                    keep.append(p)
                    kept, ckept = kept + 1, ckept + len(p)
        if keep:
            chapters.append("".join(keep))
    return ExtraText(chapters, kept, dropped, ckept, cdropped)
