from __future__ import annotations

import math

import numpy as np
import pytest

from lmpo.textagent.env import EmaStandardizer, NgramCoverage, coverage_from_scratch
from lmpo.textagent.env.rewards import ngram_keys


def test_ema_standardisation_hand_computed():
    # β=0.5, ε=0, μ0=0, σ0²=1
    # x=2: μ=0.5·0+0.5·2=1,     σ²=0.5·1+0.5·(2−1)²=1,          N=(2−1)/1=1
    # x=4: μ=0.5·1+0.5·4=2.5,   σ²=0.5·1+0.5·(4−2.5)²=1.625,    N=1.5/√1.625=1.176697
    # x=0: μ=0.5·2.5+0=1.25,    σ²=0.5·1.625+0.5·1.25²=1.59375, N=−1.25/√1.59375=−0.990148
    norm = EmaStandardizer(beta=0.5, eps=0.0)
    assert norm.update(2.0) == pytest.approx(1.0, abs=1e-12)
    assert norm.update(4.0) == pytest.approx(1.176697, abs=1e-6)
    assert norm.update(0.0) == pytest.approx(-0.990148, abs=1e-6)
    assert (norm.mean, norm.var, norm.count) == (pytest.approx(1.25), pytest.approx(1.59375), 3)
    assert norm.normalize(1.25) == 0.0  # no update
    assert norm.count == 3
    norm.reset()
    assert (norm.mean, norm.var, norm.count) == (0.0, 1.0, 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ema_standardisation_matches_slow_loop_and_default_beta(seed):
    xs = np.random.default_rng(seed).normal(3.0, 2.0, size=500)
    norm = EmaStandardizer()  # β=1e-3, ε=1e-8
    assert norm.beta == 1e-3 and norm.eps == 1e-8
    mu, var = 0.0, 1.0
    for x in xs:
        mu = (1 - 1e-3) * mu + 1e-3 * x
        var = (1 - 1e-3) * var + 1e-3 * (x - mu) ** 2
        assert norm.update(float(x)) == pytest.approx((x - mu) / (math.sqrt(var) + 1e-8), rel=1e-12)


def test_ema_standardisation_warmup_hand_computed():
    # β=0.25, ε=0, warm-up: b = max(β, 1/n) → 1, 1/2, 1/3, 1/4, then 1/4 (the EMA)
    # x=2: b=1,   μ=2,            σ²=0,                         N=0
    # x=4: b=1/2, μ=3,            σ²=½·0+½·1²=0.5,               N=1/√0.5=1.414214
    # x=0: b=1/3, μ=2,            σ²=⅔·0.5+⅓·2²=1.666667,        N=−2/√1.666667=−1.549193
    # x=6: b=1/4, μ=3,            σ²=¾·1.666667+¼·3²=3.5,         N=3/√3.5=1.603567
    # x=3: b=1/4, μ=3,            σ²=¾·3.5+0=2.625,              N=0
    norm = EmaStandardizer(beta=0.25, eps=0.0, init_mean=100.0, init_var=50.0, warmup=True)
    got = [norm.update(x) for x in (2.0, 4.0, 0.0, 6.0, 3.0)]
    assert got == pytest.approx([0.0, 1.414214, -1.549193, 1.603567, 0.0], abs=1e-6)
    assert (norm.mean, norm.var, norm.count) == (pytest.approx(3.0), pytest.approx(2.625), 5)


@pytest.mark.parametrize("seed", [0, 1])
def test_ema_standardisation_warmup_mean_is_the_sample_mean_then_the_ema(seed):
    # the init values drop out: μ after n ≤ 1/β updates is the plain mean of what it saw; after that the EMA
    xs = np.random.default_rng(seed).normal(-4.0, 0.5, size=40)
    warm = EmaStandardizer(beta=0.05, init_mean=7.0, init_var=9.0, warmup=True)
    for n, x in enumerate(xs[:20], start=1):
        warm.update(float(x))
        assert warm.mean == pytest.approx(float(xs[:n].mean()), rel=1e-12)
    mu = warm.mean
    for x in xs[20:]:
        warm.update(float(x))
        mu = 0.95 * mu + 0.05 * x
        assert warm.mean == pytest.approx(mu, rel=1e-12)
    cold = EmaStandardizer(beta=0.05)
    for x in xs:
        cold.update(float(x))
    assert abs(warm.mean - xs.mean()) < 0.5 < abs(cold.mean - xs.mean())  # 40 updates: the cold one is still ~1/e off


def test_ema_standardisation_affine_invariance():
    # N is invariant to x → a·x + b (a > 0) when the initial statistics are transformed alike and ε = 0
    xs = np.random.default_rng(5).uniform(-1, 1, size=50)
    a, b = 3.0, -7.0
    n1 = EmaStandardizer(beta=0.1, eps=0.0)
    n2 = EmaStandardizer(beta=0.1, eps=0.0, init_mean=b, init_var=a * a)
    for x in xs:
        assert n1.update(float(x)) == pytest.approx(n2.update(float(a * x + b)), rel=1e-9, abs=1e-12)


def test_coverage_hand_computed():
    # reference A B C D E (ids 0..4), h0=1 (history "A"), n=2, W=4; agent plays B, X(=9), D, E
    ref = [0, 1, 2, 3, 4]
    cov = NgramCoverage(n=2, window_chars=4, base=10)
    cov.start(ngram_keys(ref, 2, 10), offset=0, h0=1)
    y = [0]
    out = []
    for a in [1, 9, 3, 4]:
        y.append(a)
        out.append(cov.push(y))
    # S: {AB} vs {AB} → 1; {AB,BX} vs {AB,BC} → 1/2; {AB,BX,XD} vs {AB,BC,CD} → 1/3;
    # window of the last 4 chars (B X D E): {BX,XD,DE} vs {BC,CD,DE} → 1/3
    assert out == pytest.approx([1.0, 0.5, 1 / 3, 1 / 3])


@pytest.mark.parametrize("n,window", [(1, 3), (2, 2), (3, 8), (3, 64), (4, 6)])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_incremental_coverage_equals_from_scratch_every_step(n, window, seed):
    rng = np.random.default_rng(seed)
    base = 5  # a small alphabet so that n-grams repeat and hits / removals collide
    for _episode in range(5):
        ref = rng.integers(0, base, size=200).tolist()
        p = int(rng.integers(0, 100))
        h0 = min(int(rng.integers(0, 8)), p)
        cov = NgramCoverage(n, window, base)
        cov.start(ngram_keys(ref, n, base), offset=p - h0, h0=h0)
        y = ref[p - h0 : p]
        for t in range(90):
            a = ref[p + t] if rng.random() < 0.5 else int(rng.integers(0, base))
            y.append(a)
            got = cov.push(y)
            r = ref[p - h0 : p - h0 + len(y)]
            assert got == pytest.approx(coverage_from_scratch(y, r, h0, n, window), abs=1e-12), (t, h0)


def test_coverage_rejects_bad_sizes():
    with pytest.raises(ValueError, match="window_chars=2 must be >= n=3"):
        NgramCoverage(3, 2, 10)
