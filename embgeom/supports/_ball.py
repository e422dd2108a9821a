"""The ball ``{x : |x - c| <= r}`` and its minimum-enclosing-ball solvers."""

from __future__ import annotations

import math

import numpy as np

from .._special import log1p_ratio, log_unit_ball_volume
from .._validation import check_allocation, check_array, check_positive, check_positive_int, check_probability, check_seed
from ._base import (
    _CENTERINGS,
    _SOLVERS,
    Support,
    as_real_points,
    check_choice,
    check_scale_factor,
    cvxpy_solve,
    import_cvxpy,
    normalise,
    refuse_degenerate,
    row_norms,
    scale_lengths,
    trim,
    unit_ball_samples,
    unscale,
)
from ._volumetric import ball_terms

__all__ = ["Ball"]


# --------------------------------------------------------------------------------------------
# minimum enclosing ball: Frank-Wolfe with away steps on the dual (Yildirim 2008)
# --------------------------------------------------------------------------------------------
def meb_fast(X: np.ndarray, tol: float = 1e-10, max_iter: int = 200_000):
    """Minimum enclosing ball of the rows of ``X`` by Frank-Wolfe with away steps.

    Dual problem: ``max_a  phi(a) = sum_i a_i |x_i|^2 - |sum_i a_i x_i|^2`` over the simplex; any
    ``a`` gives the lower bound ``phi(a) <= r*^2`` and the centre ``c = X^T a`` the upper bound
    ``R^2 = max_i |x_i - c|^2 >= r*^2``. Iterate until ``R^2 / phi - 1 <= tol`` (so the returned
    radius is within a relative ``tol / 2`` of the optimum). Yildirim (2008), "Two algorithms for
    the minimum enclosing ball problem", SIAM J. Optim. 19(3), Algorithm 2; linear convergence.

    Returns ``(center, radius, gap, n_iter, weights)``; the radius is the exact maximum distance
    from the returned centre, so every point is inside, and ``gap = radius^2 / phi(a) - 1`` is
    recomputed from the final weights (a true bound on the relative excess of ``r^2``). ``X``
    should be normalised (:func:`~embgeom.supports._base.normalise`) and hold two distinct rows.
    """
    n, d = X.shape
    shift = X.mean(axis=0)
    Y = X - shift  # centring removes the cancellation in |y|^2 - 2 y.c + |c|^2
    sq = np.einsum("ij,ij->i", Y, Y)
    # Kumar-Yildirim style start: the two mutually far points
    i0 = int(np.argmax(sq))
    d0 = np.einsum("ij,ij->i", Y - Y[i0], Y - Y[i0])
    i1 = int(np.argmax(d0))
    a = np.zeros(n)
    a[i0] += 0.5
    a[i1] += 0.5
    c = 0.5 * (Y[i0] + Y[i1])
    p = Y @ c  # p_i = y_i . c
    gap = np.inf
    it = 0
    for it in range(1, max_iter + 1):
        cc = float(c @ c)
        dist = sq - 2.0 * p + cc
        phi = float(a @ sq) - cc
        j_up = int(np.argmax(dist))
        d_up = dist[j_up]
        if phi <= 0:
            phi = 1e-300
        gap = d_up / phi - 1.0
        active = np.flatnonzero(a > 0)
        if active.size == 0:  # cannot happen for data with two distinct points; kept as a guard
            break
        j_dn = int(active[np.argmin(dist[active])])
        d_dn = dist[j_dn]
        eps_dn = 1.0 - d_dn / phi
        if gap <= tol and eps_dn <= tol:
            break
        if gap >= eps_dn:
            j, dj = j_up, d_up
            lam = (dj - phi) / (2.0 * dj)
        else:
            j, dj = j_dn, d_dn
            lam = (dj - phi) / (2.0 * dj) if dj > 0 else -np.inf
            lam = max(lam, -a[j] / (1.0 - a[j]))
        if lam == 0.0:
            break
        g = Y @ Y[j]
        p = (1.0 - lam) * p + lam * g
        c = (1.0 - lam) * c + lam * Y[j]
        a *= 1.0 - lam
        a[j] += lam
        if a[j] < 1e-300:
            a[j] = 0.0
        if it % 500 == 0:  # refresh to stop drift of the incremental quantities
            a = np.clip(a, 0, None)
            a /= a.sum()
            c = Y.T @ a
            p = Y @ c
    center = c + shift
    # exact distances from the returned centre (after the shift back)
    radius = float(row_norms(X - center).max())
    # the certificate, recomputed from the final weights: for any a in the simplex,
    # max_i |y_i - c|^2 >= sum_i a_i |y_i - c|^2 >= sum_i a_i |y_i - Y^T a|^2 = phi(a) for every c,
    # so phi(a) <= r*^2 <= radius^2 and radius^2 / phi - 1 bounds the relative excess of r^2
    a = np.clip(a, 0, None)
    a /= a.sum()
    ca = Y.T @ a
    phi = float(a @ np.einsum("ij,ij->i", Y - ca, Y - ca))
    gap = radius**2 / phi - 1.0 if phi > 0 else float("inf")
    return center, radius, float(max(gap, 0.0)), it, a


def meb_cvxpy(X: np.ndarray):
    """Minimum enclosing ball by cvxpy: minimise ``r`` s.t. ``|x_i - c| <= r`` (an SOCP)."""
    cp = import_cvxpy()
    shift = X.mean(axis=0)
    Y = X - shift
    c = cp.Variable(X.shape[1])
    r = cp.Variable()
    prob = cp.Problem(cp.Minimize(r), [cp.norm(Y - c[None, :], 2, axis=1) <= r])
    solver = cvxpy_solve(prob, "Ball")
    center = np.asarray(c.value, dtype=np.float64) + shift
    radius = float(row_norms(X - center).max())
    return center, radius, solver


class Ball(Support):
    """The ball ``{x : |x - c| <= r}``; as an estimator, the minimum enclosing ball.

    Fit with ``Ball(centering="free").fit(X)``; build a ready ball with
    :meth:`Ball.from_params` (``Ball.from_params(None, r, dim=d)`` is the origin-centred one).

    Parameters
    ----------
    centering : {"free", "origin"}, default "free"
        Fit the minimum enclosing ball (free centre) or the origin-centred ball ``r = max |h_i|``.
    quantile : float in (0, 1], default 1.0
        Keep the ``ceil(quantile N)`` points closest to the coordinatewise median (origin for
        ``centering="origin"``) and enclose those (a robust fit; the drop count is recorded).
    solver : {"auto", "fast", "cvxpy"}, default "auto"
        ``"fast"``: Frank-Wolfe with away steps on the dual QP (Yildirim 2008), stopped at a
        certified relative duality gap ``tol`` on ``r^2``; ``"cvxpy"``: the SOCP
        ``min r s.t. |h_i - c| <= r`` (reference); ``"auto"`` uses ``"fast"`` (certified, and
        faster at every size measured).
    tol : float, default 1e-10
        Stopping tolerance of the fast solver: ``R^2/phi - 1 <= tol`` where ``phi`` is the dual
        value (a lower bound on ``r*^2``), so ``r`` is within ``tol/2`` (relative) of the
        optimum and ``log_volume`` within ``d tol / 2`` nats.

    Attributes
    ----------
    center_ : ndarray of float64, shape (d,)
    radius_ : float
        Euclidean radius. After a fit it is the largest distance from ``center_`` to a kept
        point, so every kept point is inside.
    rinf_ : float
        L-infinity radius ``max_i max_k |h_ik - c_k|`` over the kept points (the paper's
        ``r_inf`` in ``eps = r_inf 2^-11``); for a ball built from parameters, ``radius_`` (the
        L-infinity extent of the ball itself).
    gap_ : float
        Certified relative duality gap on ``r^2`` (0 for closed forms; NaN for cvxpy).
    n_iter_ : int
        Iterations of the fast solver.
    n_features_in_, feature_names_in_, n_samples_, n_fit_, n_dropped_, quantile_, solver_, fit_seconds_, offset_
        See :class:`Support`.

    Notes
    -----
    ``log_volume = d/2 log(pi) - lgamma(d/2 + 1) + d log r`` (nats).

    Examples
    --------
    >>> import numpy as np
    >>> H = np.random.default_rng(0).standard_normal((200, 3))
    >>> ball = Ball().fit(H)
    >>> bool(ball.contains(H).all()), int(ball.predict(10 * np.ones((1, 3)))[0])
    (True, -1)
    """

    shape = "ball"

    def __init__(self, centering="free", *, quantile=1.0, solver="auto", tol=1e-10):
        self.centering = centering
        self.quantile = quantile
        self.solver = solver
        self.tol = tol

    @classmethod
    def from_params(cls, center, radius, *, dim=None) -> "Ball":
        """A ready ball ``{x : |x - center| <= radius}`` (no data).

        Parameters
        ----------
        center : array_like of float, shape (d,), or None
            ``None`` (with ``dim``) means the origin.
        radius : float
            > 0.
        dim : int, optional
            The dimension; needed when ``center`` is None, checked against it otherwise.

        Returns
        -------
        Ball
            Fitted state set (``solver_ = "given"``); ``fit`` on it raises ``ValueError``.

        Raises
        ------
        ValueError, TypeError
            ``radius <= 0`` or not finite, ``center=None`` without ``dim``, a ``dim`` that does
            not match ``center``, a bad ``center`` array.
        """
        r = check_positive(radius, "radius")
        if center is None:
            if dim is None:
                raise ValueError("Ball.from_params(None, r) needs dim=d for the origin-centred ball")
            dim = check_positive_int(dim, "dim")
            check_allocation(dim * 8, "dim", dim, "a float64 centre")
            c = np.zeros(dim)
        else:
            c = check_array(as_real_points(center, "center"), "center", ndim=1)
            if dim is not None and check_positive_int(dim, "dim") != c.shape[0]:
                raise ValueError(f"dim={dim} does not match center of shape {c.shape}")
        ball = cls()
        ball._set(c, r, rinf=r, gap=0.0, n_iter=0)
        ball._record_given(c.shape[0])
        return ball

    def _set(self, center, radius, *, rinf, gap, n_iter):
        self.center_ = np.asarray(center, dtype=np.float64)
        self.radius_ = float(radius)
        self.rinf_ = float(rinf)
        self.gap_ = float(gap)
        self.n_iter_ = int(n_iter)

    def fit(self, X, y=None):
        """Fit the enclosing ball to hidden states.

        Parameters
        ----------
        X : array_like of float, shape (N, d)
            float32/float64; integers are converted to float64. A DataFrame's column
            names become ``feature_names_in_``.
            Hidden states, N >= 2, finite.
        y : None
            Ignored (scikit-learn's signature).

        Returns
        -------
        self

        Raises
        ------
        TypeError
            ``X`` not a real array (float16, booleans, text refused; complex numbers raise
            ``ComplexDataError``, also a ``ValueError``).
        ValueError
            NaN/inf, N < 2, unknown ``centering``/``solver``, ``quantile`` outside (0, 1],
            degenerate data (all kept points coincide, or all are at the origin for
            ``centering="origin"``: radius 0), a radius beyond the float64 range, or a ball built
            with :meth:`from_params`. Collinear points and points on a subspace are fine (the
            ball is full-dimensional).

        Notes
        -----
        The fit runs on ``X 2^-k`` (largest entry in ``[0.5, 1)``) and maps back exactly, so
        ``X`` at scale ``1e-160`` or ``1e160`` gives the fit at scale 1 times the scale.
        """
        H, t0 = self._start_fit(X)
        centering = check_choice(self.centering, "centering", _CENTERINGS)
        solver = check_choice(self.solver, "solver", _SOLVERS)
        q = check_probability(self.quantile, "quantile")
        tol = check_positive(self.tol, "tol")
        n, d = H.shape
        Hn, k = normalise(H)  # fit at unit scale, map back exactly (scale-equivariant)
        if centering == "origin":
            Hk, _ = trim(Hn, row_norms(Hn), q)
            c = np.zeros(d)
            r = float(row_norms(Hk).max())
            used, gap, it = "closed_form", 0.0, 0
            if not r > 0:
                refuse_degenerate(
                    "ball", f"all {Hk.shape[0]} points are at the origin, the centre of an "
                    "origin-centred ball", "its radius would be 0 (volume 0). Use centering='free' "
                    "or Ball.from_params(None, radius, dim=d)")
        else:
            med = np.median(Hn, axis=0)
            Hk, _ = trim(Hn, row_norms(Hn - med), q)
            if not np.any(Hk != Hk[0]):
                refuse_degenerate(
                    "ball", f"all {Hk.shape[0]} points coincide", "the enclosing ball would have "
                    "radius 0 (volume 0). Pass distinct points, or build a ball with "
                    "Ball.from_params(center, radius)")
            if solver == "cvxpy":
                c, r, name = meb_cvxpy(Hk)
                used, gap, it = f"cvxpy:{name}", float("nan"), 0
            else:
                c, r, gap, it, _ = meb_fast(Hk, tol=tol)
                used = "fast"
        rinf = float(np.abs(Hk - c).max())
        self._set(unscale(c, k, "centre"), unscale(r, k, "radius"), rinf=unscale(rinf, k, "radius"),
                  gap=gap, n_iter=it)
        self.n_features_in_ = d
        self._record_fit(n, Hk.shape[0], q, used, t0)
        return self

    @property
    def origin_centred(self) -> bool:
        """True when the centre is exactly the origin."""
        self._check_fitted()
        return bool(not np.any(self.center_))

    @property
    def log_volume(self) -> float:
        """``d/2 log(pi) - lgamma(d/2 + 1) + d log r`` in nats."""
        self._check_fitted()
        return log_unit_ball_volume(self.dim) + self.dim * math.log(self.radius_)

    def _gauge(self, X):
        with np.errstate(over="ignore"):
            return row_norms(X - self.center_) / self.radius_

    def sample(self, n: int, seed=None) -> np.ndarray:
        """``n`` points uniform in the ball.

        Parameters
        ----------
        n : int
            Number of points (>= 1).
        seed : None, int or numpy Generator

        Returns
        -------
        numpy.ndarray of float64, shape (n, d)
            Gaussian direction times radius ``r U^{1/d}``, plus the centre.

        Raises
        ------
        TypeError, ValueError
            Bad ``n`` or ``seed``; ``NotFittedError`` before a fit.
        """
        n = self._check_sample_args(n)
        rng = check_seed(seed)
        return self.center_ + self.radius_ * unit_ball_samples(rng, n, self.dim)

    def packing_bound_terms(self, eps) -> dict:
        """Volumetric bounds on ``log P(ball, eps)`` (nats): ``paper``, ``v2_ball``, ``vinf_steiner``.

        Parameters
        ----------
        eps : float
            Precision, > 0.

        Returns
        -------
        dict
            ``paper = v2_ball = d log(1 + 2r/eps)`` (Theorem 4.5; exact V2) and the Steiner
            formula ``vinf_steiner = log sum_j C(d,j) kappa_{d-j} (r/eps)^{d-j}`` (exact Vinf).

        Raises
        ------
        ValueError, TypeError
            ``eps <= 0`` or not finite; ``NotFittedError`` before a fit.
        """
        self._check_fitted()
        eps = check_positive(eps, "eps")
        d, r = self.dim, check_positive(self.radius_, "support.radius_")
        out = {"paper": d * log1p_ratio(r, eps, 2.0)}
        out.update(ball_terms(d, r, eps))
        return out

    def origin_ellipsoid_map(self):
        """``r I`` (shape (d, d)) for an origin-centred ball, else None (see :class:`Support`)."""
        self._check_fitted()
        return self.radius_ * np.eye(self.dim) if self.origin_centred else None

    def star_about_origin(self) -> bool:
        """True for an origin-centred ball (see :class:`Support`)."""
        return self.origin_centred

    def _params(self):
        return {
            "center": self.center_,
            "radius": self.radius_,
            "rinf": self.rinf_,
            "origin_centred": self.origin_centred,
            "gap": self.gap_,
            "n_iter": self.n_iter_,
        }

    @classmethod
    def _from_fit_options(cls, *, center, quantile, solver, **kw):
        return cls(centering=center, quantile=quantile, solver=solver, **kw)

    def scaled(self, factor) -> "Ball":
        """The ball with the same centre and ``factor`` times the radius (see
        :meth:`Support.scaled`); ``rinf_`` is scaled too.

        Parameters
        ----------
        factor : float
            > 0 and finite.

        Returns
        -------
        Ball
            A ready set (``solver_ = "given"``) with ``radius_ = factor * radius_``, the same
            ``center_`` and ``feature_names_in_``.

        Raises
        ------
        ValueError, TypeError
            ``factor <= 0`` or not finite, a radius that would leave the float64 range;
            ``NotFittedError`` before a fit.
        """
        self._check_fitted()
        s = check_scale_factor(factor)
        r, rinf = scale_lengths(np.array([self.radius_, self.rinf_]), s, "radius")
        out = type(self).from_params(self.center_, r)
        out.rinf_ = float(rinf)
        return self._derived(out)
