"""Tests of embgeom.bounds: closed forms computed by hand, validity against exact grid counts,
monotonicity, lambda on analytic cases, Cor. 4.10's small cases, overflow, bad input."""

from __future__ import annotations

import math
import types
import warnings

import numpy as np
import pytest
from scipy import special, stats

import embgeom
from embgeom import bounds as B
from embgeom.supports import Ball, Box, Cone, Ellipsoid, FinalNormShell


# ------------------------------------------------------------------------------------------
# supports built from parameters (the shapes compute their own packing-bound terms)
# ------------------------------------------------------------------------------------------
def make_ellipsoid(semi_axes, axes=None):
    s = np.asarray(semi_axes, dtype=float)
    d = s.size
    U = np.eye(d) if axes is None else np.asarray(axes, dtype=float)
    A = U.T @ np.diag(1.0 / s**2) @ U
    return Ellipsoid.from_params(np.zeros(d), A)


def make_cone(d, half_angle, radius, axis=None):
    a = np.eye(d)[0] if axis is None else np.asarray(axis, dtype=float)
    return Cone.from_params(a, half_angle, radius)


def make_shell(kind, gain):
    return FinalNormShell.from_params(kind, np.asarray(gain, dtype=float), eps=1e-6)


def make_ball(center, radius):
    return Ball.from_params(center, radius)


def grid_count(member, d, eps, half_width, rng, n_offsets=6):
    """Largest number of points of a grid of step eps (random offsets) for which member is True."""
    best = 0
    k = int(math.ceil(half_width / eps)) + 2
    base = np.arange(-k, k + 1) * eps
    for i in range(n_offsets):
        off = np.zeros(d) if i == 0 else rng.uniform(0, eps, size=d)  # first grid: through 0
        axes = [base + o for o in off]
        pts = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, d)
        best = max(best, int(member(pts).sum()))
    return best


# ------------------------------------------------------------------------------------------
# precision
# ------------------------------------------------------------------------------------------
def test_precision_eps_formats():
    assert B.precision_eps(3.0, 11) == 3.0 / 2048
    assert B.precision_eps(1.0, "float32") == 2.0**-24
    assert B.precision_eps(1.0, np.float32) == 2.0**-24
    assert B.precision_eps(1.0, np.dtype("float16")) == 2.0**-11
    assert B.precision_eps(2.0, "bf16") == 2.0 * 2.0**-8
    assert B.precision_eps(2.0, "torch.bfloat16") == 2.0 * 2.0**-8
    assert B.precision_eps(1.0, "float64") == 2.0**-53
    assert B.precision_eps(1.0, 113) == 2.0**-113  # binary128, the most bits of any format


@pytest.mark.parametrize("radius,fmt,err", [(0.0, 11, ValueError), (-1.0, 11, ValueError),
                                            (float("nan"), 11, ValueError), (1.0, 0, ValueError),
                                            (1.0, "float8", ValueError), (1.0, True, TypeError),
                                            (3.0, 1000, ValueError), (1.0, 114, ValueError)])
def test_precision_eps_bad_input(radius, fmt, err):
    # 1000 bits would give 2.8e-301: a number, and a wrong one (no format has it)
    with pytest.raises(err):
        B.precision_eps(radius, fmt)


# ------------------------------------------------------------------------------------------
# Theorem 4.5, Cor. 4.6: closed forms
# ------------------------------------------------------------------------------------------
def test_theorem45_and_linear_law_closed_form():
    d, m, r = 576, 3, 2.5
    eps = r * 2.0**-11
    # 1 + 2r/eps = 1 + 2^12 = 4097
    assert B.theorem45_log_count(d, m, r, eps) == pytest.approx(576 * 3 * math.log(4097), rel=1e-14)
    assert B.linear_law_slope(d, r, eps, 49152) == pytest.approx(576 * math.log(4097) / math.log(49152),
                                                                 rel=1e-14)
    assert B.linear_law_slope(d, r, eps, 49152, rate=12.0) == pytest.approx(576 * math.log(4097) / 12.0)
    # Gemma-3-270m with the paper's convention: about 427 tokens per vector
    assert B.linear_law_slope(640, 1.0, 2.0**-11, 262144) == pytest.approx(
        640 * math.log(4097) / (18 * math.log(2)), rel=1e-14)


def test_ball_paper_and_rigorous_closed_form():
    r, eps = 10.0, 1.0
    ball = make_ball(np.zeros(2), r)
    assert B.log_packing_number(ball, eps, variant="paper") == pytest.approx(2 * math.log(21.0))
    # Steiner, d = 2: vol(square of side eps + disc of radius r) = eps^2 + 4 eps r + pi r^2
    steiner = math.log(1 + 4 * r / eps + math.pi * (r / eps) ** 2)
    assert steiner < 2 * math.log(21.0)
    assert B.log_packing_number(ball, eps) == pytest.approx(steiner, rel=1e-12)
    # d = 3 by hand: eps^3 + 6 eps^2 r + 3 pi eps r^2 + 4/3 pi r^3
    ball3 = make_ball(np.ones(3), r)  # translation does not matter
    st3 = math.log(1 + 6 * r + 3 * math.pi * r**2 + 4 / 3 * math.pi * r**3)
    assert B.packing_bound_terms(ball3, eps)["vinf_steiner"] == pytest.approx(st3, rel=1e-12)


def test_box_of_cube_equals_cube_bound():
    d, r, eps = 50, 0.7, 0.7 * 2.0**-11
    cube = Box.from_params(-r * np.ones(d), r * np.ones(d))
    expected = B.theorem45_log_count(d, 1, r, eps)
    assert B.log_packing_number(cube, eps) == pytest.approx(expected, rel=1e-13)
    assert B.log_packing_number(cube, eps, variant="paper") == pytest.approx(expected, rel=1e-13)
    # the identity given as an explicit rotation changes nothing
    cube_r = Box.from_params(-r * np.ones(d), r * np.ones(d), rotation=np.eye(d))
    assert B.log_packing_number(cube_r, eps) == pytest.approx(expected, rel=1e-13)


def test_box_closed_forms():
    lo, hi, eps = np.array([0.0, -1.0, 2.0]), np.array([3.0, 0.5, 2.25]), 0.25
    box = Box.from_params(lo, hi)
    a = hi - lo
    assert B.log_packing_number(box, eps) == pytest.approx(
        math.log(1 + 3 / 0.25) + math.log(1 + 1.5 / 0.25) + math.log(1 + 0.25 / 0.25))
    # Steiner in d = 2 for a rotated rectangle: (a1 a2 + 2 rho (a1 + a2) + pi rho^2) / (pi rho^2)
    th = 0.4
    R = np.array([[math.cos(th), math.sin(th)], [-math.sin(th), math.cos(th)]])
    box2 = Box.from_params(np.zeros(2), np.array([3.0, 1.0]), rotation=R)
    rho = eps / 2
    t = B.packing_bound_terms(box2, eps)
    assert t["v2_box_steiner"] == pytest.approx(
        math.log((3.0 + 2 * rho * 4.0 + math.pi * rho**2) / (math.pi * rho**2)), rel=1e-12)
    # exact area of the zonotope rectangle + square, by hand: a1 a2 + eps (a1 |R_1|_1 + a2 |R_2|_1)
    # + eps^2; the Cauchy-Binet bound 1 + sqrt(2) (a1 + a2)/eps + a1 a2/eps^2 is above it
    l1 = np.abs(R).sum(axis=1)
    exact = (3.0 + eps * (3.0 * l1[0] + 1.0 * l1[1]) + eps**2) / eps**2
    assert t["vinf_box_zonotope"] == pytest.approx(
        math.log(1 + math.sqrt(2) * 4.0 / eps + 3.0 / eps**2), rel=1e-12)
    assert math.log(exact) <= t["vinf_box_zonotope"]
    assert t["vinf_box_rotated"] == pytest.approx(math.log(3 / eps + l1[0]) + math.log(1 / eps + l1[1]))


def test_ellipsoid_closed_forms_and_ball_limit():
    d, r, eps = 20, 1.5, 0.01
    # equal semi-axes: the rigorous V2 bound is exactly the ball's d log(1 + 2r/eps)
    e = make_ellipsoid(np.full(d, r))
    assert B.packing_bound_terms(e, eps)["v2_ellipsoid"] == pytest.approx(d * math.log1p(2 * r / eps),
                                                                          rel=1e-9)
    s = np.linspace(2.0, 0.05, d)
    e2 = make_ellipsoid(s)
    assert B.log_packing_number(e2, eps, variant="paper") == pytest.approx(
        float(np.sum(np.log1p(2 * s / eps))), rel=1e-12)
    # the rigorous V2 term: at least sum log(2 s_i / eps) (it contains E), and within a few nats of
    # the paper's formula here
    v2 = B.packing_bound_terms(e2, eps)["v2_ellipsoid"]
    assert v2 >= float(np.sum(np.log(2 * s / eps)))
    assert v2 - B.log_packing_number(e2, eps, variant="paper") < 3.0


def test_ellipsoid_projection_bound_closed_forms():
    # axis-aligned ellipse + square of side eps: pi a b + 2 (a + b) eps + eps^2
    a, b, eps = 3.0, 0.7, 0.2
    t = B.packing_bound_terms(make_ellipsoid([a, b]), eps)
    assert t["vinf_projections_aligned"] == pytest.approx(
        math.log(1 + 2 * (a + b) / eps + math.pi * a * b / eps**2), rel=1e-12)
    # equal semi-axes, any orientation: the projection bound is the ball's Steiner formula
    d, r = 12, 1.3
    th = 0.3
    Rm = np.eye(d)
    Rm[:2, :2] = [[math.cos(th), math.sin(th)], [-math.sin(th), math.cos(th)]]
    te = B.packing_bound_terms(make_ellipsoid(np.full(d, r), axes=Rm), eps)
    tb = B.packing_bound_terms(make_ball(np.zeros(d), r), eps)
    assert te["vinf_projections"] == pytest.approx(tb["vinf_steiner"], rel=1e-12)
    # a rotated anisotropic ellipse is not axis-aligned: only the Cauchy-Schwarz form applies
    R2 = np.array([[math.cos(th), math.sin(th)], [-math.sin(th), math.cos(th)]])
    tr = B.packing_bound_terms(make_ellipsoid([a, b], axes=R2), eps)
    assert "vinf_projections_aligned" not in tr
    assert tr["vinf_projections"] >= t["vinf_projections_aligned"]


def test_shell_closed_forms():
    d, g, eps = 16, 0.8, 0.01
    rms = make_shell("rmsnorm", np.full(d, g))
    ell = make_ellipsoid(np.full(d, math.sqrt(d) * g))
    assert B.log_packing_number(rms, eps) == pytest.approx(B.log_packing_number(ell, eps), rel=1e-12)
    # LayerNorm with a constant gain: a (d-1)-ball of radius sqrt(d) g in a hyperplane, times a
    # slab of width 2 rho: log kappa_{d-1} - log kappa_d + log 2 + (d-1) log(1 + 2 sqrt(d) g / eps)
    ln = make_shell("layernorm", np.full(d, g))
    lk = lambda k: 0.5 * k * math.log(math.pi) - special.gammaln(0.5 * k + 1)  # noqa: E731
    expect = lk(d - 1) - lk(d) + math.log(2) + (d - 1) * math.log1p(2 * math.sqrt(d) * g / eps)
    assert B.packing_bound_terms(ln, eps)["v2_hyperplane"] == pytest.approx(expect, rel=1e-9)
    assert B.log_packing_number(ln, eps) < B.log_packing_number(rms, eps)
    with pytest.raises(ValueError, match="kind"):
        make_shell(None, np.ones(4))


# ------------------------------------------------------------------------------------------
# cone: cap fraction (implemented once, in embgeom._special; supports and bounds use it)
# ------------------------------------------------------------------------------------------
def _cap(d, alpha):
    from embgeom._special import log_cap_fraction

    return float(log_cap_fraction(alpha, d))


# ------------------------------------------------------------------------------------------
# cone: cap fraction
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.1, 0.9, math.pi / 2, 2.2, 3.0])
def test_cap_fraction_low_dimensions(alpha):
    assert _cap(2, alpha) == pytest.approx(math.log(alpha / math.pi), rel=1e-12)
    assert _cap(3, alpha) == pytest.approx(math.log((1 - math.cos(alpha)) / 2), rel=1e-10)


@pytest.mark.parametrize("d", [2, 5, 576, 4096])
def test_cap_fraction_edges(d):
    assert _cap(d, math.pi / 2) == pytest.approx(math.log(0.5), abs=1e-14)
    assert _cap(d, math.pi) == 0.0
    alphas = np.linspace(0.02, math.pi, 60)
    vals = np.array([_cap(d, a) for a in alphas])
    assert np.all(vals <= 0) and np.all(np.isfinite(vals))
    assert np.all(np.diff(vals) >= -1e-12)  # larger cone, larger fraction
    assert _cap(d, math.pi - 1e-6) > -1e-5


def test_cap_fraction_bad_input():
    for a in (-0.1, 3.2, float("nan")):
        with pytest.raises(ValueError):
            _cap(5, a)
    with pytest.raises(ValueError):
        _cap(1, 1.0)


def test_cone_bounds_monotone_and_below_ball():
    d, r, eps = 64, 2.0, 2.0 * 2.0**-11
    ball = B.log_packing_number(make_ball(np.zeros(d), r), eps)
    alphas = np.linspace(0.05, math.pi, 40)
    vals = np.array([B.log_packing_number(make_cone(d, a, r), eps) for a in alphas])
    assert np.all(vals <= ball + 1e-9)
    assert np.all(np.diff(vals) >= -1e-9)
    assert vals[-1] == pytest.approx(ball, rel=1e-12)
    # the paper formula: the ball's plus the log cap fraction, log(1/2) at pi/2
    paper = B.log_packing_number(make_cone(d, math.pi / 2, r), eps, variant="paper")
    assert paper == pytest.approx(d * math.log1p(2 * r / eps) + math.log(0.5), rel=1e-13)


# ------------------------------------------------------------------------------------------
# validity: the rigorous bounds are never below an exact grid count; the paper's cone formula is
# ------------------------------------------------------------------------------------------
def test_rigorous_bounds_hold_against_grid_counts():
    rng = np.random.default_rng(0)
    eps = 1.0
    # ball, d = 2 and 3
    for d, r in ((2, 6.3), (3, 3.7)):
        ball = make_ball(np.zeros(d), r)
        cnt = grid_count(lambda X: np.linalg.norm(X, axis=1) <= r, d, eps, r, rng)
        assert math.log(cnt) <= B.log_packing_number(ball, eps) + 1e-12
    # rotated box, d = 2
    th = 0.6
    R = np.array([[math.cos(th), math.sin(th)], [-math.sin(th), math.cos(th)]])
    lo, hi = np.array([-4.0, -0.3]), np.array([4.0, 0.3])
    box = Box.from_params(lo, hi, rotation=R)
    cnt = grid_count(lambda X: np.all((X @ R.T >= lo) & (X @ R.T <= hi), axis=1), 2, eps, 5.0, rng)
    assert math.log(cnt) <= B.log_packing_number(box, eps) + 1e-12
    # thin ellipse along a grid axis, d = 2
    s = np.array([5.0, 0.05])
    ell = make_ellipsoid(s)
    cnt = grid_count(lambda X: (X[:, 0] / s[0]) ** 2 + (X[:, 1] / s[1]) ** 2 <= 1, 2, eps, 5.0, rng, 1)
    assert math.log(cnt) <= B.log_packing_number(ell, eps) + 1e-12
    # thin cone along a grid axis, d = 2 and 3
    for d, alpha, r in ((2, 0.01, 10.0), (3, 0.05, 8.0)):
        cone = make_cone(d, alpha, r)

        def member(X, alpha=alpha, r=r):
            n = np.linalg.norm(X, axis=1)
            cos = np.where(n > 0, X[:, 0] / np.maximum(n, 1e-300), 1.0)
            return (n <= r) & (cos >= math.cos(alpha) - 1e-12)

        cnt = grid_count(member, d, eps, r + 1, rng)
        assert cnt >= int(r) + 1  # the points on the axis
        assert math.log(cnt) <= B.log_packing_number(cone, eps) + 1e-12
        if d == 2:
            # THEORY's cone formula is an approximation: here it is below the exact count
            assert B.log_packing_number(cone, eps, variant="paper") < math.log(cnt)


def test_smaller_support_never_larger_bound():
    d, eps = 30, 0.01
    radii = [0.5, 1.0, 2.0, 4.0]
    balls = [B.log_packing_number(make_ball(np.zeros(d), r), eps) for r in radii]
    assert np.all(np.diff(balls) > 0)
    s = np.linspace(1.0, 0.1, d)
    e_small, e_big = make_ellipsoid(0.5 * s), make_ellipsoid(s)
    assert B.log_packing_number(e_small, eps) <= B.log_packing_number(e_big, eps)
    # the ellipsoid lies in the ball of radius max s
    assert B.log_packing_number(e_big, eps) <= B.log_packing_number(make_ball(np.zeros(d), 1.0), eps) + 1e-9
    lo = -np.linspace(1, 2, d)
    assert B.log_packing_number(Box.from_params(0.5 * lo, -0.5 * lo), eps) < B.log_packing_number(Box.from_params(lo, -lo), eps)


# ------------------------------------------------------------------------------------------
# counts, slopes, n*, accessible fraction
# ------------------------------------------------------------------------------------------
def test_counts_slopes_nstar_fraction():
    d, r, eps, V = 8, 1.0, 0.125, 1000
    cube = Box.from_params(-np.ones(d), np.ones(d))
    lp = d * math.log(17.0)
    assert B.accessible_log_count(cube, eps, 5) == pytest.approx(5 * lp)
    assert B.slope_bound(cube, eps, V) == pytest.approx(lp / math.log(V))
    assert B.slope_bound(cube, eps, V, rate=9.0) == pytest.approx(lp / 9.0)
    m = np.arange(1, 9)
    assert np.allclose(B.n_star(m, lp, V), m * lp / math.log(V))
    n = np.arange(1, 200)
    f = B.accessible_fraction_bound(n, 3, lp, V)
    ns = 3 * lp / math.log(V)
    assert np.all(f[n <= ns] == 1.0)
    past = n > ns
    assert np.allclose(f[past], np.exp(-(n[past] - ns) * math.log(V)), rtol=1e-10, atol=0)
    logf = B.accessible_fraction_bound(n, 3, lp, V, log=True)
    assert np.allclose(logf[past], -(n[past] - ns) * math.log(V))
    assert np.all(np.diff(f) <= 0)


def test_no_overflow_large_model():
    d, V, m = 4096, 262144, 1000
    r = 3.0
    eps = B.precision_eps(r, 11)
    lc = B.theorem45_log_count(d, m, r, eps)
    assert np.isfinite(lc) and lc == pytest.approx(d * m * math.log(4097))
    supports = [make_ball(np.zeros(d), r), Box.from_params(-r * np.ones(d), r * np.ones(d)),
                Ellipsoid.from_params(np.zeros(d), semi_axes=np.linspace(r, 0.01, d)),
                make_cone(d, 1.0, r),
                make_cone(d, 2.5, r), make_shell("rmsnorm", np.linspace(0.1, 2.0, d))]
    for s in supports:
        lp = B.log_packing_number(s, eps)
        assert np.isfinite(lp) and 0 < lp <= lc / m + 1e-6
        assert np.isfinite(B.accessible_log_count(s, eps, m))
        assert np.isfinite(B.slope_bound(s, eps, V))
    logf = B.accessible_fraction_bound(np.array([1, 10**5, 10**7]), m, lc / m, V, log=True)
    assert np.all(np.isfinite(logf)) and logf[-1] < -1e7
    thr = B.threshold_length_unbounded(lc / m, V, weight_bits=24)
    assert np.isfinite(thr["n_threshold"])


@pytest.mark.parametrize("call", [
    lambda: B.theorem45_log_count(8, 1, 1.0, 0.0),
    lambda: B.theorem45_log_count(8, 1, 1.0, -1.0),
    lambda: B.theorem45_log_count(8, 1, 0.0, 0.1),
    lambda: B.theorem45_log_count(8, 0, 1.0, 0.1),
    lambda: B.theorem45_log_count(8, 1, float("nan"), 0.1),
    lambda: B.linear_law_slope(8, 1.0, 0.1, 1),
    lambda: B.linear_law_slope(8, 1.0, 0.1, 100, rate=0.0),
    lambda: B.log_packing_number(make_ball(np.zeros(3), 1.0), 0.0),
    lambda: B.log_packing_number(make_ball(np.zeros(3), 1.0), float("nan")),
    lambda: B.log_packing_number(make_ball(np.zeros(3), 1.0), 0.1, variant="exact"),
    lambda: B.accessible_log_count(make_ball(np.zeros(3), 1.0), 0.1, 0),
    lambda: B.slope_bound(make_ball(np.zeros(3), 1.0), 0.1, 1),
    lambda: B.n_star(0, 10.0, 100),
    lambda: B.n_star(1, -1.0, 100),
    lambda: B.accessible_fraction_bound(0, 1, 10.0, 100),
])
def test_bad_input_value_errors(call):
    with pytest.raises(ValueError):
        call()


def test_bad_input_type_errors():
    with pytest.raises(TypeError):
        B.log_packing_number(np.ones(3), 0.1)
    with pytest.raises(TypeError, match="Support"):  # a shape name is not a support
        B.log_packing_number(types.SimpleNamespace(shape="torus"), 0.1)
    with pytest.raises(TypeError):
        B.theorem45_log_count(8.0, 1, 1.0, 0.1)
    with pytest.raises(TypeError):
        B.n_star(1.5, 10.0, 100)
    with pytest.raises(ValueError, match="fit"):
        B.log_packing_number(Ball(), 0.1)


# ------------------------------------------------------------------------------------------
# lambda
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("V", [7, 1000, 262144])
def test_cell_volume_rate_uniform_is_log_vocab(V):
    res = B.cell_volume_rate(np.full(V, 1.0 / V), 12)
    assert res.rate == pytest.approx(math.log(V), rel=1e-12)
    assert res.rate_origin == pytest.approx(math.log(V), rel=1e-12)
    assert np.allclose(res.log_median, -np.arange(1, 13) * math.log(V), rtol=1e-12)
    assert res.rate_asymptotic == pytest.approx(math.log(V), rel=1e-12)


def test_cell_volume_rate_two_level_matches_binomial_median():
    V, na, pa = 1000, 300, 0.002
    pb = (1 - na * pa) / (V - na)
    f = np.r_[np.full(na, pa), np.full(V - na, pb)]
    f = np.random.default_rng(3).permutation(f)
    k_max = 24
    res = B.cell_volume_rate(f, k_max)
    ks = np.arange(1, k_max + 1)
    # log product = J log pa + (k - J) log pb, J ~ Binomial(k, 0.3), increasing in J
    j = stats.binom.ppf(0.5, ks, na / V)
    med = j * math.log(pa) + (ks - j) * math.log(pb)
    assert np.allclose(res.log_median, med, atol=1e-9)
    slope = np.polyfit(ks, -med, 1)[0]
    assert res.rate == pytest.approx(slope, rel=1e-9)
    assert res.rate_asymptotic == pytest.approx(-(0.3 * math.log(pa) + 0.7 * math.log(pb)), rel=1e-12)
    assert res.rate > math.log(V)  # non-uniform cells: lambda > log|V| (Jensen)


def test_cell_volume_rate_grid_brackets_exact_enumeration():
    f = np.random.default_rng(1).dirichlet(np.full(6, 0.5))
    exact = B.cell_volume_rate(f, 7, exact_limit=6**7)
    assert exact.exact_k == list(range(1, 8))
    grid = B.cell_volume_rate(f, 7, exact_limit=1, max_support=512)
    assert grid.exact_k == []
    assert np.all(grid.log_median_low <= exact.log_median + 1e-9)
    assert np.all(exact.log_median <= grid.log_median_high + 1e-9)
    width = grid.log_median_high - grid.log_median_low
    span = np.ptp(np.log(f))
    assert np.all(width <= np.arange(1, 8) * span / 511 + 1e-9)
    assert grid.rate_bracket[0] <= exact.rate + 1e-9 <= grid.rate_bracket[1] + 2e-9


def test_cell_volume_rate_zero_fractions_conservative():
    V = 200
    rng = np.random.default_rng(2)
    counts = rng.multinomial(2000, rng.dirichlet(np.full(V, 0.3)))
    n = counts.sum()
    f = counts / n
    assert (f == 0).sum() > 0
    up = np.minimum(1.0, f + 3.0 / n + 2 * np.sqrt(f / n))
    lo = np.maximum(0.0, f - 2 * np.sqrt(f / n))
    res = B.cell_volume_rate(f, 10, upper=up, lower=lo)
    assert res.zero_fill == "upper" and res.n_zero == int((f == 0).sum())
    # filling with a smaller value makes lambda larger: the upper fill is the conservative one
    with pytest.warns(RuntimeWarning, match="zero fraction"):
        res_min = B.cell_volume_rate(f, 10)
    assert res.rate <= res_min.rate + 1e-12
    assert res.rate_interval[0] <= res.rate <= res.rate_interval[1]
    assert res.rate_conservative <= res.rate
    r3 = B.cell_volume_rate(f, 10, n_samples=int(n), n_boot=3, seed=0)
    assert r3.zero_fill == "rule_of_three" and r3.rate_bootstrap[1] >= 0
    d = res.to_dict()
    assert isinstance(d["log_median"], list) and "rate_conservative" in d


def test_cell_volume_rate_zero_fill_is_renormalised_jensen_holds():
    # issue 16: most tokens without a hit, filled with their upper ends, made the fractions sum
    # to about 2 and put even -mean log f below log|V|
    V, n = 2000, 3000
    rng = np.random.default_rng(4)
    counts = rng.multinomial(n, rng.dirichlet(np.full(V, 0.2)))
    f = counts / n
    up = np.where(counts > 0, np.minimum(1.0, f + 3 / n), 3.0 / n)
    assert (f == 0).mean() > 0.3
    raw = B.cell_volume_rate(f, 8, upper=up, normalize=False)
    res = B.cell_volume_rate(f, 8, upper=up)
    g = np.where(f > 0, f, up)
    assert res.log_total == pytest.approx(math.log(g.sum()), rel=1e-12) and res.log_total > 0.3
    assert raw.rate_asymptotic < math.log(V)  # the defect
    assert res.normalized and res.rate_asymptotic >= math.log(V)
    assert res.rate_asymptotic == pytest.approx(-np.mean(np.log(g / g.sum())), rel=1e-12)
    # dividing every share by the same sum shifts log median_k by -k log_total: lambda by +log_total
    assert res.rate == pytest.approx(raw.rate + res.log_total, abs=2e-3)


# ------------------------------------------------------------------------------------------
# lambda from log-shares (rare-event estimates; a token sample)
# ------------------------------------------------------------------------------------------
def _two_level(V, na, pa):
    pb = (1 - na * pa) / (V - na)
    return np.log(np.r_[np.full(na, pa), np.full(V - na, pb)]), pb


def _binomial_median_rate(ks, q, la, lb):
    j = stats.binom.ppf(0.5, ks, q)
    med = j * la + (ks - j) * lb
    return np.polyfit(ks, -med, 1)[0], med


@pytest.mark.parametrize("V", [7, 1000])
def test_rate_from_logs_equal_cells_is_log_vocab(V):
    res = B.cell_volume_rate_from_logs(np.full(V, -math.log(V)), 12, n_boot=0)
    assert res.rate == pytest.approx(math.log(V), rel=1e-12)
    assert res.rate_asymptotic == pytest.approx(math.log(V), rel=1e-12)
    assert res.normalized and not res.token_sample and abs(res.log_total) < 1e-12
    # a sample of 50 equal cells out of a vocabulary of 10 V: the same, and the interval has no width
    s = B.cell_volume_rate_from_logs(np.full(50, -math.log(10 * V)), 12, vocab_size=10 * V, n_boot=20)
    assert s.token_sample and s.n_tokens_used == 50 and s.log_vocab == pytest.approx(math.log(10 * V))
    assert s.rate == pytest.approx(math.log(10 * V), rel=1e-12)
    assert s.rate_ci[0] == pytest.approx(s.rate, rel=1e-12) and s.rate_ci[1] == pytest.approx(s.rate, rel=1e-12)


def test_rate_from_logs_two_level_exact_and_matches_fraction_path():
    V, na, pa = 1000, 300, 0.002
    x, pb = _two_level(V, na, pa)
    x = np.random.default_rng(3).permutation(x)
    k_max = 24
    ks = np.arange(1, k_max + 1)
    res = B.cell_volume_rate_from_logs(x, k_max, n_boot=0)
    slope, med = _binomial_median_rate(ks, na / V, math.log(pa), math.log(pb))
    assert np.allclose(res.log_median, med, atol=1e-9)
    assert res.rate == pytest.approx(slope, rel=1e-9)
    jensen = -(0.3 * math.log(pa) + 0.7 * math.log(pb))
    assert res.rate_asymptotic == pytest.approx(jensen, rel=1e-12)
    assert res.rate > math.log(V) and res.rate_asymptotic > math.log(V)
    assert res.rate == pytest.approx(B.cell_volume_rate(np.exp(x), k_max).rate, rel=1e-12)
    # shares that sum to 2 (every estimate e^0.69 too large): renormalised back to the same lambda
    off = B.cell_volume_rate_from_logs(x + math.log(2), k_max, n_boot=0)
    assert off.log_total == pytest.approx(math.log(2), rel=1e-9)
    assert off.rate == pytest.approx(res.rate, rel=1e-9)
    raw = B.cell_volume_rate_from_logs(x + math.log(2), k_max, n_boot=0, normalize=False)
    assert raw.rate == pytest.approx(res.rate - math.log(2), rel=1e-9)


def test_rate_from_logs_sample_estimates_vocabulary_rate_with_covering_interval():
    # vocabulary: 200,000 cells, log-shares spread over several nats (a real model's spread);
    # 20 seeded samples of 1,000 tokens: lambda's 90% bootstrap interval covers the full
    # vocabulary's lambda in most of them, and the point is within a few standard errors
    V, n, k_max = 200_000, 1000, 8
    rng = np.random.default_rng(7)
    logf = rng.normal(0.0, 2.0, V)
    logf -= special.logsumexp(logf)
    truth = B.cell_volume_rate_from_logs(logf, k_max, n_boot=0, normalize=False).rate
    assert truth > math.log(V) + 1.0  # unequal cells
    cover, errs, ses, total_cover = [], [], [], []
    for s in range(20):
        idx = np.random.default_rng(100 + s).choice(V, n, replace=False)
        r = B.cell_volume_rate_from_logs(logf[idx], k_max, vocab_size=V, n_boot=60, confidence=0.9,
                                         seed=s, max_support=512)
        assert r.token_sample and not r.normalized and r.ci_includes[0].startswith("token sampling")
        cover.append(r.rate_ci[0] <= truth <= r.rate_ci[1])
        errs.append(r.rate - truth)
        ses.append(r.rate_bootstrap[1])
        total_cover.append(r.log_total_ci[0] <= 0.0 <= r.log_total_ci[1])  # the true sum is 1
    assert np.mean(cover) >= 0.7 and np.mean(total_cover) >= 0.6
    assert 0.03 < np.median(ses) < 0.2  # about sd(log f) / sqrt(n) = 2 / 32
    assert np.sqrt(np.mean(np.square(errs))) < 2 * np.median(ses)


def test_rate_from_logs_per_token_error_enters_the_interval():
    V, na, pa = 400, 120, 0.004
    x, _ = _two_level(V, na, pa)
    exact = B.cell_volume_rate_from_logs(x, 8, n_boot=30, seed=1)
    assert exact.rate_ci[1] - exact.rate_ci[0] == pytest.approx(0.0, abs=1e-12)  # nothing random
    assert exact.ci_includes == ["renormalisation (each replicate divided by its own estimated sum)"]
    noisy = B.cell_volume_rate_from_logs(x, 8, log_lower=x - 1.0, log_upper=np.minimum(x + 1.0, 0),
                                         n_boot=30, seed=1)
    assert noisy.rate == exact.rate  # the point does not move
    assert noisy.rate_ci[1] - noisy.rate_ci[0] > 0.01
    assert any(p.startswith("per-token") for p in noisy.ci_includes)
    assert noisy.rate_conservative <= noisy.rate_ci[0] + 1e-12


def test_rate_from_logs_a_token_without_a_lower_end_widens_the_interval():
    """log_lower = -inf (the share may be 0) gave that token no spread: rate_ci was as narrow
    as if its share were exact, though at share 0 lambda is far above it. The interval now
    covers the token anywhere in [0, its upper end]: at 0, at its estimate, at its upper end."""
    x = np.log(np.random.default_rng(0).dirichlet(np.ones(50)))
    lo, hi = x - 0.01, np.minimum(x + 0.01, 0.0)
    tight = B.cell_volume_rate_from_logs(x, 8, log_lower=lo, log_upper=hi, n_boot=60, seed=1)
    at_zero = B.cell_volume_rate_from_logs(np.r_[-np.inf, x[1:]], 8, n_boot=0).rate
    at_top = B.cell_volume_rate_from_logs(np.r_[x[0] + 3.0, x[1:]], 8, n_boot=0).rate
    assert tight.rate_ci[1] < at_zero - 0.1  # token 0 exact: the interval excludes its share 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wide = B.cell_volume_rate_from_logs(x, 8, log_lower=np.r_[-np.inf, lo[1:]],
                                            log_upper=np.r_[x[0] + 3.0, hi[1:]], n_boot=60, seed=1)
    assert wide.rate == tight.rate  # the point does not move
    assert wide.rate_ci[0] <= min(tight.rate_ci[0], at_top) + 1e-9
    assert wide.rate_ci[1] >= at_zero - 1e-9
    assert wide.rate_conservative <= tight.rate_conservative
    assert any(p.startswith("1 token(s) without a lower end") for p in wide.ci_includes)
    # without an upper end the share may be up to 1; enough such tokens make lambda unbounded
    many = B.cell_volume_rate_from_logs(x, 8, log_lower=np.r_[np.full(10, -np.inf), lo[10:]],
                                        n_boot=30, seed=1)
    assert many.rate_ci[0] <= tight.rate_ci[0] and many.rate_ci[1] == math.inf
    # no lower end anywhere: from uniform shares (lambda = log|V|, its least) to no bound at all
    none = B.cell_volume_rate_from_logs(x, 8, log_lower=np.full(50, -np.inf), n_boot=10, seed=1)
    assert none.rate_ci == (pytest.approx(math.log(50)), math.inf)
    assert none.log_total_ci == (-math.inf, pytest.approx(math.log(50)))  # sum 0 to |V|


@pytest.mark.parametrize("far", [-1e20, -1e300, -1.7e308])
@pytest.mark.parametrize("normalize", [False, True])
def test_rate_from_logs_far_apart_log_shares_keep_their_digits(far, normalize):
    """One log-share of -1e20 among values of a few nats made the median curve's grid step
    2e16 nats: lambda came out -1.21 (below 0, with an 'exact' bracket); -1e300 and -1e308
    gave overflow RuntimeWarnings. While at most half of the k-fold sums hold the far cell it
    acts as an empty one, so lambda is the same as with -inf there, and nothing overflows."""
    y = np.log(np.random.default_rng(0).dirichlet(np.ones(49)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = B.cell_volume_rate_from_logs(np.r_[far, far, y], 8, n_boot=20, seed=2,
                                         normalize=normalize)
    b = B.cell_volume_rate_from_logs(np.r_[-np.inf, -np.inf, y], 8, n_boot=20, seed=2,
                                     normalize=normalize)
    assert a.rate == pytest.approx(b.rate, rel=1e-12) and a.rate > math.log(51) - 0.5
    assert a.rate_bracket == pytest.approx(b.rate_bracket, rel=1e-12)
    np.testing.assert_allclose(a.log_median, b.log_median, rtol=1e-12)
    assert a.rate_ci == pytest.approx(b.rate_ci, rel=1e-12)
    assert a.n_empty == 0 and b.n_empty == 2
    if not normalize:  # -mean log f, summed without overflow
        assert a.rate_asymptotic == pytest.approx(-(2 * (far / 51) + y.sum() / 51), rel=1e-12)


def test_rate_from_logs_is_homogeneous_up_to_the_float_range():
    """Without renormalisation lambda of c x is c times lambda of x: at c = 1e300 the sums and
    the fit's squares overflowed (RuntimeWarnings); they are now formed in units of 2**e."""
    x = np.linspace(-1.0, -1e-3, 50)  # a sample of 50 of 100 tokens: the bootstrap resamples
    ref = B.cell_volume_rate_from_logs(x, 8, n_boot=20, seed=3, normalize=False, vocab_size=100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for c in (2.0**600, 1e300, 1.7e308):
            r = B.cell_volume_rate_from_logs(c * x, 8, n_boot=20, seed=3, normalize=False,
                                             vocab_size=100)
            assert r.rate == pytest.approx(c * ref.rate, rel=1e-12)
            assert r.rate_ci == pytest.approx((c * ref.rate_ci[0], c * ref.rate_ci[1]), rel=1e-12)
            # (a c that is not a power of two moves an atom across a half-node now and then)
            assert r.rate_bootstrap == pytest.approx((c * ref.rate_bootstrap[0],
                                                      c * ref.rate_bootstrap[1]), rel=1e-4)
            assert r.rate_asymptotic == pytest.approx(c * ref.rate_asymptotic, rel=1e-12)
            # a median product below exp(-1.8e308) is 0 to any precision: -inf, the rest kept
            with np.errstate(over="ignore"):  # the expected value itself overflows there
                beyond = ~np.isfinite(c * ref.log_median)
            assert np.all(np.isneginf(r.log_median[beyond]))
            np.testing.assert_allclose(r.log_median[~beyond], c * ref.log_median[~beyond], rtol=1e-12)


def test_rate_from_logs_nan_outside_sample_unresolved_and_empty():
    rng = np.random.default_rng(5)
    V = 300
    full = np.log(rng.dirichlet(np.ones(V)))
    ids = np.sort(rng.choice(V, 60, replace=False))
    arr = np.full(V, np.nan)
    arr[ids] = full[ids]
    a = B.cell_volume_rate_from_logs(arr, 6, n_boot=0)
    b = B.cell_volume_rate_from_logs(full[ids], 6, vocab_size=V, n_boot=0)
    assert a.vocab_size == V and a.n_tokens_used == 60 and a.rate == b.rate
    # an unresolved token (nan with an upper end) counts with its upper end
    x, hi = full[ids].copy(), full[ids] + 0.5
    x[0] = np.nan
    c = B.cell_volume_rate_from_logs(x, 6, log_upper=hi, vocab_size=V, n_boot=0)
    d = B.cell_volume_rate_from_logs(np.r_[hi[0], full[ids][1:]], 6, vocab_size=V, n_boot=0)
    assert c.n_unresolved == 1 and c.rate == d.rate
    # an empty cell (-inf) is a share of 0: kept, it can only raise the median curve's slope
    e = B.cell_volume_rate_from_logs(np.r_[-np.inf, full[1:]], 6, n_boot=0)
    f = B.cell_volume_rate_from_logs(full, 6, n_boot=0)
    assert e.n_empty == 1 and np.all(e.log_median <= f.log_median + 1e-12)


def _cell_volumes_by_hand(counts, n_samples, log_shares=None, half_width=0.5, confidence=0.95):
    """A CellVolumes built from its fields: uniform counts, or rare-event log-shares whose
    two-sided ``confidence`` intervals are ``log_share -+ half_width``."""
    from embgeom.volumes import CellVolumes, binomial_interval

    counts = np.asarray(counts, dtype=np.int64)
    lo, hi = binomial_interval(counts, n_samples, confidence)
    logs = {}
    if log_shares is not None:
        x = np.asarray(log_shares, dtype=np.float64)
        logs = {"log_fractions": x, "log_lower": x - half_width,
                "log_upper": np.minimum(x + half_width, 0.0),
                "token_method": np.full(x.size, "rare-event"), "estimator": "rare-event"}
    return CellVolumes(fractions=counts / n_samples, counts=counts, n_samples=n_samples, lower=lo,
                       upper=hi, confidence=confidence, interval="clopper-pearson",
                       support_log_volume=0.0, sampling="directions",
                       seed=np.random.SeedSequence(0), seconds=0.0, **logs)


def test_rare_event_cell_volumes_rate_by_hand_and_its_levels():
    # two cells, shares 1/4 and 3/4, every token estimated (so the shares are renormalised;
    # they already sum to 1). By hand, k = 1: the lower median of {1/4, 3/4} is 1/4, so
    # y_1 = log 4; k = 2: the products sorted are 1/16, 3/16, 3/16, 9/16 and the lower median is
    # 3/16, so y_2 = log(16/3); the slope through the two points is log(16/3) - log 4 = log(4/3).
    cv = _cell_volumes_by_hand([25, 75], 100, np.log([0.25, 0.75]), confidence=0.5)
    r = B.cell_volume_rate(cv, 2, n_boot=0)
    assert r.estimator == "log-shares" and r.zero_fill == "none"
    assert r.rate == pytest.approx(math.log(4 / 3), abs=1e-12)
    assert r.log_median == pytest.approx([-math.log(4), -math.log(16 / 3)], abs=1e-12)
    # bug 1: n_boot=0 means no bootstrap (it silently became 200)
    assert r.rate_ci is None and r.rate_bootstrap is None and r.ci_level is None
    # bug 1: the bootstrap level is the caller's (default 0.95), not the per-token level 0.5
    rb = B.cell_volume_rate(cv, 2, n_boot=40, seed=3)
    assert rb.ci_level == 0.95 and rb.rate_ci is not None
    assert cv.cell_volume_rate(2, n_boot=40, seed=3, confidence=0.8).ci_level == 0.8
    # ... and the per-token intervals are read at their own level, 0.5: se = 0.5 / z_0.75,
    # each log-share raised by se^2 / 2 first (the log bias of an unbiased share estimate)
    sh = 0.5 * (0.5 / 0.6744897501960817) ** 2
    xs, los = cv.log_fractions + sh, cv.log_lower + sh
    his = np.minimum(cv.log_upper + sh, 0.0)
    ref = B.cell_volume_rate_from_logs(xs, 2, log_lower=los, log_upper=his, n_boot=40, seed=3,
                                       token_confidence=0.5)
    wrong = B.cell_volume_rate_from_logs(xs, 2, log_lower=los, log_upper=his, n_boot=40, seed=3,
                                         token_confidence=0.95)
    assert rb.rate_bootstrap == ref.rate_bootstrap != wrong.rate_bootstrap
    # default n_boot of a rare-event CellVolumes: 200 replicates (its interval is part of it)
    assert B.cell_volume_rate(cv, 2, seed=1).rate_ci is not None
    with pytest.raises(ValueError, match="n_samples: not accepted"):
        B.cell_volume_rate(cv, 2, n_samples=100)


def test_uniform_cell_volumes_rate_by_hand():
    # counts 5, 3, 2, 0 of 10: the zero is filled by its 95% Clopper-Pearson upper end
    # u = 1 - 0.025^(1/10) = 0.30849..., the four shares divided by their sum 1 + u; k_max = 1:
    # lambda = -log(lower median) = -log(sorted second share) = log((1 + u) / 0.3).
    cu = _cell_volumes_by_hand([5, 3, 2, 0], 10)
    u = 1 - 0.025 ** (1 / 10)
    r = B.cell_volume_rate(cu, 1)
    assert r.estimator == "uniform counts" and r.zero_fill == "upper" and r.n_zero == 1
    assert r.rate == pytest.approx(math.log((1 + u) / 0.3), rel=1e-12)
    assert r.unresolved_share == 0.25 and r.rate_bootstrap is None
    assert cu.cell_volume_rate(1).rate == r.rate


def test_bounds_section_takes_a_uniform_cell_volumes(tmp_path):
    # bug 2: a uniform CellVolumes and no unresolved_share used to raise a TypeError at
    # np.asarray(fractions) <= 0; the share now comes from the rate: 1 zero count of 4 tokens
    from embgeom.report import bounds_report_section

    d = 3
    cu = _cell_volumes_by_hand([5, 3, 2, 0], 10)
    sec = bounds_report_section({"hidden_size": d, "vocab_size": 4}, {}, rinf=1.0, fractions=cu,
                                k_max=1, out_dir=tmp_path)
    u = 1 - 0.025 ** (1 / 10)
    lam = math.log((1 + u) / 0.3)
    assert sec["unresolved_share"] == 0.25 and sec["lambda_usable"] is False
    assert "25.0% of the cells are unresolved" in sec["lambda_note"]
    assert sec["rate_lambda"] == pytest.approx(lam, rel=1e-12)
    # the cube's closed form d log(1 + 2 r / eps) with eps = r 2^-11, refined by lambda
    log_p = d * math.log(1 + 2 * 2**11)
    assert sec["slope"]["cube"] == pytest.approx(log_p / math.log(4), rel=1e-12)
    assert sec["slope_refined"]["cube"] == pytest.approx(log_p / lam, rel=1e-12)
    rate = cu.cell_volume_rate(1)
    assert sec["slope_refined_conservative"]["cube"] == pytest.approx(
        log_p / rate.rate_conservative, rel=1e-12)
    assert rate.rate_conservative < lam  # the upper interval ends give a smaller lambda


def test_slope_bound_takes_a_cell_volume_rate():
    ball = Ball.from_params(np.zeros(4), 2.0)
    eps, V = 2.0**-11, 100
    rate = B.cell_volume_rate(np.array([0.1, 0.2, 0.3, 0.4]), 2, upper=np.array([0.3, 0.4, 0.5, 0.6]))
    log_p = B.log_packing_number(ball, eps)
    assert B.slope_bound(ball, eps, V) == pytest.approx(log_p / math.log(V), rel=1e-12)
    assert B.slope_bound(ball, eps, V, rate) == pytest.approx(log_p / rate.rate, rel=1e-12)
    assert B.slope_bound(ball, eps, V, rate, conservative=True) == pytest.approx(
        log_p / rate.rate_conservative, rel=1e-12)
    assert rate.rate_conservative < rate.rate
    assert B.slope_bound(ball, eps, V, 2.5) == pytest.approx(log_p / 2.5, rel=1e-12)
    assert B.slope_from_log_packing(20.0, 100, 5.0) == 4.0
    assert B.slope_from_log_packing(20.0, 100) == pytest.approx(20 / math.log(100), rel=1e-15)
    with pytest.raises(ValueError, match="conservative: needs a CellVolumeRate"):
        B.slope_bound(ball, eps, V, 2.5, conservative=True)
    with pytest.raises(TypeError, match="conservative"):
        B.slope_from_log_packing(20.0, 100, rate, conservative="yes")
    with pytest.raises(ValueError, match="log_packing"):
        B.slope_from_log_packing(-1.0, 100)
    with pytest.raises(ValueError, match="rate"):
        B.slope_from_log_packing(1.0, 100, 0.0)


@pytest.mark.parametrize("kwargs,err", [
    (dict(log_fractions=np.r_[0.5, np.full(9, -3.0)]), ValueError),  # a share above 1
    (dict(log_fractions=np.r_[np.inf, np.full(9, -3.0)]), ValueError),
    (dict(log_fractions=np.r_[np.nan, -1.0]), ValueError),  # one token with a figure
    (dict(log_fractions=np.r_[np.nan, np.full(9, -3.0)], log_upper=np.full(10, np.nan)), ValueError),
    (dict(log_fractions=np.full(10, -3.0), vocab_size=5), ValueError),
    (dict(log_fractions=np.full(10, -3.0), log_lower=np.full(10, -2.0)), ValueError),
    (dict(log_fractions=np.full(10, -3.0), log_upper=np.full(10, -4.0)), ValueError),
    (dict(log_fractions=np.full(10, -3.0), log_upper=np.full(9, -2.0)), ValueError),
    (dict(log_fractions=np.full(10, -np.inf)), ValueError),
    (dict(log_fractions=np.full(10, -3.0), normalize="yes"), ValueError),
    (dict(log_fractions=np.full(10, -3.0), confidence=1.0), ValueError),
    (dict(log_fractions=np.full(10, -3.0), k_max=0), ValueError),
    (dict(log_fractions=np.arange(10)), TypeError),
])
def test_rate_from_logs_bad_input(kwargs, err):
    with pytest.raises(err):
        B.cell_volume_rate_from_logs(**kwargs)


@pytest.mark.parametrize("kwargs,err", [
    (dict(fractions=np.full(10, 0.2)), ValueError),  # sums to 2
    (dict(fractions=np.r_[-0.1, np.full(9, 1.1 / 9)]), ValueError),
    (dict(fractions=np.r_[np.nan, np.full(9, 1 / 9)]), ValueError),
    (dict(fractions=np.full(10, 0.1), k_max=0), ValueError),
    (dict(fractions=np.full(10, 0.1), max_support=1), ValueError),
    (dict(fractions=np.full(10, 0.1), upper=np.full(9, 0.2)), ValueError),
    (dict(fractions=np.full(10, 0.1), n_boot=2), ValueError),
    (dict(fractions=np.arange(10)), TypeError),
])
def test_cell_volume_rate_bad_input(kwargs, err):
    with pytest.raises(err):
        B.cell_volume_rate(**kwargs)


# ------------------------------------------------------------------------------------------
# Cor. 4.10
# ------------------------------------------------------------------------------------------
def test_threshold_small_closed_form():
    # P = 3 points, K = 4 weight levels: C(4 + 3, 4) = 35 measures; |V| = 2
    t = B.threshold_length_unbounded(math.log(3), 2, weight_bits=2)
    assert t["log_count"] == pytest.approx(math.log(35), rel=1e-12)
    assert t["n_threshold"] == pytest.approx(math.log(35) / math.log(2), rel=1e-12)
    # context of <= 2 vectors: multisets of size <= 2 from 3 points: 1 + 3 + 6 = 10
    t2 = B.threshold_length_unbounded(math.log(3), 2, weight_bits=2, context_length=[1, 2, 4, 9])
    assert np.allclose(np.exp(t2["log_count"]), [4, 10, 35, 35])
    assert np.allclose(np.exp(B.log_multiset_count(math.log(3), np.arange(5))), [1, 4, 10, 20, 35])


def test_threshold_monotone_and_large():
    base = B.threshold_length_unbounded(50.0, 1000)["n_threshold"]
    assert B.threshold_length_unbounded(60.0, 1000)["n_threshold"] > base
    assert B.threshold_length_unbounded(50.0, 1000, weight_bits=12)["n_threshold"] > base
    assert B.threshold_length_unbounded(50.0, 2000)["n_threshold"] < base
    L = np.array([1, 10, 100, 1000, 2048, 5000, 10**6])
    nl = B.threshold_length_unbounded(50.0, 1000, context_length=L)["n_threshold"]
    assert np.all(np.diff(nl) >= 0) and nl[-1] == pytest.approx(base)
    # the two branches of log_multiset_count agree around log P = 700
    n = np.array([0, 1, 5, 100])
    a = B.log_multiset_count(699.999, n)
    b = B.log_multiset_count(700.001, n)
    assert np.allclose(b - a, n * 0.002, atol=1e-9)
    # permutation invariance saves about log K! against K ordered vectors
    lp = 5000.0
    t = B.threshold_length_unbounded(lp, 262144, weight_bits=11)
    assert t["log_count"] == pytest.approx(2048 * lp - special.gammaln(2049), rel=1e-12)


@pytest.mark.parametrize("lp", [1e308, 1e306])
def test_threshold_overflow_is_refused(lp):
    # 2048 weight levels times log P = 1e306 nats is beyond float64: a ValueError naming the
    # arguments, never inf with a RuntimeWarning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="log_points and n.*overflows"):
            B.threshold_length_unbounded(lp, 49152)
        with pytest.raises(ValueError, match="overflows"):
            B.log_multiset_count(lp, [1, 2048])
    # one level short of it is still a number: 1e305 * 1 nats
    assert B.log_multiset_count(1e305, 1) == pytest.approx(1e305, rel=1e-12)


# ------------------------------------------------------------------------------------------
# report section
# ------------------------------------------------------------------------------------------




def _two_of_four_sampled(x, methods, extra=None):
    """A rare-event CellVolumes by hand: tokens 0, 1 of 4 estimated, log-shares ``x`` with
    level-0.5 intervals ``x -+ 0.5`` and the given token methods; tokens 2, 3 not estimated."""
    from embgeom.volumes import CellVolumes

    nan = np.nan
    return CellVolumes(fractions=np.zeros(4), counts=np.zeros(4, np.int64), n_samples=100,
                       lower=np.zeros(4), upper=np.ones(4), confidence=0.5,
                       interval="clopper-pearson", support_log_volume=0.0,
                       sampling="directions", seed=np.random.SeedSequence(0), seconds=0.0,
                       log_fractions=np.array([x[0], x[1], nan, nan]),
                       log_lower=np.array([x[0] - 0.5, x[1] - 0.5, nan, nan]),
                       log_upper=np.array([x[0] + 0.5, x[1] + 0.5, nan, nan]),
                       token_method=np.array([*methods, "not estimated", "not estimated"]),
                       estimator="rare-event", extra=extra or {})


def test_rare_event_rate_removes_the_log_bias_of_each_token():
    # A token sample (2 of 4 tokens estimated, so no renormalisation): the rate's asymptote is
    # -mean(log-share). Splitting is unbiased in the share, so its log is low by se^2 / 2; the
    # rate raises each rare-event log-share by that much. Half-width 0.5 at level 0.5:
    # se = 0.5 / z_0.75, z_0.75 = 0.6744897501960817.
    x = np.log([0.1, 0.05])
    se = 0.5 / 0.6744897501960817
    cv = _two_of_four_sampled(x, ["rare-event", "uniform"])
    r = cv.cell_volume_rate(4, n_boot=0)
    # token 0 (rare-event) shifted by se^2 / 2 = 0.27480..., token 1 (a count) left as it is
    assert r.rate_asymptotic == pytest.approx(-(x[0] + se**2 / 2 + x[1]) / 2, abs=1e-12)
    assert r.token_sample and r.vocab_size == 4


def test_rare_event_rate_reads_se_with_the_intervals_t_quantile():
    # one run of 16 groups: the interval is Student t on 15 degrees of freedom, so the se^2/2
    # shift reads se = half-width / t_15 (0.6912... at level 0.5), not / z_0.75 (0.6745...)
    from scipy import stats

    x = np.log([0.1, 0.05])
    t15 = float(stats.t.ppf(0.75, 15))
    assert t15 == pytest.approx(0.6912, abs=1e-4)
    cv = _two_of_four_sampled(x, ["rare-event", "rare-event"],
                              extra={"rare_event": {"n_groups": 16},
                                     "rare_event_n_runs": np.array([1, 3, 0, 0])})
    r = cv.cell_volume_rate(4, n_boot=0)
    se0, se1 = 0.5 / t15, 0.5 / float(stats.t.ppf(0.75, 47))  # 3 runs: 3 * 16 - 1 = 47
    assert r.rate_asymptotic == pytest.approx(-(x[0] + se0**2 / 2 + x[1] + se1**2 / 2) / 2,
                                              abs=1e-12)


def test_rare_event_rate_uses_each_tokens_recorded_standard_error():
    # n_runs counts the pilot run, which is not in the estimate: reading se back from the
    # interval with n_runs * n_groups - 1 degrees of freedom is off; a recorded se is used as
    # it is (token 0), the read-back only where none was recorded (token 1: nan)
    from scipy import stats

    x = np.log([0.1, 0.05])
    cv = _two_of_four_sampled(x, ["rare-event", "rare-event"],
                              extra={"rare_event": {"n_groups": 16},
                                     "rare_event_n_runs": np.array([2, 3, 0, 0]),
                                     "rare_event_std_err": np.array([0.3, np.nan, np.nan, np.nan])})
    r = cv.cell_volume_rate(4, n_boot=0)
    se1 = 0.5 / float(stats.t.ppf(0.75, 47))
    assert r.rate_asymptotic == pytest.approx(-(x[0] + 0.3**2 / 2 + x[1] + se1**2 / 2) / 2,
                                              abs=1e-12)


def test_cell_volumes_records_the_rare_event_standard_errors():
    from embgeom.cells import Decoder
    from embgeom.supports import Ball
    from embgeom.volumes import cell_volumes

    rng = np.random.default_rng(1)
    W = rng.standard_normal((40, 6)).astype(np.float32)
    toks = [3, 17]
    cv = cell_volumes(Decoder(W), Ball.from_params(np.zeros(6), 1.0), 2_000, seed=5,
                      method="rare-event", tokens=toks, n_chains=32, progress=False)
    se = cv.extra["rare_event_std_err"]
    assert se.shape == (40,) and np.isnan(np.delete(se, toks)).all()
    split = [t for t in toks if cv.token_method[t] == "rare-event"]
    assert split and np.all(se[split] > 0)
    # the interval is the t-interval on that se
    assert np.all(cv.log_fractions[split] - cv.log_lower[split] > se[split])


def test_bounds_markdown_writes_c_emp_as_a_lower_bound_unless_converged(tmp_path):
    from embgeom.report import bounds_report_section

    facts = {"hidden_size": 3, "vocab_size": 6}
    meas = {"c_emp": 13.0, "c_emp_lower": 11.0, "c_emp_upper": 15.0, "source": "horizons"}
    md = bounds_report_section(facts, {}, rinf=1.0, c_emp=meas, out_dir=tmp_path)["markdown"]
    assert "C_emp >= 13 tokens per prompt vector" in md and "not shown to converge" in md
    md = bounds_report_section(facts, {}, rinf=1.0, c_emp={**meas, "converged": True},
                                 out_dir=tmp_path)["markdown"]
    assert "C_emp = 13 tokens per prompt vector" in md
    md = bounds_report_section(facts, {}, rinf=1.0, published_c_emp=44.54,
                                 out_dir=tmp_path)["markdown"]
    assert "C_emp = 44.54 tokens per prompt vector (published" in md


@pytest.mark.parametrize("bad", [float("nan"), 0.0, -1.0, float("inf"), True, "x"])
def test_bounds_section_refuses_a_bad_c_emp(tmp_path, bad):
    from embgeom.report import bounds_report_section

    with pytest.raises((TypeError, ValueError), match=r"c_emp\['c_emp'\]"):
        bounds_report_section({"hidden_size": 3, "vocab_size": 6}, {}, rinf=1.0,
                              c_emp={"c_emp": bad}, out_dir=tmp_path)


def test_accessible_fraction_bound_names_n_and_m_when_shapes_clash():
    with pytest.raises(ValueError, match="n and m"):
        B.accessible_fraction_bound([1, 2], [1, 2, 3], 1000.0, 49152)
    # shapes that broadcast still give the bound: m = 2 vectors, log-packing 1000 nats each
    f = B.accessible_fraction_bound(np.array([[1], [10**4]]), [1, 2], 1000.0, 49152, log=True)
    assert f.shape == (2, 2)
    np.testing.assert_array_equal(f[0], [0.0, 0.0])  # n = 1: every sequence fits
    assert f[1, 1] < 0 and f[1, 1] - f[1, 0] == pytest.approx(1000.0)  # one more vector: +1000 nats


@pytest.mark.parametrize("shift", [0.0, -1e3, -1e17, -1e20, -1e300])
def test_rate_from_logs_renormalises_far_shifted_log_shares(shift):
    """Renormalising divides the shares by their sum, so a common shift of the log-shares
    cancels: 50 equal shares give lambda = log 50 at any shift (at -1e17 and beyond the
    renormalised log-shares used to round to 0 and lambda to 0, below log|V|)."""
    from embgeom import cell_volume_rate_from_logs

    r = cell_volume_rate_from_logs(np.full(50, shift), 8, n_boot=0, normalize=True)
    assert r.rate == pytest.approx(math.log(50), abs=1e-12)
    assert r.rate_asymptotic == pytest.approx(math.log(50), abs=1e-12)
    x = np.log(np.random.default_rng(0).dirichlet(np.ones(50)))
    a = cell_volume_rate_from_logs(x, 8, n_boot=0)
    b = cell_volume_rate_from_logs(x + max(shift, -1e3), 8, n_boot=0)
    assert b.rate == pytest.approx(a.rate, abs=1e-9) and a.rate_asymptotic >= math.log(50)


@pytest.mark.parametrize("k_max", [257, 10**6])
def test_rate_refuses_a_k_max_that_would_run_for_hours(k_max):
    """The median curve costs about k_max^2: 10**6 ran for hours with no sign of it."""
    from embgeom import cell_volume_rate, cell_volume_rate_from_logs

    p = np.random.default_rng(0).dirichlet(np.ones(50))
    with pytest.raises(ValueError, match="k_max: expected at most 256"):
        cell_volume_rate(p, k_max)
    with pytest.raises(ValueError, match="k_max: expected at most 256"):
        cell_volume_rate_from_logs(np.log(p), k_max)


def test_bounds_refuse_overflow_instead_of_returning_inf():
    """A subnormal rate, or a cliff past float64, was returned as inf (a silent non-number)."""
    from embgeom.bounds import slope_from_log_packing

    with pytest.raises(ValueError, match="rate: expected nats per token of at least"):
        embgeom.n_star(10, 10.0, 100, rate=1e-320)
    with pytest.raises(ValueError, match="rate"):
        embgeom.linear_law_slope(8, 1.0, 1e-3, 100, rate=1e-320)
    with pytest.raises(ValueError, match="rate"):
        embgeom.threshold_length_unbounded(10.0, 100, rate=1e-320)
    with pytest.raises(ValueError, match="m and log_packing: m log P overflows"):
        embgeom.n_star(10, 1e308, 100)
    with pytest.raises(ValueError, match="log_packing and rate: C = log_packing / rate overflows"):
        slope_from_log_packing(1e300, 100, 1e-10)
    # the largest normal rate still divides: 1 / 1e-300 is finite
    assert embgeom.n_star(1, 1.0, 100, rate=1e-300) == pytest.approx(1e300)
    # P = 1: no number of ordered vectors reaches the multiset count (was nan)
    assert embgeom.threshold_length_unbounded(0.0, 100)["ordered_equivalent_m"] == math.inf


def test_log_counts_that_overflow_are_refused_as_n_star_refuses_them():
    """accessible_fraction_bound returned 1.0 (m log P = inf) or 0.0 (n log|V| = inf) with an
    overflow warning where n_star raises; Theorem 4.5's counts returned inf, ints beyond float64
    an OverflowError. Each is now the ValueError naming the factors, with no warning."""
    ball = make_ball(np.zeros(3), 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for log in (False, True):
            with pytest.raises(ValueError, match=r"m and log_packing: m log P overflows float64"):
                B.accessible_fraction_bound(5, 10, 1e308, 100, log=log)
            with pytest.raises(ValueError, match=r"n and rate: n rate overflows float64"):
                B.accessible_fraction_bound([1, 10**300], 1, 10.0, 100, rate=1e10, log=log)
            with pytest.raises(ValueError, match=r"n and vocab_size: n log\|V\| overflows"):
                B.accessible_fraction_bound(10**308, 1, 10.0, 100, log=log)
        with pytest.raises(ValueError, match=r"m and log_packing: m log P overflows float64"):
            B.n_star(10, 1e308, 100)  # the sibling, same words
        with pytest.raises(ValueError, match=r"d, m, r and eps: d m log\(1 \+ 2r/eps\) overflows"):
            B.theorem45_log_count(8, 10**307, 1.0, 0.1)
        with pytest.raises(ValueError, match=r"d, m, r and eps: .* overflows"):
            B.linear_law_slope(10**308, 1.0, 0.1, 100)  # was C = inf
        with pytest.raises(ValueError, match=r"m and log_packing_number: m log P overflows"):
            B.accessible_log_count(ball, 1e-300, 10**307)
        for call, name in ((lambda: B.n_star(10**400, 1.0, 100), "m"),
                           (lambda: B.accessible_fraction_bound(10**400, 1, 1.0, 100), "n"),
                           (lambda: B.threshold_length_unbounded(10.0, 100, context_length=10**400),
                            "context_length")):
            with pytest.raises(ValueError, match=rf"{name}: expected integers below 1.8e308 "
                                                 r"\(float64\), got an integer of 401 digits"):
                call()
        # just below the overflow: still the bound
        assert B.accessible_fraction_bound(1, 10, 1e307, 100, log=True) == 0.0
        assert B.theorem45_log_count(2, 3, 1.0, 0.5) == pytest.approx(6 * math.log(5.0))
        assert B.accessible_log_count(ball, 0.1, 3) == pytest.approx(3 * B.log_packing_number(ball, 0.1))


def test_bounds_take_integers_beyond_int64_and_name_empty_lengths():
    assert embgeom.n_star(10**30, 10.0, 100) == pytest.approx(1e31 / math.log(100), rel=1e-15)
    assert embgeom.accessible_fraction_bound(10**30, 1, 10.0, 100) == 0.0
    logf = embgeom.accessible_fraction_bound([1, 10**30], 1, 10.0, 100, log=True)
    np.testing.assert_allclose(logf, [0.0, 10.0 - 1e30 * math.log(100)], rtol=1e-15)
    a = embgeom.threshold_length_unbounded(10.0, 100, context_length=[5, 10**30])["n_threshold"]
    b = embgeom.threshold_length_unbounded(10.0, 100, context_length=5)["n_threshold"]
    assert a[0] == pytest.approx(b) and a[1] == embgeom.threshold_length_unbounded(10.0, 100)["n_threshold"]
    with pytest.raises(ValueError, match="n: expected at least one length"):
        embgeom.accessible_fraction_bound(np.array([], int), 1, 10.0, 100)
    with pytest.raises(ValueError, match="context_length: expected at least one length"):
        embgeom.threshold_length_unbounded(10.0, 100, context_length=np.array([], int))
    with pytest.raises(TypeError, match="m: expected an integer"):
        embgeom.n_star([True, 2**70], 10.0, 100)  # a bool among big ints is still refused


def test_rate_and_bound_flags_are_checked():
    """Strings where bools go, None for a format, a negative tolerance and crossed intervals
    were accepted (a truthy 'yes' or float64 silently)."""
    p = np.random.default_rng(0).dirichlet(np.ones(50))
    with pytest.raises(ValueError, match="sum_tol: expected a number >= 0"):
        embgeom.cell_volume_rate(p, 8, sum_tol=-1)
    with pytest.raises(TypeError, match="dtype_or_bits: .* got None"):
        embgeom.precision_eps(1.0, None)
    with pytest.raises(TypeError, match="log: expected True or False"):
        embgeom.accessible_fraction_bound(5, 1, 10.0, 100, log="yes")
    with pytest.raises(TypeError, match="normalize: expected True, False or None"):
        embgeom.cell_volume_rate(p, 8, normalize="yes")
    with pytest.raises(ValueError, match="lower and upper: expected lower <= upper"):
        embgeom.cell_volume_rate(p, 8, lower=p * 1.1, upper=p * 0.9)
    ok = embgeom.cell_volume_rate(p, 8, lower=p * 0.9, upper=p * 1.1)
    assert ok.rate == pytest.approx(embgeom.cell_volume_rate(p, 8).rate)


def test_cell_volume_rate_refuses_interval_ends_on_the_wrong_side_of_the_fractions():
    """lower above the estimate (or upper below it) was used silently for rate_interval."""
    p = np.random.default_rng(0).dirichlet(np.ones(50))
    lo, up = p * 0.9, p * 1.1
    with pytest.raises(ValueError, match=r"lower: expected lower <= fractions for every token "
                                         r".* for 1 token\(s\), e.g. token 3: lower 0.5"):
        embgeom.cell_volume_rate(p, 8, lower=np.where(np.arange(50) == 3, 0.5, lo), upper=up + 0.5)
    with pytest.raises(ValueError, match=r"lower: expected lower <= fractions .* 50 token"):
        embgeom.cell_volume_rate(p, 8, lower=p * 1.1)  # no upper to cross
    with pytest.raises(ValueError, match=r"upper: expected upper >= fractions .* 50 token"):
        embgeom.cell_volume_rate(p, 8, upper=p * 0.9)
    with pytest.raises(ValueError, match=r"upper: expected upper >= fractions .* e.g. token 7"):
        embgeom.cell_volume_rate(p, 8, lower=lo * 0, upper=np.where(np.arange(50) == 7, 0.0, up))
    # ends equal to the estimate (an exact token) and a rounding's worth away are intervals
    for ends in (dict(lower=p * (1 + 1e-12)), dict(upper=p * (1 - 1e-12)),
                 dict(lower=p.copy(), upper=p.copy())):
        r = embgeom.cell_volume_rate(p, 8, **ends)
        assert r.rate_interval == pytest.approx((r.rate, r.rate))
