"""Extra training text with its leak filter, the supervised reference (`lmpo sac reference`), and the RL stage
that starts from it (``init_policy``, the KL anchor, the policy warm-up)."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from lmpo.errors import InputError
from lmpo.textagent.env import sample_text_path
from lmpo.textagent.env.corpus import load_extra_text
from lmpo.textagent.sac import losses as L


def _write_json(path, chapters):
    path.write_text(json.dumps([{"chapter": t, "paragraphs": ps} for t, ps in chapters], ensure_ascii=False),
                    encoding="utf-8")
    return path


def test_leak_filter_drops_paragraphs_sharing_ten_han_characters_with_the_heldout_text(tmp_path):
    heldout = ["子曰：学而时习之，不亦说乎？有朋自远方来，不亦乐乎？"]
    extra = _write_json(tmp_path / "extra.json", [
        ("a", ["学而时习之不亦说乎有朋",            # 11 Han characters of the held-out text, punctuation removed
               "天地玄黄，宇宙洪荒。日月盈昃，辰宿列张。"]),  # unrelated: kept
        ("b", ["有朋自远方来，不亦乐"]),            # 9 Han characters in common only: kept
        ("c", ["曰学而时习之不亦说乎"]),            # exactly 10 in a row ("学而时习之不亦说乎" + 曰 before)
    ])
    got = load_extra_text([extra], heldout, leak_chars=10)
    assert got.chapters == ["天地玄黄，宇宙洪荒。日月盈昃，辰宿列张。有朋自远方来，不亦乐"]  # one chapter per file
    assert (got.paragraphs_kept, got.paragraphs_dropped) == (2, 2)
    assert got.chars_dropped == len("学而时习之不亦说乎有朋") + len("曰学而时习之不亦说乎")
    assert load_extra_text([extra], heldout, leak_chars=0).paragraphs_dropped == 0
    assert load_extra_text([extra], heldout, leak_chars=12).paragraphs_dropped == 0
    with pytest.raises(ValueError, match="leak_chars"):
        load_extra_text([extra], heldout, leak_chars=-1)


def test_bundled_classical_text_is_found_and_does_not_leak_the_default_heldout_chapters():
    from lmpo.textagent.env import load_corpus
    from lmpo.textagent.env.bundled import resolve_corpus

    train, heldout = load_corpus(resolve_corpus("lunyu.simplified.json")).split(0.2, seed=0)
    extra = load_extra_text([resolve_corpus("classical")], heldout, leak_chars=10)
    assert extra.paragraphs_dropped == 0 and extra.chars_kept > 300_000
    assert resolve_corpus("classical/sishu").is_dir()
    with pytest.raises(InputError, match="extra_train_corpus"):
        resolve_corpus("no/such/text", "extra_train_corpus[0]")


def test_anchor_kl_matches_the_formula_and_is_zero_at_the_reference():
    ref = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    pi = torch.tensor([[0.25, 0.75, 0.0], [0.2, 0.3, 0.5]])
    ref_logp = torch.where(ref > 0, ref.clamp_min(1e-30).log(), torch.full_like(ref, -1e9))
    logp = torch.where(pi > 0, pi.clamp_min(1e-30).log(), torch.full_like(pi, -1e9))
    expected = (0.5 * torch.log(torch.tensor(0.5 / 0.25)) + 0.5 * torch.log(torch.tensor(0.5 / 0.75))) / 2
    assert torch.allclose(L.anchor_kl(ref, ref_logp, logp), expected)
    assert L.anchor_kl(ref, ref_logp, ref_logp).item() == 0.0
    # illegal actions (probability 0 under the reference) contribute nothing, even at log π = −1e9
    logp2 = logp.clone()
    logp2[0, 2] = -1e9
    assert torch.isfinite(L.anchor_kl(ref, ref_logp, logp2))


def _small(tmp_path, **over):
    from lmpo.textagent.sac.config import TrainConfig, apply_overrides

    base = {
        "corpus": str(sample_text_path()), "heldout_fraction": 0.25, "num_envs": 2, "learning_starts": 32,
        "checkpoint_every_updates": 0, "threads": 1, "eval_max_positions": 100, "eval_generations": 2,
        "eval_generation_chars": 8, "eval_rollout_episodes": 2,
        "net": {"embed_dim": 16, "gru_hidden": 32, "policy_hidden": 32, "q_hidden": 32, "action_embed_dim": 16},
        "replay": {"transitions_per_batch": 32, "teacher_anneal_env_steps": 60},
        "env": {"window_chars": 8, "max_steps": 16, "nce_pretrain_steps": 5, "use_jieba_lexicon": False},
    }
    return apply_overrides(apply_overrides(TrainConfig(), base), over)


def test_reference_then_rl_starts_from_it_with_the_anchor(tmp_path, monkeypatch):
    from lmpo.textagent.sac.reference import train_reference
    from lmpo.textagent.sac.train import Trainer

    monkeypatch.setenv("LMPO_CACHE_DIR", str(tmp_path / "cache"))
    extra = _write_json(tmp_path / "extra.json", [("x", ["春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。"])])
    cfg = _small(tmp_path, extra_train_corpus=[str(extra)])
    summary = train_reference(cfg, tmp_path / "ref", steps=30, batch=32, eval_every=15, progress=False)
    assert summary["kind"] == "reference" and summary["num_actions"] > 0
    assert [s for s, _ in summary["heldout_top1_curve"]] == [15, 30]
    ev = summary["eval"]
    assert 0.0 <= ev["agent"]["top1"] <= ev["agent"]["top3"] <= 1.0
    assert ev["interpolation"]["top1"] == max(v["top1"] for v in ev["interpolation"]["by_lambda"].values())
    assert summary["extra_text"]["chars_kept"] == len("春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。")
    with pytest.raises(InputError, match="not empty"):
        train_reference(cfg, tmp_path / "ref", steps=2, progress=False)

    from safetensors.torch import load_file

    ref_state = load_file(str(tmp_path / "ref" / "policy.safetensors"))
    rl = _small(tmp_path, extra_train_corpus=[str(extra)], init_policy=str(tmp_path / "ref"),
                sac={"anchor_weight": 1.0, "policy_warmup_updates": 4})
    t = Trainer(rl, tmp_path / "rl", progress=False)
    assert all(torch.equal(t.agent.policy.state_dict()[k], v) for k, v in ref_state.items())
    t.run(max_updates=8)
    assert t.bundle.extra_report["chars_kept"] == len("春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。")
    row = t.history[-1] if t.history else {}
    assert t.agent.updates == 8 and t.agent.ref_policy is not None
    assert all(torch.equal(t.agent.ref_policy.state_dict()[k], v) for k, v in ref_state.items())  # frozen
    assert row == {} or "losses/anchor_kl" in row

    # another alphabet (no extra text): refused, naming the fix
    with pytest.raises(InputError, match="another alphabet"):
        Trainer(_small(tmp_path, init_policy=str(tmp_path / "ref")), tmp_path / "rl2", progress=False)
    with pytest.raises(InputError, match="init_policy"):
        _small(tmp_path, init_policy=str(tmp_path / "missing")).validate()


def _replay_batch(seed: int, is_demo: bool):
    """A small random replay batch (B = 6 windows of M = 4 over A = 7 actions, action 0 illegal)."""
    from lmpo.textagent.sac.replay import ReplaySample

    B, M, A = 6, 4, 7
    g = torch.Generator().manual_seed(seed)
    legal = torch.ones(B, A, dtype=torch.bool)
    legal[:, 0] = False
    return ReplaySample(
        obs=torch.randint(1, A, (B, M), generator=g), legal=legal, action=torch.randint(1, A, (B,), generator=g),
        reward=torch.randn(B, generator=g), next_obs=torch.randint(1, A, (B, M), generator=g), next_legal=legal,
        terminated=torch.zeros(B), truncated=torch.zeros(B), is_demo=torch.full((B,), is_demo),
        teacher_action=torch.randint(1, A, (B,), generator=g), is_relabeled=torch.zeros(B, dtype=torch.bool),
    ), g


def test_policy_warmup_keeps_the_rl_term_off():
    from lmpo.textagent.sac.agent import SACAgent
    from lmpo.textagent.sac.config import NetworkConfig, SACConfig

    net = NetworkConfig(embed_dim=8, gru_hidden=8, policy_hidden=8, q_hidden=8, action_embed_dim=8)
    A = 7
    batch, _ = _replay_batch(0, is_demo=False)
    for warmup, moves in ((2, False), (0, True)):
        agent = SACAgent(A, 0, net, SACConfig(bc_weight=0.0, policy_warmup_updates=warmup), seed=0)
        before = [p.detach().clone() for p in agent.policy.parameters()]
        agent.update(batch)
        changed = any(not torch.equal(a, b) for a, b in zip(before, agent.policy.parameters()))
        assert changed is moves


def test_frozen_policy_warmup_keeps_the_policy_exactly_while_the_critics_learn():
    from lmpo.textagent.sac.agent import SACAgent
    from lmpo.textagent.sac.config import NetworkConfig, SACConfig

    net = NetworkConfig(embed_dim=8, gru_hidden=8, policy_hidden=8, q_hidden=8, action_embed_dim=8)
    A = 7
    batch, _ = _replay_batch(0, is_demo=True)  # demo rows: BC alone would move an "imitate" warm-up
    for mode, frozen in (("frozen", True), ("imitate", False)):
        agent = SACAgent(A, 0, net, SACConfig(bc_weight=1.0, policy_warmup_updates=2, policy_warmup=mode), seed=0)
        pol = [p.detach().clone() for p in agent.policy.parameters()]
        crit = [p.detach().clone() for p in agent.critic.parameters()]
        agent.update(batch)
        agent.update(batch)
        assert all(torch.equal(a, b) for a, b in zip(pol, agent.policy.parameters())) is frozen
        assert any(not torch.equal(a, b) for a, b in zip(crit, agent.critic.parameters()))
        assert agent.updates == 2
        # the warm-up is over: the third update moves the policy in either mode
        pol = [p.detach().clone() for p in agent.policy.parameters()]
        agent.update(batch)
        assert any(not torch.equal(a, b) for a, b in zip(pol, agent.policy.parameters()))


def test_cosine_policy_schedule_follows_the_update_count(tmp_path, monkeypatch):
    import math

    from lmpo.textagent.sac.config import ConfigError
    from lmpo.textagent.sac.train import Trainer

    monkeypatch.setenv("LMPO_CACHE_DIR", str(tmp_path / "cache"))
    cfg = _small(tmp_path, max_updates=12, sac={"lr_policy": 1e-3, "lr_policy_schedule": "cosine",
                                                 "lr_q": 2e-3, "lr_q_schedule": "cosine"})
    t = Trainer(cfg, tmp_path / "run", progress=False)
    t.run(max_updates=6)
    # the last update (number 6, counted from 0 = update 5) ran at lr·½(1 + cos(π·5/12))
    decay = 0.5 * (1 + math.cos(math.pi * 5 / 12))
    assert math.isclose(t.agent.opt_policy.param_groups[0]["lr"], 1e-3 * decay)
    assert math.isclose(t.agent.opt_q.param_groups[0]["lr"], 2e-3 * decay)
    for key in ("lr_policy_schedule", "lr_q_schedule"):
        with pytest.raises(ConfigError, match=f"sac.{key}.*max_updates"):
            _small(tmp_path, max_updates=0, sac={key: "cosine"}).validate()
    # constant: the critics keep their learning rate
    t = Trainer(_small(tmp_path, max_updates=12, sac={"lr_q": 2e-3}), tmp_path / "run2", progress=False)
    t.run(max_updates=3)
    assert t.agent.opt_q.param_groups[0]["lr"] == 2e-3


def test_resume_of_a_run_stored_before_a_field_existed_is_not_a_config_change(tmp_path, monkeypatch):
    from lmpo.textagent.sac.train import train

    monkeypatch.setenv("LMPO_CACHE_DIR", str(tmp_path / "cache"))
    cfg = _small(tmp_path, total_env_steps=48, eval_max_positions=20)
    train(cfg, tmp_path / "run", progress=False, evaluate=False)
    stored = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    del stored["sac"]["lr_policy_schedule"], stored["eval_no_repeat_ngram"]  # as written by an older lmpo,
    (tmp_path / "run" / "config.yaml").unlink()  # which stored it as config.json
    (tmp_path / "run" / "config.json").write_text(json.dumps(stored))
    train(cfg, tmp_path / "run", resume=True, progress=False, evaluate=False)  # no InputError
    with pytest.raises(InputError, match="sac.gamma"):
        from lmpo.textagent.sac.config import apply_overrides

        train(apply_overrides(cfg, {"sac": {"gamma": 0.5}}), tmp_path / "run", resume=True, progress=False,
              evaluate=False)


def test_bc_text_batch_adds_the_cross_entropy_of_the_training_text(tmp_path, monkeypatch):
    import torch.nn.functional as F

    from lmpo.textagent.sac.agent import SACAgent
    from lmpo.textagent.sac.config import NetworkConfig, SACConfig
    from lmpo.textagent.sac.train import Trainer

    net = NetworkConfig(embed_dim=8, gru_hidden=8, policy_hidden=8, q_hidden=8, action_embed_dim=8)
    M, A = 4, 7
    batch, g = _replay_batch(1, is_demo=True)
    text = (torch.randint(1, A, (5, M), generator=g), batch.legal[:5], torch.randint(1, A, (5,), generator=g))
    plain = SACAgent(A, 0, net, SACConfig(), seed=0)
    with_text = SACAgent(A, 0, net, SACConfig(), seed=0)
    _, logp_text = with_text.policy(text[0], text[1])
    expected_extra = F.nll_loss(logp_text, text[2]).item()
    extra = with_text.update(batch, text)["losses/bc"].item() - plain.update(batch)["losses/bc"].item()
    assert abs(extra - expected_extra) < 1e-5

    monkeypatch.setenv("LMPO_CACHE_DIR", str(tmp_path / "cache"))
    t = Trainer(_small(tmp_path, sac={"bc_text_batch": 8}), tmp_path / "run", progress=False)
    pairs = t.text_pairs
    assert len(pairs) == len(pairs.windows) > 0 and pairs.windows.shape[1] == t.bundle.window
    t.run(max_updates=4)
    assert t.agent.updates == 4


def test_corpus_share_draws_that_share_of_each_batch_from_the_corpus_chapters(tmp_path):
    from lmpo.textagent.env import Alphabet
    from lmpo.textagent.env.compliance import Compliance
    from lmpo.textagent.sac.config import ConfigError
    from lmpo.textagent.sac.textdata import TextPairs, training_pairs

    corpus, extra = ["学而时习之不亦说乎"], ["春眠不觉晓处处闻啼鸟", "夜来风雨声花落知多少"]
    alphabet = Alphabet.from_texts(corpus + extra)
    compliance = Compliance(alphabet)
    pairs = TextPairs(corpus, extra, alphabet, compliance, 4)
    X, _, Y = training_pairs(corpus + extra, alphabet, compliance, 4)
    assert torch.equal(pairs.windows, X) and torch.equal(pairs.targets, Y)  # corpus rows first, same pairs
    assert pairs.num_corpus == len(training_pairs(corpus, alphabet, compliance, 4)[2]) == 8
    assert len(TextPairs(corpus, [], alphabet, compliance, 4)) == 8 and len(TextPairs([], [], alphabet, compliance, 4)) == 0

    g = torch.Generator().manual_seed(0)
    draw = lambda lo, hi, n: torch.randint(lo, hi, (n,), generator=g)  # noqa: E731
    idx = pairs.sample(40, 0.25, draw)
    assert (idx < 8).sum() == 10 and ((idx >= 8) & (idx < len(pairs))).sum() == 30
    uniform = torch.cat([pairs.sample(40, 0.0, draw) for _ in range(50)])
    assert 0.25 < (uniform < 8).float().mean() < 0.55  # 8 of 26 rows ≈ 0.31 when every row is equally likely
    windows, masks, targets = pairs.batch(idx)
    assert masks.shape == (40, len(alphabet)) and bool(masks[torch.arange(40), targets].all())

    with pytest.raises(ConfigError, match="corpus_share.*extra_train_corpus"):
        _small(tmp_path, corpus_share=0.5).validate()


def test_training_pairs_are_every_allowed_position_with_its_window_and_blocked_id():
    from lmpo.textagent.env import Alphabet
    from lmpo.textagent.env.compliance import Compliance
    from lmpo.textagent.sac.evaluate import left_padded_window
    from lmpo.textagent.sac.textdata import training_pairs

    texts = ["哈哈哈哈哈。子曰：学而时习之", "之", "不不不，不不不不也"]
    alphabet = Alphabet.from_texts(texts)
    compliance = Compliance(alphabet, max_run_chars=3, blacklist="也")
    m = 5
    expected = []  # the definition, position by position
    for text in texts:
        ids = alphabet.encode(text)
        for p in range(1, len(ids)):
            b = compliance.run_blocked(ids[:p])
            if ids[p] != b and compliance.static_mask[ids[p]]:
                expected.append((left_padded_window(ids, p, m, alphabet.pad_id).tolist(), b, ids[p]))
    X, blocked, Y = training_pairs(texts, alphabet, compliance, m)
    assert list(zip(X.tolist(), blocked.tolist(), Y.tolist())) == expected
    # kept with the run's id blocked: 。 after 哈×5 and ， after 不不不; a fourth 哈 / 不 is forbidden (dropped), and
    # 也 is blacklisted
    assert (blocked >= 0).sum() == 2
