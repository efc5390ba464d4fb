from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from lmpo.textagent.env import ENV_ID, REWARD_KEYS, CharTextEnv, EnvConfig, coverage_from_scratch
from lmpo.textagent.env.lexicon import Lexicon

FAST = dict(nce_pretrain_steps=20)
CONTRACT_INFO_KEYS = {
    "reward/cov", "reward/nce", "reward/bonus", "reward/garble", "reward/illegal", "reward/base",
    "reward/potential", "reward/soft", "is_teacher", "teacher_action", "target_char", "prev_char",
    "action_char", "is_illegal",
}  # fmt: skip


def _random_legal(env, obs, rng):
    legal = np.flatnonzero(obs["legal_mask"])
    return int(legal[rng.integers(len(legal))])


def test_check_env_unwrapped_and_via_make():
    env = CharTextEnv(config=EnvConfig(**FAST))
    check_env(env, skip_render_check=True)
    made = gym.make(ENV_ID, config=EnvConfig(**FAST), render_mode="ansi")
    check_env(made.unwrapped)
    assert made.spec.id == ENV_ID
    obs, _ = made.reset(seed=0)
    assert made.render().startswith("reset")
    made.step(_random_legal(made, obs, np.random.default_rng(0)))
    assert made.render().startswith("Step 01 | prev=")


def test_spaces_and_contract_keys(sample_chapters):
    env = CharTextEnv(sample_chapters, config=EnvConfig(window_chars=16, **FAST))
    A = len(env.alphabet)
    assert env.action_space.n == A
    assert env.observation_space["window"].shape == (16,)
    assert env.observation_space["legal_mask"].n == A
    obs, info = env.reset(seed=1)
    assert obs["window"].dtype == np.int64 and obs["legal_mask"].dtype == np.int8
    assert np.array_equal(env.action_masks(), obs["legal_mask"].astype(bool))
    assert not env.action_masks()[env.alphabet.pad_id] and env.action_masks()[env.alphabet.eos_id]
    _, _, _, _, info = env.step(_random_legal(env, obs, np.random.default_rng(0)))
    assert CONTRACT_INFO_KEYS <= set(info) and set(REWARD_KEYS) <= set(info)


def _rollout(env, seed, steps, action_seed=0):
    rng = np.random.default_rng(action_seed)
    obs, info = env.reset(seed=seed)
    out = [(obs["window"].tolist(), info)]
    for _ in range(steps):
        obs, r, term, trunc, info = env.step(_random_legal(env, obs, rng))
        out.append((obs["window"].tolist(), obs["legal_mask"].tolist(), r, term, trunc, info))
        if term or trunc:
            obs, info = env.reset()
            out.append((obs["window"].tolist(), info))
    return out


def test_seeded_determinism(sample_chapters):
    cfg = EnvConfig(max_steps=10, **FAST)
    a = _rollout(CharTextEnv(sample_chapters, config=cfg), seed=7, steps=40)
    env_b = CharTextEnv(sample_chapters, config=cfg)
    assert a == _rollout(env_b, seed=7, steps=40)
    # a seeded reset restores the normaliser statistics and the negative queue too
    assert a == _rollout(env_b, seed=7, steps=40)
    assert a != _rollout(env_b, seed=8, steps=40)


def test_terminated_and_truncated_are_apart(sample_chapters):
    env = CharTextEnv(sample_chapters, config=EnvConfig(max_steps=5, **FAST))
    obs, _ = env.reset(seed=0)
    env.set_teacher(True)
    flags = [env.step(0)[2:4] for _ in range(5)]
    assert flags == [(False, False)] * 4 + [(False, True)]  # truncated after T steps
    # chapter end: the last target is <eos>, reached → terminated, not truncated
    last = len(sample_chapters[0])
    env.reset(options={"chapter": 0, "position": last - 2})
    assert [env.teacher_action() for _ in range(1)] == [env.alphabet.char_to_id[sample_chapters[0][-2]]]
    r = [env.step(0)[2:4] for _ in range(3)]
    assert r == [(False, False), (False, False), (True, False)]
    # the agent emitting <eos> terminates
    env.set_teacher(False)
    env.reset(seed=3)
    _, _, term, trunc, info = env.step(env.alphabet.eos_id)
    assert (term, trunc, info["is_eos"]) == (True, False, True)


def test_teacher_override_advances_history_with_reference(sample_chapters):
    env = CharTextEnv(sample_chapters, config=EnvConfig(window_chars=8, **FAST))
    obs, _ = env.reset(options={"chapter": 1, "position": 20})
    ch = sample_chapters[1]
    env.set_teacher(True)
    for t in range(6):
        target = env.teacher_action()
        assert target == env.alphabet.char_to_id[ch[20 + t]]
        agent = env.alphabet.char_to_id["的"]
        obs, r, term, trunc, info = env.step(agent)
        assert info["is_teacher"] and info["teacher_action"] == target and info["agent_action"] == agent
        assert info["action"] == target and info["action_char"] == ch[20 + t]
        assert env.alphabet.decode(obs["window"]) == ch[20 + t - 7 : 20 + t + 1]
    env.set_teacher(False)
    obs, *_, info = env.step(env.alphabet.char_to_id["的"])
    assert not info["is_teacher"] and env.alphabet.decode(obs["window"])[-1] == "的"


def test_observations_never_contain_reference_ahead(sample_chapters):
    # an agent that always plays one character: the window is the initial history plus that character only
    cfg = EnvConfig(window_chars=12, max_steps=40, max_run_chars=1000, **FAST)
    env = CharTextEnv(sample_chapters, config=cfg)
    x = env.alphabet.char_to_id["雨"]
    for seed in range(5):
        obs, info = env.reset(seed=seed)
        history = env.alphabet.encode(
            sample_chapters[info["chapter"]][info["position"] - 12 : info["position"]]
        )
        assert obs["window"].tolist() == history
        seq = list(history)
        for _ in range(40):
            obs, r, term, trunc, info = env.step(x)
            seq.append(x)
            assert obs["window"].tolist() == seq[-12:]
            if term or trunc:
                break
    # two chapters with the same past and different futures give identical observations and masks
    common = "春天来了，河边的柳树发芽了。"
    chapters = [common + "小鸟在树上唱歌。" * 3, common + "大家都去田里干活。" * 3]
    env = CharTextEnv(chapters, config=EnvConfig(window_chars=10, use_infonce=False, use_bigram_bonus=False))
    rng = np.random.default_rng(0)
    actions = [int(a) for a in rng.integers(3, len(env.alphabet), size=12)]
    seen = []
    for ci in (0, 1):
        obs, _ = env.reset(options={"chapter": ci, "position": len(common)})
        trace = [(obs["window"].tolist(), obs["legal_mask"].tolist())]
        for a in actions:
            obs, *_ = env.step(a)
            trace.append((obs["window"].tolist(), obs["legal_mask"].tolist()))
        seen.append(trace)
    assert seen[0] == seen[1]


RUN_TEXT = "他听完以后笑着说：哈哈哈哈，真是太好了。我们明天再去河边看看吧，好不好？"


def test_mask_conflict_teacher_is_accepted_and_reported():
    cfg = EnvConfig(window_chars=4, max_run_chars=3, use_infonce=False, use_bigram_bonus=False)
    env = CharTextEnv([RUN_TEXT], config=cfg)
    ha = env.alphabet.char_to_id["哈"]
    fourth = RUN_TEXT.index("哈") + 3
    env.reset(options={"chapter": 0, "position": fourth})
    assert env.teacher_action() == ha and not env.action_masks()[ha]  # the run rule forbids the 4th 哈
    env.set_teacher(True)
    obs, r, term, trunc, info = env.step(0)
    assert info["mask_conflict"] and not info["is_illegal"] and info["reward/illegal"] == 0.0
    assert not term and obs["window"].tolist() == [ha] * 4
    # the same character played by the agent is illegal: −λ_ill and an early stop
    env.set_teacher(False)
    env.reset(options={"chapter": 0, "position": fourth})
    obs, r, term, trunc, info = env.step(ha)
    assert (r, term, trunc, info["is_illegal"], info["mask_conflict"]) == (-2.0, True, False, True, False)
    assert (
        info["reward/base"] == -2.0 and obs["window"].tolist() == [env.alphabet.char_to_id["："]] + [ha] * 3
    )


def test_illegal_without_early_stop_penalises_and_continues():
    cfg = EnvConfig(
        window_chars=4, illegal_done=False, use_infonce=False, use_bigram_bonus=False, use_garble=False
    )
    env = CharTextEnv([RUN_TEXT], config=cfg)
    env.reset(options={"chapter": 0, "position": 10})
    obs, r, term, trunc, info = env.step(env.alphabet.pad_id)
    assert info["is_illegal"] and not term and info["reward/illegal"] == 1.0
    assert r == pytest.approx(info["reward/cov_norm"] - 2.0)
    with pytest.raises(ValueError, match="outside Discrete"):
        env.step(len(env.alphabet))


def test_reward_composition_and_coverage_in_env(sample_chapters):
    cfg = EnvConfig(max_steps=30, potential_coef=0.2, **FAST)
    env = CharTextEnv(sample_chapters, config=cfg)
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=2)
    ref = env._chapter_ref(info["chapter"])
    start = info["position"] - cfg.window_chars
    for _ in range(30):
        a = env.teacher_action() if rng.random() < 0.5 else _random_legal(env, obs, rng)
        obs, r, term, trunc, info = env.step(a)
        y = env._y
        expect_cov = coverage_from_scratch(y, ref[start : start + len(y)], cfg.window_chars, 3, 64)
        assert info["reward/cov"] == pytest.approx(expect_cov, abs=1e-12)
        base = (
            cfg.lambda_cov * info["reward/cov_norm"] + cfg.lambda_nce * info["reward/nce_norm"]
            - cfg.lambda_gar * info["reward/garble"] - cfg.lambda_ill * info["reward/illegal"]
        )  # fmt: skip
        assert info["reward/base"] == pytest.approx(base, abs=1e-12)
        assert r == pytest.approx(
            info["reward/base"] + info["reward/potential"] + info["reward/soft"], abs=1e-12
        )
        assert info["reward/nce"] <= 0.0
        if term or trunc:
            break


def test_potential_shaping_telescopes_to_zero_on_termination(sample_chapters):
    cfg = EnvConfig(potential_coef=0.5, potential_gamma=0.9, max_steps=200, use_infonce=False)
    env = CharTextEnv(sample_chapters, config=cfg)
    last = len(sample_chapters[0])
    env.reset(options={"chapter": 0, "position": last - 12})
    env.set_teacher(True)
    pots, term = [], False
    while not term:
        _, _, term, _, info = env.step(0)
        pots.append(info["reward/potential"])
        assert abs(info["reward/potential"]) <= 0.5
    # Σ γ^t (γΦ(s_{t+1}) − Φ(s_t)) = γ^T Φ(s_T) − Φ(s_0) = 0 with Φ(s_0) = 0 and Φ(terminal) = 0
    assert len(pots) == 13
    assert sum(0.9**t * p for t, p in enumerate(pots)) == pytest.approx(0.0, abs=1e-12)
    assert pots[0] > 0  # a correct first step raises the potential


def test_bigram_bonus_lexicon_then_match_fallback():
    text = "今天天气很好，我们一起去公园散步吧。" * 3
    lex = Lexicon({"天气": 3}, num_dictionary=1, num_names=0, num_reference=0)
    cfg = EnvConfig(window_chars=2, use_infonce=False, lambda_bigram=1.0, bigram_match_bonus=0.5)
    env = CharTextEnv([text], config=cfg, lexicon=lex)
    ids = env.alphabet.char_to_id
    env.reset(options={"chapter": 0, "position": 3})  # prev ref "天", target "气"
    env.set_teacher(True)
    assert env.step(0)[4]["reward/bonus"] == 1.0  # 天气 ∈ L
    info = env.step(0)[4]  # prev "气", target "很": 气很 ∉ L, action = target → 0.5
    assert (info["reward/bonus"], info["reward/soft"]) == (0.5, 0.5)
    env.set_teacher(False)
    info = env.step(ids["我"])[4]  # prev "很", target "好", action 我: neither
    assert info["reward/bonus"] == 0.0
    env.reset(options={"chapter": 0, "position": 3})
    assert env.step(ids["气"])[4]["reward/bonus"] == 1.0  # agent action forms the lexicon word too
    # switched off: no bonus at all
    env2 = CharTextEnv([text], config=EnvConfig(window_chars=2, use_infonce=False, use_bigram_bonus=False))
    env2.reset(options={"chapter": 0, "position": 3})
    env2.set_teacher(True)
    assert env2.step(0)[4]["reward/bonus"] == 0.0


def test_garble_and_reward_switches():
    text = "这是一段很普通的文字，这是一段很普通的文字。罕"
    cfg = EnvConfig(window_chars=2, use_infonce=False, use_bigram_bonus=False, use_normalisation=False)
    env = CharTextEnv([text], config=cfg)
    env.reset(options={"chapter": 0, "position": 2})
    info = env.step(env.alphabet.char_to_id["罕"])[4]  # count 1 < garble_min_count 2, not punctuation
    assert info["reward/garble"] == 1.0
    assert info["reward/base"] == pytest.approx(info["reward/cov"] - 0.1)
    env.reset(options={"chapter": 0, "position": 2})
    assert env.step(env.alphabet.char_to_id["，"])[4]["reward/garble"] == 0.0  # rare punctuation is fine
    off = CharTextEnv([text], config=EnvConfig(window_chars=2, use_infonce=False, use_bigram_bonus=False,
                                               use_coverage=False, use_garble=False))  # fmt: skip
    off.reset(options={"chapter": 0, "position": 2})
    _, r, *_, info = off.step(off.alphabet.char_to_id["罕"])
    assert (r, info["reward/cov"], info["reward/garble"]) == (0.0, 0.0, 0.0)


def test_blacklist_reload_applies_to_next_mask(tmp_path):
    f = tmp_path / "black.txt"
    f.write_text("", encoding="utf-8")
    env = CharTextEnv([RUN_TEXT], config=EnvConfig(window_chars=4, blacklist_path=str(f), use_infonce=False,
                                                   use_bigram_bonus=False))  # fmt: skip
    env.reset(options={"chapter": 0, "position": 5})
    hao = env.alphabet.char_to_id["好"]
    assert env.action_masks()[hao]
    f.write_text("好\n", encoding="utf-8")
    env.reload_blacklist()
    assert not env.action_masks()[hao]


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="coverage_window_chars=2 must be >= ngram_n=3"):
        EnvConfig(coverage_window_chars=2)
    with pytest.raises(ValueError, match="start='middle'"):
        EnvConfig(start="middle")
    with pytest.raises(ValueError, match="no chapters with text"):
        CharTextEnv(["", ""], config=EnvConfig(use_infonce=False))


def test_step_after_episode_end_is_an_error(sample_chapters):
    env = CharTextEnv(sample_chapters, config=EnvConfig(max_steps=1, use_infonce=False))
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(1)
    env.reset(seed=0)
    assert env.step(env.teacher_action())[3]  # truncated after T = 1
    with pytest.raises(RuntimeError, match="episode has ended"):
        env.step(env.alphabet.eos_id)
    env.reset()
    assert env.step(env.alphabet.eos_id)[2]


def test_normalised_components_follow_the_ema_standardiser(sample_chapters):
    from lmpo.textagent.env import EmaStandardizer

    env = CharTextEnv(sample_chapters, config=EnvConfig(norm_beta=0.05, max_steps=200, **FAST))
    ref_cov, ref_nce = EmaStandardizer(0.05, warmup=True), EmaStandardizer(0.05, warmup=True)
    rng = np.random.default_rng(1)
    obs, _ = env.reset(seed=4)
    for _ in range(60):
        obs, r, term, trunc, info = env.step(_random_legal(env, obs, rng))
        assert info["reward/cov_norm"] == pytest.approx(ref_cov.update(info["reward/cov"]), abs=1e-12)
        assert info["reward/nce_norm"] == pytest.approx(ref_nce.update(info["reward/nce"]), abs=1e-12)
        if term or trunc:
            obs, _ = env.reset()  # no seed: the statistics keep running
    assert env.normaliser_stats()["norm/cov_mean"] == pytest.approx(ref_cov.mean)


def test_out_of_alphabet_target_is_unk_and_a_mask_conflict():
    train = "我们今天去山上看红叶，山上的红叶很好看。" * 3
    heldout = "我们明天去河边看小鱼，河边的小鱼很好看。" * 3
    from lmpo.textagent.env import Alphabet

    alphabet = Alphabet.from_texts([train])
    env = CharTextEnv(
        [heldout], alphabet, EnvConfig(window_chars=4, use_infonce=False, use_bigram_bonus=False)
    )
    env.reset(options={"chapter": 0, "position": 2})  # target 明 is not in the train alphabet
    assert env.teacher_action() == alphabet.unk_id and not env.action_masks()[alphabet.unk_id]
    env.set_teacher(True)
    obs, r, term, trunc, info = env.step(0)
    assert info["mask_conflict"] and info["target_char"] == "<unk>" and not term
    assert obs["window"][-1] == alphabet.unk_id


def test_chapter_start_mode(sample_chapters):
    env = CharTextEnv(
        sample_chapters, config=EnvConfig(start="chapter_start", window_chars=16, use_infonce=False)
    )
    for seed in range(4):
        _, info = env.reset(seed=seed)
        assert info["position"] == 16


def test_everything_blacklisted_falls_back_to_whitelist_and_bad_chapters():
    text = "一二三四五六七八九十" * 3
    cfg = EnvConfig(
        window_chars=4, blacklist=(text,), whitelist_size=5, use_infonce=False, use_bigram_bonus=False
    )
    env = CharTextEnv([text], config=cfg)
    obs, info = env.reset(seed=0)
    assert info["mask_fallback"] and int(obs["legal_mask"].sum()) == 6  # 5 whitelist chars + <eos>
    with pytest.raises(ValueError, match="no legal characters"):
        CharTextEnv(["\u200b\u200c" * 40], config=EnvConfig(window_chars=4, use_infonce=False))
    with pytest.raises(TypeError, match="chapters must be strings, got int"):
        CharTextEnv(["好的", 3], config=EnvConfig(use_infonce=False))


def test_lambda_target_ranks_the_reference_character_above_other_lexicon_hits():
    text = "今天天气很好，我们一起去公园散步吧。" * 3
    lex = Lexicon({"天气": 3, "天空": 3}, num_dictionary=2, num_names=0, num_reference=0)
    cfg = EnvConfig(window_chars=2, use_infonce=False, lambda_bigram=1.0, bigram_match_bonus=0.5, lambda_target=2.0)
    env = CharTextEnv([text + "空"], config=cfg, lexicon=lex)
    ids = env.alphabet.char_to_id
    env.reset(options={"chapter": 0, "position": 3})  # prev ref "天", target "气"
    assert env.step(ids["气"])[4]["reward/bonus"] == 3.0  # 天气 ∈ L and = target: λ_bigram + λ_target
    env.reset(options={"chapter": 0, "position": 3})
    assert env.step(ids["空"])[4]["reward/bonus"] == 1.0  # 天空 ∈ L, not the target: λ_bigram only
    env.reset(options={"chapter": 0, "position": 4})  # prev "气", target "很": 气很 ∉ L
    assert env.step(ids["很"])[4]["reward/bonus"] == 2.5  # fallback 0.5 + λ_target
