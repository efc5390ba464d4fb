"""Command-line entry points of the text environment.

``lmpo sac build-lexicon [--cache-dir DIR] [--source FILE] [--text CORPUS]`` builds the two lexicon cache
files from jieba's dictionary and prints their paths and sizes (with ``--text``: also how many of the
corpus's bigrams the lexicon covers before reference augmentation).

``python -m lmpo.textagent.env.cli env-demo [--text CORPUS] [--steps N] [--teacher-ratio P]`` plays one episode
(teacher with probability P per step, else a random legal character) and prints the trace docs/textenv.md describes.
Both are also available as ``python -m lmpo.textagent.env.cli build-lexicon …``.
"""

from __future__ import annotations

import argparse


def _build_lexicon(args: argparse.Namespace) -> int:
    import json

    from lmpo.textagent.env.lexicon import build_lexicon_files, load_lexicon

    freq_path, name_path = build_lexicon_files(args.cache_dir, args.source)
    for p in (freq_path, name_path):
        n = len(json.loads(p.read_text(encoding="utf-8")))
        print(f"{p}  ({n} entries)")
    if args.text:
        from lmpo.textagent.env.corpus import load_corpus

        corpus = load_corpus(args.text)
        lex = load_lexicon((), args.cache_dir)
        bigrams = {c[i : i + 2] for c in corpus.chapters for i in range(len(c) - 1)}
        hit = sum(b in lex for b in bigrams)
        print(
            f"{args.text}: {len(corpus)} chapters, {corpus.num_chars} characters, {len(bigrams)} distinct bigrams, "
            f"{hit} ({hit / max(len(bigrams), 1):.1%}) in the dictionary lexicon; the environment adds the rest"
        )
    return 0


def _env_demo(args: argparse.Namespace) -> int:
    import numpy as np

    from lmpo.textagent.env.env import CharTextEnv, TextEnvConfig, format_trace

    cfg = TextEnvConfig(max_steps=args.steps, split=args.split, nce_pretrain_steps=args.pretrain_steps)
    env = CharTextEnv(text=args.text, config=cfg)
    rng = np.random.default_rng(args.seed)
    obs, info = env.reset(seed=args.seed)
    print(
        f"{args.text or 'bundled sample text'}: {len(env.chapters)} {args.split} chapters, A = {len(env.alphabet)}; "
        f"chapter {info['chapter']} position {info['position']}; history: …{env.history[-16:]}"
    )
    total = 0.0
    for _ in range(args.steps):
        env.set_teacher(bool(rng.random() < args.teacher_ratio))
        legal = np.flatnonzero(obs["legal_mask"])
        obs, reward, terminated, truncated, info = env.step(int(legal[rng.integers(len(legal))]))
        total += reward
        print(format_trace(info, reward))
        if terminated or truncated:
            break
    print(f"return {total:.3f}; terminated={terminated} truncated={truncated}; {env.normaliser_stats()}")
    return 0


def register_env_demo(subparsers: argparse._SubParsersAction, name: str) -> None:
    """``env-demo``: one traced episode of ``CharTextEnv`` on any corpus."""
    p = subparsers.add_parser(name, help="play one traced episode of the character environment")
    p.add_argument("--text", default=None, help="corpus (.txt/.json/directory); default: the bundled sample")
    p.add_argument("--split", default="train", choices=("train", "heldout", "all"))
    p.add_argument("--steps", type=int, default=20, help="episode length T")
    p.add_argument("--teacher-ratio", type=float, default=0.5, help="probability of a teacher step")
    p.add_argument("--pretrain-steps", type=int, default=300, help="InfoNCE encoder training steps")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_env_demo)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmpo.textagent.env.cli", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register_build_lexicon(sub, "build-lexicon")
    register_env_demo(sub, "env-demo")
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
