"""The ellipsoid ``{x : (x - c)^T A (x - c) <= 1}``; as an estimator, the minimum-volume
enclosing ellipsoid (the solvers are in :mod:`embgeom.supports._mvee`)."""

from __future__ import annotations

import math
import warnings

import numpy as np

from .._progress import check_progress
from .._special import log1p_ratio, log_unit_ball_volume, row_norms
from .._validation import check_array, check_positive, check_positive_int, check_probability, check_seed
from ._base import (
    _SOLVERS,
    Support,
    as_real_points,
    affine_hull,
    check_choice,
    check_scale_factor,
    normalise,
    refuse_degenerate,
    scale_lengths,
    trim,
    unit_ball_samples,
    unscale,
)
from ._mvee import mvee
from ._volumetric import circumball_terms, ellipsoid_terms, is_axis_aligned

__all__ = ["Ellipsoid"]


class Ellipsoid(Support):
    """The ellipsoid ``{x : (x - c)^T A (x - c) <= 1}``; as an estimator, the minimum-volume
    enclosing ellipsoid (MVEE, Loewner-John ellipsoid).

    Fit with ``Ellipsoid().fit(X)``; build a ready ellipsoid with :meth:`Ellipsoid.from_params`.

    Parameters
    ----------
    quantile : float in (0, 1], default 1.0
        Robust fit: drop the points of largest Mahalanobis distance to the mean (sample
        covariance, pseudo-inverse if singular) first.
    solver : {"auto", "fast", "cvxpy"}, default "auto"
        ``"fast"``: Todd-Yildirim with drop steps from a Kumar-Yildirim start (see Notes);
        ``"cvxpy"``: ``max log det B s.t. |B x_i + b| <= 1`` (the reference; small d and N only,
        its problem has ``d^2`` variables); ``"auto"``: ``"fast"``.
    tol : float, default 1e-7
        Relative optimality tolerance ``eps`` of the fast solver (see Notes).
    ridge : float, optional
        Regularisation for rank-deficient data (``N <= d`` or points in a proper affine
        subspace). Without it such data raise ``ValueError``. With ``ridge = t > 0`` the MVEE is
        fitted in the affine hull of the points (dimension ``k < d``) and given semi-axes ``t``
        (absolute length) along the ``d - k`` orthogonal directions; ``ridge_`` and
        ``affine_rank_`` record it.
    max_iter : int, default 1_000_000
        Step cap of the fast solver (``eps_`` tells how far it got).
    progress : bool, default False
        tqdm progress bar of the fast solver.

    Attributes
    ----------
    center_ : ndarray of float64, shape (d,)
    semi_axes_ : ndarray of float64, shape (d,)
        Descending; ``1 / sqrt`` of the eigenvalues of ``A``.
    axes_ : ndarray of float64, shape (d, d)
        Rows are the principal axes, matching ``semi_axes_``. ``center_``, ``axes_`` and
        ``semi_axes_`` are the ellipsoid (what ``log_volume``, ``gauge``, ``sample`` and the
        bounds use).
    shape_matrix_ : ndarray of float64, shape (d, d)
        ``A = axes_^T diag(semi_axes_^-2) axes_``, derived from them; at extreme scales or axis
        ratios its entries under- or overflow (``A ~ 1e-320`` for an ellipsoid of size ``1e160``),
        which does not affect the fit.
    eps_ : float
        Final relative optimality gap of the fast solver (NaN for cvxpy, 0 for a given one).
    gap_nats_ : float
        Certified bound on the excess log-volume over the MVEE (nats):
        ``log_volume - L`` where ``L`` is the dual lower bound
        ``log kappa_r + r/2 log r + 1/2 log det Sigma(u)`` on every enclosing ellipsoid, from
        the solver's final weights ``u`` (Todd 2016, Ch. 2; see :mod:`embgeom.supports._mvee`).
        A true bound, recomputed after the final containment step; for cvxpy it uses the dual
        values of the constraints (NaN if the solver gives none); 0 for a given ellipsoid.
        With ``ridge`` it is measured in the affine hull (the ridge axes are given, not fitted).
    ridge_ : float or None
        The semi-axis given to the directions off the affine hull; ``None`` when the points
        are full rank (``ridge`` then unused).
    affine_rank_ : int
        Dimension of the affine hull of the fitted points (``d`` when full).
    n_iter_ : int
    n_features_in_, feature_names_in_, n_samples_, n_fit_, n_dropped_, quantile_, solver_, fit_seconds_, offset_
        See :class:`Support`.

    Notes
    -----
    ``log_volume = log vol(B_d) + sum_i log s_i = log vol(B_d) - 1/2 log det A`` (nats).

    Both solvers run on the whitened points (:func:`embgeom.supports._mvee.mvee`: the thin SVD
    of the centred data, which the MVEE's affine equivariance allows), so neither the scale, the
    rotation nor the axis ratio of the data changes the number of steps or the accuracy; the
    result is mapped back as axes and semi-axes. The fast solver
    (:func:`embgeom.supports._mvee.todd_yildirim`) ends at a tolerance, after which the
    ellipsoid is scaled so that the farthest point lies exactly on the boundary: every point is
    contained, and ``gap_nats_`` certifies how far above the minimum it can be. Each step costs one rank-one update of ``M^{-1}`` (``d^2``) and of the Mahalanobis
    norms of the candidates (``N`` each); the product ``Q M^{-1} q_B`` for a batch of candidates
    is one GEMM. Its convergence is linear but slows down when many points are in the optimal
    support (i.i.d. Gaussian data in high d: most of them); ``N >> d^2`` is where the support is
    a small fraction.

    References
    ----------
    M. J. Todd and E. A. Yildirim, "On Khachiyan's algorithm for the computation of
    minimum-volume enclosing ellipsoids", Discrete Applied Mathematics 155 (2007).
    P. Kumar and E. A. Yildirim, "Minimum-volume enclosing ellipsoids and core sets", J. Optim.
    Theory Appl. 126 (2005).

    Examples
    --------
    >>> import numpy as np
    >>> H = np.random.default_rng(0).standard_normal((500, 3))
    >>> ell = Ellipsoid().fit(H)
    >>> bool(ell.contains(H).all())
    True
    """

    shape = "ellipsoid"

    def __init__(self, *, quantile=1.0, solver="auto", tol=1e-7, ridge=None, max_iter=1_000_000,
                 progress=False):
        self.quantile = quantile
        self.solver = solver
        self.tol = tol
        self.ridge = ridge
        self.max_iter = max_iter
        self.progress = progress

    @classmethod
    def from_params(cls, center, shape_matrix=None, *, semi_axes=None, axes=None) -> "Ellipsoid":
        """A ready ellipsoid ``{x : (x - center)^T A (x - center) <= 1}`` (no data).

        Give either the shape matrix ``A`` or the semi-axes (and axes): ``A`` cannot hold an
        ellipsoid of size ``1e160`` (its entries would be ``1e-320``) or one with an axis ratio
        of ``1e10`` (its eigenvalues span ``1e20``), the semi-axes can.

        Parameters
        ----------
        center : array_like of float, shape (d,)
        shape_matrix : array_like of float, shape (d, d), optional
            Symmetric positive definite ``A``.
        semi_axes : array_like of float, shape (d,), optional
            Positive semi-axis lengths (instead of ``shape_matrix``).
        axes : array_like of float, shape (d, d), optional
            Orthonormal rows, the axis of each semi-axis; default the coordinate axes. Only
            with ``semi_axes``.

        Returns
        -------
        Ellipsoid
            Fitted state set (``solver_ = "given"``); ``fit`` on it raises ``ValueError``.

        Raises
        ------
        ValueError, TypeError
            ``shape_matrix`` not symmetric positive definite, non-positive ``semi_axes``, ``axes``
            not orthonormal, both or neither of ``shape_matrix`` and ``semi_axes``, shapes that
            do not match, NaN/inf.
        """
        c = check_array(as_real_points(center, "center"), "center", ndim=1)
        d = c.shape[0]
        ell = cls()
        if (shape_matrix is None) == (semi_axes is None):
            raise ValueError("Ellipsoid.from_params: give exactly one of shape_matrix and semi_axes")
        if shape_matrix is not None:
            if axes is not None:
                raise ValueError("axes: only with semi_axes (shape_matrix already holds the axes)")
            A = check_array(as_real_points(shape_matrix, "shape_matrix"), "shape_matrix", ndim=2, shape=(d, d))
            ell._set(c, A, eps=0.0, n_iter=0, ridge=None, rank=d)
        else:
            s = check_array(as_real_points(semi_axes, "semi_axes"), "semi_axes", ndim=1, shape=(d,))
            if not np.all(s > 0):
                raise ValueError(f"semi_axes: expected positive lengths, got min {float(s.min())}")
            if axes is None:
                R = np.eye(d)
            else:
                R = check_array(as_real_points(axes, "axes"), "axes", ndim=2, shape=(d, d))
                if not np.allclose(R @ R.T, np.eye(d), atol=1e-8):
                    raise ValueError("axes: rows must be orthonormal (R R^T = I)")
            order = np.argsort(s, kind="stable")[::-1]
            ell._set_axes(c, R[order], s[order], eps=0.0, gap_nats=0.0, n_iter=0, ridge=None, rank=d)
        ell._record_given(d)
        return ell

    def _set(self, center, A, *, eps, n_iter, ridge, rank):
        """Set the ellipsoid from a shape matrix (``from_params``)."""
        A = np.asarray(A, dtype=np.float64)
        if not np.allclose(A, A.T, rtol=1e-10, atol=1e-12 * np.abs(A).max()):
            raise ValueError("shape_matrix: expected a symmetric matrix")
        A = 0.5 * (A + A.T)
        w, V = np.linalg.eigh(A)
        if not w[0] > 0:
            raise ValueError(
                f"shape_matrix: expected positive definite, smallest eigenvalue is {w[0]:.3g}"
            )
        # eigenvalues ascending -> semi-axes descending
        self._set_axes(center, V.T, 1.0 / np.sqrt(w), eps=eps, gap_nats=0.0, n_iter=n_iter,
                       ridge=ridge, rank=rank)

    def _set_axes(self, center, axes, semi_axes, *, eps, gap_nats, n_iter, ridge, rank):
        """Set the ellipsoid from its centre, axes (rows) and semi-axes (descending)."""
        self.center_ = np.asarray(center, dtype=np.float64)
        self.axes_ = np.ascontiguousarray(axes, dtype=np.float64)
        self.semi_axes_ = np.asarray(semi_axes, dtype=np.float64)
        self.eps_ = float(eps)
        self.gap_nats_ = float(gap_nats)
        self.n_iter_ = int(n_iter)
        self.ridge_ = ridge
        self.affine_rank_ = int(rank)

    def fit(self, X, y=None):
        """Fit the minimum-volume enclosing ellipsoid.

        Parameters
        ----------
        X : array_like of float, shape (N, d)
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
            NaN/inf, N < 2, bad options, an ellipsoid built with :meth:`from_params`, a result
            beyond the float64 range, or degenerate data without ``ridge``: all points
            coincide, or they are collinear / lie in a proper affine subspace (``N <= d``
            included). With ``ridge = t`` such data get the MVEE in their affine hull plus
            semi-axes ``t`` off it (a single point: the ball of radius ``t``).

        Warns
        -----
        RuntimeWarning
            The fast solver stopped at ``max_iter`` above ``tol``.

        Notes
        -----
        The MVEE is affine-equivariant, so the solvers work on the whitened points (the thin
        SVD of the centred, power-of-two-normalised ``X``; :func:`embgeom.supports._mvee.mvee`)
        and the result is mapped back exactly: the number of steps and the certified gap do
        not depend on the scale, the rotation or the axis ratio of the data (up to what the
        float64 data itself resolves: an axis ratio beyond about ``1e13`` is rank deficiency).
        """
        H, t0 = self._start_fit(X)
        solver = check_choice(self.solver, "solver", _SOLVERS)
        q = check_probability(self.quantile, "quantile")
        tol = check_positive(self.tol, "tol")
        max_iter = check_positive_int(self.max_iter, "max_iter")
        ridge = None if self.ridge is None else check_positive(self.ridge, "ridge")
        n, d = H.shape
        Hn, k = normalise(H)  # fit at unit scale; centre and semi-axes map back exactly
        mu, rank, U, sv, Vt = affine_hull(Hn)
        if q < 1.0 and rank > 0:
            # Mahalanobis distance to the mean with the pseudo-inverse of the sample covariance:
            # (n - 1) |U_i|^2 over the hull's directions (no ill-conditioned inverse)
            Hk, _ = trim(Hn, (n - 1) * np.einsum("ij,ij->i", U[:, :rank], U[:, :rank]), q)
            mu, rank, U, sv, Vt = affine_hull(Hk)
        else:
            Hk = Hn
        nk = Hk.shape[0]
        # the rows left after quantile trimming are what the fit sees: say so
        kept = f"{nk} points (of {n}, quantile={q} kept {nk})" if nk < n else f"{nk} points"
        if rank == 0 and ridge is None:
            refuse_degenerate(
                "ellipsoid", f"all {kept} coincide", "the enclosing ellipsoid would have "
                "volume 0. Pass ridge=t for the ball of radius t around the point (the rule for "
                "rank-deficient data), or build one with Ellipsoid.from_params")
        if rank < d and ridge is None:
            refuse_degenerate(
                "ellipsoid", f"the {kept} span an affine subspace of dimension {rank} < d={d} "
                f"({'collinear points' if rank == 1 else 'N <= d' if nk <= d else 'points on a subspace'})",
                "the minimum-volume enclosing ellipsoid is flat (volume 0). Pass more points"
                + (" or a larger quantile" if nk < n else "") + ", or "
                "ridge=t to fit in the affine hull and give the remaining axes semi-axis t explicitly")
        fit = None
        if rank > 0:
            fit = mvee(mu, U[:, :rank], sv[:rank], Vt[:rank], solver="cvxpy" if solver == "cvxpy" else "fast",
                       tol=tol, max_iter=max_iter, progress=check_progress(self.progress))
            center = unscale(fit.center, k, "centre")
            axes_in, semi_in = fit.axes, unscale(fit.semi_axes, k, "semi-axes")
            log_lower = fit.log_lower + rank * k * math.log(2.0)
            eps, it, used = fit.eps, fit.n_iter, fit.solver
        else:  # a single point, with ridge: the ball of radius ridge around it
            center = unscale(mu, k, "centre")
            axes_in, semi_in = np.zeros((0, d)), np.zeros(0)
            log_lower, eps, it, used = float("nan"), 0.0, 0, "closed_form"
        if rank < d:
            from scipy.linalg import null_space

            perp = null_space(axes_in).T if rank else np.eye(d)  # (d - rank, d): off the hull
            axes = np.vstack([axes_in, perp])
            semi = np.concatenate([semi_in, np.full(d - rank, ridge)])
            order = np.argsort(semi, kind="stable")[::-1]
            axes, semi = axes[order], semi[order]
        else:
            axes, semi = axes_in, semi_in
        # exact containment in the data's own coordinates (guards the whitening and the maps back)
        Xk = unscale(Hk, k, "points")
        self.center_, self.axes_, self.semi_axes_ = center, axes, semi
        g = float(self._gauge(Xk).max())
        grow = g if g > 1.0 else 1.0
        semi = semi * grow
        gap = float("nan")
        if rank > 0 and np.isfinite(log_lower):
            log_vol_hull = log_unit_ball_volume(rank) + float(np.sum(np.log(semi_in))) + rank * math.log(grow)
            gap = max(log_vol_hull - log_lower, 0.0)
        elif rank == 0:
            gap = 0.0
        if solver != "cvxpy" and eps > tol:
            warnings.warn(
                f"Ellipsoid: the fast solver stopped at max_iter={max_iter} with relative gap "
                f"{eps:.3g} > tol={tol:g}; the ellipsoid contains every point but its "
                f"log-volume may exceed the minimum by up to {gap:.3g} nats (certified)",
                RuntimeWarning,
                stacklevel=2,
            )
        self._set_axes(center, axes, semi, eps=eps, gap_nats=gap, n_iter=it,
                       ridge=None if rank == d else ridge, rank=rank)
        self.n_features_in_ = d
        self._record_fit(n, nk, q, used, t0)
        return self

    @property
    def shape_matrix_(self) -> np.ndarray:
        """``A = axes_^T diag(semi_axes_^-2) axes_``, shape (d, d), derived from the axes.

        Raises
        ------
        ValueError
            ``A`` does not fit in float64 (its entries would over- or underflow: an ellipsoid
            of size ``1e160``, or semi-axes spanning more than about ``1e150``); the ellipsoid
            itself is ``center_``, ``axes_`` and ``semi_axes_``.
        """
        self._check_fitted()
        s = self.semi_axes_
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            B = self.axes_ / s[:, None]
            A = B.T @ B
        tiny = np.finfo(np.float64).tiny
        if not np.all(np.isfinite(A)) or not float(s.max()) ** -2 >= tiny:
            raise ValueError(
                f"shape_matrix_: A = axes^T diag(semi_axes^-2) axes is not representable in float64 "
                f"(semi-axes from {float(s.min()):.3g} to {float(s.max()):.3g}); use center_, axes_ "
                "and semi_axes_, which describe the ellipsoid exactly"
            )
        return 0.5 * (A + A.T)

    @property
    def log_volume(self) -> float:
        """``log vol(B_d) + sum_i log(semi_axes_i)`` in nats."""
        self._check_fitted()
        return log_unit_ball_volume(self.dim) + float(np.sum(np.log(self.semi_axes_)))

    def _gauge(self, X):
        # |Y| by row_norms, as the ball: squaring overflowed for points of size 1e160 and up
        with np.errstate(over="ignore"):
            Y = (X - self.center_) @ self.axes_.T / self.semi_axes_
        return row_norms(Y)

    def sample(self, n: int, seed=None) -> np.ndarray:
        """``n`` points uniform in the ellipsoid (uniform in the ball, mapped linearly).

        Parameters
        ----------
        n : int
        seed : None, int or numpy Generator

        Returns
        -------
        numpy.ndarray of float64, shape (n, d)

        Raises
        ------
        TypeError, ValueError
            Bad ``n`` or ``seed``; ``NotFittedError`` before a fit.
        """
        n = self._check_sample_args(n)
        rng = check_seed(seed)
        B = unit_ball_samples(rng, n, self.dim)
        return self.center_ + (B * self.semi_axes_) @ self.axes_

    def packing_bound_terms(self, eps) -> dict:
        """Volumetric bounds on ``log P(ellipsoid, eps)`` (nats), by name.

        Parameters
        ----------
        eps : float
            Precision, > 0.

        Returns
        -------
        dict
            ``paper = sum_i log(1 + 2 s_i/eps)`` (an approximation), the rigorous
            ``v2_ellipsoid``, ``vinf_ellipsoid`` (enclosing ellipsoids of ``E + B(rho)``),
            ``vinf_projections`` (and ``vinf_projections_aligned`` when the axes are coordinate
            axes) and the circumscribed ball's ``v2_ball_circumball``, ``vinf_steiner_circumball``.

        Raises
        ------
        ValueError, TypeError
            ``eps <= 0`` or not finite; ``NotFittedError`` before a fit.
        """
        self._check_fitted()
        eps = check_positive(eps, "eps")
        s = self.semi_axes_
        out = {"paper": float(np.sum(log1p_ratio(s, eps, 2.0)))}
        out.update(ellipsoid_terms(s, eps, aligned=is_axis_aligned(self.axes_)))
        out.update(circumball_terms(s.size, float(np.max(s)), eps, "_circumball"))
        return out

    @property
    def origin_centred(self) -> bool:
        """True when the centre is exactly the origin."""
        self._check_fitted()
        return bool(not np.any(self.center_))

    def origin_ellipsoid_map(self):
        """``G = A^{-1/2}`` (symmetric, shape (d, d)) for an origin-centred ellipsoid, else None.

        ``{x : x^T A x <= 1} = G B``: ``x = G u`` gives ``x^T A x = |u|^2``.
        """
        self._check_fitted()
        if not self.origin_centred:
            return None
        return (self.axes_.T * self.semi_axes_) @ self.axes_

    def star_about_origin(self) -> bool:
        """True for an origin-centred ellipsoid (see :class:`Support`)."""
        return self.origin_centred

    def _params(self):
        return {
            "center": self.center_,
            "semi_axes": self.semi_axes_,
            "eps": self.eps_,
            "gap_nats": self.gap_nats_,
            "n_iter": self.n_iter_,
            "ridge": self.ridge_,
            "affine_rank": self.affine_rank_,
        }

    def scaled(self, factor) -> "Ellipsoid":
        """The ellipsoid with the same centre and axes, semi-axes times ``factor`` (see
        :meth:`Support.scaled`).

        It scales the ellipsoid's own parameters, never the shape matrix ``A`` (which cannot
        hold semi-axes of ``1e160``): an ellipsoid that :meth:`from_params` accepts from its
        semi-axes can be scaled as long as ``factor`` times them stays in float64's range.

        Parameters
        ----------
        factor : float
            > 0 and finite.

        Returns
        -------
        Ellipsoid
            A ready set (``solver_ = "given"``): the same ``center_``, ``axes_``,
            ``affine_rank_`` and ``feature_names_in_``; ``semi_axes_`` and ``ridge_`` times
            ``factor``.

        Raises
        ------
        ValueError, TypeError
            ``factor <= 0`` or not finite, semi-axes that would leave the float64 range;
            ``NotFittedError`` before a fit.
        """
        self._check_fitted()
        s = check_scale_factor(factor)
        semi = scale_lengths(self.semi_axes_, s, "semi-axes")
        ridge = None if self.ridge_ is None else scale_lengths(self.ridge_, s, "ridge")
        out = type(self)()  # the axes are this fit's (orthonormal already): no re-validation
        out._set_axes(self.center_.copy(), self.axes_.copy(), semi, eps=0.0, gap_nats=0.0, n_iter=0,
                      ridge=ridge, rank=self.affine_rank_)
        out._record_given(self.dim)
        return self._derived(out)
