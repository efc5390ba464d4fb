"""The lab's statistics against known cases, textbook values and slow direct formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmpo.lab import stats as st


def test_bootstrap_ci_of_a_constant_is_a_point():
    lo, hi = st.bootstrap_ci([0.1, 0.1, 0.1, 0.1, 0.1])
    assert lo == hi == np.mean([0.1] * 5)


def test_bootstrap_ci_needs_two_values():
    assert all(math.isnan(v) for v in st.bootstrap_ci([0.3]))
    assert all(math.isnan(v) for v in st.bootstrap_ci([]))


def test_bootstrap_ci_is_seeded_and_covers_the_mean():
    x = np.random.default_rng(1).normal(2.0, 1.0, 40)
    a, b = st.bootstrap_ci(x, seed=3), st.bootstrap_ci(x, seed=3)
    assert a == b
    assert a[0] < x.mean() < a[1]
    # the percentile interval of the mean is close to mean ± 1.96·s/√n for n = 40
    half = 1.96 * x.std(ddof=1) / math.sqrt(x.size)
    assert a[1] - a[0] == pytest.approx(2 * half, rel=0.15)


def test_identical_samples_give_p_one():
    a = [0.2, 0.5, 0.4, 0.9, 0.1]
    assert st.paired_t_test(a, list(a)) == 1.0
    comp = st.paired_comparison(a, list(a))
    assert comp["diff"] == 0.0 and comp["ci"] == [0.0, 0.0] and comp["p"] == 1.0


def test_known_shift_is_detected():
    rng = np.random.default_rng(0)
    a = rng.normal(0.0, 1.0, 5)
    b = a + 1.0 + rng.normal(0.0, 0.05, 5)  # same seeds, shifted by 1
    comp = st.paired_comparison(b, a)
    assert comp["p"] < 0.001
    assert comp["ci"][0] > 0.8 and comp["ci"][1] < 1.2
    assert comp["diff"] == pytest.approx(1.0, abs=0.1)


def test_no_shift_is_not_detected():
    rng = np.random.default_rng(5)
    a = rng.normal(0.0, 1.0, 8)
    b = a + rng.normal(0.0, 1.0, 8)
    comp = st.paired_comparison(b, a)
    assert comp["p"] > 0.05
    assert comp["ci"][0] < 0 < comp["ci"][1]


def test_exact_shift_gives_p_zero_and_too_few_pairs_nan():
    assert st.paired_t_test([1.0, 2.0, 3.0], [0.0, 1.0, 2.0]) == 0.0
    assert math.isnan(st.paired_t_test([1.0], [0.0]))


@pytest.mark.parametrize("t, df, p", [(2.776445, 4, 0.05), (2.570582, 5, 0.05), (12.706205, 1, 0.05),
                                      (3.169273, 10, 0.01), (1.959964, 1e7, 0.05), (0.0, 3, 1.0)])
def test_student_t_two_sided_tail_matches_tables(t, df, p):
    assert st.student_t_sf2(t, df) == pytest.approx(p, abs=2e-6)
    assert st.student_t_sf(t, df) == pytest.approx(p / 2, abs=2e-6)
    assert st.student_t_sf(-t, df) == pytest.approx(1 - p / 2, abs=2e-6)


def test_paired_t_test_by_hand():
    # d = [1, 2, 3, 4]: mean 2.5, sd 1.2910, t = 2.5 / (1.2910 / 2) = 3.873, df 3 → p = 0.03047
    assert st.paired_t_test([1, 2, 3, 4], [0, 0, 0, 0]) == pytest.approx(0.030466, abs=1e-5)


@pytest.mark.parametrize("a, b", [(0.5, 0.5), (2.0, 3.0), (1.5, 0.5), (10.0, 2.5)])
def test_betainc_symmetry_and_bounds(a, b):
    for x in (0.0, 0.1, 0.5, 0.9, 1.0):
        assert st.betainc(a, b, x) == pytest.approx(1.0 - st.betainc(b, a, 1.0 - x), abs=1e-12)
    assert st.betainc(a, a, 0.5) == pytest.approx(0.5, abs=1e-12)
    # I_x(1, b) = 1 − (1 − x)^b in closed form
    assert st.betainc(1.0, b, 0.3) == pytest.approx(1 - 0.7 ** b, abs=1e-12)


def test_window_trajectory_by_hand():
    # 20 steps → window 2: start = mean(5, 4) = 4.5, end = mean(2, 3) = 2.5, min of the 2-step moving average
    curve = [5, 4, 4, 3, 3, 2, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3]
    out = st.window_trajectory(curve)
    assert out == {"start": 4.5, "min": 1.0, "end": 2.5}
    assert math.isnan(st.window_trajectory([])["end"])


def test_curve_area_is_the_mean_and_skips_non_finite():
    assert st.curve_area([1.0, 2.0, float("nan"), 3.0]) == 2.0


def test_band_of_identical_curves_is_the_curve():
    out = st.band([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]])
    assert out == {"mean": [1.0, 2.0], "lo": [1.0, 2.0], "hi": [1.0, 2.0]}


def _direct_snr(vectors: np.ndarray) -> float:
    mean = vectors.mean(0)
    var = ((vectors - mean) ** 2).sum(1).sum() / (len(vectors) - 1)
    return float((mean @ mean - var / len(vectors)) / var)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gram_snr_and_cosine_match_the_vectors(seed):
    rng = np.random.default_rng(seed)
    g = rng.normal(0.5, 1.0, (7, 30))  # 7 gradient samples of dimension 30
    ref = rng.normal(size=30)
    gram = g @ g.T
    assert st.gram_snr(gram) == pytest.approx(_direct_snr(g), rel=1e-10)
    assert st.gram_cosine(gram, g @ ref, float(ref @ ref)) == pytest.approx(_direct_cos(g, ref), rel=1e-10)
    assert st.gram_cosine(gram, g @ ref, float(ref @ ref), ref_noise=0.3) == pytest.approx(
        _direct_cos(g, ref, 0.3), rel=1e-10)
    idx = np.array([0, 0, 3, 5, 6, 6, 2])  # a resample: the same as the vectors picked by idx
    assert st.gram_snr(gram, idx) == pytest.approx(_direct_snr(g[idx]), rel=1e-10)
    assert st.gram_cosine(gram, g @ ref, float(ref @ ref), idx) == pytest.approx(_direct_cos(g[idx], ref),
                                                                                 rel=1e-10)


def _direct_cos(vectors, ref, ref_noise=0.0):
    """The bias-corrected cosine from the vectors: ‖ḡ‖² − V/R and ‖g*‖² − ref_noise as the squared norms."""
    mean = vectors.mean(0)
    var = ((vectors - mean) ** 2).sum() / (len(vectors) - 1)
    return float(mean @ ref / np.sqrt((mean @ mean - var / len(vectors)) * (ref @ ref - ref_noise)))


def test_bias_corrected_cosine_removes_the_noise_of_both_means():
    # true directions: E g = E g* = e_0 (cosine 1); each sample adds isotropic noise of total variance
    # 400 · 0.1² = 4. With R = R* = 8 the means have ‖·‖² ≈ 1 + 4/8 = 1.5, so the raw cosine is ≈ 1/1.5 = 0.667;
    # the corrected one is ≈ 1.
    rng = np.random.default_rng(0)
    dim, R = 400, 8
    raw, fixed = [], []
    for _ in range(200):
        mu = np.zeros(dim)
        mu[0] = 1.0
        g = mu + rng.normal(0.0, 0.1, (R, dim))
        on = mu + rng.normal(0.0, 0.1, (R, dim))
        g_star = on.mean(0)
        raw.append(g.mean(0) @ g_star / np.linalg.norm(g.mean(0)) / np.linalg.norm(g_star))
        fixed.append(st.gram_cosine(g @ g.T, g @ g_star, float(g_star @ g_star), ref_noise=st.mean_noise(on @ on.T)))
    assert np.mean(raw) == pytest.approx(1 / 1.5, abs=0.02)
    assert np.nanmean(fixed) == pytest.approx(1.0, abs=0.03)


def test_gram_snr_of_pure_noise_is_near_zero_and_of_signal_large():
    rng = np.random.default_rng(0)
    noise = rng.normal(0.0, 1.0, (400, 50))
    assert abs(st.gram_snr(noise @ noise.T)) < 0.05
    signal = noise * 0.1 + 1.0  # ‖E g‖² = 50, E‖g − E g‖² = 0.5
    assert st.gram_snr(signal @ signal.T) == pytest.approx(100.0, rel=0.1)


def test_gram_statistics_of_many_resamples_equal_one_at_a_time():
    rng = np.random.default_rng(3)
    g = rng.normal(0.2, 1.0, (6, 10))
    gram, dots = g @ g.T, g @ np.ones(10)
    idx = rng.integers(0, 6, (20, 6))
    np.testing.assert_allclose(st.gram_snr(gram, idx), [st.gram_snr(gram, i) for i in idx], rtol=1e-12)
    np.testing.assert_allclose(st.gram_cosine(gram, dots, 10.0, idx),
                               [st.gram_cosine(gram, dots, 10.0, i) for i in idx], rtol=1e-12)
    assert np.isnan(st.gram_snr(gram, np.zeros((1, 6), dtype=int)))[0]  # one sample repeated: no variance


def test_jackknife_of_the_mean_is_the_standard_error():
    x = np.random.default_rng(2).normal(size=12)

    def mean(idx):
        return x.mean() if idx is None else x[idx].mean(1)

    point, se = st.jackknife(mean, x.size)
    assert point == pytest.approx(x.mean())
    assert se == pytest.approx(x.std(ddof=1) / math.sqrt(x.size), rel=1e-12)  # exact for the mean
    out = st.jackknife_interval(mean, x.size)
    half = 2.200985 * se  # t quantile, 11 degrees of freedom
    assert out["ci"] == pytest.approx([x.mean() - half, x.mean() + half], rel=1e-5)


@pytest.mark.parametrize("p, df, t", [(0.05, 4, 2.776445), (0.05, 11, 2.200985), (0.01, 10, 3.169273)])
def test_student_t_quantile_inverts_the_tail(p, df, t):
    assert st.student_t_quantile(p, df) == pytest.approx(t, abs=1e-5)


def test_paired_jackknife_difference_of_identical_estimators_is_zero_with_p_one():
    g = np.random.default_rng(0).normal(size=(6, 4))
    gram = g @ g.T

    def fn(idx):
        return st.gram_snr(gram, idx)

    out = st.paired_jackknife_difference([fn, fn], [fn, fn], [6, 6])
    assert out["diff"] == 0.0 and out["ci"] == [0.0, 0.0] and out["p"] == 1.0


def test_paired_jackknife_difference_detects_a_shift_that_survives_leaving_samples_out():
    rng = np.random.default_rng(1)
    x = rng.normal(size=20)
    y = x + 0.5 + rng.normal(0.0, 0.05, 20)  # paired: the same samples, shifted by 0.5

    def a(idx):
        return y.mean() if idx is None else y[idx].mean(1)

    def b(idx):
        return x.mean() if idx is None else x[idx].mean(1)

    out = st.paired_jackknife_difference([a, a], [b, b], [20, 20])
    assert out["diff"] == pytest.approx(0.5, abs=0.05) and out["ci"][0] > 0.4 and out["p"] < 1e-6
    # the same shift on unpaired noise is much less certain
    z = rng.normal(size=20) + 0.5

    def c(idx):
        return z.mean() if idx is None else z[idx].mean(1)

    assert st.paired_jackknife_difference([c], [b], [20])["p"] > out["p"]


# ----------------------------------------------------------------------------------------------------
# Rule v2: t intervals, power, Holm, one-sided tests, pass@k
# ----------------------------------------------------------------------------------------------------


def test_t_interval_and_mde_by_hand():
    # d = [1, 2, 3, 4, 5]: mean 3, sd 1.5811, se 0.70711, t_{0.975,4} = 2.77645 → 3 ± 1.96324;
    # MDE at 80% power: (t_{0.975,4} + t_{0.80,4}) · se = (2.77645 + 0.94096) · 0.70711 = 2.62861
    comp = st.paired_comparison([1, 2, 3, 4, 5], [0, 0, 0, 0, 0])
    assert comp["diff"] == 3.0 and comp["df"] == 4 and comp["n"] == 5
    assert comp["se"] == pytest.approx(0.707107, abs=1e-6)
    assert comp["ci"] == pytest.approx([3 - 1.963243, 3 + 1.963243], abs=1e-5)
    assert comp["mde"] == pytest.approx(2.628606, abs=1e-5)
    # one-sided (non-inferiority) MDE: (t_{0.95,4} + t_{0.80,4}) · se = (2.13185 + 0.94096) · 0.70711 = 2.17281
    assert st.minimum_detectable_effect(comp["se"], 4, sided=1) == pytest.approx(2.172806, abs=1e-5)


def test_t_interval_is_wider_than_the_percentile_bootstrap_for_five_seeds():
    x = [0.1, 0.4, 0.2, 0.5, 0.3]
    t_lo, t_hi = st.t_interval(x)["ci"]
    b_lo, b_hi = st.bootstrap_ci(x)
    assert t_hi - t_lo > 1.3 * (b_hi - b_lo)


def test_t_interval_edge_cases():
    assert st.t_interval([0.2, 0.2, 0.2])["ci"] == [0.2, 0.2]
    one = st.t_interval([0.3])
    assert one["mean"] == 0.3 and all(math.isnan(v) for v in one["ci"])
    assert math.isnan(st.minimum_detectable_effect(math.nan, 4))


def test_student_t_ppf_matches_tables():
    assert st.student_t_ppf(0.975, 4) == pytest.approx(2.776445, abs=1e-5)
    assert st.student_t_ppf(0.80, 4) == pytest.approx(0.940965, abs=1e-5)
    assert st.student_t_ppf(0.025, 4) == pytest.approx(-2.776445, abs=1e-5)
    assert st.student_t_ppf(0.5, 3) == 0.0


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 → 3·0.01 = 0.03, 2·0.03 = 0.06, max(0.06, 1·0.04) = 0.06
    assert st.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert st.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    out = st.holm([0.01, math.nan])
    assert out[0] == pytest.approx(0.01) and math.isnan(out[1])  # nan does not count in m
    assert st.holm([]) == []


def test_one_sided_p_by_hand():
    # d = 0, se = 0.02, df 4, H0: d ≤ −0.05 → t = 2.5, P(T ≥ 2.5) = 0.03339
    assert st.one_sided_p(0.0, 0.02, 4, shift=-0.05) == pytest.approx(0.033389, abs=1e-5)
    assert st.one_sided_p(0.0, 0.02, 4, shift=0.05, upper=False) == pytest.approx(0.033389, abs=1e-5)
    assert st.one_sided_p(0.1, 0.0, 4) == 0.0 and st.one_sided_p(-0.1, 0.0, 4) == 1.0


def test_last_mean_is_the_endpoint():
    assert st.last_mean([0.1, 0.2, 0.3, 0.6, math.nan], 3) == pytest.approx((0.2 + 0.3 + 0.6) / 3)
    assert math.isnan(st.last_mean([0.1, 0.2], 3))


def test_pass_at_k_against_the_combinatorial_formula():
    from math import comb

    from lmpo.lab.jobs import pass_at_k

    for n, c, k in ((8, 0, 8), (8, 1, 8), (10, 3, 4), (5, 5, 1), (20, 2, 5)):
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is the share right


def test_t_interval_keeps_its_coverage_where_the_percentile_bootstrap_does_not():
    # docs/lab.md: five normal values, 95% nominal (400 samples here; the docs' 2,000 give 0.835 and 0.942)
    rng = np.random.default_rng(0)
    boot = t = 0
    for i in range(400):
        x = rng.normal(0.0, 1.0, 5)
        lo, hi = st.bootstrap_ci(x, resamples=1000, seed=i)
        boot += lo < 0 < hi
        a, b = st.t_interval(x)["ci"]
        t += a < 0 < b
    assert boot / 400 < 0.88 and 0.92 < t / 400 < 0.98


def test_bias_corrected_cosine_is_undefined_where_the_mean_is_mostly_noise():
    # E g = 0.05·e_0 against noise of total variance 4 over R = 8: ‖E g‖² = 0.0025 ≪ V/R = 0.5 → nan, not ±10⁶
    rng = np.random.default_rng(1)
    mu = np.zeros(400)
    mu[0] = 0.05
    g = mu + rng.normal(0.0, 0.1, (8, 400))
    ref = np.zeros(400)
    ref[0] = 1.0
    assert math.isnan(st.gram_cosine(g @ g.T, g @ ref, 1.0))


def _constant(value):
    """A statistic in the form :func:`st.jackknife` calls: one value for None, one per row of an index array."""
    def stat(idx):
        return np.full(np.shape(idx)[0], value) if idx is not None and np.ndim(idx) == 2 else value
    return stat


def test_paired_jackknife_difference_leaves_out_undefined_groups():
    out = st.paired_jackknife_difference([_constant(1.0), _constant(np.nan)], [_constant(0.0), _constant(0.0)],
                                         [4, 4])
    assert out["diff"] == 1.0 and out["groups"] == 1 and out["groups_left_out"] == 1 and out["p"] == 0.0
