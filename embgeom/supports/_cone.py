"""The circular cone cut by a ball, ``{x : |x| <= r, angle(x, axis) <= alpha}``, apex at 0."""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import special

from .._special import _log_kappa, log1mexp, log1p_ratio, log_cap_fraction, log_unit_ball_volume
from .._validation import check_array, check_positive, check_probability, check_seed
from ._ball import meb_fast
from ._base import (
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
    unscale,
    vector_norm,
)
from ._volumetric import circumball_terms

__all__ = ["Cone"]


def _cone_convex_log_volume(d: int, lr: float, alpha: float) -> float:
    """Upper bound on ``log vol(K + B(rho)) - d log rho`` for ``K = cone(alpha) cap B(r)``,
    ``alpha <= pi/2``, with ``lr = log(r / rho)`` (everything in units of ``rho``, in logs, so
    that ``r = 1e30``, ``rho = 1e-300`` is finite).

    ``cone + B(rho)`` lies in the same cone with its apex moved back by ``delta = rho/sin alpha``
    (a convex cone contains ``x + B(delta a, delta sin alpha)`` for every ``x`` in it), and every
    point is within ``r + rho`` of the origin, hence within ``r + rho + delta`` of the new apex:
    ``vol <= kappa_d (r + rho + delta)^d frac(alpha)``.
    """
    log_reach = float(special.logsumexp([lr, 0.0, -math.log(math.sin(alpha))]))  # log((r+rho+delta)/rho)
    return float(_log_kappa(d)) + d * log_reach + float(log_cap_fraction(alpha, d))


def _cone_reflex_log_volume(d: int, lr: float, alpha: float) -> float:
    """Upper bound on ``log vol(K + B(rho)) - d log rho`` for ``alpha >= pi/2`` (``lr`` as in
    :func:`_cone_convex_log_volume`).

    ``K`` misses the open convex cone of half-angle ``beta = pi - alpha`` around ``-axis``; the
    points of that cone moved ``delta = rho / sin beta`` further along ``-axis`` are at distance
    ``>= rho`` from ``K``, and that moved cone holds a sector of radius ``r + rho - delta`` inside
    ``B(r + rho)``: ``vol <= kappa_d (r+rho)^d [1 - frac(beta) ((r+rho-delta)/(r+rho))^d]``.
    """
    log_outer = float(np.logaddexp(lr, 0.0))  # log((r + rho) / rho)
    base = float(_log_kappa(d)) + d * log_outer
    beta = math.pi - alpha
    if beta <= 0.0:
        return base
    log_frac = -math.log(math.sin(beta)) - log_outer  # log(delta / (r + rho))
    if log_frac >= 0.0:
        return base
    cut = float(log_cap_fraction(beta, d)) + d * float(log1mexp(log_frac))
    return base + log1mexp(cut)


def cone_terms(d: int, r: float, alpha: float, eps: float) -> dict:
    """Rigorous V2 and Vinf bounds (nats) for the cone of half-angle ``alpha`` in ``B(r)``.

    Computed in units of ``rho`` and in logs (``r / eps`` is never formed): V2 uses
    ``rho = eps/2`` and divides by ``vol B(rho)``; Vinf uses ``rho' = sqrt(d) eps / 2`` (the
    cube ``Q(eps)`` lies in ``B(rho')``) and divides by ``eps^d``.
    """
    from scipy import optimize

    out = {}
    log_r, log_eps = math.log(r), math.log(eps)
    # (log rho, log of the denominator relative to rho^d)
    pairs = {"v2": (log_eps - math.log(2.0), float(_log_kappa(d))),
             "vinf": (log_eps + math.log(0.5 * math.sqrt(d)), -d * math.log(0.5 * math.sqrt(d)))}
    for name, (log_rho, log_den) in pairs.items():
        lr = log_r - log_rho
        vals = []
        if alpha <= 0.5 * math.pi:
            # any cone containing K gives a valid bound: minimise over alpha' in [alpha, pi/2]
            f = lambda al: _cone_convex_log_volume(d, lr, al)  # noqa: E731
            vals.append(f(alpha))
            res = optimize.minimize_scalar(f, bounds=(alpha, 0.5 * math.pi), method="bounded")
            vals.append(min(float(res.fun), f(0.5 * math.pi)))
        if alpha >= 0.5 * math.pi:
            vals.append(_cone_reflex_log_volume(d, lr, alpha))
        out[f"{name}_cone"] = min(vals) - log_den
    return out


#: Angles (radians) at or below this are rounding: directions this close coincide (64 ulps).
_ANGLE_RESOLUTION = 64 * np.finfo(np.float64).eps


def _angles(X: np.ndarray, axis: np.ndarray) -> np.ndarray:
    """Angles (radians) between rows of ``X`` and the unit ``axis``, accurate at small angles."""
    along = X @ axis
    perp = row_norms(X - np.outer(along, axis))
    return np.arctan2(perp, along)


def _min_pairwise_cosine(U: np.ndarray, block: int = 2048) -> float:
    """Smallest ``u_i . u_j`` over all pairs of unit rows (blocked Gram matrix)."""
    best = 1.0
    n = U.shape[0]
    for i in range(0, n, block):
        G = U[i:i + block] @ U.T
        best = min(best, float(G.min()))
    return max(-1.0, min(1.0, best))




class Cone(Support):
    """The circular cone intersected with a ball ``{x : |x| <= r, angle(x, axis) <= alpha}``.

    Apex at the origin (the decoder cells of a bias-free unembedding are cones with that apex).

    Fit with ``Cone().fit(X)``; build a ready cone with :meth:`Cone.from_params`.

    Parameters
    ----------
    quantile : float in (0, 1], default 1.0
        Robust fit: drop the points whose direction makes the largest angle with the mean
        direction first.
    solver : {"auto", "fast", "cvxpy"}, default "auto"
        The smallest cone is ``max t s.t. u . x_i/|x_i| >= t, |u| <= 1``, ``alpha = arccos t``
        (an SOCP, ``"cvxpy"``). Its dual is the minimum-norm point of the convex hull of the
        directions, which is the dual of the minimum enclosing ball of the unit directions, so
        ``"fast"`` runs the certified ball solver on them; ``"auto"``: ``"fast"``.
    tol : float, default 1e-12
        Fast solver tolerance (as for :class:`Ball`).

    Attributes
    ----------
    axis_ : ndarray of float64, shape (d,)
        Unit axis.
    half_angle_ : float
        Radians, in ``(0, pi]``; after a fit the largest angle of a kept direction to
        ``axis_`` (so every kept point is inside).
    radius_ : float
        Largest norm of a kept point.
    paper_half_angle_ : float
        The paper's estimate ``arccos(min_{i,j} cos(x_i, x_j)) / 2`` (half of the largest
        pairwise angle). It is a lower bound of the smallest cone's half-angle (an enclosing cap
        has at least half the diameter) and need not contain the points.
    optimal_ : bool
        ``True`` when the cone is the smallest (directions in an open hemisphere); ``False`` when
        the directions are not in any open hemisphere (the origin is in the convex hull of the
        directions, ``t <= 0``): the smallest cone then has half-angle >= pi/2 and is a
        non-convex problem; the fit returns the cone around the best of a few candidate axes
        (the ball-solver centre, the mean and the median direction), valid but not certified
        minimal, and warns.

    Notes
    -----
    ``log_volume = log vol(B_d(r)) + log f(alpha)`` with ``f`` the cap fraction
    (:func:`log_cap_fraction`); for ``alpha > pi/2`` it is ``1 - f(pi - alpha)``.

    Sampling is exact, never rejection from the ball: the angle to the axis has density
    ``~ sin^{d-2} theta`` on ``[0, alpha]``, drawn by inverting the regularised incomplete beta
    (``scipy.special.betaincinv``) or, for caps whose mass underflows, by rejection from the
    exponential envelope ``exp(-(d-2) cot(alpha) (alpha - theta))`` (log sin is concave);
    then a uniform direction orthogonal to the axis and the radius ``r U^{1/d}``.
    """

    shape = "cone"

    def __init__(self, *, quantile=1.0, solver="auto", tol=1e-12):
        self.quantile = quantile
        self.solver = solver
        self.tol = tol

    @classmethod
    def from_params(cls, axis, half_angle, radius) -> "Cone":
        """A ready cone ``{x : |x| <= radius, angle(x, axis) <= half_angle}`` (no data).

        Parameters
        ----------
        axis : array_like of float, shape (d,)
            Non-zero; normalised here.
        half_angle : float
            Radians, in ``(0, pi]``.
        radius : float
            > 0.

        Returns
        -------
        Cone
            Fitted state set (``solver_ = "given"``); ``fit`` on it raises ``ValueError``.

        Raises
        ------
        ValueError, TypeError
            A zero axis, a half-angle outside ``[64 eps, pi]`` (``64 eps = 1.4e-14`` rad: finer
            angles are rounding), ``radius <= 0``, NaN/inf.
        """
        ax = check_array(as_real_points(axis, "axis"), "axis", ndim=1)
        nrm = vector_norm(ax)
        if not nrm > 0:
            raise ValueError("axis: expected a non-zero vector")
        al = check_positive(half_angle, "half_angle")
        if al > math.pi:
            raise ValueError(f"half_angle: expected a value in (0, pi], got {al}")
        if al < _ANGLE_RESOLUTION:  # predict put the axis itself outside; sample never returned
            raise ValueError(f"half_angle: expected at least {_ANGLE_RESOLUTION:.3g} rad (64 ulps: "
                             f"directions closer than that coincide in float64, so membership "
                             f"and sampling cannot resolve the cone), got {al!r}")
        r = check_positive(radius, "radius")
        cone = cls()
        cone._set(ax / nrm, al, r, paper=float("nan"), optimal=True, gap=0.0)
        cone._record_given(ax.shape[0])
        return cone

    def _set(self, axis, half_angle, radius, *, paper, optimal, gap):
        self.axis_ = np.asarray(axis, dtype=np.float64)
        self.half_angle_ = float(half_angle)
        self.radius_ = float(radius)
        self.paper_half_angle_ = float(paper)
        self.optimal_ = bool(optimal)
        self.gap_ = float(gap)

    def fit(self, X, y=None):
        """Fit the smallest circular cone (apex at the origin) and the enclosing radius.

        Parameters
        ----------
        X : array_like of float, shape (N, d), d >= 2
            float32/float64; integers are converted to float64. A DataFrame's column
            names become ``feature_names_in_``.
        y : None
            Ignored.

        Returns
        -------
        self

        Raises
        ------
        TypeError
            ``X`` not a real array (float16, booleans, text refused; complex numbers raise
            ``ComplexDataError``, also a ``ValueError``).
        ValueError
            NaN/inf, N < 2, d < 2, bad options, a cone built with :meth:`from_params`, or
            degenerate data: every point at the origin, or all directions the same (points on
            one ray: half-angle 0, volume 0). Zero vectors among other points are fine: the
            origin is the apex, inside every cone (they are counted in ``n_fit_``).

        Warns
        -----
        RuntimeWarning
            The directions are in no open hemisphere (see ``optimal_``).

        Notes
        -----
        Directions do not depend on the scale of ``X``; the radius is computed on ``X 2^-k``
        and mapped back exactly, so ``1e-160`` and ``1e160`` data give the fit at scale 1.
        """
        H, t0 = self._start_fit(X)
        solver = check_choice(self.solver, "solver", _SOLVERS)
        q = check_probability(self.quantile, "quantile")
        tol = check_positive(self.tol, "tol")
        n, d = H.shape
        if d < 2:
            raise ValueError(f"X: a cone needs d >= 2 columns, got {d} feature(s)")
        Hn, k = normalise(H)  # directions are scale-free; the radius is mapped back exactly
        norms = row_norms(Hn)
        nonzero = norms > 0
        if not nonzero.any():
            refuse_degenerate("cone", f"all {n} points are at the origin (the apex): they have no "
                              "direction", "no cone of positive volume is determined by them")
        # a zero vector is the apex, inside every cone: it constrains nothing but the count
        U = Hn[nonzero] / norms[nonzero, None]
        normk = norms[nonzero]
        if q < 1.0:
            mean_dir = U.mean(axis=0)
            mn = vector_norm(mean_dir)
            ref = mean_dir / mn if mn > 0 else U[0]
            keep_src = np.concatenate([U, normk[:, None]], axis=1)
            kept, _ = trim(keep_src, -(U @ ref), q)
            U, normk = kept[:, :d], kept[:, d]
        radius = unscale(float(normk.max()), k, "radius")
        spread = float(_angles(U, U[0]).max())
        if not spread > _ANGLE_RESOLUTION:
            refuse_degenerate(
                "cone", f"all {U.shape[0]} directions coincide (the points lie on one ray from the "
                f"origin, angles <= {spread:.2g} rad)", "the smallest cone has half-angle 0 "
                "(volume 0); fit a ball or a box, or build a cone with Cone.from_params")
        gap = 0.0
        if solver == "cvxpy":
            cp = import_cvxpy()
            u = cp.Variable(d)
            t = cp.Variable()
            prob = cp.Problem(cp.Maximize(t), [U @ u >= t, cp.norm(u, 2) <= 1])
            name = cvxpy_solve(prob, "Cone")
            cand = np.asarray(u.value, dtype=np.float64)
            used, gap = f"cvxpy:{name}", float("nan")
        else:
            cand, _, gap, _, _ = meb_fast(U, tol=tol)
            used = "fast"
        candidates = []
        if vector_norm(cand) > 0:
            candidates.append(cand / vector_norm(cand))
        best_axis, best_angle = None, np.inf
        for ax in candidates:
            ang = float(_angles(U, ax).max())
            if ang < best_angle:
                best_axis, best_angle = ax, ang
        optimal = best_angle <= 0.5 * math.pi
        if not optimal:
            for ref in (U.mean(axis=0), np.median(U, axis=0)):
                nr = vector_norm(ref)
                if nr > 0:
                    ang = float(_angles(U, ref / nr).max())
                    if ang < best_angle:
                        best_axis, best_angle = ref / nr, ang
            if best_axis is None:
                best_axis, best_angle = U[0], float(_angles(U, U[0]).max())
            warnings.warn(
                "Cone: the directions are not contained in any open hemisphere (the origin is in "
                f"their convex hull); returning a cone of half-angle {best_angle:.4f} rad > pi/2 "
                "around a heuristic axis, valid but not certified minimal",
                RuntimeWarning,
                stacklevel=2,
            )
        half = min(max(best_angle, 1e-300), math.pi)
        paper = 0.5 * math.acos(_min_pairwise_cosine(U))
        self._set(best_axis, half, radius, paper=paper,
                  optimal=optimal, gap=gap)
        self.n_features_in_ = d
        self._record_fit(n, U.shape[0] + int(n - nonzero.sum()), q, used, t0)
        return self

    @property
    def log_volume(self) -> float:
        """``log vol(B_d(r)) + log f(alpha)`` in nats (see :func:`log_cap_fraction`)."""
        self._check_fitted()
        return (log_unit_ball_volume(self.dim) + self.dim * math.log(self.radius_)
                + log_cap_fraction(self.half_angle_, self.dim))

    @property
    def paper_log_volume_(self) -> float:
        """The log-volume with the paper's half-angle estimate in place of ``half_angle_``."""
        self._check_fitted()
        if not np.isfinite(self.paper_half_angle_):
            return float("nan")
        return (log_unit_ball_volume(self.dim) + self.dim * math.log(self.radius_)
                + log_cap_fraction(self.paper_half_angle_, self.dim))

    def _gauge(self, X):
        nrm = row_norms(X)
        ang = np.where(nrm > 0, _angles(X, self.axis_), 0.0)
        return np.maximum(nrm / self.radius_, ang / self.half_angle_)

    def _sample_angles(self, rng, n):
        d, al = self.dim, self.half_angle_
        a, b = 0.5 * (d - 1), 0.5
        logF = log_cap_fraction(al, d)
        if logF > -600.0:
            p = rng.uniform(size=n) * math.exp(logF)
            lo = p <= 0.5
            theta = np.empty(n)
            s = special.betaincinv(a, b, np.clip(2.0 * p[lo], 0.0, 1.0))
            theta[lo] = np.arcsin(np.sqrt(s))
            s = special.betaincinv(a, b, np.clip(2.0 * (1.0 - p[~lo]), 0.0, 1.0))
            theta[~lo] = math.pi - np.arcsin(np.sqrt(s))
            return np.minimum(theta, al)
        # tiny cap (alpha < pi/2 here): rejection from an exponential envelope on t = alpha - theta
        rate = (d - 2) / math.tan(al)
        out = np.empty(0)
        log_sin_al = math.log(math.sin(al))
        while out.size < n:
            m = 2 * (n - out.size) + 16
            t = -np.log1p(-rng.uniform(size=m) * (-math.expm1(-rate * al))) / rate
            th = al - t
            with np.errstate(divide="ignore"):
                log_acc = (d - 2) * (np.log(np.sin(th)) - log_sin_al + t / math.tan(al))
            acc = np.log(rng.uniform(size=m)) <= np.minimum(log_acc, 0.0)
            out = np.concatenate([out, th[acc]])
        return out[:n]

    def sample(self, n: int, seed=None) -> np.ndarray:
        """``n`` points uniform in the cone intersected with the ball (exact, see Notes).

        Parameters
        ----------
        n : int
        seed : None, int or numpy Generator

        Returns
        -------
        numpy.ndarray of float64, shape (n, d)
        """
        n = self._check_sample_args(n)
        rng = check_seed(seed)
        d = self.dim
        theta = self._sample_angles(rng, n)
        g = rng.standard_normal((n, d))
        g -= np.outer(g @ self.axis_, self.axis_)
        g /= np.linalg.norm(g, axis=1, keepdims=True)
        r = self.radius_ * np.exp(np.log(rng.uniform(size=n)) / d)
        return r[:, None] * (np.cos(theta)[:, None] * self.axis_ + np.sin(theta)[:, None] * g)

    def _params(self):
        return {
            "axis": self.axis_,
            "half_angle": self.half_angle_,
            "radius": self.radius_,
            "paper_half_angle": self.paper_half_angle_,
            "paper_log_volume": self.paper_log_volume_,
            "log_cap_fraction": log_cap_fraction(self.half_angle_, self.dim),
            "optimal": self.optimal_,
            "gap": self.gap_,
        }

    def packing_bound_terms(self, eps) -> dict:
        """Volumetric bounds on ``log P(cone, eps)`` (nats), by name.

        Parameters
        ----------
        eps : float
            Precision, > 0.

        Returns
        -------
        dict
            ``paper = d log(1 + 2r/eps) + log f(alpha)`` (an approximation: the eps/2-balls near
            the cone's surface stick out), the rigorous ``v2_cone``, ``vinf_cone`` (the cone with
            its apex moved back by ``rho / sin alpha``; a reflex version for ``alpha > pi/2``)
            and the enclosing ball's ``v2_ball_ball``, ``vinf_steiner_ball``.

        Raises
        ------
        ValueError, TypeError
            ``eps <= 0`` or not finite; ``NotFittedError`` before a fit.
        """
        self._check_fitted()
        eps = check_positive(eps, "eps")
        d, r = self.dim, check_positive(self.radius_, "support.radius_")
        alpha = min(float(self.half_angle_), math.pi)
        lf = float(log_cap_fraction(alpha, d))
        out = {"paper": d * log1p_ratio(r, eps, 2.0) + lf}
        out.update(cone_terms(d, r, alpha, eps))
        out.update(circumball_terms(d, r, eps, "_ball"))
        return out

    @classmethod
    def _from_fit_options(cls, *, center, quantile, solver, **kw):
        # the apex is always the origin: either centering is accepted
        return cls(quantile=quantile, solver=solver, **kw)

    def scaled(self, factor) -> "Cone":
        """The cone ``{x : |x| <= factor r, angle(x, axis) <= min(pi, factor alpha)}`` (see
        :meth:`Support.scaled`: the sublevel set of the gauge ``max(|x|/r, angle/alpha)``).

        Parameters
        ----------
        factor : float
            > 0 and finite.

        Returns
        -------
        Cone
            A ready set (``solver_ = "given"``) with the same ``axis_`` and
            ``feature_names_in_``.

        Raises
        ------
        ValueError, TypeError
            ``factor <= 0`` or not finite, a radius that would leave the float64 range or a
            half-angle that would fall below 64 ulps (1.4e-14 rad); ``NotFittedError`` before a fit.
        """
        self._check_fitted()
        s = check_scale_factor(factor)
        radius = scale_lengths(self.radius_, s, "radius")
        # the half-angle is capped at pi (the whole ball); below the cap it must stay > 0
        half = math.pi if s * self.half_angle_ >= math.pi else scale_lengths(self.half_angle_, s, "half-angle")
        if half < _ANGLE_RESOLUTION:  # as a box whose sides round to zero width
            raise ValueError(f"factor: {s:g} times the half-angle {self.half_angle_:.3g} rad is "
                             f"below {_ANGLE_RESOLUTION:.3g} rad, where directions coincide in "
                             "float64 (membership and sampling cannot resolve such a cone)")
        return self._derived(type(self).from_params(self.axis_, half, radius))
