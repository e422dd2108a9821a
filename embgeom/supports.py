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
import time
import warnings

import numpy as np
from scipy import special

from ._validation import check_array, check_positive, check_positive_int, check_probability, check_seed

__all__ = [
    "Support",
    "Ball",
    "Box",
    "Ellipsoid",
    "Cone",
    "FinalNormShell",
    "fit_support",
    "support_from_final_norm",
    "supports_report_section",
    "log_unit_ball_volume",
    "log_cap_fraction",
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
            _, _, Vt = np.linalg.svd(Hc, full_matrices=False)  # thin: U would be (N, N)
            if Vt.shape[0] < d:  # N < d: complete the basis with the null space
                from scipy.linalg import null_space

                Vt = np.vstack([Vt, null_space(Vt).T])
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
        # widths at rounding level (e.g. a PCA axis off the data's affine hull) count as zero
        floor = 64 * np.finfo(np.float64).eps * float(np.abs(Yk).max())
        zero = np.flatnonzero(~(hi - lo > floor))
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
            "widened": self.widened_,
        }


# --------------------------------------------------------------------------------------------
# minimum-volume enclosing ellipsoid: Todd-Yildirim with drop steps, batched
# --------------------------------------------------------------------------------------------
def _kumar_yildirim_init(Y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices of the Kumar-Yildirim initial core set (at most ``2 d`` points).

    For ``d`` directions, each orthogonal to the span of the previous extreme differences, keep
    the points of largest and smallest projection (Kumar & Yildirim 2005, Algorithm 3.1).
    """
    n, d = Y.shape
    idx = []
    basis = np.zeros((0, d))
    for _ in range(d):
        b = rng.standard_normal(d)
        if basis.shape[0]:
            b -= basis.T @ (basis @ b)
        nb = np.linalg.norm(b)
        if nb == 0:
            break
        proj = Y @ (b / nb)
        i, j = int(np.argmax(proj)), int(np.argmin(proj))
        idx += [i, j]
        v = Y[i] - Y[j]
        if basis.shape[0]:
            v -= basis.T @ (basis @ v)
        nv = np.linalg.norm(v)
        if nv > 1e-12 * (np.linalg.norm(Y[i]) + np.linalg.norm(Y[j]) + 1e-300):
            basis = np.vstack([basis, v / nv])
    return np.unique(np.asarray(idx, dtype=np.int64))


def _mvee_fast(X: np.ndarray, tol: float = 1e-7, max_iter: int = 1_000_000, seed: int = 0,
               progress: bool = False):
    """Minimum-volume enclosing ellipsoid by the Todd-Yildirim algorithm with drop steps.

    Works on the lifted points ``q_i = (x_i - mean, 1)`` in ``R^m``, ``m = d + 1``, and the dual
    ``max_u log det M(u)``, ``M(u) = sum_i u_i q_i q_i^T`` over the simplex, whose gradient is the
    vector of Mahalanobis norms ``omega_i = q_i^T M(u)^{-1} q_i``. Each step moves weight to the
    point of largest ``omega`` (increase) or from the active point of smallest ``omega``
    (decrease, possibly dropping it) with the exact line search
    ``lambda = (omega_j - m) / (m (omega_j - 1))``; ``M^{-1}`` and ``omega`` follow by
    Sherman-Morrison rank-one updates. Steps are taken in batches: ``omega``'s rank-one updates
    need ``Q M^{-1} q_j`` for the stepped points, computed for a batch of candidates at once (one
    GEMM instead of a GEMV per step) and kept current by rank-one BLAS updates, so the exact
    sequence of line searches is unchanged; a batch ends when its best candidate violates the
    optimality conditions by less than half of the worst point overall.

    Stops when ``max_i omega_i <= m (1 + tol)`` and ``min_{u_i > 0} omega_i >= m (1 - tol)``
    (``tol``-approximate optimality and complementarity, Todd & Yildirim 2007); ``omega`` is
    recomputed from scratch before the stop is accepted.

    Initialisation: the Kumar-Yildirim core set (Kumar & Yildirim 2005).

    Returns ``(center, A, eps, n_iter)`` with ``A`` already scaled so that the largest
    ``(x - c)^T A (x - c)`` over the points is exactly 1.
    """
    from scipy.linalg.blas import dger

    n, d = X.shape
    m = d + 1
    shift = X.mean(axis=0)
    Y = X - shift
    Q = np.empty((n, m))
    Q[:, :d] = Y
    Q[:, d] = 1.0
    u = np.zeros(n)
    core = _kumar_yildirim_init(Y, np.random.default_rng(seed))
    u[core] = 1.0 / core.size

    def refresh(u):
        act = np.flatnonzero(u > 0)
        M = Q[act].T @ (u[act, None] * Q[act])
        Minv = np.linalg.inv(M)
        Minv = 0.5 * (Minv + Minv.T)
        om = np.einsum("ij,ij->i", Q @ Minv, Q)
        return Minv, om

    try:
        Minv, om = refresh(u)
    except np.linalg.LinAlgError:
        u[:] = 1.0 / n
        Minv, om = refresh(u)
    k = 1 if m <= 64 else 32
    steps = 0
    batches = 0
    fresh = True
    eps = np.inf
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=None, desc="ellipsoid (Todd-Yildirim)", unit="step", leave=False)
    while steps < max_iter:
        active = u > 0
        v_up = om / m - 1.0
        v_dn = np.where(active, 1.0 - om / m, -np.inf)
        eps = max(float(v_up.max()), float(v_dn.max()))
        if eps <= tol:
            if fresh:
                break
            Minv, om = refresh(u)
            fresh = True
            continue
        fresh = False
        kk = min(k, n)
        up = np.argpartition(-v_up, kk - 1)[:kk] if kk < n else np.arange(n)
        act_idx = np.flatnonzero(active)
        kd = min(max(k // 2, 1), act_idx.size)
        dn = act_idx[np.argpartition(-v_dn[act_idx], kd - 1)[:kd]] if kd < act_idx.size else act_idx
        B = np.unique(np.concatenate([up, dn]))
        G = np.asfortranarray(Minv @ Q[B].T)  # (m, b): M^{-1} q_B, stored scaled by 1/s
        V = np.asfortranarray(Q @ G)  # (n, b): Q M^{-1} q_B, stored scaled by 1/s
        s = 1.0
        used, coefs = [], []
        scale = 1.0
        for _ in range(2 * B.size):
            omB = om[B]
            cu = omB / m - 1.0
            cd = np.where(u[B] > 0, 1.0 - omB / m, -np.inf)
            lu, ld = int(np.argmax(cu)), int(np.argmax(cd))
            lcol, viol = (lu, cu[lu]) if cu[lu] >= cd[ld] else (ld, cd[ld])
            worst = max(float(om.max()) / m - 1.0, 1.0 - float(om[u > 0].min()) / m)
            if viol <= tol or viol < 0.5 * worst:
                break
            j = int(B[lcol])
            w = om[j]
            lam = (w - m) / (m * (w - 1.0))
            if lam < 0:
                lam = max(lam, -u[j] / (1.0 - u[j]))  # drop step: u_j reaches 0
            den = (1.0 - lam) + lam * w
            vj = V[:, lcol] * s
            row = V[B, lcol].copy()
            gj = G[:, lcol] * s
            om = (om - (lam / den) * vj * vj) / (1.0 - lam)
            a = -(lam / den) * s
            V = dger(a, V[:, lcol].copy(), row, a=V, overwrite_a=1)
            G = dger(a, G[:, lcol].copy(), row, a=G, overwrite_a=1)
            s /= 1.0 - lam
            # M^{-1}_t = (M^{-1}_{t-1} - (lam/den) g g^T) / (1 - lam), accumulated in product form
            coefs = [c / (1.0 - lam) for c in coefs]
            coefs.append(lam / den / (1.0 - lam))
            used.append(gj)
            scale /= 1.0 - lam
            u *= 1.0 - lam
            u[j] += lam
            if u[j] < 0:
                u[j] = 0.0
            steps += 1
        if used:
            Gu = np.array(used).T
            Minv = scale * Minv - (Gu * np.asarray(coefs)) @ Gu.T
            Minv = 0.5 * (Minv + Minv.T)
        batches += 1
        if bar is not None:
            bar.update(len(used))
            bar.set_postfix(eps=f"{eps:.2e}")
        if batches % (200 if k == 1 else 25) == 0:  # refresh against drift
            u = np.clip(u, 0, None)
            u /= u.sum()
            Minv, om = refresh(u)
            fresh = True
    if bar is not None:
        bar.close()
    c = Y.T @ u
    Sig = (Y.T * u) @ Y - np.outer(c, c)
    A = np.linalg.inv(Sig) / d
    A = 0.5 * (A + A.T)
    D = Y - c
    A /= float(np.einsum("ij,ij->i", D @ A, D).max())
    return c + shift, A, float(eps), steps


def _mvee_cvxpy(X: np.ndarray):
    """MVEE by cvxpy: maximise ``log det B`` s.t. ``|B x_i + b| <= 1``; ``A = B^2``, ``c = -B^{-1} b``."""
    cp = _import_cvxpy()
    n, d = X.shape
    shift = X.mean(axis=0)
    scale = float(np.abs(X - shift).max())
    Y = (X - shift) / scale
    B = cp.Variable((d, d), PSD=True)
    b = cp.Variable(d)
    prob = cp.Problem(cp.Maximize(cp.log_det(B)), [cp.norm(Y @ B + b[None, :], 2, axis=1) <= 1])
    solver = _cvxpy_solve(prob, "Ellipsoid")
    Bv = np.asarray(B.value, dtype=np.float64)
    Bv = 0.5 * (Bv + Bv.T)
    c = -np.linalg.solve(Bv, np.asarray(b.value, dtype=np.float64))
    A = (Bv @ Bv) / scale**2
    center = c * scale + shift
    D = X - center
    A /= float(np.einsum("ij,ij->i", D @ A, D).max())
    return center, A, solver


class Ellipsoid(Support):
    """The ellipsoid ``{x : (x - c)^T A (x - c) <= 1}``; as an estimator, the minimum-volume
    enclosing ellipsoid (MVEE, Loewner-John ellipsoid).

    Parameters
    ----------
    center : array_like of float, shape (d,), optional
        Centre of an ellipsoid built directly (with ``shape_matrix``).
    shape_matrix : array_like of float, shape (d, d), optional
        Symmetric positive definite ``A``.
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
        Final relative optimality gap of the fast solver (NaN for cvxpy, 0 for a built one).
    gap_nats_ : float
        ``(d + 1)/2 log(1 + eps_)``: the bound on the excess log-volume over the MVEE that the
        ``eps``-optimality certificate gives (Todd & Yildirim 2007; Kumar & Yildirim 2005).
    ridge_ : float or None
    affine_rank_ : int
        Dimension of the affine hull of the fitted points (``d`` when full).
    n_iter_ : int

    Raises
    ------
    ValueError
        A built ellipsoid whose ``shape_matrix`` is not symmetric positive definite; see
        :meth:`fit` for fits.

    Notes
    -----
    ``log_volume = log vol(B_d) + sum_i log s_i = log vol(B_d) - 1/2 log det A`` (nats).

    The fast solver ends at a tolerance, after which ``A`` is scaled so that the farthest point
    lies exactly on the boundary: every point is contained. Each step costs one rank-one update
    of ``M^{-1}`` (``d^2``) and of the Mahalanobis norms of the candidates (``N`` each); the
    product ``Q M^{-1} q_B`` for a batch of candidates is one GEMM. Its convergence is linear
    but slows down when many points are in the optimal support (i.i.d. Gaussian data in high
    d: most of them); ``N >> d^2`` is where the support is a small fraction.

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

    def __init__(self, center=None, shape_matrix=None, *, quantile=1.0, solver="auto", tol=1e-7,
                 ridge=None, max_iter=1_000_000, progress=False):
        super().__init__()
        self.center = center
        self.shape_matrix = shape_matrix
        self.quantile = quantile
        self.solver = solver
        self.tol = tol
        self.ridge = ridge
        self.max_iter = max_iter
        self.progress = progress
        self._d = None
        if center is not None or shape_matrix is not None:
            if center is None or shape_matrix is None:
                raise ValueError("Ellipsoid needs both center and shape_matrix (or neither, then call fit)")
            c = check_array(center, "center", ndim=1)
            A = check_array(shape_matrix, "shape_matrix", ndim=2, shape=(c.shape[0], c.shape[0]))
            self._set(c, A, eps=0.0, n_iter=0, ridge=None, rank=c.shape[0])

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
        self._d = d

    def fit(self, H):
        """Fit the minimum-volume enclosing ellipsoid.

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
            NaN/inf, N < 2, bad options, or rank-deficient points (``N <= d`` or in a proper
            affine subspace) without ``ridge``.
        """
        t0 = time.perf_counter()
        H = _check_hidden(H)
        solver = _check_choice(self.solver, "solver", _SOLVERS)
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
            Hk, _ = _trim(H, np.einsum("ij,ij->i", Hc @ P, Hc), q)
            mu = Hk.mean(axis=0)
            Hc = Hk - mu
        else:
            Hk = H
        # affine rank of the kept points
        _, sv, Vt = np.linalg.svd(Hc, full_matrices=False)  # Vt: (min(N, d), d)
        rank_tol = sv[0] * max(Hc.shape) * np.finfo(np.float64).eps * 16 if sv.size else 0.0
        rank = int(np.sum(sv > rank_tol))
        if rank == 0:
            raise ValueError("H: all points coincide; no ellipsoid of positive volume encloses them")
        if rank < d:
            if ridge is None:
                raise ValueError(
                    f"H: the {Hk.shape[0]} points span an affine subspace of dimension {rank} < d={d} "
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
            raise ValueError(f"H: need more than {Z.shape[1]} points for the ellipsoid")
        if solver == "cvxpy":
            c, A, name = _mvee_cvxpy(Z)
            used, eps, it = f"cvxpy:{name}", float("nan"), 0
        else:
            c, A, eps, it = _mvee_fast(Z, tol=tol, max_iter=max_iter, progress=bool(self.progress))
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
        self._record_fit(n, Hk.shape[0], q, used, t0)
        return self

    @property
    def log_volume(self) -> float:
        """``log vol(B_d) + sum_i log(semi_axes_i)`` in nats."""
        self._require_fitted()
        return log_unit_ball_volume(self._d) + float(np.sum(np.log(self.semi_axes_)))

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
        """
        self._require_fitted()
        n = check_positive_int(n, "n")
        rng = check_seed(seed)
        B = _unit_ball_samples(rng, n, self._d)
        return self.center_ + (B * self.semi_axes_) @ self.axes_

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


# --------------------------------------------------------------------------------------------
# cone
# --------------------------------------------------------------------------------------------
def _log_betainc_small(a: float, b: float, x: np.ndarray) -> np.ndarray:
    """``log I_x(a, b)`` by the series ``I_x = x^a (1-x)^b / (a B(a,b)) sum_n (a+b)_n/(a+1)_n x^n``.

    For ``b <= 1`` the terms decrease monotonically (ratio ``(a+b+n)/(a+1+n) x < x``); the sum
    lies in ``[1, 1/(1-x)]`` and is accumulated in floats, the prefactor in logs, so the result
    is finite where ``betainc`` underflows to 0 (DLMF 8.17.8 with 15.2.1).
    """
    x = np.atleast_1d(np.asarray(x, dtype=np.float64))
    out = np.full(x.shape, -np.inf)
    pos = x > 0
    if not pos.any():
        return out
    xp = x[pos]
    xmax = float(xp.max())
    n_terms = int(min(2_000_000, max(10, math.ceil(-40.0 / math.log(xmax)) + 10))) if xmax < 1 else 2_000_000
    s = np.ones_like(xp)
    t = np.ones_like(xp)
    for k in range(n_terms):
        t = t * ((a + b + k) / (a + 1.0 + k)) * xp
        s += t
        if k % 64 == 63 and float((t / s).max()) < 1e-17:
            break
    out[pos] = a * np.log(xp) + b * np.log1p(-xp) - math.log(a) - special.betaln(a, b) + np.log(s)
    return out


def log_cap_fraction(half_angle, d: int) -> np.ndarray:
    """Log of the fraction of the unit ball (equivalently of the sphere ``S^{d-1}``) inside a
    circular cone of the given half-angle.

    ``f(alpha) = 1/2 I_{sin^2 alpha}((d-1)/2, 1/2)`` for ``alpha <= pi/2`` (regularised incomplete
    beta; S. Li, "Concise formulas for the area and volume of a hyperspherical cap", Asian J.
    Math. Stat. 4 (2011)), and ``1 - f(pi - alpha)`` for ``alpha > pi/2``. Computed in logs: where
    ``betainc`` underflows (tiny caps in high ``d``) a log-space series takes over, so ``d = 576``,
    ``alpha = 0.3`` is finite. This is the paper's cone refinement (THEORY.md).

    Parameters
    ----------
    half_angle : float or array_like of float
        Half-angle(s) in radians, in ``[0, pi]``.
    d : int
        Dimension, >= 2.

    Returns
    -------
    float or numpy.ndarray of float64
        ``log f`` in nats (``-inf`` at ``alpha = 0``, ``0`` at ``alpha = pi``).

    Raises
    ------
    ValueError
        Angles outside ``[0, pi]`` or NaN, ``d < 2``.
    """
    d = check_positive_int(d, "d", minimum=2)
    al = np.asarray(half_angle, dtype=np.float64)
    scalar = al.ndim == 0
    al = np.atleast_1d(al)
    if not np.all(np.isfinite(al)) or np.any(al < 0) or np.any(al > math.pi):
        raise ValueError("half_angle: expected angles in [0, pi] radians")
    a, b = 0.5 * (d - 1), 0.5
    narrow = np.minimum(al, math.pi - al)
    x = np.sin(narrow) ** 2
    with np.errstate(divide="ignore"):
        logI = np.log(special.betainc(a, b, x))
    small = ~(logI > -650.0)
    if small.any():
        logI[small] = _log_betainc_small(a, b, x[small])
    logI = np.where(narrow >= 0.5 * math.pi, 0.0, logI)  # sin^2 = 1 up to rounding
    logf = math.log(0.5) + logI
    wide = al > 0.5 * math.pi
    logf = np.where(wide, np.log1p(-np.exp(np.minimum(logf, 0.0))), logf)
    return float(logf[0]) if scalar else logf


def _angles(X: np.ndarray, axis: np.ndarray) -> np.ndarray:
    """Angles (radians) between rows of ``X`` and the unit ``axis``, accurate at small angles."""
    along = X @ axis
    perp = np.linalg.norm(X - np.outer(along, axis), axis=1)
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

    Parameters
    ----------
    axis : array_like of float, shape (d,), optional
        Axis of a cone built directly (normalised here).
    half_angle : float, optional
        Half-angle in radians, in ``(0, pi]``.
    radius : float, optional
        Radius of the ball the cone is cut by.
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

    def __init__(self, axis=None, half_angle=None, radius=None, *, quantile=1.0, solver="auto",
                 tol=1e-12):
        super().__init__()
        self.axis = axis
        self.half_angle = half_angle
        self.radius = radius
        self.quantile = quantile
        self.solver = solver
        self.tol = tol
        self._d = None
        given = [v is not None for v in (axis, half_angle, radius)]
        if any(given):
            if not all(given):
                raise ValueError("Cone needs axis, half_angle and radius together (or none, then call fit)")
            ax = check_array(axis, "axis", ndim=1)
            nrm = float(np.linalg.norm(ax))
            if not nrm > 0:
                raise ValueError("axis: expected a non-zero vector")
            al = check_positive(half_angle, "half_angle")
            if al > math.pi:
                raise ValueError(f"half_angle: expected a value in (0, pi], got {al}")
            r = check_positive(radius, "radius")
            self._set(ax / nrm, al, r, paper=float("nan"), optimal=True, gap=0.0)

    def _set(self, axis, half_angle, radius, *, paper, optimal, gap):
        self.axis_ = np.asarray(axis, dtype=np.float64)
        self.half_angle_ = float(half_angle)
        self.radius_ = float(radius)
        self.paper_half_angle_ = float(paper)
        self.optimal_ = bool(optimal)
        self.gap_ = float(gap)
        self._d = self.axis_.shape[0]

    def fit(self, H):
        """Fit the smallest circular cone (apex at the origin) and the enclosing radius.

        Parameters
        ----------
        H : array_like of float32/float64, shape (N, d), d >= 2

        Returns
        -------
        self

        Raises
        ------
        TypeError
            ``H`` not real floats (float16 refused).
        ValueError
            NaN/inf, N < 2, d < 2, zero vectors (no direction), bad options.
        """
        t0 = time.perf_counter()
        H = _check_hidden(H)
        solver = _check_choice(self.solver, "solver", _SOLVERS)
        q = check_probability(self.quantile, "quantile")
        tol = check_positive(self.tol, "tol")
        n, d = H.shape
        if d < 2:
            raise ValueError("H: a cone needs d >= 2")
        norms = np.linalg.norm(H, axis=1)
        zero = np.flatnonzero(~(norms > 0))
        if zero.size:
            raise ValueError(
                f"H: {zero.size} zero vector(s) (first at row {int(zero[0])}); a zero vector has no "
                "direction, so no cone can be fitted to it"
            )
        U = H / norms[:, None]
        if q < 1.0:
            mean_dir = U.mean(axis=0)
            mn = np.linalg.norm(mean_dir)
            ref = mean_dir / mn if mn > 0 else U[0]
            keep_src = np.concatenate([U, norms[:, None]], axis=1)
            kept, _ = _trim(keep_src, -(U @ ref), q)
            U, normk = kept[:, :d], kept[:, d]
        else:
            normk = norms
        gap = 0.0
        if solver == "cvxpy":
            cp = _import_cvxpy()
            u = cp.Variable(d)
            t = cp.Variable()
            prob = cp.Problem(cp.Maximize(t), [U @ u >= t, cp.norm(u, 2) <= 1])
            name = _cvxpy_solve(prob, "Cone")
            cand = np.asarray(u.value, dtype=np.float64)
            used, gap = f"cvxpy:{name}", float("nan")
        else:
            cand, _, gap, _, _ = _meb_fast(U, tol=tol)
            used = "fast"
        candidates = []
        if np.linalg.norm(cand) > 0:
            candidates.append(cand / np.linalg.norm(cand))
        best_axis, best_angle = None, np.inf
        for ax in candidates:
            ang = float(_angles(U, ax).max())
            if ang < best_angle:
                best_axis, best_angle = ax, ang
        optimal = best_angle <= 0.5 * math.pi
        if not optimal:
            for ref in (U.mean(axis=0), np.median(U, axis=0)):
                nr = np.linalg.norm(ref)
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
        self._set(best_axis, half, float(normk.max()), paper=paper, optimal=optimal, gap=gap)
        self._record_fit(n, U.shape[0], q, used, t0)
        return self

    @property
    def log_volume(self) -> float:
        """``log vol(B_d(r)) + log f(alpha)`` in nats (see :func:`log_cap_fraction`)."""
        self._require_fitted()
        return (log_unit_ball_volume(self._d) + self._d * math.log(self.radius_)
                + log_cap_fraction(self.half_angle_, self._d))

    @property
    def paper_log_volume_(self) -> float:
        """The log-volume with the paper's half-angle estimate in place of ``half_angle_``."""
        self._require_fitted()
        if not np.isfinite(self.paper_half_angle_):
            return float("nan")
        return (log_unit_ball_volume(self._d) + self._d * math.log(self.radius_)
                + log_cap_fraction(self.paper_half_angle_, self._d))

    def _gauge(self, X):
        nrm = np.linalg.norm(X, axis=1)
        ang = np.where(nrm > 0, _angles(X, self.axis_), 0.0)
        return np.maximum(nrm / self.radius_, ang / self.half_angle_)

    def _sample_angles(self, rng, n):
        d, al = self._d, self.half_angle_
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
        self._require_fitted()
        n = check_positive_int(n, "n")
        rng = check_seed(seed)
        d = self._d
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
            "log_cap_fraction": log_cap_fraction(self.half_angle_, self._d),
            "optimal": self.optimal_,
            "gap": self.gap_,
        }


# --------------------------------------------------------------------------------------------
# the final-norm shell
# --------------------------------------------------------------------------------------------
class FinalNormShell(Support):
    """The set of outputs of the final RMSNorm/LayerNorm: a data-free, architecture-certified
    support. Build it with :func:`support_from_final_norm`.

    Derivation (``h`` the output, ``g`` the effective gain, ``b`` the bias, ``eps`` the norm's
    epsilon, ``y_i = (h_i - b_i) / g_i``):

    - RMSNorm ``h = g * x / sqrt(ms + eps)``, ``ms = mean(x^2)``:
      ``sum_i y_i^2 = sum_i x_i^2 / (ms + eps) = d ms / (ms + eps) <= d``, with equality up to the
      factor ``ms / (ms + eps)``, which is ``1 - eps/ms``: 1 to float precision for real
      residual streams (``ms >> eps``). So ``h`` lies on the ellipsoidal shell
      ``{h : sum_i (h_i / g_i)^2 = d}`` (``b = 0``), semi-axes ``sqrt(d) |g_i|``.
    - LayerNorm ``h = g * (x - mu) / sqrt(var + eps) + b``: ``sum_i y_i = 0`` and
      ``sum_i y_i^2 = d var / (var + eps) <= d``: the same shell, shifted by ``b`` and cut by the
      hyperplane ``sum_i y_i = 0`` (a (d-2)-dimensional ellipsoid).

    Strictly the image over all inputs is the solid ``sum y_i^2 <= d`` (``ms`` can be as small as
    one likes); the shell is where the hidden states are in practice.

    Attributes
    ----------
    kind_ : {"rmsnorm", "layernorm"}
    gain_ : ndarray of float64, shape (d,)
        Effective gain (Gemma's ``1 + w`` already applied by the adapter).
    bias_ : ndarray of float64, shape (d,), or None
    radius_ : float
        ``sqrt(d)``: the radius of the shell in the normalised coordinates ``y``.
    eps_ : float

    Notes
    -----
    - ``log_volume`` is the volume of the *enclosing solid* ellipsoid
      ``{sum_i ((h_i - b_i)/g_i)^2 <= d}``: ``log vol(B_d) + sum_i log(sqrt(d) |g_i|)``. The shell
      itself has measure zero in ``R^d``.
    - ``log_area`` is the (d-1)-dimensional surface measure of the ellipsoid
      ``{sum_i y_i^2 = d}`` (the RMSNorm shell itself; for LayerNorm the shell is the
      (d-2)-dimensional slice of it by the mean-zero hyperplane, so this is an upper surface).
    - ``sample`` draws points *on the shell*, not in the volume: ``y = sqrt(d) z / |z|`` with
      ``z`` Gaussian (projected onto ``sum z = 0`` for LayerNorm), ``h = b + g y``: the output of
      the norm for isotropic input directions. This is not the uniform surface measure of the
      ellipsoid (it is the gain map's push-forward of the uniform sphere measure).
    - ``contains`` tests membership of the shell (``|sqrt(sum y^2 / d) - 1| <= tol``, and
      ``|sum y| <= tol d`` for LayerNorm); pass ``solid=True`` for the enclosing solid.
    - Zero gains are refused (``ValueError``): along such an axis every output equals ``b_i``, the
      shell is degenerate (a lower-dimensional set), and ``y_i`` is undefined.
    """

    shape = "final_norm"

    def __init__(self, kind, gain, bias=None, eps=0.0):
        super().__init__()
        if kind not in ("rmsnorm", "layernorm"):
            raise ValueError(f"kind: expected 'rmsnorm' or 'layernorm', got {kind!r}")
        g = check_array(gain, "gain", ndim=1)
        zero = np.flatnonzero(g == 0)
        if zero.size:
            raise ValueError(
                f"gain: {zero.size} zero entries (first at {int(zero[0])}); the final-norm shell is "
                "degenerate along those axes (the output is constant there), so it has no "
                "d-dimensional volume; fit a data support instead"
            )
        self.kind_ = kind
        self.gain_ = g
        self.bias_ = None if bias is None else check_array(bias, "bias", ndim=1, shape=(g.shape[0],))
        self.eps_ = check_positive(eps, "eps", allow_zero=True)
        self.radius_ = math.sqrt(g.shape[0])
        self.solver_ = "closed_form"
        self._d = g.shape[0]
        self._log_area = None

    def _y(self, X):
        Y = X if self.bias_ is None else X - self.bias_
        return Y / self.gain_

    def _gauge(self, X):
        Y = self._y(X)
        return np.sqrt(np.einsum("ij,ij->i", Y, Y) / self._d)

    def contains(self, X, tol: float = 1e-9, solid: bool = False) -> np.ndarray:
        """Whether each point lies on the shell (or in the enclosing solid), up to relative ``tol``.

        Parameters
        ----------
        X : array_like of float, shape (N, d) or (d,)
        tol : float, default 1e-9
            Relative tolerance on the normalised radius ``sqrt(sum y^2 / d)`` (and, for
            LayerNorm, on ``|sum y| / d``). Hidden states computed in float32 need about 1e-5.
        solid : bool, default False
            Test the enclosing solid ``sum y^2 <= d (1 + tol)^2`` instead.

        Returns
        -------
        numpy.ndarray of bool, shape (N,)

        Raises
        ------
        ValueError, TypeError
            Wrong dimension, NaN/inf, float16, negative tol.
        """
        tol = check_positive(tol, "tol", allow_zero=True)
        X = self._check_points(X)
        rho = self._gauge(X)
        if solid:
            return rho <= 1.0 + tol
        ok = np.abs(rho - 1.0) <= tol
        if self.kind_ == "layernorm":
            ok &= np.abs(self._y(X).sum(axis=1)) <= tol * self._d
        return ok

    @property
    def semi_axes_(self) -> np.ndarray:
        """``sqrt(d) |g_i|``, shape (d,) (in coordinate order, not sorted)."""
        return self.radius_ * np.abs(self.gain_)

    @property
    def log_volume(self) -> float:
        """Log-volume (nats) of the enclosing solid ellipsoid ``sum ((h-b)/g)^2 <= d``."""
        return log_unit_ball_volume(self._d) + float(np.sum(np.log(self.semi_axes_)))

    @property
    def log_area(self) -> float:
        """Log of the (d-1)-dimensional area (nats) of the ellipsoid ``sum ((h-b)/g)^2 = d``.

        ``area = prod_i s_i |S^{d-1}| E_u[ sqrt(sum_i u_i^2 / s_i^2) ]`` for ``u`` uniform on the
        sphere (the surface element of ``x -> S x`` is ``det S |S^{-1} u|``); the expectation is a
        Monte Carlo mean over 4096 fixed-seed directions, whose relative standard error (stored
        in ``log_area_stderr_``, in nats) is small in high d because the integrand concentrates.
        """
        if self._log_area is None:
            s = self.semi_axes_
            rng = np.random.default_rng(0)
            vals = []
            for _ in range(4):
                z = rng.standard_normal((1024, self._d))
                z /= np.linalg.norm(z, axis=1, keepdims=True)
                vals.append(np.sqrt(np.einsum("ij,ij->i", z / s, z / s)))
            v = np.concatenate(vals)
            mean = float(v.mean())
            self.log_area_stderr_ = float(v.std(ddof=1) / math.sqrt(v.size) / mean)
            self._log_area = float(np.sum(np.log(s))) + _log_sphere_area(self._d) + math.log(mean)
        return self._log_area

    def sample(self, n: int, seed=None) -> np.ndarray:
        """``n`` points on the shell (not in its volume; see the class Notes).

        Parameters
        ----------
        n : int
        seed : None, int or numpy Generator

        Returns
        -------
        numpy.ndarray of float64, shape (n, d)
        """
        n = check_positive_int(n, "n")
        rng = check_seed(seed)
        z = rng.standard_normal((n, self._d))
        if self.kind_ == "layernorm":
            z -= z.mean(axis=1, keepdims=True)
        z *= self.radius_ / np.linalg.norm(z, axis=1, keepdims=True)
        h = z * self.gain_
        return h if self.bias_ is None else h + self.bias_

    def enclosing_ellipsoid(self) -> Ellipsoid:
        """The solid ellipsoid ``{h : sum_i ((h_i - b_i)/g_i)^2 <= d}`` as an :class:`Ellipsoid`."""
        c = np.zeros(self._d) if self.bias_ is None else self.bias_.copy()
        ell = Ellipsoid(c, np.diag(1.0 / (self._d * self.gain_**2)))
        ell.solver_ = "closed_form"
        return ell

    def _params(self):
        out = {
            "kind": self.kind_,
            "eps": self.eps_,
            "radius": self.radius_,
            "log_volume_is": "enclosing solid ellipsoid",
            "log_area": self.log_area,
            "log_area_stderr": self.log_area_stderr_,
            "gain_abs_min": float(np.abs(self.gain_).min()),
            "gain_abs_max": float(np.abs(self.gain_).max()),
            "has_bias": self.bias_ is not None,
        }
        return out


def support_from_final_norm(unembedding) -> FinalNormShell:
    """The final-norm shell of a model: a support certified by the architecture, no data needed.

    Parameters
    ----------
    unembedding : embgeom.adapters.Unembedding or FinalNorm
        Anything with a ``norm`` attribute (``kind``, ``weight`` (effective gain, (d,)), ``bias``,
        ``eps``), or such a norm object itself.

    Returns
    -------
    FinalNormShell
        See its docstring for the derivation: RMSNorm outputs satisfy
        ``sum_i (h_i/g_i)^2 = d ms/(ms + eps) <= d``; LayerNorm outputs also
        ``sum_i (h_i - b_i)/g_i = 0``.

    Raises
    ------
    ValueError
        No final norm (``kind`` None), an unknown kind, zero gains, NaN gains.
    TypeError
        Not an unembedding/norm object.
    """
    norm = getattr(unembedding, "norm", unembedding)
    if not hasattr(norm, "kind") or not hasattr(norm, "weight"):
        raise TypeError(
            "unembedding: expected an embgeom.adapters.Unembedding (or its FinalNorm), got "
            f"{type(unembedding).__name__}"
        )
    if norm.kind is None:
        raise ValueError("unembedding: the model has no final norm, so there is no final-norm shell")
    return FinalNormShell(norm.kind, norm.weight, getattr(norm, "bias", None), float(getattr(norm, "eps", 0.0)))


# --------------------------------------------------------------------------------------------
# front door and report section
# --------------------------------------------------------------------------------------------
_SHAPES = {"ball": Ball, "ellipsoid": Ellipsoid, "cone": Cone, "box": Box}


def fit_support(H, shape, *, center="free", quantile=1.0, solver="auto", **kw) -> Support:
    """Fit the smallest support of a given shape that holds the hidden states.

    Parameters
    ----------
    H : array_like of float32/float64, shape (N, d)
        Hidden states (N >= 2, finite).
    shape : {"ball", "ellipsoid", "cone", "box"}
        The shape to fit. The final-norm shell is not a fit: see :func:`support_from_final_norm`.
    center : {"free", "origin"}, default "free"
        Ball: free centre (minimum enclosing ball) or origin-centred (``r = max |h_i|``). Cones
        always have their apex at the origin (either value accepted). Ellipsoid and box have a
        free centre: ``"origin"`` raises ``ValueError``.
    quantile : float in (0, 1], default 1.0
        Fraction of points kept; the most outlying are trimmed first (per shape: distance to
        the coordinatewise median for the ball, Mahalanobis distance for the ellipsoid, angle to
        the mean direction for the cone, MAD-scaled L-infinity distance to the median for the
        box). ``n_dropped_`` and ``n_fit_`` record it.
    solver : {"auto", "fast", "cvxpy"}, default "auto"
        See each class.
    **kw
        Further options of the class (``tol``, ``rotation``, ``ridge``, ``min_width``,
        ``max_iter``, ``progress``, ...).

    Returns
    -------
    Support
        The fitted :class:`Ball`, :class:`Ellipsoid`, :class:`Cone` or :class:`Box`.

    Raises
    ------
    ValueError
        Unknown shape or option, or bad ``H`` (NaN/inf, N < 2, ...).
    TypeError
        ``H`` not real floats (float16 refused).

    Examples
    --------
    >>> import numpy as np
    >>> H = np.random.default_rng(0).standard_normal((300, 4))
    >>> S = fit_support(H, "ellipsoid")
    >>> bool(S.contains(H).all())
    True
    """
    if not isinstance(shape, str) or shape not in _SHAPES:
        if shape == "final_norm":
            raise ValueError("shape='final_norm' is not a fit: use support_from_final_norm(unembedding)")
        raise ValueError(f"shape: expected one of {tuple(_SHAPES)}, got {shape!r}")
    _check_choice(center, "center", _CENTERINGS)
    _check_choice(solver, "solver", _SOLVERS)
    if shape == "ball":
        est = Ball(centering=center, quantile=quantile, solver=solver, **kw)
    elif shape == "cone":
        est = Cone(quantile=quantile, solver=solver, **kw)
    else:
        if center == "origin":
            raise ValueError(f"center='origin' is only for the ball (and the cone, always at the origin), not {shape!r}")
        if shape == "ellipsoid":
            est = Ellipsoid(quantile=quantile, solver=solver, **kw)
        else:
            est = Box(quantile=quantile, **kw)
    return est.fit(H)


_REPORT_FITS = {
    "ball": ("ball", {"center": "free"}),
    "ball_origin": ("ball", {"center": "origin"}),
    "ellipsoid": ("ellipsoid", {}),
    "cone": ("cone", {}),
    "box": ("box", {}),
    "box_pca": ("box", {"rotation": "pca"}),
}


def supports_report_section(H, out_dir, shapes=("ball", "ball_origin", "ellipsoid", "cone", "box", "box_pca"),
                            unembedding=None, *, quantile=1.0, solver="auto",
                            heldout=None, heldout_min=0.99, return_supports=False):
    """The report's supports section: every shape's parameters and log-volume, and a figure.

    Parameters
    ----------
    H : array_like of float32/float64, shape (N, d)
        Hidden states.
    out_dir : str or path-like
        Folder for the figure ``supports_log_volume.png`` (created if missing).
    shapes : sequence of str
        Among ``"ball"``, ``"ball_origin"``, ``"ellipsoid"``, ``"cone"``, ``"box"``,
        ``"box_pca"``.
    unembedding : embgeom.adapters.Unembedding, optional
        Adds ``"final_norm"`` (the data-free shell; its log-volume is the enclosing solid's).
    quantile, solver
        Passed to :func:`fit_support`.
    heldout : array_like of float, shape (M, d), optional
        Hidden states not used in the fits (e.g. another seed). Every support then gets
        ``heldout_contained`` (the share of them inside, ``contains(tol=1e-6)``) and
        ``heldout_valid`` (that share ``>= heldout_min``), and the figure greys out the invalid
        ones: a support fitted to a sample bounds the model's hidden states only if it also holds
        the ones it has not seen.
    heldout_min : float, default 0.99
    return_supports : bool, default False
        Also return the fitted support objects, ``{name: Support}`` (the shapes that could be
        fitted), for the bounds section.

    Returns
    -------
    dict
        ``{<name>: support.to_dict() (with "log_volume", "log_volume_per_dim", "fit_seconds",
        and for final_norm "contains_fraction": the fraction of H on the shell at tol 1e-4), ...,
        "figures": {"log_volume": path}}``. JSON-able. A shape that cannot be fitted to ``H``
        (e.g. an ellipsoid with N <= d) gets ``{"error": message}`` instead of raising. With
        ``return_supports=True``: ``(section, supports)``.

    Raises
    ------
    ValueError
        Unknown shape name, bad ``H``.
    """
    from pathlib import Path

    unknown = [s for s in shapes if s not in _REPORT_FITS]
    if unknown:
        raise ValueError(f"shapes: unknown {unknown}; expected names among {tuple(_REPORT_FITS)}")
    H = _check_hidden(H)
    out_dir = Path(out_dir)
    if heldout is not None:  # checked before anything is fitted or written
        Ht = _check_hidden(heldout, "heldout")
        if Ht.shape[1] != H.shape[1]:
            raise ValueError(f"heldout: expected {H.shape[1]} columns, got {Ht.shape[1]}")
        heldout_min = check_probability(heldout_min, "heldout_min")
    out_dir.mkdir(parents=True, exist_ok=True)
    section: dict = {}
    fitted: dict = {}
    for name in shapes:
        shape, kw = _REPORT_FITS[name]
        kw = dict(kw)
        center = kw.pop("center", "free")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                S = fit_support(H, shape, center=center, quantile=quantile, solver=solver, **kw)
            except ValueError as exc:
                section[name] = {"shape": shape, "error": str(exc)}
                continue
        fitted[name] = S
        entry = S.to_dict()
        entry["log_volume_per_dim"] = entry["log_volume"] / S.dim
        if caught:
            entry["warnings"] = [str(w.message) for w in caught]
        for big in ("center", "axis", "lower", "upper", "semi_axes"):
            if big in entry and isinstance(entry[big], list) and len(entry[big]) > 16:
                arr = np.asarray(entry.pop(big), dtype=np.float64)
                entry[f"{big}_summary"] = {"min": float(arr.min()), "max": float(arr.max()),
                                           "mean": float(arr.mean())}
        section[name] = entry
    if unembedding is not None:
        shell = support_from_final_norm(unembedding)
        entry = shell.to_dict()
        entry["log_volume_per_dim"] = entry["log_volume"] / shell.dim
        if shell.dim == H.shape[1]:
            entry["contains_fraction"] = float(shell.contains(H, tol=1e-4).mean())
        section["final_norm"] = entry
        fitted["final_norm"] = shell
    if heldout is not None:
        for name, S in fitted.items():
            frac = float(np.mean(S.contains(Ht, tol=1e-6)))
            section[name]["heldout_contained"] = frac
            section[name]["heldout_valid"] = frac >= heldout_min
    section["figures"] = {"log_volume": str(_plot_log_volumes(section, out_dir / "supports_log_volume.png"))}
    return (section, fitted) if return_supports else section


def _plot_log_volumes(section: dict, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k in section if k != "figures" and "log_volume" in section[k]]
    vals = [section[k]["log_volume"] for k in names]
    valid = [section[k].get("heldout_valid", True) for k in names]
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(names) + 1.4))
    ax.barh(names, vals, color=["tab:blue" if ok else "lightgrey" for ok in valid])
    for i, (v, ok) in enumerate(zip(vals, valid)):
        ax.text(v, i, f" {v:.1f}" + ("" if ok else " (misses held-out states)"), va="center",
                fontsize=8)
    lo, hi = min(0.0, min(vals)), max(vals)
    ax.set_xlim(lo, hi + 0.35 * (hi - lo))
    ax.set_xlabel("log-volume (nats)")
    ax.set_title("Support log-volumes (smaller = tighter bound; grey: not a valid support)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
