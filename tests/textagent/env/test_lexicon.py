from __future__ import annotations

import json

import pytest

from lmpo.cli import main as lmpo_main
from lmpo.textagent.env import CharTextEnv, EnvConfig
from lmpo.textagent.env.lexicon import (
    FREQUENCY_FILE,
    NAME_FILE,
    build_lexicon_files,
    jieba_dict_path,
    lexicon_dir,
    load_lexicon,
    parse_jieba_dict,
)

FAKE_DICT = (
    "天气 300 n\n中华人民共和国 50 ns\n李白 120 nr\n诸葛亮 90 nr\n好 999 a\n晴天 40 n\n天气 10 n\nbad line\n"
)


def test_parse_jieba_format(tmp_path):
    src = tmp_path / "dict.txt"
    src.write_text(FAKE_DICT, encoding="utf-8")
    words, names = parse_jieba_dict(src)
    # two-character words (any tag; the larger of repeated frequencies), names = every nr word
    assert words == {"天气": 300, "李白": 120, "晴天": 40}
    assert names == {"李白": 120, "诸葛亮": 90}


def test_build_from_installed_jieba_dictionary(tmp_path):
    freq_path, name_path = build_lexicon_files(tmp_path)
    assert freq_path == tmp_path / FREQUENCY_FILE and name_path == tmp_path / NAME_FILE
    words = json.loads(freq_path.read_text(encoding="utf-8"))
    names = json.loads(name_path.read_text(encoding="utf-8"))
    expect_words, expect_names = parse_jieba_dict(jieba_dict_path())
    assert words == expect_words and names == expect_names
    assert len(words) > 50_000 and all(len(w) == 2 for w in words)
    assert len(names) > 10_000
    lex = load_lexicon(["甲乙丙甲乙"], cache_dir=tmp_path)
    # reference bigrams join at frequency >= 1 (甲乙 occurs twice in the reference)
    assert lex.words["甲乙"] >= 2 and lex.words["丙甲"] >= 1 and "乙丙" in lex
    assert lex.num_reference == 3
    assert lex.num_dictionary == len(words)


def test_corrupt_or_missing_cache_is_rebuilt_with_warning(tmp_path):
    build_lexicon_files(tmp_path)
    good = (tmp_path / FREQUENCY_FILE).read_text(encoding="utf-8")
    (tmp_path / FREQUENCY_FILE).write_text('{"天气": "many"', encoding="utf-8")  # truncated + wrong type
    (tmp_path / NAME_FILE).write_text("[1, 2]", encoding="utf-8")  # valid JSON, wrong shape
    with pytest.warns(UserWarning) as record:
        lex = load_lexicon((), cache_dir=tmp_path)
    messages = [str(w.message) for w in record]
    assert any(f"{FREQUENCY_FILE} is corrupt" in m for m in messages)
    assert any(f"{NAME_FILE} is corrupt" in m for m in messages)
    assert (tmp_path / FREQUENCY_FILE).read_text(encoding="utf-8") == good
    assert len(json.loads((tmp_path / NAME_FILE).read_text(encoding="utf-8"))) > 10_000
    assert "天气" in lex
    (tmp_path / NAME_FILE).unlink()
    load_lexicon((), cache_dir=tmp_path)  # missing → built silently on first use
    assert (tmp_path / NAME_FILE).is_file()


def test_cache_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("LMPO_CACHE_DIR", str(tmp_path / "c"))
    assert lexicon_dir() == tmp_path / "c" / "lexicon"
    assert lexicon_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("LMPO_CACHE_DIR")
    assert lexicon_dir().name == "lexicon" and "lmpo" in str(lexicon_dir())


def test_env_uses_lexicon_from_cache_dir(tmp_path):
    text = "诸葛亮坐在船上看着远方的江水，诸葛亮笑了。"
    cfg = EnvConfig(
        window_chars=2, use_infonce=False, lexicon_dir=str(tmp_path), augment_lexicon_with_reference=False
    )
    env = CharTextEnv([text], config=cfg)
    assert (tmp_path / FREQUENCY_FILE).is_file()
    # jieba's dict.txt: "江水 833 ns", "船上 1357 s", "诸葛 152 nr"; "上看" is not a word
    assert {"江水", "船上", "诸葛"} <= set(env.lexicon.words)
    assert "上看" not in env.lexicon  # not a dictionary word, and the reference is not added here
    env.reset(options={"chapter": 0, "position": text.index("江") + 1})  # prev ref 江, target 水
    env.set_teacher(True)
    assert env.step(0)[4]["reward/bonus"] == 1.0  # 江水 ∈ L
    env.reset(options={"chapter": 0, "position": text.index("上") + 1})  # prev ref 上, target 看
    assert env.step(0)[4]["reward/bonus"] == 0.5  # 上看 ∉ L, action = target


def test_build_lexicon_command(tmp_path, capsys):
    src = tmp_path / "dict.txt"
    src.write_text(FAKE_DICT, encoding="utf-8")
    corpus = tmp_path / "c.txt"
    corpus.write_text("今天天气很好，晴天。", encoding="utf-8")
    rc = lmpo_main(["sac", "build-lexicon", "--cache-dir", str(tmp_path / "lex"), "--source", str(src),
                    "--text", str(corpus)])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert f"{FREQUENCY_FILE}  (3 entries)" in out and f"{NAME_FILE}  (2 entries)" in out
    # bigrams of 今天天气很好，晴天。: 今天 天天 天气 气很 很好 好， ，晴 晴天 天。 → 9 distinct, 2 in the dictionary
    assert "9 distinct bigrams, 2 (22.2%) in the dictionary lexicon" in out
