from __future__ import annotations

import numpy as np
import pytest
import torch

from lmpo.textagent.env import CharTextEnv, EnvConfig
from lmpo.textagent.env.infonce import InfoNCEConfig, InfoNCEModel, InfoNCEScorer


def _episode_nce(env, chapter, position, actions=None, steps=24):
    env.reset(seed=0, options={"chapter": chapter, "position": position})  # seeded: same queue for both
    env.set_teacher(actions is None)
    out = []
    for t in range(steps):
        info = env.step(0 if actions is None else actions[t])[4]
        out.append(info["reward/nce"])
    env.set_teacher(False)
    return float(np.mean(out))


def test_nce_higher_for_true_continuation_than_shuffled(trained_encoder_env):
    env = trained_encoder_env
    assert env.encoder.steps_trained == 300
    rng = np.random.default_rng(0)
    wins, gaps = 0, []
    for k in range(8):
        chapter = k % len(env.chapters)
        position = 40 + 60 * k
        ref = env._chapter_ref(chapter)[position : position + 24]
        shuffled = list(rng.permutation(ref))
        true_nce = _episode_nce(env, chapter, position)
        shuf_nce = _episode_nce(env, chapter, position, [int(a) for a in shuffled])
        gaps.append(true_nce - shuf_nce)
        wins += true_nce > shuf_nce
    assert wins == 8, gaps
    assert np.mean(gaps) > 1.0, gaps  # observed ≈ 3.9 nats (seed 0)


def test_numpy_scoring_matches_torch_encoders_and_log_softmax():
    cfg = InfoNCEConfig(
        context_chars=5, ngram_n=3, hidden_dim=16, embed_dim=8, queue_size=6, pairs_per_step=16
    )
    model = InfoNCEModel(20, cfg)
    rng = np.random.default_rng(0)
    chapters = [rng.integers(3, 20, size=50), rng.integers(3, 20, size=30)]
    model.train(chapters, 3)
    scorer = InfoNCEScorer(model, chapters)
    window = [int(x) for x in rng.integers(3, 20, size=9)]
    pos = 17
    queue_before, ids_before = scorer.queue.copy(), scorer.queue_ids.copy()
    got = scorer.score(window, 0, pos)
    with torch.no_grad():
        q = model.online.query(torch.tensor([window[-5:]]))[0].double().numpy()
        gram = torch.tensor([chapters[0][pos + 1 : pos + 4].tolist()])
        k_pos = model.target.key(gram)[0].double().numpy()
    gram_id = int(((chapters[0][pos + 1] * 20) + chapters[0][pos + 2]) * 20 + chapters[0][pos + 3])
    negs = queue_before[ids_before != gram_id]
    logits = np.concatenate([[k_pos @ q], negs @ q]) / 0.07
    expect = logits[0] - np.log(np.exp(logits).sum())  # log softmax of the positive
    assert got == pytest.approx(expect, abs=1e-5)
    # the positive key entered the FIFO queue
    assert np.allclose(scorer.queue[0], k_pos, atol=1e-6) and scorer.queue_ids[0] == gram_id
    # batched evaluation equals per-step scoring against the same queue
    scorer.reset_queue()
    wins = rng.integers(3, 20, size=(4, 5))
    positions = np.array([0, 5, 28, 49])
    batch = scorer.score_batch(wins, 0, positions)
    single = []
    for w, p in zip(wins, positions):
        single.append(scorer.score(w.tolist(), 0, int(p), enqueue=False))
    assert np.allclose(batch, single, atol=1e-9)


def test_target_encoder_follows_by_ema_and_queue_is_fifo():
    cfg = InfoNCEConfig(hidden_dim=8, embed_dim=4, queue_size=20, pairs_per_step=8, momentum=0.9)
    model = InfoNCEModel(12, cfg)
    chapters = [np.arange(3, 12).repeat(3)]
    old_target = [p.detach().clone() for p in model.target.parameters()]
    stats = model.train_step(chapters)
    assert set(stats) == {"infonce/loss", "infonce/accuracy"} and np.isfinite(stats["infonce/loss"])
    for pt, po, old in zip(model.target.parameters(), model.online.parameters(), old_target):
        torch.testing.assert_close(pt, 0.9 * old + 0.1 * po.detach())
        assert not torch.equal(po.detach(), old)  # the online encoder moved
    assert len(model.queue) == 8
    model.train(chapters, 3)
    assert len(model.queue) == 20 and len(model.queue_ids) == 20
    assert model.version == 4


def test_training_lowers_the_loss(sample_chapters):
    env = CharTextEnv(sample_chapters, config=EnvConfig(nce_pretrain_steps=0, nce_seed=1))
    first = env.encoder.train_step(env._scorer.chapters_ids)["infonce/loss"]
    last = env.train_encoder(150)["infonce/loss"]
    assert last < 0.6 * first, (first, last)
    with pytest.raises(RuntimeError, match="use_infonce=False"):
        CharTextEnv(sample_chapters, config=EnvConfig(use_infonce=False)).train_encoder(1)
