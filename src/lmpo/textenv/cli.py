"""Command-line entry points of the text environment.

``lmpo sac build-lexicon [--cache-dir DIR] [--source FILE] [--text CORPUS]`` builds the two lexicon cache
files from jieba's dictionary and prints their paths and sizes (with ``--text``: also how many of the
corpus's bigrams the lexicon covers before reference augmentation).
"""

from __future__ import annotations

import argparse


def _build_lexicon(args: argparse.Namespace) -> int:
    import json

    from lmpo.textenv.lexicon import build_lexicon_files, load_lexicon

    freq_path, name_path = build_lexicon_files(args.cache_dir, args.source)
    for p in (freq_path, name_path):
        n = len(json.loads(p.read_text(encoding="utf-8")))
        print(f"{p}  ({n} entries)")
    if args.text:
        from lmpo.textenv.corpus import load_corpus

        corpus = load_corpus(args.text)
        lex = load_lexicon((), args.cache_dir)
        bigrams = {c[i : i + 2] for c in corpus.chapters for i in range(len(c) - 1)}
        hit = sum(b in lex for b in bigrams)
        print(
            f"{args.text}: {len(corpus)} chapters, {corpus.num_chars} characters, {len(bigrams)} distinct bigrams, "
            f"{hit} ({hit / max(len(bigrams), 1):.1%}) in the dictionary lexicon; the environment adds the rest"
        )
    return 0


def register_build_lexicon(subparsers: argparse._SubParsersAction, name: str) -> None:
    """``lmpo sac build-lexicon``: (re)build the jieba-derived lexicon cache."""
    p = subparsers.add_parser(
        name,
        help="build chinese_frequency_word.json / chinese_name_frequency_word.json from jieba's dictionary",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        help="directory for the two JSON files (default: $LMPO_CACHE_DIR/lexicon or the user cache directory)",
    )
    p.add_argument("--source", default=None, help="a dictionary in jieba's format (default: jieba/dict.txt)")
    p.add_argument(
        "--text", default=None, help="optional corpus (.txt/.json/directory) to report bigram coverage for"
    )
    p.set_defaults(func=_build_lexicon)
