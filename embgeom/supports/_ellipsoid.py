"""The ellipsoid ``{x : (x - c)^T A (x - c) <= 1}``; as an estimator, the minimum-volume
enclosing ellipsoid (the solvers are in :mod:`embgeom.supports._mvee`)."""

from __future__ import annotations

import math
import warnings

import numpy as np

from .._special import log_unit_ball_volume
from .._validation import check_array, check_positive, check_positive_int, check_probability, check_seed
from ._base import _SOLVERS, Support, check_choice, trim, unit_ball_samples
from ._mvee import mvee_cvxpy, mvee_fast
from ._volumetric import circumball_terms, ellipsoid_terms, is_axis_aligned
from ._base import check_scale_factor

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
    shape_matrix_ : ndarray of float64, shape (d, d)
    semi_axes_ : ndarray of float64, shape (d,)
        Descending; ``1 / sqrt`` of the eigenvalues of ``A``.
    axes_ : ndarray of float64, shape (d, d)
        Rows are the principal axes, matching ``semi_axes_``.
    eps_ : float
        Final relative optimality gap of the fast solver (NaN for cvxpy, 0 for a given one).
    gap_nats_ : float
        ``(d + 1)/2 log(1 + eps_)``: the bound on the excess log-volume over the MVEE that the
        ``eps``-optimality certificate gives (Todd & Yildirim 2007; Kumar & Yildirim 2005).
    ridge_ : float or None
    affine_rank_ : int
        Dimension of the affine hull of the fitted points (``d`` when full).
    n_iter_ : int
    n_features_in_, n_samples_, n_fit_, n_dropped_, quantile_, solver_, fit_seconds_, offset_
        See :class:`Support`.

    Notes
    -----
    ``log_volume = log vol(B_d) + sum_i log s_i = log vol(B_d) - 1/2 log det A`` (nats).

    The fast solver (:func:`embgeom.supports._mvee.mvee_fast`) ends at a tolerance, after which
    ``A`` is scaled so that the farthest point lies exactly on the boundary: every point is
    contained. Each step costs one rank-one update of ``M^{-1}`` (``d^2``) and of the Mahalanobis
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
    def from_params(cls, center, shape_matrix) -> "Ellipsoid":
        """A ready ellipsoid ``{x : (x - center)^T A (x - center) <= 1}`` (no data).

        Parameters
        ----------
        center : array_like of float, shape (d,)
        shape_matrix : array_like of float, shape (d, d)
            Symmetric positive definite ``A``.

        Returns
        -------
        Ellipsoid
            Fitted state set (``solver_ = "given"``); ``fit`` on it raises ``ValueError``.

        Raises
        ------
        ValueError, TypeError
            ``shape_matrix`` not symmetric positive definite, shapes that do not match, NaN/inf.
        """
        c = check_array(center, "center", ndim=1)
        A = check_array(shape_matrix, "shape_matrix", ndim=2, shape=(c.shape[0], c.shape[0]))
        ell = cls()
        ell._set(c, A, eps=0.0, n_iter=0, ridge=None, rank=c.shape[0])
        ell._record_given(c.shape[0])
        return ell

    def _set(self, center, A, *, eps, n_iter, ridge, rank):
        A = np.asarray(A, dtype=np.float64)
        if not np.allclose(A, A.T, rtol=1e-10, atol=1e-12 * np.abs(A).max()):
            raise ValueError("shape_matrix: expected a symmetric matrix")
        A = 0.5 * (A + A.T)
        w, V = np.linalg.eigh(A)
        if not w[0] > 0:
            raise ValueError(
                f"shape_matrix: expected positive definite, smallest eigenvalue is {w[0]:.3g}"
            )
        self.center_ = np.asarray(center, dtype=np.float64)
        self.shape_matrix_ = A
        # eigenvalues ascending -> semi-axes descending
        self.semi_axes_ = 1.0 / np.sqrt(w)
        self.axes_ = np.ascontiguousarray(V.T)
        self.eps_ = float(eps)
        d = self.center_.shape[0]
        self.gap_nats_ = 0.5 * (d + 1) * math.log1p(eps) if np.isfinite(eps) else float("nan")
        self.n_iter_ = int(n_iter)
        self.ridge_ = ridge
        self.affine_rank_ = int(rank)

    def fit(self, X, y=None):
        """Fit the minimum-volume enclosing ellipsoid.

        Parameters
        ----------
        X : array_like of float32/float64, shape (N, d)
        y : None
            Ignored.

        Returns
        -------
        self

        Raises
        ------
        TypeError
            ``X`` not real floats (float16 refused).
        ValueError
            NaN/inf, N < 2, bad options, rank-deficient points (``N <= d`` or in a proper
            affine subspace) without ``ridge``, or an ellipsoid built with :meth:`from_params`.

        Warns
        -----
        RuntimeWarning
            The fast solver stopped at ``max_iter`` above ``tol``.
        """
        H, t0 = self._start_fit(X)
        solver = check_choice(self.solver, "solver", _SOLVERS)
        q = check_probability(self.quantile, "quantile")
        tol = check_positive(self.tol, "tol")
        max_iter = check_positive_int(self.max_iter, "max_iter")
        ridge = None if self.ridge is None else check_positive(self.ridge, "ridge")
        n, d = H.shape
        mu = H.mean(axis=0)
        Hc = H - mu
        if q < 1.0:
            cov = Hc.T @ Hc / max(n - 1, 1)
            P = np.linalg.pinv(cov, hermitian=True)
            Hk, _ = trim(H, np.einsum("ij,ij->i", Hc @ P, Hc), q)
            mu = Hk.mean(axis=0)
            Hc = Hk - mu
        else:
            Hk = H
        # affine rank of the kept points
        _, sv, Vt = np.linalg.svd(Hc, full_matrices=False)  # Vt: (min(N, d), d)
        rank_tol = sv[0] * max(Hc.shape) * np.finfo(np.float64).eps * 16 if sv.size else 0.0
        rank = int(np.sum(sv > rank_tol))
        if rank == 0:
            raise ValueError("X: all points coincide; no ellipsoid of positive volume encloses them")
        if rank < d:
            if ridge is None:
                raise ValueError(
                    f"X: the {Hk.shape[0]} points span an affine subspace of dimension {rank} < d={d} "
                    f"(N <= d or degenerate data); the minimum-volume enclosing ellipsoid is flat "
                    "(volume 0). Pass more points, or ridge=t to fit in the affine hull and give the "
                    "remaining axes semi-axis t explicitly"
                )
            basis = Vt[:rank]
            Z = Hc @ basis.T
        else:
            basis = None
            Z = Hk
        if Z.shape[0] <= Z.shape[1]:  # cannot happen for a genuine affine rank, kept as a guard
            raise ValueError(f"X: need more than {Z.shape[1]} points for the ellipsoid")
        if solver == "cvxpy":
            c, A, name = mvee_cvxpy(Z)
            used, eps, it = f"cvxpy:{name}", float("nan"), 0
        else:
            c, A, eps, it = mvee_fast(Z, tol=tol, max_iter=max_iter, progress=bool(self.progress))
            used = "fast"
            if eps > tol:
                warnings.warn(
                    f"Ellipsoid: the fast solver stopped at max_iter={max_iter} with relative gap "
                    f"{eps:.3g} > tol={tol:g}; the ellipsoid contains every point but its "
                    f"log-volume may exceed the minimum by up to {(d + 1) / 2 * math.log1p(eps):.3g} nats",
                    RuntimeWarning,
                    stacklevel=2,
                )
        if basis is not None:
            center = mu + c @ basis
            from scipy.linalg import null_space

            perp = null_space(basis).T  # (d - rank, d): the directions off the affine hull
            A_full = basis.T @ A @ basis + (perp.T @ perp) / ridge**2
            c_full = center
        else:
            A_full, c_full = A, c
        self._set(c_full, A_full, eps=eps, n_iter=it, ridge=ridge, rank=rank)
        # exact containment in the full space (guards the change of basis)
        g = self._gauge(Hk).max()
        if g > 1.0:
            self._set(c_full, A_full / g**2, eps=eps, n_iter=it, ridge=ridge, rank=rank)
        self.n_features_in_ = d
        self._record_fit(n, Hk.shape[0], q, used, t0)
        return self

    @property
    def log_volume(self) -> float:
        """``log vol(B_d) + sum_i log(semi_axes_i)`` in nats."""
        self._check_fitted()
        return log_unit_ball_volume(self.dim) + float(np.sum(np.log(self.semi_axes_)))

    def _gauge(self, X):
        Y = (X - self.center_) @ self.axes_.T / self.semi_axes_
        return np.sqrt(np.einsum("ij,ij->i", Y, Y))

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
        out = {"paper": float(np.sum(np.log1p(2.0 * s / eps)))}
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
        """The ellipsoid with the same centre and axes, semi-axes times ``factor`` (shape
        matrix ``A / factor^2``; see :meth:`Support.scaled`).

        Raises
        ------
        ValueError, TypeError
            ``factor <= 0`` or not finite; ``NotFittedError`` before a fit.
        """
        self._check_fitted()
        s = check_scale_factor(factor)
        return type(self).from_params(self.center_, self.shape_matrix_ / (s * s))
