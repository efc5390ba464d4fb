from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from lmpo.textagent.env import ENV_ID, Alphabet, CharTextEnv, EnvConfig, load_corpus
from lmpo.textagent.env.cli import main as textenv_cli


def test_ids_order_encode_decode():
    a = Alphabet.from_texts(["好好好，天天。", "天好"], min_count=1)
    # specials first, then by descending count (好 4, 天 3), ties by code point (， U+FF0C > 。 U+3002)
    assert a.chars == ["<pad>", "<eos>", "<unk>", "好", "天", "。", "，"]
    assert (a.pad_id, a.eos_id, a.unk_id, len(a)) == (0, 1, 2, 7)
    assert a.counts.tolist() == [0, 0, 0, 4, 3, 1, 1]
    assert a.encode("天好雨") == [4, 3, 2]
    assert a.decode([0, 0, 4, 3, 1]) == "天好<eos>"
    assert "好" in a and "雨" not in a
    assert Alphabet.from_texts(["好好好，天天。"], min_count=2).chars[3:] == ["好", "天"]
    with pytest.raises(ValueError, match="min_count=5"):
        Alphabet.from_texts(["好好"], min_count=5)


def test_garble_mask():
    a = Alphabet.from_texts(["好好天天罕。"])
    g = a.garble_mask(common_min_count=2)
    # rare 罕 (count 1) is garble, rare punctuation 。 is not, eos never, pad/unk always
    assert {a.chars[i] for i in np.flatnonzero(g)} == {"<pad>", "<unk>", "罕"}


def test_make_with_text_path_and_corpus_object(tmp_path):
    f = tmp_path / "book.txt"
    f.write_text("第一章\n\n" + "春天到了，小河里的冰化了。" * 6 + "\n\n第二章\n\n" + "夏天来了，树上的知了叫了。" * 6,
                 encoding="utf-8")  # fmt: skip
    cfg = EnvConfig(window_chars=8, use_infonce=False, heldout_fraction=0.5, split="heldout")
    env = gym.make(ENV_ID, text=str(f), config=cfg)
    obs, info = env.reset(seed=0)
    assert len(env.unwrapped.chapters) == 1 and obs["window"].shape == (8,)
    # the alphabet comes from the train chapter: the held-out chapter's other characters are <unk>
    train_ch = load_corpus(f).split(0.5, 0)[0][0]
    assert set(env.unwrapped.alphabet.chars[3:]) == set(train_ch)
    env2 = CharTextEnv(load_corpus(f), config=EnvConfig(window_chars=8, use_infonce=False))
    assert len(env2.chapters) == 2


def test_env_demo_command(capsys):
    assert textenv_cli(["env-demo", "--steps", "5", "--pretrain-steps", "5", "--teacher-ratio", "1.0"]) == 0
    out = capsys.readouterr().out.splitlines()
    steps = [line for line in out if line.startswith("Step ")]
    assert len(steps) == 5 and all("source=teacher" in s for s in steps)
    assert out[-1].startswith("return ") and "truncated=True" in out[-1]
