"""Degenerate data (issue 12, kind 2) and odd inputs.

Every shape and every solver answers degenerate input (coincident points, collinear points,
points on a proper affine subspace, a single direction, two points, one point) the same way:
one error family, ``"X: degenerate data for the <shape>: <what>; <remedy>"`` (``H:`` from
:func:`embgeom.fit_support`, whose argument is ``H``), raised by
:func:`embgeom.supports._base.refuse_degenerate`, or a correct value where one exists (a ball
around collinear points, an axis-aligned box around a generic line, a cone around two
directions). Each (shape, solver, kind) below has its expected message or value.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from embgeom import bounds
from embgeom._special import log_cap_fraction, log_unit_ball_volume
from embgeom.cells import Decoder
from embgeom.supports import Ball, Box, Cone, Ellipsoid, FinalNormShell, fit_support

P = np.array([1.0, 2.0, 3.0])
V = np.array([1.0, 0.5, 2.0])
T = np.linspace(-1.0, 2.0, 10)
B1 = np.array([1.0, 0.0, 0.0])
B2 = np.array([0.0, 0.6, 0.8])
AB = np.random.default_rng(0).uniform(-1, 1, (20, 2))

KINDS = {
    "coincident": np.tile(P, (10, 1)),
    "collinear": P + T[:, None] * V,
    "subspace": P + AB[:, :1] * B1 + AB[:, 1:] * B2,  # a plane off the origin
    "one_direction": np.arange(1.0, 11.0)[:, None] * P,  # one ray from the origin
    "two_points": np.array([[1.0, 2.0, 3.0], [4.0, 6.0, 3.0]]),
}

SOLVERS = {
    "ball-fast": ("ball", {"solver": "fast"}),
    "ball-cvxpy": ("ball", {"solver": "cvxpy"}),
    "ball-origin": ("ball", {"center": "origin"}),
    "ellipsoid-fast": ("ellipsoid", {"solver": "fast"}),
    "ellipsoid-cvxpy": ("ellipsoid", {"solver": "cvxpy"}),
    "box-axes": ("box", {}),
    "box-pca": ("box", {"rotation": "pca"}),
    "cone-fast": ("cone", {"solver": "fast"}),
    "cone-cvxpy": ("cone", {"solver": "cvxpy"}),
}


def _angle(a, b):
    return math.atan2(np.linalg.norm(np.cross(a, b)), float(a @ b))


def _ball(center, radius):
    def check(S):
        assert isinstance(S, Ball)
        np.testing.assert_allclose(S.center_, center, atol=1e-4 * radius)
        assert S.radius_ == pytest.approx(radius, rel=1e-7)
    return check


def _box_extents(extents):
    def check(S):
        np.testing.assert_allclose(S.extents_, extents, rtol=1e-12)
        assert S.log_volume == pytest.approx(float(np.sum(np.log(extents))), rel=1e-12)
    return check


def _cone(half_angle):
    def check(S):
        assert S.half_angle_ == pytest.approx(half_angle, rel=1e-6)
    return check


def _meb_2d(Z):
    """Minimum enclosing ball of 2-d points by brute force over pairs and triples (exact)."""
    best = None
    n = Z.shape[0]
    cands = []
    for i in range(n):
        for j in range(i + 1, n):
            cands.append(((Z[i] + Z[j]) / 2, np.linalg.norm(Z[i] - Z[j]) / 2))
            for k in range(j + 1, n):
                a, b, c = Z[i], Z[j], Z[k]
                dmat = 2 * np.array([b - a, c - a])
                if abs(np.linalg.det(dmat)) < 1e-12:
                    continue
                o = np.linalg.solve(dmat, np.array([b @ b - a @ a, c @ c - a @ a]))
                cands.append((o, np.linalg.norm(a - o)))
    for o, r in cands:
        if np.all(np.linalg.norm(Z - o, axis=1) <= r * (1 + 1e-12)) and (best is None or r < best[1]):
            best = (o, r)
    return best


_c2, _r2 = _meb_2d(AB)
_SUB_CENTER = P + _c2[0] * B1 + _c2[1] * B2
_X2 = KINDS["two_points"]
_LINE_ENDS = (P + T[0] * V, P + T[-1] * V)
_DEG = "H: degenerate data for the "  # fit_support names its argument H
_DEG_X = "X: degenerate data for the "  # an estimator's fit(X) names X

# (kind, solver key) -> ("error", regex) or ("value", check)
EXPECT = {}
for key in SOLVERS:
    shape = SOLVERS[key][0]
    EXPECT[("coincident", key)] = ("error", {
        "ball": f"{_DEG}ball: all 10 points coincide; the enclosing ball would have radius 0",
        "ellipsoid": f"{_DEG}ellipsoid: all 10 points coincide; .*Pass ridge=t",
        "box": f"{_DEG}box: all 10 points coincide; its volume would be 0. Pass min_width=w",
        "cone": f"{_DEG}cone: all 10 directions coincide \\(the points lie on one ray",
    }[shape])
    EXPECT[("one_direction", key)] = {
        "ball": ("value", _ball(5.5 * P, 4.5 * np.linalg.norm(P))),
        "ellipsoid": ("error", f"{_DEG}ellipsoid: the 10 points span an affine subspace of dimension 1 < d=3 \\(collinear points\\)"),
        "box": ("value", _box_extents(9.0 * P)),
        "cone": ("error", f"{_DEG}cone: all 10 directions coincide"),
    }[shape]
    EXPECT[("collinear", key)] = {
        "ball": ("value", _ball((_LINE_ENDS[0] + _LINE_ENDS[1]) / 2, 1.5 * np.linalg.norm(V))),
        "ellipsoid": ("error", f"{_DEG}ellipsoid: the 10 points span an affine subspace of dimension 1 < d=3 \\(collinear points\\)"),
        "box": ("value", _box_extents(3.0 * V)),
        "cone": ("value", _cone(0.5 * _angle(*_LINE_ENDS))),
    }[shape]
    EXPECT[("subspace", key)] = {
        "ball": ("value", _ball(_SUB_CENTER, _r2)),
        "ellipsoid": ("error", f"{_DEG}ellipsoid: the 20 points span an affine subspace of dimension 2 < d=3 \\(points on a subspace\\); .*ridge=t"),
        "box": ("value", lambda S: None),  # generic plane: a box of positive volume (checked below)
        "cone": ("value", lambda S: None),
    }[shape]
    EXPECT[("two_points", key)] = {
        "ball": ("value", _ball(_X2.mean(axis=0), 2.5)),
        "ellipsoid": ("error", f"{_DEG}ellipsoid: the 2 points span an affine subspace of dimension 1 < d=3 \\(collinear points\\)"),
        "box": ("error", f"{_DEG}box: the box has zero width along 1 axis/axes \\(first \\[2\\]\\): the points lie in a proper affine subspace"),
        "cone": ("value", _cone(0.5 * _angle(_X2[0], _X2[1]))),
    }[shape]
# the exceptions to the per-shape rule
EXPECT[("coincident", "ball-origin")] = ("value", _ball(np.zeros(3), float(np.linalg.norm(P))))
EXPECT[("one_direction", "ball-origin")] = ("value", _ball(np.zeros(3), 10.0 * np.linalg.norm(P)))
EXPECT[("collinear", "ball-origin")] = ("value", _ball(np.zeros(3), float(np.linalg.norm(KINDS["collinear"], axis=1).max())))
EXPECT[("subspace", "ball-origin")] = ("value", _ball(np.zeros(3), float(np.linalg.norm(KINDS["subspace"], axis=1).max())))
EXPECT[("two_points", "ball-origin")] = ("value", _ball(np.zeros(3), float(np.linalg.norm(_X2[1]))))
for kind, zeros in (("collinear", 2), ("subspace", 1), ("one_direction", 2), ("two_points", 2)):
    EXPECT[(kind, "box-pca")] = ("error", f"{_DEG}box: the box has zero width along {zeros} axis/axes")


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("key", list(SOLVERS))
def test_degenerate_matrix(kind, key):
    shape, kw = SOLVERS[key]
    X = KINDS[kind]
    what, expected = EXPECT[(kind, key)]
    if what == "error":
        with pytest.raises(ValueError, match=expected):
            fit_support(X, shape, **kw)
        return
    S = fit_support(X, shape, **kw)
    assert S.contains(X, tol=1e-7).all()
    assert np.isfinite(S.log_volume)
    expected(S)


@pytest.mark.parametrize("key", list(SOLVERS))
def test_single_point_and_scaled_degenerate_data(key):
    """One point: the scikit-learn wording; degenerate data at 1e-160 and 1e160 stay degenerate
    (the rank test is relative to the data's own scale)."""
    shape, kw = SOLVERS[key]
    with pytest.raises(ValueError, match="H: a support fit needs at least 2 points, got 1 sample$"):
        fit_support(P[None], shape, **kw)
    for s in (1e-160, 1e160):
        what, expected = EXPECT[("coincident", key)]
        if what == "error":
            with pytest.raises(ValueError, match=expected):
                fit_support(KINDS["coincident"] * s, shape, **kw)


def test_remedies_give_the_documented_sets():
    """ridge for the ellipsoid, min_width for the box: the explicit regularisation."""
    X = KINDS["coincident"]
    ell = Ellipsoid(ridge=0.5).fit(X)  # a single point: the ball of radius ridge around it
    np.testing.assert_allclose(ell.center_, P)
    np.testing.assert_allclose(ell.semi_axes_, 0.5)
    assert ell.log_volume == pytest.approx(log_unit_ball_volume(3) + 3 * math.log(0.5), rel=1e-14)
    assert ell.affine_rank_ == 0 and ell.ridge_ == 0.5 and ell.gap_nats_ == 0.0
    line = Ellipsoid(ridge=0.1).fit(KINDS["collinear"])  # the segment's MVEE is its own length
    np.testing.assert_allclose(line.semi_axes_, [1.5 * np.linalg.norm(V), 0.1, 0.1], rtol=1e-6)
    assert line.contains(KINDS["collinear"]).all() and line.affine_rank_ == 1
    cube = Box(min_width=0.25).fit(X)
    np.testing.assert_allclose(cube.lower_, P - 0.125)
    np.testing.assert_allclose(cube.upper_, P + 0.125)
    with pytest.raises(ValueError, match="min_width: 1e-20 is below the rounding of the coordinates"):
        Box(min_width=1e-20).fit(X + 1e6)
    with pytest.raises(ValueError, match=f"{_DEG_X}ball: all 5 points are at the origin"):
        Ball(centering="origin").fit(np.zeros((5, 3)))
    with pytest.raises(ValueError, match=f"{_DEG_X}cone: all 5 points are at the origin"):
        Cone().fit(np.zeros((5, 3)))
    # zero vectors among others: the apex, inside every cone
    Z = np.vstack([KINDS["two_points"], np.zeros((3, 3))])
    cone = Cone().fit(Z)
    assert cone.half_angle_ == pytest.approx(0.5 * _angle(_X2[0], _X2[1]), rel=1e-6)
    assert cone.contains(Z).all() and cone.n_fit_ == 5


def test_subspace_fits_are_full_dimensional():
    X = KINDS["subspace"]
    box = Box().fit(X)
    np.testing.assert_allclose(box.extents_, X.max(axis=0) - X.min(axis=0), rtol=1e-15)
    fast, ref = Cone().fit(X), Cone(solver="cvxpy").fit(X)
    assert fast.half_angle_ == pytest.approx(ref.half_angle_, rel=1e-6)
    assert 0 < fast.half_angle_ < math.pi / 2


# ------------------------------------------------------------------------------ odd inputs
ODD = {
    "nan": (np.array([[1.0, np.nan, 0.0], [0.0, 1.0, 2.0], [1.0, 1.0, 1.0]]), ValueError, "NaN"),
    "inf": (np.array([[1.0, np.inf, 0.0], [0.0, 1.0, 2.0], [1.0, 1.0, 1.0]]), ValueError, "infinite"),
    "empty": (np.zeros((0, 3)), ValueError, "at least 2 points, got 0"),
    "no_columns": (np.zeros((5, 0)), ValueError, "0 feature"),
    "1d": (np.ones(3), ValueError, "ndim"),
    "3d": (np.ones((2, 4, 3)), ValueError, "ndim"),
    "0d": (np.float64(1.0), ValueError, "ndim"),
    "float16": (np.ones((4, 3), np.float16), TypeError, "float16"),
    "bool": (np.ones((4, 3), bool), TypeError, "dtype bool"),
    "complex": (np.ones((4, 3), complex), TypeError, "complex"),
    "object": (np.array([[1.0, "a", 2.0]] * 3, dtype=object), TypeError, "dtype object"),
    "none": (None, TypeError, "got None"),
}


@pytest.mark.parametrize("name", list(ODD))
@pytest.mark.parametrize("key", list(SOLVERS))
def test_odd_inputs_are_refused_by_name(name, key):
    shape, kw = SOLVERS[key]
    X, exc, msg = ODD[name]
    with pytest.raises(exc, match=f"H.*{msg}|{msg}.*H" if name != "none" else "H: .*None"):
        fit_support(X, shape, **kw)


@pytest.mark.parametrize("key", list(SOLVERS))
def test_integer_points_are_converted_as_scikit_learn_does(key):
    """Integer X is accepted and converted to float64 (issue 20): the same fit as the floats."""
    shape, kw = SOLVERS[key]
    Xi = np.random.default_rng(0).integers(-9, 10, size=(40, 3))
    a = fit_support(Xi, shape, **kw)
    b = fit_support(Xi.astype(np.float64), shape, **kw)
    assert a.log_volume == pytest.approx(b.log_volume, rel=1e-9, abs=1e-9)


def test_extreme_values_give_right_answers_or_a_named_error():
    rng = np.random.default_rng(5)
    H = rng.standard_normal((30, 4))
    # subnormal data (1e-310): the fit is the s = 1 fit times the scale (normalised exactly)
    ref = Ball().fit(H)
    sub = Ball().fit(np.ldexp(H, -1030))
    assert sub.radius_ == np.ldexp(ref.radius_, -1030) or sub.radius_ == pytest.approx(np.ldexp(ref.radius_, -1030), rel=1e-12)
    # a radius beyond float64: refused by name, never inf
    big = H / np.abs(H).max() * 1.7e308
    for shape in ("ball", "ellipsoid", "box", "cone"):
        with pytest.raises(ValueError, match="H: the .*(would not fit in float64|exceed the float64 range)"):
            fit_support(big, shape)
    # many dimensions, few points: the ball and the box are fine, the ellipsoid asks for ridge
    few = rng.standard_normal((5, 4096))
    ball = Ball().fit(few)
    assert ball.contains(few).all() and np.isfinite(ball.log_volume)
    with pytest.raises(ValueError, match=f"{_DEG_X}ellipsoid: the 5 points span an affine subspace of dimension 4 < d=4096 \\(N <= d\\)"):
        Ellipsoid().fit(few)
    ell = Ellipsoid(ridge=1e-3).fit(few)
    assert ell.affine_rank_ == 4 and ell.contains(few).all()


def test_decoder_odd_inputs():
    W = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    dec = Decoder(W)
    for X, exc, msg in [(np.zeros((0, 3)), ValueError, "H: expected a non-empty"),
                        (np.ones((2, 4, 3)), ValueError, "H: expected an array with ndim"),
                        (np.float64(1.0), ValueError, "H: expected an array with ndim"),
                        (np.ones((2, 3), bool), TypeError, "H: expected a real floating-point"),
                        (np.ones((2, 3), complex), TypeError, "H: expected a real floating-point"),
                        (np.ones((2, 5)), ValueError, "H: expected hidden states of dimension d=3")]:
        for f in (dec.assign, dec.margins, dec.top2):
            with pytest.raises(exc, match=msg):
                f(X)
    # a zero hidden state: every logit is 0, a tie, the lowest id; margin 0
    assert dec.assign(np.zeros(3))[0] == 0 and dec.margins(np.zeros((1, 3)))[0] == 0.0
    # one token: margin inf, runner-up -1 with logit -inf
    one = Decoder(W[:1])
    assert one.margins(np.ones((2, 3))).tolist() == [math.inf, math.inf]
    b1, i1, b2, i2 = one.top2(np.ones((1, 3)))
    assert i1[0] == 0 and i2[0] == -1 and b2[0] == -math.inf and b1[0] == pytest.approx(float(W[0].sum()))


def test_bounds_odd_arguments():
    ball = Ball.from_params(None, 2.0, dim=3)
    for eps, exc in [(0.0, ValueError), (-1.0, ValueError), (math.nan, ValueError), (math.inf, ValueError),
                     ("0.1", TypeError), (True, TypeError), (None, TypeError)]:
        with pytest.raises(exc, match="eps"):
            bounds.log_packing_number(ball, eps)
    with pytest.raises(TypeError, match="support"):
        bounds.log_packing_number(object(), 0.1)
    with pytest.raises(ValueError, match="r: expected a number > 0"):
        bounds.theorem45_log_count(3, 1, 0.0, 0.1)
    # 1e-300 / 1e300 arguments: finite, and equal to the closed form in logs
    assert bounds.theorem45_log_count(4, 2, 1e300, 1e-300) == pytest.approx(
        8 * (math.log(2.0) + 600 * math.log(10.0)), rel=1e-13)
    assert np.isfinite(bounds.log_packing_number(Ball.from_params(None, 1e300, dim=4096), 1e-300))
    # log_cap_fraction at the ends and in high dimension
    assert log_cap_fraction(0.0, 5) == -math.inf and log_cap_fraction(math.pi, 5) == 0.0
    assert np.isfinite(log_cap_fraction(1e-10, 4096))
    with pytest.raises(ValueError, match="half_angle"):
        log_cap_fraction(math.nan, 5)


def test_ready_sets_odd_parameters():
    with pytest.raises(ValueError, match="radius"):
        Ball.from_params(np.zeros(3), math.inf)
    with pytest.raises(ValueError, match="axis: expected a non-zero vector"):
        Cone.from_params(np.zeros(3), 0.5, 1.0)
    # a tiny axis is a direction all the same (its norm used to underflow to 0)
    cone = Cone.from_params(np.array([1e-200, 1e-200, 0.0]), 0.5, 1.0)
    np.testing.assert_allclose(cone.axis_, [2**-0.5, 2**-0.5, 0.0])
    with pytest.raises(ValueError, match="upper - lower: the side lengths exceed the float64 range"):
        Box.from_params(-np.full(2, 1e308), np.full(2, 1e308))
    with pytest.raises(ValueError, match="semi_axes: expected positive lengths"):
        Ellipsoid.from_params(np.zeros(2), semi_axes=[1.0, 0.0])
    with pytest.raises(ValueError, match="exactly one of shape_matrix and semi_axes"):
        Ellipsoid.from_params(np.zeros(2))
    with pytest.raises(ValueError, match="axes: rows must be orthonormal"):
        Ellipsoid.from_params(np.zeros(2), semi_axes=[1.0, 2.0], axes=np.ones((2, 2)))
    big = Ellipsoid.from_params(np.zeros(2), semi_axes=[1e160, 1e159])
    assert big.log_volume == pytest.approx(math.log(math.pi) + 319 * math.log(10.0), rel=1e-14)
    with pytest.raises(ValueError, match="shape_matrix_: A = .* is not representable"):
        big.shape_matrix_
    with pytest.raises(ValueError, match="gain: 1 zero entries"):
        FinalNormShell.from_params("rmsnorm", np.array([1.0, 0.0]))


def test_ellipsoid_trimmed_to_too_few_points_names_quantile():
    """quantile trimming, not the caller's N, left too few points: the message says so."""
    from embgeom import fit_support

    H = np.random.default_rng(0).standard_normal((200, 8))
    with pytest.raises(ValueError, match=r"the 6 points \(of 200, quantile=0.03 kept 6\).*larger quantile"):
        fit_support(H, "ellipsoid", quantile=0.03)
