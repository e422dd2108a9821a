"""Supports: bounded sets that hold the hidden states, fitted as minimum-volume enclosures.

A *support* ``S`` is a bounded subset of ``R^d`` that contains the hidden states (or the prompt
vectors) in practice. Its volume enters the packing-number bounds (THEORY.md, "Refinements"), and
it is the sampling region of the Monte Carlo cell volumes. Tighter support, tighter bound.

Shapes (each a :class:`Support`; each is both the set and the estimator that fits it):

- :class:`Ball` ``{x : |x - c| <= r}``: minimum enclosing ball (free centre) or the
  origin-centred ball (``r = max |h_i|``); also the L-infinity radius ``rinf_`` of the paper's
  precision ``eps = r_inf 2^-11``.
- :class:`Ellipsoid` ``{x : (x - c)^T A (x - c) <= 1}``: minimum-volume enclosing ellipsoid.
- :class:`Cone` ``{x : |x| <= r, angle(x, axis) <= alpha}``: smallest circular cone holding every
  direction, intersected with the origin-centred enclosing ball.
- :class:`Box` ``{x : lower <= R x <= upper}``: axis-aligned (``R = I``) or principal-axes box.
- :class:`FinalNormShell`: the set certified by the final RMSNorm/LayerNorm, no data needed
  (:func:`support_from_final_norm`).

:func:`fit_support` is the functional front door. Everything about volumes is in log space
(nats), so ``d = 4096`` never overflows.

This module is numpy/scipy only (cvxpy is imported lazily, as the reference solver); it never
imports torch.

References
----------
M. Meyer, M. Michelessa, C. Chaux, V. Y. F. Tan, "How Many Different Outputs Can a Transformer
Generate?", ICML 2026, Sec. 4 (Theorem 4.5 and the support refinements).
"""

from __future__ import annotations

import math
import numbers
import time
import warnings

import numpy as np
from scipy import special

from ._validation import check_array, check_positive, check_positive_int, check_probability, check_seed

__all__ = [
    "Support",
    "Ball",
    "Box",
    "fit_support",
    "log_unit_ball_volume",
]

_CENTERINGS = ("free", "origin")
_SOLVERS = ("auto", "cvxpy", "fast")


# --------------------------------------------------------------------------------------------
# small shared helpers
# --------------------------------------------------------------------------------------------
def log_unit_ball_volume(d: int) -> float:
    """Log-volume (nats) of the unit ball in ``R^d``: ``d/2 log(pi) - lgamma(d/2 + 1)``.

    Parameters
    ----------
    d : int
        Dimension, >= 1.

    Returns
    -------
    float
        ``log vol(B_d)`` in nats; finite for any ``d`` (computed with ``gammaln``).

    Raises
    ------
    TypeError, ValueError
        ``d`` not a positive integer.
    """
    d = check_positive_int(d, "d")
    return 0.5 * d * math.log(math.pi) - float(special.gammaln(0.5 * d + 1.0))


def _log_sphere_area(d: int) -> float:
    """Log of the (d-1)-dimensional area of the unit sphere ``S^{d-1}``: ``log(2 pi^{d/2} / Gamma(d/2))``."""
    return math.log(2.0) + 0.5 * d * math.log(math.pi) - float(special.gammaln(0.5 * d))


def _unit_ball_samples(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """``n`` points uniform in the unit ball of ``R^d``: Gaussian direction, radius ``U^{1/d}``."""
    g = rng.standard_normal((n, d))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    # U^{1/d} computed as exp(log(U)/d) (exact, and stable for large d)
    r = np.exp(np.log(rng.uniform(size=n)) / d)
    return g * r[:, None]


def _check_hidden(H, name: str = "H") -> np.ndarray:
    """Validate hidden states ``(N, d)``: real float32/64, finite, N >= 2; returns float64."""
    H = check_array(H, name, ndim=2)
    if H.shape[0] < 2:
        raise ValueError(f"{name}: a support fit needs at least 2 points, got N={H.shape[0]}")
    if H.shape[1] < 1:
        raise ValueError(f"{name}: expected d >= 1 columns, got shape {H.shape}")
    return H


def _check_choice(value, name: str, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value!r}")
    return value


def _trim(H: np.ndarray, outlyingness: np.ndarray, quantile: float) -> tuple[np.ndarray, int]:
    """Keep the ``ceil(quantile N)`` least outlying rows of ``H`` (at least 2).

    Returns the kept rows (in their original order) and the number dropped.
    """
    n = H.shape[0]
    if quantile >= 1.0:
        return H, 0
    keep = max(2, int(math.ceil(quantile * n)))
    if keep >= n:
        return H, 0
    idx = np.argpartition(outlyingness, keep - 1)[:keep]
    idx.sort()
    return H[idx], n - keep


def _import_cvxpy():
    try:
        import cvxpy as cp
    except ImportError as exc:  # pragma: no cover - cvxpy is a declared dependency
        raise ImportError("solver='cvxpy' needs the cvxpy package") from exc
    return cp


def _cvxpy_solve(problem, name: str):
    """Solve with Clarabel when cvxpy has it (interior point, ~1e-8 accuracy), else SCS."""
    cp = _import_cvxpy()
    installed = cp.installed_solvers()
    solver = "CLARABEL" if "CLARABEL" in installed else "SCS"
    kwargs = {} if solver == "CLARABEL" else {"eps": 1e-9, "max_iters": 200_000}
    problem.solve(solver=solver, **kwargs)
    if problem.status not in ("optimal", "optimal_inaccurate"):
        raise RuntimeError(f"{name}: cvxpy ({solver}) returned status {problem.status!r}")
    return solver


# --------------------------------------------------------------------------------------------
# base class
# --------------------------------------------------------------------------------------------
class Support:
    """Base class of every support: a bounded set in ``R^d`` and the estimator that fits it.

    Subclasses implement ``fit(H)``, ``log_volume``, ``_gauge(X)`` (a number <= 1 exactly for
    points inside) and ``sample``. Construction with explicit parameters builds a ready
    support; construction without them gives an estimator to ``fit``.

    Attributes
    ----------
    shape : str
        ``"ball"``, ``"ellipsoid"``, ``"cone"``, ``"box"`` or ``"final_norm"``.
    dim : int
        The ambient dimension ``d``.
    log_volume : float
        Lebesgue volume of the set in ``R^d``, in nats (never overflows).
    n_samples_ : int
        Number of rows given to ``fit`` (``None`` for a support built directly).
    n_fit_ : int
        Rows actually used (after ``quantile`` trimming).
    n_dropped_ : int
        Rows dropped as the most outlying (``n_samples_ - n_fit_``).
    solver_ : str
        The solver used (``"fast"``, ``"cvxpy:CLARABEL"``, ``"closed_form"``, ...).
    fit_seconds_ : float
        Wall time of the fit.
    """

    shape: str = "support"

    def __init__(self):
        self.n_samples_ = None
        self.n_fit_ = None
        self.n_dropped_ = 0
        self.quantile_ = 1.0
        self.solver_ = "given"
        self.fit_seconds_ = 0.0

    # -- fitted-state helpers ---------------------------------------------------------------
    def _is_fitted(self) -> bool:
        return getattr(self, "_d", None) is not None

    def _require_fitted(self):
        if not self._is_fitted():
            raise RuntimeError(
                f"this {type(self).__name__} is not fitted: call .fit(H) or build it with "
                "explicit parameters"
            )

    def _record_fit(self, n_samples: int, n_fit: int, quantile: float, solver: str, t0: float):
        self.n_samples_ = int(n_samples)
        self.n_fit_ = int(n_fit)
        self.n_dropped_ = int(n_samples - n_fit)
        self.quantile_ = float(quantile)
        self.solver_ = solver
        self.fit_seconds_ = time.perf_counter() - t0

    @property
    def dim(self) -> int:
        """The ambient dimension ``d`` (int)."""
        self._require_fitted()
        return int(self._d)

    @property
    def log_volume(self) -> float:  # pragma: no cover - overridden
        raise RuntimeError(f"{type(self).__name__} does not define a volume")

    def _check_points(self, X, name: str = "X") -> np.ndarray:
        self._require_fitted()
        X = check_array(X, name, ndim=(1, 2))
        if X.ndim == 1:
            X = X[None, :]
        if X.shape[1] != self._d:
            raise ValueError(
                f"{name}: expected points of dimension d={self._d} (shape (N, {self._d})), got "
                f"shape {X.shape}"
            )
        return X

    def _gauge(self, X: np.ndarray) -> np.ndarray:  # pragma: no cover - overridden
        raise RuntimeError(f"{type(self).__name__} does not define a gauge")

    def gauge(self, X) -> np.ndarray:
        """Scale-free membership value: ``<= 1`` exactly for points inside the support.

        Parameters
        ----------
        X : array_like of float, shape (N, d) or (d,)

        Returns
        -------
        numpy.ndarray of float64, shape (N,)
            For a ball ``|x - c| / r``; an ellipsoid ``sqrt((x-c)^T A (x-c))``; a box the largest
            coordinate's position relative to the half-width from the centre; a cone the larger
            of ``|x| / r`` and ``angle / alpha``.

        Raises
        ------
        ValueError
            Wrong dimension, NaN/inf. TypeError: not a float array (float16 refused).
        """
        return self._gauge(self._check_points(X))

    def contains(self, X, tol: float = 1e-9) -> np.ndarray:
        """Whether each point lies in the support, up to a relative tolerance.

        Parameters
        ----------
        X : array_like of float, shape (N, d) or (d,)
            Points (float32 or float64).
        tol : float, default 1e-9
            Relative slack: a point is inside when ``gauge(x) <= 1 + tol`` (see :meth:`gauge`).

        Returns
        -------
        numpy.ndarray of bool, shape (N,)

        Raises
        ------
        ValueError
            ``X`` of the wrong dimension, NaN/inf, negative ``tol``.
        TypeError
            ``X`` not a real float array (float16 refused).
        """
        tol = check_positive(tol, "tol", allow_zero=True)
        return self.gauge(X) <= 1.0 + tol

    def sample(self, n: int, seed=None) -> np.ndarray:  # pragma: no cover - overridden
        raise RuntimeError(f"{type(self).__name__} cannot sample")

    def _params(self) -> dict:  # pragma: no cover - overridden
        return {}

    def to_dict(self) -> dict:
        """A JSON-able summary: shape, dim, log_volume (nats), parameters and fit details.

        Returns
        -------
        dict
            Arrays become lists of floats.
        """
        self._require_fitted()
        out = {"shape": self.shape, "dim": self.dim, "log_volume": float(self.log_volume)}
        for k, v in self._params().items():
            if isinstance(v, np.ndarray):
                v = v.tolist()
            elif isinstance(v, (np.floating, np.integer)):
                v = v.item()
            out[k] = v
        out.update(
            n_samples=self.n_samples_,
            n_fit=self.n_fit_,
            n_dropped=self.n_dropped_,
            quantile=self.quantile_,
            solver=self.solver_,
            fit_seconds=float(self.fit_seconds_),
        )
        return out

    def __repr__(self) -> str:
        if not self._is_fitted():
            return f"{type(self).__name__}(unfitted)"
        return f"{type(self).__name__}(dim={self.dim}, log_volume={self.log_volume:.6g})"


# --------------------------------------------------------------------------------------------
# minimum enclosing ball: Frank-Wolfe with away steps on the dual (Yildirim 2008)
# --------------------------------------------------------------------------------------------
def _meb_fast(X: np.ndarray, tol: float = 1e-10, max_iter: int = 200_000):
    """Minimum enclosing ball of the rows of ``X`` by Frank-Wolfe with away steps.

    Dual problem: ``max_a  phi(a) = sum_i a_i |x_i|^2 - |sum_i a_i x_i|^2`` over the simplex; any
    ``a`` gives the lower bound ``phi(a) <= r*^2`` and the centre ``c = X^T a`` the upper bound
    ``R^2 = max_i |x_i - c|^2 >= r*^2``. Iterate until ``R^2 / phi - 1 <= tol`` (so the returned
    radius is within a relative ``tol / 2`` of the optimum). Yildirim (2008), "Two algorithms for
    the minimum enclosing ball problem", SIAM J. Optim. 19(3), Algorithm 2; linear convergence.

    Returns ``(center, radius, gap, n_iter, weights)``; the radius is the exact maximum distance
    from the returned centre, so every point is inside.
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
    dist = np.sqrt(np.einsum("ij,ij->i", Y - c, Y - c))
    radius = float(dist.max())
    center = c + shift
    # exact distances from the returned centre (after the shift back)
    radius = max(radius, float(np.sqrt(np.einsum("ij,ij->i", X - center, X - center)).max()))
    return center, radius, float(gap), it, a


def _meb_cvxpy(X: np.ndarray):
    """Minimum enclosing ball by cvxpy: minimise ``r`` s.t. ``|x_i - c| <= r`` (an SOCP)."""
    cp = _import_cvxpy()
    shift = X.mean(axis=0)
    Y = X - shift
    c = cp.Variable(X.shape[1])
    r = cp.Variable()
    prob = cp.Problem(cp.Minimize(r), [cp.norm(Y - c[None, :], 2, axis=1) <= r])
    solver = _cvxpy_solve(prob, "Ball")
    center = np.asarray(c.value, dtype=np.float64) + shift
    radius = float(np.sqrt(np.einsum("ij,ij->i", X - center, X - center)).max())
    return center, radius, solver


class Ball(Support):
    """The ball ``{x : |x - c| <= r}``; as an estimator, the minimum enclosing ball.

    Build directly with ``Ball(center, radius)`` (``center=None`` with ``dim=`` gives the
    origin-centred ball) or fit with ``Ball(centering="free").fit(H)``.

    Parameters
    ----------
    center : array_like of float, shape (d,), or None
        The centre of a ball built directly. ``None`` (with ``dim``) means the origin. Passing the
        strings ``"free"``/``"origin"`` here is accepted as ``centering``.
    radius : float, optional
        The radius of a ball built directly (> 0). Without it the object is an unfitted estimator.
    dim : int, optional
        The dimension, needed only for ``Ball(center=None, radius=r, dim=d)``.
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
        ``r_inf`` in ``eps = r_inf 2^-11``); for a ball built directly, ``radius_`` (the
        L-infinity extent of the ball itself).
    gap_ : float
        Certified relative duality gap on ``r^2`` (0 for closed forms; NaN for cvxpy).
    n_iter_ : int
        Iterations of the fast solver.

    Raises
    ------
    ValueError, TypeError
        Bad input (see :meth:`fit`).

    Notes
    -----
    ``log_volume = d/2 log(pi) - lgamma(d/2 + 1) + d log r`` (nats).

    Examples
    --------
    >>> import numpy as np
    >>> H = np.random.default_rng(0).standard_normal((200, 3))
    >>> ball = Ball().fit(H)
    >>> bool(ball.contains(H).all())
    True
    """

    shape = "ball"

    def __init__(self, center=None, radius=None, *, dim=None, centering="free", quantile=1.0,
                 solver="auto", tol=1e-10):
        super().__init__()
        if isinstance(center, str):
            centering, center = center, None
        self.center = center
        self.radius = radius
        self.dim_param = dim
        self.centering = centering
        self.quantile = quantile
        self.solver = solver
        self.tol = tol
        self._d = None
        if radius is not None:
            r = check_positive(radius, "radius")
            if center is None:
                if dim is None:
                    raise ValueError("Ball(center=None, radius=r) needs dim=d for the origin-centred ball")
                d = check_positive_int(dim, "dim")
                c = np.zeros(d)
            else:
                c = check_array(center, "center", ndim=1)
                if dim is not None and check_positive_int(dim, "dim") != c.shape[0]:
                    raise ValueError(f"dim={dim} does not match center of shape {c.shape}")
            self._set(c, r, rinf=r, gap=0.0, n_iter=0)
        elif center is not None:
            raise ValueError("Ball(center=...) needs radius= too (or call fit)")

    def _set(self, center, radius, *, rinf, gap, n_iter):
        self.center_ = np.asarray(center, dtype=np.float64)
        self.radius_ = float(radius)
        self.rinf_ = float(rinf)
        self.gap_ = float(gap)
        self.n_iter_ = int(n_iter)
        self._d = self.center_.shape[0]

    def fit(self, H):
        """Fit the enclosing ball to hidden states.

        Parameters
        ----------
        H : array_like of float32/float64, shape (N, d)
            Hidden states, N >= 2, finite.

        Returns
        -------
        self

        Raises
        ------
        TypeError
            ``H`` not real floats (float16 refused).
        ValueError
            NaN/inf, N < 2, unknown ``centering``/``solver``, ``quantile`` outside (0, 1], or all
            points at the centre (zero radius).
        """
        t0 = time.perf_counter()
        H = _check_hidden(H)
        centering = _check_choice(self.centering, "centering", _CENTERINGS)
        solver = _check_choice(self.solver, "solver", _SOLVERS)
        q = check_probability(self.quantile, "quantile")
        tol = check_positive(self.tol, "tol")
        n = H.shape[0]
        if centering == "origin":
            Hk, _ = _trim(H, np.linalg.norm(H, axis=1), q)
            c = np.zeros(H.shape[1])
            r = float(np.linalg.norm(Hk, axis=1).max())
            used, gap, it = "closed_form", 0.0, 0
        else:
            med = np.median(H, axis=0)
            Hk, _ = _trim(H, np.linalg.norm(H - med, axis=1), q)
            if solver == "cvxpy":
                c, r, name = _meb_cvxpy(Hk)
                used, gap, it = f"cvxpy:{name}", float("nan"), 0
            else:
                c, r, gap, it, _ = _meb_fast(Hk, tol=tol)
                used = "fast"
        if not r > 0:
            raise ValueError("H: all points coincide with the centre; the enclosing ball has zero radius")
        rinf = float(np.abs(Hk - c).max())
        self._set(c, r, rinf=rinf, gap=gap, n_iter=it)
        self._record_fit(n, Hk.shape[0], q, used, t0)
        return self

    @property
    def origin_centred(self) -> bool:
        """True when the centre is exactly the origin."""
        self._require_fitted()
        return bool(not np.any(self.center_))

    @property
    def log_volume(self) -> float:
        """``d/2 log(pi) - lgamma(d/2 + 1) + d log r`` in nats."""
        self._require_fitted()
        return log_unit_ball_volume(self._d) + self._d * math.log(self.radius_)

    def _gauge(self, X):
        return np.linalg.norm(X - self.center_, axis=1) / self.radius_

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
        """
        self._require_fitted()
        n = check_positive_int(n, "n")
        rng = check_seed(seed)
        return self.center_ + self.radius_ * _unit_ball_samples(rng, n, self._d)

    def _params(self):
        return {
            "center": self.center_,
            "radius": self.radius_,
            "rinf": self.rinf_,
            "origin_centred": self.origin_centred,
            "gap": self.gap_,
            "n_iter": self.n_iter_,
        }


# --------------------------------------------------------------------------------------------
# box
# --------------------------------------------------------------------------------------------
class Box(Support):
    """The box ``{x : lower <= R x <= upper}`` (``R = I``: axis-aligned).

    Build directly with ``Box(lower, upper, rotation=None)`` or fit with ``Box().fit(H)``
    (``Box(rotation="pca").fit(H)`` for a principal-axes box).

    Parameters
    ----------
    lower, upper : array_like of float, shape (d,), optional
        Bounds in the box's own coordinates ``y = R x``; ``upper > lower`` in every coordinate.
    rotation : None, "pca", or array_like of float, shape (d, d)
        ``None``: axis-aligned. ``"pca"`` (fit only): rows of ``rotation_`` are the principal
        axes of the (kept) points, in decreasing variance. A matrix: its rows are the box axes and
        must be orthonormal.
    quantile : float in (0, 1], default 1.0
        Robust fit: drop the points with the largest ``max_k |y_k - median_k| / MAD_k`` (in the
        box's coordinates) before taking min/max.
    min_width : float, optional
        A side of zero width makes the volume zero (``log_volume = -inf``), which the bounds cannot
        use; by default the fit raises ``ValueError``. With ``min_width=w`` such sides are widened
        symmetrically to width ``w``, and the widened axes are recorded in ``widened_``.

    Attributes
    ----------
    lower_, upper_ : ndarray of float64, shape (d,)
    rotation_ : ndarray of float64, shape (d, d), or None
        Rows are the box axes.
    widened_ : list of int
        Axes widened to ``min_width``.

    Notes
    -----
    ``log_volume = sum_k log(upper_k - lower_k)`` (nats); a rotation preserves volume. The
    paper's box refinement ``log P <= sum_k log(1 + a_k / eps)`` uses the extents
    ``a_k = upper_k - lower_k`` (THEORY.md).

    Examples
    --------
    >>> import numpy as np
    >>> box = Box(np.zeros(2), np.ones(2))
    >>> round(box.log_volume, 12)
    0.0
    """

    shape = "box"

    def __init__(self, lower=None, upper=None, rotation=None, *, quantile=1.0, min_width=None):
        super().__init__()
        self.lower = lower
        self.upper = upper
        self.rotation = rotation
        self.quantile = quantile
        self.min_width = min_width
        self._d = None
        if lower is not None or upper is not None:
            if lower is None or upper is None:
                raise ValueError("Box needs both lower and upper (or neither, then call fit)")
            lo = check_array(lower, "lower", ndim=1)
            hi = check_array(upper, "upper", ndim=1, shape=(lo.shape[0],))
            if not np.all(hi > lo):
                bad = np.flatnonzero(~(hi > lo))
                raise ValueError(f"upper must exceed lower in every coordinate; fails at {bad[:10].tolist()}")
            R = None
            if rotation is not None:
                if isinstance(rotation, str):
                    raise ValueError("rotation='pca' is a fit option; a built box needs a (d, d) matrix or None")
                R = self._check_rotation(rotation, lo.shape[0])
            self._set(lo, hi, R, [])

    @staticmethod
    def _check_rotation(rotation, d):
        R = check_array(rotation, "rotation", ndim=2, shape=(d, d))
        if not np.allclose(R @ R.T, np.eye(d), atol=1e-8):
            raise ValueError("rotation: rows must be orthonormal (R R^T = I)")
        return R

    def _set(self, lo, hi, R, widened):
        self.lower_ = np.asarray(lo, dtype=np.float64)
        self.upper_ = np.asarray(hi, dtype=np.float64)
        self.rotation_ = R
        self.widened_ = list(widened)
        self._d = self.lower_.shape[0]

    def _coords(self, X):
        return X if self.rotation_ is None else X @ self.rotation_.T

    def fit(self, H):
        """Fit the min/max box of the hidden states.

        Parameters
        ----------
        H : array_like of float32/float64, shape (N, d)

        Returns
        -------
        self

        Raises
        ------
        TypeError
            ``H`` not real floats (float16 refused).
        ValueError
            NaN/inf, N < 2, bad ``quantile``/``rotation``, or a side of zero width without
            ``min_width``.
        """
        t0 = time.perf_counter()
        H = _check_hidden(H)
        q = check_probability(self.quantile, "quantile")
        d = H.shape[1]
        R = None
        if isinstance(self.rotation, str):
            if self.rotation != "pca":
                raise ValueError(f"rotation: expected None, 'pca' or a (d, d) matrix, got {self.rotation!r}")
            Hc = H - H.mean(axis=0)
            # principal axes: right singular vectors, decreasing variance
            _, _, Vt = np.linalg.svd(Hc, full_matrices=True)
            R = np.ascontiguousarray(Vt)
        elif self.rotation is not None:
            R = self._check_rotation(self.rotation, d)
        Y = H if R is None else H @ R.T
        med = np.median(Y, axis=0)
        mad = np.median(np.abs(Y - med), axis=0)
        mad = np.where(mad > 0, mad, 1.0)
        Yk, _ = _trim(Y, (np.abs(Y - med) / mad).max(axis=1), q)
        lo, hi = Yk.min(axis=0), Yk.max(axis=0)
        widened = []
        zero = np.flatnonzero(~(hi > lo))
        if zero.size:
            if self.min_width is None:
                raise ValueError(
                    f"H: the box has zero width along {zero.size} axis/axes (first {zero[:10].tolist()}); "
                    "its volume is 0. Pass min_width=w to widen those sides to w explicitly"
                )
            w = check_positive(self.min_width, "min_width")
            mid = 0.5 * (lo[zero] + hi[zero])
            lo[zero], hi[zero] = mid - 0.5 * w, mid + 0.5 * w
            widened = zero.tolist()
        self._set(lo, hi, R, widened)
        self._record_fit(H.shape[0], Yk.shape[0], q, "closed_form", t0)
        return self

    @property
    def log_volume(self) -> float:
        """``sum_k log(upper_k - lower_k)`` in nats."""
        self._require_fitted()
        return float(np.sum(np.log(self.upper_ - self.lower_)))

    @property
    def extents_(self) -> np.ndarray:
        """Side lengths ``upper_ - lower_``, shape (d,)."""
        self._require_fitted()
        return self.upper_ - self.lower_

    def _gauge(self, X):
        Y = self._coords(X)
        mid = 0.5 * (self.lower_ + self.upper_)
        half = 0.5 * (self.upper_ - self.lower_)
        return (np.abs(Y - mid) / half).max(axis=1)

    def sample(self, n: int, seed=None) -> np.ndarray:
        """``n`` points uniform in the box.

        Parameters
        ----------
        n : int
        seed : None, int or numpy Generator

        Returns
        -------
        numpy.ndarray of float64, shape (n, d)
            Uniform in the box's coordinates, mapped back by ``x = R^T y``.
        """
        self._require_fitted()
        n = check_positive_int(n, "n")
        rng = check_seed(seed)
        Y = self.lower_ + (self.upper_ - self.lower_) * rng.uniform(size=(n, self._d))
        return Y if self.rotation_ is None else Y @ self.rotation_

    def _params(self):
        return {
            "lower": self.lower_,
            "upper": self.upper_,
            "rotation": None if self.rotation_ is None else "given" if not isinstance(self.rotation, str) else self.rotation,
            "rotation_matrix": self.rotation_,
            "widened": self.widened_,
        }


# --------------------------------------------------------------------------------------------
# front door
# --------------------------------------------------------------------------------------------
_SHAPES = {"ball": Ball, "box": Box}


def fit_support(H, shape, *, center="free", quantile=1.0, solver="auto", **kw) -> Support:
    """Fit the smallest support of a given shape that holds the hidden states.

    Parameters
    ----------
    H : array_like of float32/float64, shape (N, d)
        Hidden states (N >= 2, finite).
    shape : {"ball", "ellipsoid", "cone", "box"}
        The shape to fit. The final-norm shell is not a fit: see :func:`support_from_final_norm`.
    center : {"free", "origin"}, default "free"
        For the ball: free centre (minimum enclosing ball) or origin-centred (max norm). Cones
        are always origin-centred; ellipsoid and box ignore ``"free"`` and refuse ``"origin"``.
    quantile : float in (0, 1], default 1.0
        Fraction of points kept; the most outlying are trimmed first (per shape, see each class).
    solver : {"auto", "fast", "cvxpy"}, default "auto"
        See each class.
    **kw
        Further options of the class (``tol``, ``rotation``, ``ridge``, ``min_width``, ...).

    Returns
    -------
    Support
        The fitted support.

    Raises
    ------
    ValueError
        Unknown shape, bad options, or bad ``H`` (NaN/inf, N < 2, ...).
    TypeError
        ``H`` not real floats (float16 refused).
    """
    if not isinstance(shape, str) or shape not in _SHAPES:
        if shape == "final_norm":
            raise ValueError("shape='final_norm' is not a fit: use support_from_final_norm(unembedding)")
        raise ValueError(f"shape: expected one of {tuple(_SHAPES)}, got {shape!r}")
    _check_choice(center, "center", _CENTERINGS)
    _check_choice(solver, "solver", _SOLVERS)
    if shape == "ball":
        est = Ball(centering=center, quantile=quantile, solver=solver, **kw)
    elif shape == "box":
        est = Box(quantile=quantile, **kw)
    return est.fit(H)
