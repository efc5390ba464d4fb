from __future__ import annotations

import json

import pytest

from lmpo.textagent.env import CharTextEnv, Corpus, CorpusError, EnvConfig, load_corpus, load_sample_corpus
from lmpo.textagent.env.corpus import split_text_chapters


def test_text_chapter_rule_headings_blocks_and_markdown():
    text = "前言第一句。\n\n第一章 开始\n\n甲乙丙。\n丁戊。\n\n子曰：“好。”\n\n# 第二章\n\n己庚辛。\n"
    pairs = split_text_chapters(text)
    # the preface block before the first heading is its own chapter; lines are joined without breaks;
    # a one-line block ending with sentence punctuation (子曰：“好。”) is a paragraph, not a heading
    assert pairs == [
        ("", "前言第一句。"),
        ("第一章 开始", "甲乙丙。丁戊。子曰：“好。”"),
        ("第二章", "己庚辛。"),
    ]


def test_text_single_block_is_one_chapter_and_separator():
    assert split_text_chapters("只有一行") == [("", "只有一行")]
    text = "标题一\n正文一。\n===\n标题二\n正文二。\n===\n\n"
    assert split_text_chapters(text, separator="===") == [("标题一", "正文一。"), ("标题二", "正文二。")]
    with pytest.raises(ValueError, match="separator"):
        split_text_chapters(text, separator="")


def test_json_and_directory_loading(tmp_path):
    data = [
        {"chapter": "甲篇", "paragraphs": ["子曰：学。", "又曰：习。"]},
        {"chapter": "乙篇", "paragraphs": ["乐。"]},
    ]
    (tmp_path / "a.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    (tmp_path / "b.txt").write_text("第三章\n\n丙丁。\n", encoding="utf-8")
    (tmp_path / "ignored.md").write_text("不读", encoding="utf-8")
    c = load_corpus(tmp_path)
    assert c.chapters == ["子曰：学。又曰：习。", "乐。", "丙丁。"]
    assert c.titles == ["甲篇", "乙篇", "第三章"]
    assert c.sources[0].endswith("a.json") and c.sources[2].endswith("b.txt")
    assert load_corpus([tmp_path / "b.txt", tmp_path / "a.json"]).chapters == [
        "丙丁。",
        "子曰：学。又曰：习。",
        "乐。",
    ]


def test_bundled_sample_is_a_few_chapters_of_chinese():
    c = load_sample_corpus()
    assert len(c) == 4 and 2000 < c.num_chars < 5000
    assert all(t.startswith("第") for t in c.titles)


def test_split_is_deterministic_disjoint_and_complete():
    c = Corpus([f"章{i}" for i in range(10)])
    tr, ho = c.split_indices(0.2, seed=3)
    assert (tr, ho) == c.split_indices(0.2, seed=3)
    assert len(ho) == 2 and sorted(tr + ho) == list(range(10))
    assert any(c.split_indices(0.2, seed=s)[1] != ho for s in range(4, 10))
    train, held = c.split(0.2, seed=3)
    assert train == [c.chapters[i] for i in tr] and held == [c.chapters[i] for i in ho]
    # at least one held-out chapter for a positive fraction, never all of them
    assert len(Corpus(["a", "b"]).split_indices(0.01)[1]) == 1
    assert Corpus(["a"]).split_indices(0.5) == ([0], [])
    with pytest.raises(ValueError, match="heldout_fraction"):
        c.split(1.0)


def test_bad_inputs_name_the_file(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n \n", encoding="utf-8")
    with pytest.raises(CorpusError, match="empty.txt: empty corpus"):
        load_corpus(empty)
    ctrl = tmp_path / "ctrl.txt"
    ctrl.write_text("\x07\x08\u200b\ue000", encoding="utf-8")
    with pytest.raises(CorpusError, match="ctrl.txt: no legal characters"):
        load_corpus(ctrl)
    gbk = tmp_path / "gbk.txt"
    gbk.write_bytes("ab中文".encode("gb18030"))
    with pytest.raises(CorpusError, match=r"gbk.txt: not valid UTF-8 \(byte offset 2"):
        load_corpus(gbk)
    with pytest.raises(CorpusError, match="missing.txt: no such file"):
        load_corpus(tmp_path / "missing.txt")
    bad = tmp_path / "bad.json"
    bad.write_text('{"chapter": "x"}', encoding="utf-8")
    with pytest.raises(CorpusError, match="bad.json: expected a JSON list"):
        load_corpus(bad)
    bad.write_text('[{"chapter": "x"}]', encoding="utf-8")
    with pytest.raises(CorpusError, match='bad.json: item 0 must be an object with a "paragraphs" list'):
        load_corpus(bad)
    bad.write_text("[{", encoding="utf-8")
    with pytest.raises(CorpusError, match="bad.json: invalid JSON"):
        load_corpus(bad)


def test_window_longer_than_text_is_a_clear_error(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("短短的一句话。", encoding="utf-8")
    cfg = EnvConfig(window_chars=32, split="all", use_infonce=False, use_bigram_bonus=False)
    with pytest.raises(
        ValueError, match=r"window_chars=32 is longer than every chapter of .*short.txt \(longest: 7"
    ):
        CharTextEnv(text=short, config=cfg)
