"""The bigram lexicon L of the lexical bonus, built offline from ``jieba``'s dictionary.

Two cache files (plain JSON objects ``{word: frequency}``):

- ``chinese_frequency_word.json``: every two-character word of ``jieba/dict.txt`` (line format
  ``word frequency tag``) with its frequency;
- ``chinese_name_frequency_word.json``: every word tagged ``nr`` (person name), any length.

Both are read from the installed ``jieba`` package (no network) and cached in the lexicon directory:
the ``cache_dir`` argument, else ``$LMPO_CACHE_DIR/lexicon``, else ``platformdirs.user_cache_dir("lmpo")
/lexicon``. A missing file is built on first use; a corrupt one (unreadable JSON, not a non-empty
``{str: int}`` object) is rebuilt with a ``UserWarning``.

``L`` = two-character entries of both files ∪ every bigram of the reference text (frequency = its count in
the reference, at least 1, kept if larger than the dictionary's). The reference augmentation lives in
memory only: the cache stays corpus-independent.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

FREQUENCY_FILE = "chinese_frequency_word.json"
NAME_FILE = "chinese_name_frequency_word.json"
CACHE_ENV_VAR = "LMPO_CACHE_DIR"


def lexicon_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The directory the lexicon files are cached in (see module docstring)."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env) / "lexicon"
    import platformdirs

    return Path(platformdirs.user_cache_dir("lmpo")) / "lexicon"


def jieba_dict_path() -> Path:
    """``dict.txt`` inside the installed ``jieba`` package."""
    try:
        import jieba
    except ImportError:
        raise ImportError(
            "the lexicon is built from the `jieba` package's dictionary; install it with `pip install jieba` "
            "(or `pip install lmpo[text]`), or disable the bonus with TextEnvConfig(use_bigram_bonus=False)"
        ) from None
    path = Path(jieba.__file__).parent / "dict.txt"
    if not path.is_file():
        raise FileNotFoundError(f"jieba is installed but its dictionary {path} is missing; reinstall jieba")
    return path


def parse_jieba_dict(path: str | os.PathLike) -> tuple[dict[str, int], dict[str, int]]:
    """(two-character words -> frequency, ``nr`` person names -> frequency) from a jieba-format dictionary."""
    words: dict[str, int] = {}
    names: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 2:
                continue
            word = parts[0]
            try:
                freq = int(parts[1])
            except ValueError:
                continue
            if len(word) == 2:
                words[word] = max(freq, words.get(word, 0))
            if len(parts) >= 3 and parts[2] == "nr":
                names[word] = max(freq, names.get(word, 0))
    return words, names


def _valid(obj: object) -> bool:
    return (
        isinstance(obj, dict)
        and len(obj) > 0
        and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in obj.items())
    )


def _write_json(path: Path, data: dict[str, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, ensure_ascii=False, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)  # atomic, so a concurrent reader never sees half a file


def build_lexicon_files(
    cache_dir: str | os.PathLike | None = None, source: str | os.PathLike | None = None
) -> tuple[Path, Path]:
    """Build both cache files from jieba's dictionary (or ``source``, a file in jieba's format)."""
    d = lexicon_dir(cache_dir)
    words, names = parse_jieba_dict(source if source is not None else jieba_dict_path())
    if not words:
        raise ValueError(
            f"{source or jieba_dict_path()}: no two-character words found; is it a jieba dictionary?"
        )
    _write_json(d / FREQUENCY_FILE, words)
    _write_json(d / NAME_FILE, names)
    return d / FREQUENCY_FILE, d / NAME_FILE


_MEMO: dict[tuple, tuple[dict[str, int], dict[str, int]]] = {}


def _load_or_rebuild(cache_dir: str | os.PathLike | None) -> tuple[dict[str, int], dict[str, int]]:
    # memoised per (file, size, mtime): many environments in one process read the same files once
    d = lexicon_dir(cache_dir)
    stamp = []
    for name in (FREQUENCY_FILE, NAME_FILE):
        try:
            st = (d / name).stat()
            stamp.append((str(d / name), st.st_size, st.st_mtime_ns))
        except OSError:
            stamp.append((str(d / name), -1, -1))
    memo_key = tuple(stamp)
    if memo_key in _MEMO:
        return _MEMO[memo_key]
    result = _read_or_rebuild(d)
    if all(s[1] >= 0 for s in stamp):
        _MEMO[memo_key] = result
    return result


def _read_or_rebuild(d: Path) -> tuple[dict[str, int], dict[str, int]]:
    loaded: list[dict[str, int] | None] = []
    for name in (FREQUENCY_FILE, NAME_FILE):
        path = d / name
        data = None
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                data = None
            if not _valid(data):
                warnings.warn(
                    f"lexicon cache file {path} is corrupt (not a non-empty {{word: frequency}} JSON object); "
                    "rebuilding it from jieba's dictionary",
                    UserWarning,
                    stacklevel=4,
                )
                data = None
        else:
            log.info("lexicon cache file %s is missing; building it from jieba's dictionary", path)
        loaded.append(data)
    if any(x is None for x in loaded):
        build_lexicon_files(d)  # one parse of dict.txt writes both files
        loaded = [json.loads((d / name).read_text(encoding="utf-8")) for name in (FREQUENCY_FILE, NAME_FILE)]
    return loaded[0], loaded[1]


@dataclass(frozen=True)
class Lexicon:
    """Two-character words with frequencies (``words``) and how many came from each source."""

    words: dict[str, int]
    num_dictionary: int
    num_names: int
    num_reference: int

    def __contains__(self, bigram: str) -> bool:
        return bigram in self.words

    def __len__(self) -> int:
        return len(self.words)

    def pair_ids(self, alphabet) -> set[int]:
        """``{prev_id * A + action_id}`` for every word whose two characters are both in Σ (fast lookup)."""
        a = len(alphabet)
        get = alphabet.char_to_id.get
        out = set()
        for w in self.words:
            i, j = get(w[0]), get(w[1])
            if i is not None and j is not None:
                out.add(i * a + j)
        return out


def load_lexicon(
    reference_texts: Iterable[str] = (),
    cache_dir: str | os.PathLike | None = None,
    use_dictionary: bool = True,
) -> Lexicon:
    """L = two-character dictionary words ∪ two-character names ∪ reference bigrams (module docstring).

    Arguments:
        reference_texts: texts whose bigrams are added (frequency >= 1); pass ``()`` to skip.
        cache_dir: lexicon directory override (see ``lexicon_dir``).
        use_dictionary: include jieba's words and names (False: only the reference bigrams).
    """
    words: dict[str, int] = {}
    num_dict = num_names = 0
    if use_dictionary:
        freq, names = _load_or_rebuild(cache_dir)
        for w, f in freq.items():
            if len(w) == 2:
                words[w] = f
        num_dict = len(words)
        for w, f in names.items():
            if len(w) == 2:
                num_names += 1
                words[w] = max(f, words.get(w, 0))
    ref: Counter[str] = Counter()
    for t in reference_texts:
        ref.update(t[i : i + 2] for i in range(len(t) - 1))
    for w, c in ref.items():
        words[w] = max(words.get(w, 0), c, 1)
    return Lexicon(words, num_dict, num_names, len(ref))
