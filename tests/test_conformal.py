"""Split-conformal calibration of supports, scaled shapes, and the held-out validity rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from embgeom.supports import (
    Ball,
    Box,
    Cone,
    Ellipsoid,
    FinalNormShell,
    calibrate_support,
    clopper_pearson_lower,
    conformal_rank,
    containment_check,
    fit_support,
    min_points_for,
    split_for_calibration,
)

FITS = [("ball", {}), ("ellipsoid", {}), ("cone", {}), ("box", {}), ("box", {"rotation": "pca"})]


def _data(rng, n, d=4):
    # a shifted, anisotropic Gaussian in the positive orthant's direction: the cone fits too
    return rng.standard_normal((n, d)) * np.array([1.0, 0.5, 0.3, 0.2])[:d] + 3.0


@pytest.mark.parametrize("shape, kw", FITS)
def test_scaled_is_the_gauge_sublevel_set(shape, kw):
    rng = np.random.default_rng(0)
    S = fit_support(_data(rng, 300), shape, **kw)
    X = _data(rng, 400) * 1.1 - 0.3
    g = S.gauge(X)
    for s in (0.4, 1.0, 1.3):
        T = S.scaled(s)
        assert type(T) is type(S)
        np.testing.assert_allclose(T.gauge(X), g / s, rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(T.contains(X, tol=0.0), g <= s)
    # the homothety multiplies the volume by s^d (the cone: radius and half-angle both move)
    if shape != "cone":
        assert S.scaled(2.0).log_volume == pytest.approx(S.log_volume + 4 * math.log(2.0), rel=1e-12)
    with pytest.raises(ValueError, match="factor"):
        S.scaled(0.0)
    with pytest.raises(ValueError, match="factor"):
        S.scaled(float("nan"))


def test_scaled_shapes_by_hand():
    ball = Ball.from_params([1.0, 2.0], 3.0).scaled(2.0)
    assert ball.radius_ == 6.0 and ball.center_.tolist() == [1.0, 2.0]
    box = Box.from_params([0.0, -1.0], [2.0, 3.0]).scaled(0.5)
    assert box.lower_.tolist() == [0.5, 0.0] and box.upper_.tolist() == [1.5, 2.0]
    cone = Cone.from_params([1.0, 0.0, 0.0], 1.0, 2.0).scaled(4.0)
    assert cone.half_angle_ == math.pi and cone.radius_ == 8.0  # half-angle capped at pi
    ell = Ellipsoid.from_params([0.0, 0.0], np.diag([1.0, 0.25])).scaled(3.0)
    np.testing.assert_allclose(sorted(ell.semi_axes_), [3.0, 6.0])
    shell = FinalNormShell.from_params("rmsnorm", [1.0, 2.0]).scaled(2.0)
    np.testing.assert_allclose(shell.gain_, [2.0, 4.0])
    with pytest.raises(ValueError, match="factor"):
        Ball.from_params(None, 1.0, dim=2).scaled(-1.0)


def test_conformal_rank_and_small_samples():
    assert conformal_rank(99, 0.01) == 99  # ceil(100 * 0.99) = 99
    assert conformal_rank(9, 0.1) == 9 and conformal_rank(19, 0.1) == 18
    assert conformal_rank(200, 0.05) == 191  # ceil(201 * 0.95) = ceil(190.95)
    with pytest.raises(ValueError, match="at least 99"):
        conformal_rank(98, 0.01)
    with pytest.raises(ValueError, match="alpha"):
        conformal_rank(10, 0.0)
    with pytest.raises(ValueError, match="alpha"):
        conformal_rank(10, 1.0)


@pytest.mark.parametrize("shape, kw", FITS)
def test_scale_factor_is_the_order_statistic_by_hand(shape, kw):
    rng = np.random.default_rng(5)
    H = _data(rng, 240)
    alpha, frac, seed = 0.1, 0.4, 11
    C = fit_support(H, shape, calibrate=alpha, calibration_fraction=frac, seed=seed, **kw)
    # the documented split: the first round(frac N) rows of default_rng(seed).permutation(N)
    perm = np.random.default_rng(seed).permutation(240)
    n_cal = round(frac * 240)
    cal, fit = np.sort(perm[:n_cal]), np.sort(perm[n_cal:])
    raw = fit_support(H[fit], shape, **kw)
    k = math.ceil((n_cal + 1) * (1 - alpha))
    q = np.sort(raw.gauge(H[cal]))[k - 1]
    assert C.calibration_["rank"] == k and C.calibration_["n_calibration"] == n_cal
    assert C.calibration_["scale"] == pytest.approx(q, rel=1e-12)
    X = _data(rng, 100)
    np.testing.assert_allclose(C.gauge(X), raw.gauge(X) / q, rtol=1e-9)
    # exactly k of the calibration points are inside (continuous gauges: no ties)
    assert int(C.contains(H[cal], tol=1e-12).sum()) == k
    assert C.calibration_["log_volume_raw"] == pytest.approx(raw.log_volume)
    # the fit's record travels with the calibrated set
    d = C.to_dict()
    assert d["n_samples"] == 240 and d["n_fit"] == raw.n_fit_ == 240 - n_cal - raw.n_dropped_
    assert d["solver"] == f"{raw.solver_} + conformal"


@pytest.mark.parametrize("shape", ["ball", "box", "ellipsoid"])
def test_conformal_coverage_on_fresh_draws(shape):
    # split-conformal: P(fresh inside) >= 1 - alpha, and <= 1 - alpha + 1/(n + 1) without ties.
    # The average coverage over R independent calibrations estimates the marginal probability
    # k/(n+1); its standard error is below sqrt(Var_Beta / R) + sqrt(1 / (4 R M)).
    rng = np.random.default_rng(2024)
    alpha, n_fit, n_cal, R, M = 0.1, 60, 49, 150, 200
    k = conformal_rank(n_cal, alpha)
    cover = np.empty(R)
    for r in range(R):
        S = fit_support(_data(rng, n_fit), shape)
        C = calibrate_support(S, _data(rng, n_cal), alpha)
        cover[r] = C.contains(_data(rng, M)).mean()
    expected = k / (n_cal + 1)  # 45/50 = 0.9
    a, b = k, n_cal + 1 - k
    se = math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)) / R) + math.sqrt(0.25 / (R * M))
    assert cover.mean() >= 1 - alpha - 4 * se
    assert abs(cover.mean() - expected) <= 4 * se
    assert cover.mean() <= 1 - alpha + 1 / (n_cal + 1) + 4 * se


def test_calibrate_support_errors():
    rng = np.random.default_rng(0)
    S = Ball().fit(_data(rng, 50))
    with pytest.raises(ValueError, match="H_calibration"):
        calibrate_support(S, _data(rng, 20, d=3), 0.1)
    with pytest.raises(ValueError, match="at least 19"):
        calibrate_support(S, _data(rng, 10), 0.05)
    with pytest.raises(TypeError, match="support"):
        calibrate_support("ball", _data(rng, 10), 0.1)
    with pytest.raises(ValueError, match="calibration_fraction"):
        fit_support(_data(rng, 50), "ball", calibrate=0.1, calibration_fraction=1.0)
    with pytest.raises(ValueError, match=r"calibrate=0.01, calibration_fraction=0.5 \(50 of 100 rows\).*at least 99"):
        fit_support(_data(rng, 100), "ball", calibrate=0.01)  # before any fit
    for bad in (0, 1.0, 1.5, -0.1, float("nan")):  # one message, naming the user's argument
        with pytest.raises(ValueError, match=r"^calibrate: expected a number in \(0, 1\), got"):
            fit_support(_data(rng, 100), "ball", calibrate=bad)
    with pytest.raises(TypeError, match="calibrate: expected a real number"):
        fit_support(_data(rng, 100), "ball", calibrate="0.1")
    fit_idx, cal_idx = split_for_calibration(10, 0.3, 0)
    assert cal_idx.size == 3 and np.union1d(fit_idx, cal_idx).tolist() == list(range(10))


def test_clopper_pearson_lower_matches_scipy_binomtest():
    for k, n in [(0, 10), (3, 10), (199, 200), (2000, 2000), (1989, 2000)]:
        ref = stats.binomtest(k, n).proportion_ci(0.95, method="exact")  # two-sided 95%
        ref90 = stats.binomtest(k, n).proportion_ci(0.90, method="exact")  # its lower end = one-sided 95%
        lb = clopper_pearson_lower(k, n, 0.95)
        assert lb == pytest.approx(ref90.low, abs=1e-12)
        assert lb >= ref.low - 1e-15
    assert clopper_pearson_lower(300, 300) == pytest.approx(0.05 ** (1 / 300))
    assert min_points_for(0.99, 0.95) == 299
    assert clopper_pearson_lower(299, 299) >= 0.99 > clopper_pearson_lower(298, 298)
    # the report's 2,004 held-out states tolerate 12 outside, not 13 (docs/report.md)
    assert clopper_pearson_lower(2004 - 12, 2004) >= 0.99 > clopper_pearson_lower(2004 - 13, 2004)
    with pytest.raises(ValueError, match="k"):
        clopper_pearson_lower(5, 4)


def test_containment_check_rule():
    ball = Ball.from_params(None, 1.0, dim=2)
    inside = np.tile([[0.1, 0.2]], (400, 1))
    res = containment_check(ball, inside)
    assert (res.n, res.n_inside, res.share) == (400, 400, 1.0)
    assert res.valid and res.lower_bound == pytest.approx(0.05 ** (1 / 400))
    # 2 misses in 400: share 0.995 passes the old ">= 99% of the sample" rule, not this one
    X = inside.copy()
    X[:2] = 5.0
    res = containment_check(ball, X)
    assert res.share == 0.995 and not res.valid and res.lower_bound < 0.99
    # too few points can never be valid, even all inside
    assert not containment_check(ball, inside[:200]).valid
    assert "holds 200 of 200" in containment_check(ball, inside[:200]).sentence()
