from __future__ import annotations

import numpy as np
import pytest

from lmpo.textagent.env import Alphabet, Compliance, char_class_ok


def test_code_point_classes():
    # Cc, Cf, Co, Cn (U+0378 is unassigned), surrogate-free replacement char: rejected
    for ch in ["\x07", "\n", "\u200b", "\ue000", "\u0378", "\ufffd"]:
        assert not char_class_ok(ch), repr(ch)
    for ch in ["中", "，", "a", " ", "。", "“"]:
        assert char_class_ok(ch), repr(ch)


def _alphabet():
    # counts: 的 5, 了 4, 哈 3, \u200b 2, 好 1  → ids 3.. in that order
    return Alphabet.from_texts(["的的的的的了了了了哈哈哈\u200b\u200b好"])


def test_static_mask_specials_and_blacklist(tmp_path):
    a = _alphabet()
    assert a.chars[3:] == ["的", "了", "哈", "\u200b", "好"]
    c = Compliance(a, max_run_chars=3, blacklist={"好"})
    m, fb = c.mask([])
    # pad, unk never legal; eos always; \u200b (Cf) and the blacklisted 好 rejected
    assert m.tolist() == [False, True, False, True, True, True, False, False] and not fb
    # reloadable blacklist file
    f = tmp_path / "black.txt"
    f.write_text("# comment line 的\n了\n", encoding="utf-8")
    c = Compliance(a, blacklist_path=f)
    assert c.mask([])[0][a.char_to_id["了"]] == False  # noqa: E712
    assert c.mask([])[0][a.char_to_id["的"]] == True  # noqa: E712  (comment lines are ignored)
    f.write_text("哈\n", encoding="utf-8")
    c.reload_blacklist()
    assert c.mask([])[0][a.char_to_id["了"]] and not c.mask([])[0][a.char_to_id["哈"]]


def test_run_length_rule_only_blocks_the_repeated_char():
    a = _alphabet()
    c = Compliance(a, max_run_chars=3)
    de, le = a.char_to_id["的"], a.char_to_id["了"]
    assert c.legal([de, de], de)  # a run of 2 may grow to 3
    assert not c.legal([le, de, de, de], de)  # a run of 3 may not grow to 4
    assert c.legal([de, de, de], le)
    m, _ = c.mask([le, de, de, de])
    static, _ = c.mask([])
    diff = np.flatnonzero(m != static)
    assert diff.tolist() == [de]
    # out-of-range actions are illegal, not an exception
    assert not c.legal([], len(a)) and not c.legal([], -1)


def test_whitelist_fallback_when_fewer_than_three_legal():
    a = _alphabet()
    # blacklist everything but 的 → legal set {的, eos} has 2 < 3 entries → whitelist of the top-2 chars + eos
    c = Compliance(a, blacklist=set("了哈好"), whitelist_size=2)
    m, fb = c.mask([])
    assert fb
    assert np.flatnonzero(m).tolist() == [a.eos_id, a.char_to_id["的"], a.char_to_id["了"]]
    # the whitelist skips code points of a rejected class (\u200b would be 4th; size 4 gives 的 了 哈 好)
    c = Compliance(a, blacklist=set("了哈好"), whitelist_size=4)
    assert [a.chars[i] for i in np.flatnonzero(c.mask([])[0])] == ["<eos>", "的", "了", "哈", "好"]
    # the run rule can also trigger the fallback: {eos, 的, 了} is legal statically (3 entries); after
    # "的" with max_run_chars=1 the run rule removes 的 → 2 < 3 → whitelist (的, 了) + eos, which deliberately
    # ignores the rules that made the set too small, so 的 is legal again
    c = Compliance(a, blacklist=set("哈好"), whitelist_size=2, max_run_chars=1)
    de = a.char_to_id["的"]
    assert not c.mask([])[1]
    m, fb = c.mask([de])
    assert fb and m[de] and c.legal([de], de)


def test_bad_config():
    with pytest.raises(ValueError, match="max_run_chars=0"):
        Compliance(_alphabet(), max_run_chars=0)
    with pytest.raises(FileNotFoundError, match="blacklist_path"):
        Compliance(_alphabet(), blacklist_path="/nonexistent/black.txt")
