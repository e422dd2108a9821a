"""The scale of the data must not matter (issue 12, kind 1).

Every fit and every cell here is scale-equivariant, so the results at scale ``s`` in
``{1e-160, 1e-46, 1, 1e46, 1e160}`` must be the ``s = 1`` results moved by the known law:
``log_volume + d log s`` (an ellipsoid: up to its certified gap), centres and radii times ``s``,
the same cell ids, margins times ``s``, packing numbers with ``eps`` scaled too unchanged. At a
power of two the normalisation inside is exact, so the fit is the ``s = 1`` fit bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import special_ortho_group

from embgeom import bounds
from embgeom.cells import Decoder
from embgeom.supports import Ball, Box, Cone, Ellipsoid, FinalNormShell, fit_support

SCALES = [1e-160, 1e-46, 1.0, 1e46, 1e160]

# (shape, fit_support options); the cone's data sit in an open half-space (a certified fit)
FITS = [
    ("ball", {}),
    ("ball", {"center": "origin"}),
    ("ball", {"solver": "cvxpy"}),
    ("ellipsoid", {}),
    ("ellipsoid", {"solver": "cvxpy"}),
    ("box", {}),
    ("box", {"rotation": "pca"}),
    ("cone", {}),
    ("cone", {"solver": "cvxpy"}),
]


def _data(shape, n=40, d=4, seed=0):
    rng = np.random.default_rng(seed)
    H = rng.standard_normal((n, d)) * np.array([3.0, 1.0, 0.5, 0.2])[:d]
    if shape == "cone":
        H[:, 0] += 6.0
    return H


def _params(S):
    """The set's defining numbers, in the data's units (each scales like s or not at all)."""
    if isinstance(S, Ball):
        return {"center": S.center_, "radius": S.radius_}
    if isinstance(S, Ellipsoid):
        return {"center": S.center_, "semi_axes": S.semi_axes_}
    if isinstance(S, Box):
        return {"lower": S.lower_, "upper": S.upper_}
    return {"radius": S.radius_}


@pytest.mark.parametrize("shape,kw", FITS, ids=[f"{s}-{'-'.join(map(str, k.values())) or 'default'}" for s, k in FITS])
def test_fit_scale_matrix(shape, kw):
    H = _data(shape)
    d = H.shape[1]
    ref = fit_support(H, shape, **kw)
    for s in SCALES:
        S = fit_support(H * s, shape, **kw)
        want = ref.log_volume + d * math.log(s)
        tol = 1e-12 * max(1.0, abs(want))
        if shape == "ellipsoid":  # iterates differ by rounding: within the certified gaps
            tol += ref.gap_nats_ + S.gap_nats_
        cvx = kw.get("solver") == "cvxpy"
        if cvx:  # an interior-point solver's own accuracy (~1e-8 relative), at every scale
            tol += 1e-6
        assert abs(S.log_volume - want) <= tol, (s, S.log_volume, want)
        # a minimum enclosing ball's centre is determined to ~sqrt(solver accuracy)
        rtol = 1e-3 if cvx else 1e-5 if shape == "ellipsoid" else 1e-9
        size = np.abs(_params(ref)[list(_params(ref))[-1]]).max()  # radius / semi-axes / bounds
        for name, v in _params(S).items():
            np.testing.assert_allclose(v, np.asarray(_params(ref)[name]) * s, rtol=rtol,
                                       atol=rtol * s * size, err_msg=f"{name} at {s}")
        if shape == "cone":
            assert S.half_angle_ == pytest.approx(ref.half_angle_, rel=1e-9)
        assert S.contains(H * s).all()
        # membership is scale-free: the gauge of the scaled points in the scaled set
        np.testing.assert_allclose(S.gauge(H * s), ref.gauge(H), rtol=1e-3 if cvx else 1e-5, atol=1e-9)
        if shape == "ellipsoid" and kw.get("solver") != "cvxpy":
            assert np.isfinite(S.gap_nats_) and S.gap_nats_ < 1e-4


@pytest.mark.parametrize("shape,kw", [f for f in FITS if "cvxpy" not in f[1].values()])
def test_power_of_two_scale_is_bit_exact(shape, kw):
    """At s = 2^j the normalised data are the same bits: the fit is the s = 1 fit times 2^j."""
    H = _data(shape)
    ref = fit_support(H, shape, **kw)
    for j in (-520, -7, 9, 510):
        S = fit_support(np.ldexp(H, j), shape, **kw)
        for name, v in _params(S).items():
            np.testing.assert_array_equal(v, np.ldexp(np.asarray(_params(ref)[name]), j), err_msg=name)


def test_ellipsoid_anisotropic_rotated_whitened():
    """Axes from 1e-3 to 1e3, randomly rotated (the issue: > 84,000 steps and a gap that lied):
    the whitened solver takes the steps of an isotropic cloud, and the log-volume is the
    isotropic one plus sum log(axes), within the certified gaps."""
    rng = np.random.default_rng(0)
    d, n = 30, 300
    Q = special_ortho_group.rvs(d, random_state=1)
    X0 = rng.standard_normal((n, d))
    iso = Ellipsoid().fit(X0)
    for ratio_exp in (3, 5):  # axis ratios 1e6 and 1e10 (the latter was an error naming shape_matrix)
        a = np.logspace(-ratio_exp, ratio_exp, d)
        X = (X0 * a) @ Q.T
        ell = Ellipsoid().fit(X)
        assert ell.n_iter_ <= 3 * iso.n_iter_ + 100
        assert ell.contains(X).all()
        assert abs(ell.log_volume - iso.log_volume - np.sum(np.log(a))) <= ell.gap_nats_ + iso.gap_nats_ + 1e-6


def test_ellipsoid_certified_gap_is_true_against_cvxpy():
    """gap_nats_ bounds log_volume - log vol(MVEE); cvxpy (interior point) is the reference."""
    rng = np.random.default_rng(3)
    d, n = 6, 60
    Q = special_ortho_group.rvs(d, random_state=2)
    X = (rng.standard_normal((n, d)) * np.logspace(-3, 3, d)) @ Q.T + 5.0
    ref = Ellipsoid(solver="cvxpy").fit(X)
    for tol in (1e-2, 1e-4, 1e-7):
        fast = Ellipsoid(tol=tol).fit(X)
        # the cvxpy solution itself is within its own certified gap of the optimum
        assert fast.log_volume - ref.log_volume <= fast.gap_nats_ + 1e-9
        assert ref.log_volume - fast.log_volume <= ref.gap_nats_ + 1e-9
        assert fast.gap_nats_ >= 0 and np.isfinite(fast.gap_nats_)
    assert ref.gap_nats_ < 1e-5


@pytest.mark.parametrize("s", SCALES)
def test_ready_sets_and_packing_numbers_scale(s):
    """Ready sets at scale s: log_volume + d log s; every packing bound at eps s is unchanged."""
    d = 5
    rng = np.random.default_rng(1)
    Q = special_ortho_group.rvs(d, random_state=3)
    gain = rng.uniform(0.5, 2.0, d)
    sets = [
        lambda t: Ball.from_params(np.full(d, 2.0 * t), 3.0 * t),
        lambda t: Box.from_params(-np.arange(1, d + 1) * t, np.arange(1, d + 1) * 2.0 * t),
        lambda t: Box.from_params(-np.ones(d) * t, np.ones(d) * t, rotation=Q),
        lambda t: Ellipsoid.from_params(np.ones(d) * t, semi_axes=np.arange(1.0, d + 1) * t, axes=Q),
        lambda t: Cone.from_params(np.ones(d), 0.4, 2.0 * t),
        lambda t: Cone.from_params(np.ones(d), 2.0, 2.0 * t),
        lambda t: FinalNormShell.from_params("rmsnorm", gain * t),
        lambda t: FinalNormShell.from_params("layernorm", gain * t, bias=np.ones(d) * t),
    ]
    for make in sets:
        ref, S = make(1.0), make(s)
        assert S.log_volume == pytest.approx(ref.log_volume + d * math.log(s), rel=1e-13, abs=1e-10)
        for eps in (1e-3, 0.3, 10.0):
            t_ref = bounds.packing_bound_terms(ref, eps)
            t_s = bounds.packing_bound_terms(S, eps * s)
            assert t_ref.keys() == t_s.keys()
            for k in t_ref:
                assert t_s[k] == pytest.approx(t_ref[k], rel=1e-11, abs=1e-9), (type(S).__name__, k, s, eps)
            assert bounds.log_packing_number(S, eps * s) == pytest.approx(
                bounds.log_packing_number(ref, eps), rel=1e-11, abs=1e-9)
        if isinstance(S, FinalNormShell):
            assert S.log_area == pytest.approx(ref.log_area + (d - 1) * math.log(s), rel=1e-13, abs=1e-9)
            assert S.enclosing_ellipsoid().log_volume == pytest.approx(S.log_volume, rel=1e-13, abs=1e-9)


def test_packing_number_of_a_huge_ball_at_tiny_eps():
    """The issue's example: Ball(radius 1e30, d = 8) at eps = 1e-300 was inf; true ~6,080 nats.

    At r/eps = 2e330 the Steiner sum is its j = 0 term to 1e-330: log kappa_8 + 8 log(r/eps),
    kappa_8 = pi^4/24; the V2 bound is 8 log(1 + 2r/eps) = 8 (log 2 + 330 log 10).
    """
    ball = Ball.from_params(None, 1e30, dim=8)
    want = math.log(math.pi**4 / 24) + 8 * 330 * math.log(10.0)
    assert bounds.log_packing_number(ball, 1e-300) == pytest.approx(want, rel=1e-13)
    assert want == pytest.approx(6080.2255112, abs=1e-6)
    terms = bounds.packing_bound_terms(ball, 1e-300)
    v2 = 8 * (math.log(2.0) + 330 * math.log(10.0))
    assert terms["paper"] == pytest.approx(v2, rel=1e-13) and terms["v2_ball"] == pytest.approx(v2, rel=1e-13)
    assert bounds.theorem45_log_count(8, 3, 1e30, 1e-300) == pytest.approx(3 * v2, rel=1e-13)
    assert bounds.linear_law_slope(8, 1e30, 1e-300, 2) == pytest.approx(v2 / math.log(2.0), rel=1e-13)
    box = Box.from_params(-np.full(8, 1e30), np.full(8, 1e30))
    assert bounds.log_packing_number(box, 1e-300) == pytest.approx(v2, rel=1e-13)  # sum log(1 + 2r/eps)
    # the other end: a tiny set at a huge precision (log P -> 0 from above, never negative or NaN)
    tiny = Ball.from_params(None, 1e-30, dim=8)
    lp = bounds.log_packing_number(tiny, 1e300)
    assert 0.0 <= lp <= 1e-300  # 8 log(1 + 2e-330)


def test_precision_eps_is_exact_and_refuses_underflow():
    assert bounds.precision_eps(3.0, "float32") == 3.0 * 2.0**-24
    assert bounds.precision_eps(1e300, 53) == 1e300 * 2.0**-53
    with pytest.raises(ValueError, match="dtype_or_bits: radius \\* 2\\*\\*-53 = .* underflows"):
        bounds.precision_eps(1e-300, 53)
    with pytest.raises(ValueError, match="underflows"):
        bounds.precision_eps(1e-290, 113)  # binary128 at a tiny radius
    with pytest.raises(ValueError, match="more than any float format"):
        bounds.precision_eps(1.0, 2000)  # was 0.0, silently


# ------------------------------------------------------------------------------ decoder
def _decoder_data(bias: bool, seed=0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((50, 8)).astype(np.float32)
    b = rng.standard_normal(50).astype(np.float32) if bias else None
    H = rng.standard_normal((200, 8))
    return W, b, H


def _brute(W, b, H):
    z = H @ W.astype(np.float64).T
    if b is not None:
        z = z + b.astype(np.float64)
    order = np.argsort(-z, axis=1, kind="stable")
    zs = np.take_along_axis(z, order[:, :2], axis=1)
    return order[:, 0], order[:, 1], zs[:, 0], zs[:, 1]


@pytest.mark.parametrize("s", SCALES + [1e-300, 1e300])
def test_decoder_without_bias_is_scale_free(s):
    """The issue's example: assign(H * 1e-46) sent all 200 points to token 0. Without a bias
    the cells are cones: same ids at every scale, margins and logits times s."""
    W, _, H = _decoder_data(False)
    dec = Decoder(W)
    i1, i2, v1, v2 = _brute(W, None, H)
    np.testing.assert_array_equal(dec.assign(H), i1)  # no near-ties in this draw
    np.testing.assert_array_equal(dec.assign(H * s), dec.assign(H))
    np.testing.assert_array_equal(dec.assign(H * s, method="nearest"),
                                  _brute(W, -0.5 * np.sum(W.astype(np.float64) ** 2, axis=1), H * s)[0])
    m = dec.margins(H * s)
    assert m.dtype == np.float64
    np.testing.assert_allclose(m, (v1 - v2) * s, rtol=1e-12)
    b1, j1, b2, j2 = dec.top2(H * s)
    np.testing.assert_array_equal(j1, i1)
    np.testing.assert_array_equal(j2, i2)
    np.testing.assert_allclose(b1, v1 * s, rtol=1e-12)
    np.testing.assert_allclose(b2, v2 * s, rtol=1e-12)


@pytest.mark.parametrize("s", SCALES + [1e-300, 1e300])
def test_decoder_with_bias_matches_float64_brute_force(s):
    """With a bias scaling is no equivalence: the cells of s H are those of the float64 brute
    force (rows the float32 product cannot hold are computed in float64)."""
    W, b, H = _decoder_data(True)
    dec = Decoder(W, b)
    Hs = H * s
    i1, i2, v1, v2 = _brute(W, b, Hs)
    np.testing.assert_array_equal(dec.assign(Hs), i1)
    np.testing.assert_allclose(dec.margins(Hs), v1 - v2, rtol=1e-9, atol=1e-12 * max(1.0, s))
    b1, j1, b2, j2 = dec.top2(Hs)
    np.testing.assert_array_equal(j1, i1)
    np.testing.assert_allclose(b1, v1, rtol=1e-12, atol=1e-12)


def test_decoder_bias_ties_broken_by_tiny_hidden_states():
    """Two tokens with the same bias: at h ~ 1e-46 only w . h separates them (float32 would
    read h as 0 and give the lower id); the float64 path sees it."""
    W = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=np.float32)
    b = np.array([0.0, 0.0, -1.0], dtype=np.float32)
    H = np.array([[0.0, 1e-46], [1e-46, 0.0], [0.0, -1e-46]])
    np.testing.assert_array_equal(Decoder(W, b).assign(H), [1, 0, 0])
    # the third point: token 0 (logit 0) against token 1 (logit -1e-46)
    np.testing.assert_allclose(Decoder(W, b).margins(H), [1e-46, 1e-46, 1e-46], rtol=1e-15)


def test_decoder_rows_beyond_float32_and_float64():
    W, b, H = _decoder_data(True)
    dec = Decoder(W, b)
    # 1e39 used to be refused ("float32 logits could overflow"); it is an ordinary scale
    np.testing.assert_array_equal(Decoder(W).assign(np.full((1, 8), 1e39)), Decoder(W).assign(np.ones((1, 8))))
    np.testing.assert_array_equal(dec.assign(H * 1e39), _brute(W, b, H * 1e39)[0])
    big = np.full((1, 8), 1e308)
    # without a bias the cell exists, the margin (~1e310) does not fit in float64: an error
    # naming H, never inf
    W100 = W * np.float32(100.0)
    assert Decoder(W100).assign(big)[0] == Decoder(W).assign(np.ones((1, 8)))[0]
    with pytest.raises(ValueError, match="H: the margins exceed the float64 range"):
        Decoder(W100).margins(big)
    with pytest.raises(ValueError, match="H: the logits exceed the float64 range"):
        Decoder(W100).top2(big)
    with pytest.raises(ValueError, match="H: the logits W h \\+ b exceed the float64 range"):
        dec.assign(big)


def test_exact_scan_and_chebyshev_centre_are_scale_free_without_bias():
    """A bias-free decoder's cells are cones: the unargmaxable tokens in the box [-s, s]^d are
    those in [-1, 1]^d, and the Chebyshev centre and depth scale with s. At s = 1e-160 the scan
    used to report wrong tokens and a depth of 0 (below HiGHS's absolute tolerances)."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((30, 4)).astype(np.float32)
    W[5] = 0.5 * (W[1] + W[2])  # planted inside the hull: unargmaxable
    dec = Decoder(W)
    ref = dec.unargmaxable(progress=False)
    assert 5 in ref.tokens
    c1, d1 = dec.chebyshev_center(3)
    assert d1 > 0
    for s in SCALES:
        box = Box.from_params(-np.full(4, s), np.full(4, s))
        got = dec.unargmaxable(box, progress=False)
        np.testing.assert_array_equal(got.tokens, ref.tokens)
        assert got.n_undecided == 0
        c, depth = dec.chebyshev_center(3, radius=s)
        assert depth == pytest.approx(d1 * s, rel=1e-9)
        np.testing.assert_allclose(c, c1 * s, rtol=1e-9, atol=1e-9 * s)


def test_exact_scan_with_bias_refuses_a_box_out_of_proportion():
    rng = np.random.default_rng(0)
    W = rng.standard_normal((30, 4)).astype(np.float32)
    dec = Decoder(W, rng.standard_normal(30).astype(np.float32))
    with pytest.raises(ValueError, match="support: the box \\(size about 2\\^-532\\) is out of proportion to the bias"):
        dec.unargmaxable(Box.from_params(-np.full(4, 1e-160), np.full(4, 1e-160)), progress=False)
    with pytest.raises(ValueError, match="radius: the box .* is out of proportion to the bias"):
        dec.chebyshev_center(3, radius=1e-160)
    # at a huge radius the bias is negligible: the centre is the bias-free one, scaled
    c, depth = dec.chebyshev_center(3, radius=1e160)
    c0, d0 = Decoder(W).chebyshev_center(3)
    assert depth == pytest.approx(d0 * 1e160, rel=1e-6)
