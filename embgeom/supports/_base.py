"""The :class:`Support` base class and the helpers every shape shares.

A support is a scikit-learn estimator of the outlier-detector family: ``__init__`` stores the
options unchanged, ``fit(X)`` validates once and sets the fitted set in trailing-underscore
attributes, ``predict`` says +1 inside / -1 outside. A ready set built from parameters is a
classmethod of each shape (``Ball.from_params(center, radius)``, ...).

Every question the rest of embgeom asks about a support is a method here, answered by the shape
itself: its log-volume, its packing-bound terms, whether it is an origin-centred ellipsoid
``G B`` (so that a bias-free decoder's cells, which are cones, have their share given by a
Gaussian measure), its LP description for the exact cell scan, its JSON form. Nothing outside
:mod:`embgeom.supports` reads a shape's name.
"""

import abc
import math
import time
from typing import NamedTuple

import numpy as np
from sklearn.base import BaseEstimator, OutlierMixin
from sklearn.utils.validation import check_is_fitted

from .._special import row_norms, vector_norm
from .._validation import check_array, check_positive, check_positive_int

__all__ = ["Support", "BoxRegion", "CONTAINS_TOL", "row_norms", "vector_norm", "refuse_degenerate",
           "affine_hull", "normalise", "unscale"]

#: Relative slack of :meth:`Support.contains` and of the ``predict`` rule: a point is inside
#: when ``gauge(x) <= 1 + CONTAINS_TOL`` (a fitted set's farthest point sits on the boundary up
#: to rounding).
CONTAINS_TOL = 1e-9

_CENTERINGS = ("free", "origin")
_SOLVERS = ("auto", "cvxpy", "fast")


class BoxRegion(NamedTuple):
    """A support written as linear constraints ``lower <= R x <= upper`` (an LP description).

    Attributes
    ----------
    lower, upper : ndarray of float64, shape (d,)
        Bounds in the box's own coordinates ``y = R x``.
    rotation : ndarray of float64, shape (d, d), or None
        ``R`` (rows are the box axes, orthonormal); ``None`` means the identity.
    """

    lower: np.ndarray
    upper: np.ndarray
    rotation: np.ndarray | None


# --------------------------------------------------------------------------------------------
# small shared helpers
# --------------------------------------------------------------------------------------------
def unit_ball_samples(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """``n`` points uniform in the unit ball of ``R^d``: Gaussian direction, radius ``U^{1/d}``."""
    g = rng.standard_normal((n, d))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    # U^{1/d} computed as exp(log(U)/d) (exact, and stable for large d)
    r = np.exp(np.log(rng.uniform(size=n)) / d)
    return g * r[:, None]


def normalise(H: np.ndarray) -> tuple[np.ndarray, int]:
    """``(H 2^-k, k)`` with ``k`` chosen so that the largest absolute entry is in ``[0.5, 1)``.

    Every fit here is scale-equivariant (a fit to ``s H`` is ``s`` times the fit to ``H``), so
    the shapes fit the normalised rows and map the result back with :func:`unscale`. A power of
    two makes both steps exact: squares and products of the normalised rows can neither
    overflow (``1e160``) nor underflow (``1e-160``), and ``H`` at scale ``2^j`` gives bit for bit
    the fit at scale 1, moved by ``2^j``.

    Returns
    -------
    Hn : ndarray of float64, shape of ``H``
    k : int
        The exponent (0 for an all-zero ``H``).
    """
    m = float(np.abs(H).max()) if H.size else 0.0
    if not m > 0:
        return H, 0
    k = int(np.frexp(m)[1])
    return np.ldexp(H, -k), k


def unscale(x, k: int, what: str):
    """``x 2^k`` (exact), refusing a result beyond the float64 range with an error naming ``X``.

    Raises
    ------
    ValueError
        The fitted quantity ``what`` does not fit in float64 at the data's scale.
    """
    with np.errstate(over="ignore"):
        out = np.ldexp(np.asarray(x, dtype=np.float64), k)
    if not np.all(np.isfinite(out)):
        raise ValueError(
            f"X: the fitted {what} would not fit in float64 (beyond about 1.8e308) at the scale of "
            "the data; rescale X"
        )
    return float(out) if out.ndim == 0 else out


def refuse_degenerate(shape: str, detail: str, remedy: str = "") -> None:
    """Raise the one error every shape gives for degenerate data (one message family).

    The message reads ``"X: degenerate data for the <shape>: <detail>; <remedy>"``: it names the
    argument (``X``), says what is degenerate (all points coincide, they lie on a line or a
    proper affine subspace, they have a single direction) and what the caller can do.

    Raises
    ------
    ValueError
        Always.
    """
    msg = f"X: degenerate data for the {shape}: {detail}"
    if remedy:
        msg += f"; {remedy}"
    raise ValueError(msg)


def affine_hull(H: np.ndarray):
    """The affine hull of the rows of ``H`` (N, d): ``(mean, rank, U, sv, Vt)``.

    A thin SVD ``H - mean = U diag(sv) Vt`` computed on the centred rows divided by their
    largest absolute entry, so the rank does not depend on the scale of the data (``1e-160``
    and ``1e160`` give the rank at ``1``). A direction counts when its singular value exceeds
    ``16 max(N, d) eps_64`` times the largest (the SVD's rounding) and ``16 sqrt(N d) eps_64
    max|H|`` (the rounding of the centring itself: rows that agree to the last bits are not a
    direction). ``rank = 0`` means all rows coincide exactly.

    Returns
    -------
    mean : ndarray of float64, shape (d,)
    rank : int
    U : ndarray of float64, shape (N, min(N, d))
        Left singular vectors (orthonormal columns).
    sv : ndarray of float64, shape (min(N, d),)
        Singular values of the centred rows, descending, in the data's units.
    Vt : ndarray of float64, shape (min(N, d), d)
        Right singular vectors (orthonormal rows), matching ``sv``.
    """
    mu = H.mean(axis=0)
    Hc = H - mu
    m = float(np.abs(Hc).max()) if Hc.size else 0.0
    if not m > 0 or not np.any(H != H[0]):  # identical rows (their mean may differ by rounding)
        kk = min(H.shape)
        return mu, 0, np.zeros((H.shape[0], kk)), np.zeros(kk), np.eye(H.shape[1])[:kk]
    U, sv, Vt = np.linalg.svd(Hc / m, full_matrices=False)
    eps = np.finfo(np.float64).eps
    # relative to the spread (the SVD's own rounding), and to the rows' magnitude: centring rows
    # of size |H| leaves errors up to eps |H| in each entry, sqrt(N d) eps |H| in a singular value
    floor = 16 * eps * math.sqrt(H.size) * float(np.abs(H).max()) / m
    tol = max(sv[0] * max(Hc.shape) * eps * 16, floor)
    return mu, int(np.sum(sv > tol)), U, sv * m, Vt


def _refuse_sparse(X, name: str):
    if hasattr(X, "tocsr") and hasattr(X, "nnz"):  # scipy.sparse matrix or array
        raise TypeError(f"{name}: sparse input is not supported; pass a dense float array (X.toarray())")


def check_hidden(H, name: str = "X") -> np.ndarray:
    """Validate points to fit ``(N, d)``: real float32/64, finite, N >= 2, d >= 1; float64 out.

    The messages for zero columns, a single row and sparse input use scikit-learn's wording
    (``"0 feature(s)"``, ``"1 sample"``, ``"sparse"``) so that its estimator checks recognise
    them.
    """
    _refuse_sparse(H, name)
    H = check_array(H, name, ndim=2, allow_empty=True)
    if H.shape[1] == 0:
        raise ValueError(
            f"{name}: found an array with 0 feature(s) (shape={H.shape}) while a minimum of 1 is required."
        )
    if H.shape[0] < 2:
        raise ValueError(
            f"{name}: a support fit needs at least 2 points, got {H.shape[0]} sample"
            + ("" if H.shape[0] == 1 else "s")
        )
    return H


def check_choice(value, name: str, choices) -> str:
    """``value`` if it is one of ``choices`` (strings), else ``ValueError`` naming ``name``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value!r}")
    return value


def trim(H: np.ndarray, outlyingness: np.ndarray, quantile: float) -> tuple[np.ndarray, int]:
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


def import_cvxpy():
    """cvxpy, imported on first use (the reference solver only)."""
    try:
        import cvxpy as cp
    except ImportError as exc:  # pragma: no cover - cvxpy is a declared dependency
        raise ImportError("solver='cvxpy' needs the cvxpy package") from exc
    return cp


def cvxpy_solve(problem, name: str) -> str:
    """Solve with Clarabel when cvxpy has it (interior point, ~1e-8 accuracy), else SCS."""
    cp = import_cvxpy()
    installed = cp.installed_solvers()
    solver = "CLARABEL" if "CLARABEL" in installed else "SCS"
    kwargs = {} if solver == "CLARABEL" else {"eps": 1e-9, "max_iters": 200_000}
    problem.solve(solver=solver, **kwargs)
    if problem.status not in ("optimal", "optimal_inaccurate"):
        raise RuntimeError(f"{name}: cvxpy ({solver}) returned status {problem.status!r}")
    return solver


def check_scale_factor(factor) -> float:
    """``factor`` as a float if it is > 0 and finite, else ``ValueError``/``TypeError``."""
    return check_positive(factor, "factor")


# --------------------------------------------------------------------------------------------
# base class
# --------------------------------------------------------------------------------------------
class Support(OutlierMixin, BaseEstimator, abc.ABC):
    """Base class of every support: a bounded set in ``R^d`` as a scikit-learn outlier detector.

    Subclasses store their options in ``__init__``, implement ``fit(X, y=None)`` (set the set's
    parameters in trailing-underscore attributes, then call :meth:`_record_fit`), a
    ``from_params`` classmethod for a ready set, ``log_volume``, ``_gauge(X)`` (a number ``<= 1``
    exactly for points inside), ``sample``, ``packing_bound_terms`` and ``_params``. They
    override :meth:`origin_ellipsoid_map`, :meth:`star_about_origin` and :meth:`lp_region` when
    the answer is not the default "no".

    Attributes
    ----------
    shape : str
        Class attribute: the name in :func:`embgeom.supports.fit_support`'s registry and in
        :meth:`to_dict` (``"ball"``, ``"ellipsoid"``, ``"cone"``, ``"box"``, ``"final_norm"``).
    n_features_in_ : int
        The ambient dimension ``d`` (also :attr:`dim`).
    offset_ : float
        ``-(1 + CONTAINS_TOL)``: ``decision_function = score_samples - offset_`` (scikit-learn's
        outlier-detector convention).
    n_samples_ : int or None
        Number of rows given to ``fit`` (``None`` for a set built with ``from_params``).
    n_fit_ : int or None
        Rows actually used (after ``quantile`` trimming).
    n_dropped_ : int
        Rows dropped as the most outlying (``n_samples_ - n_fit_``).
    quantile_ : float
    solver_ : str
        The solver used (``"fast"``, ``"cvxpy:CLARABEL"``, ``"closed_form"``, ``"given"``).
    fit_seconds_ : float
        Wall time of the fit.

    Notes
    -----
    ``predict``, ``decision_function`` and ``score_samples`` follow scikit-learn's
    outlier-detector family: ``score_samples(X) = -gauge(X)`` (larger = more inside),
    ``decision_function(X) = 1 + CONTAINS_TOL - gauge(X)`` (``>= 0`` exactly inside, up to the
    relative slack ``CONTAINS_TOL``) and ``predict`` is ``+1`` where the decision is ``>= 0``,
    ``-1`` elsewhere; ``predict(X) == 1`` is ``contains(X)`` at its default tolerance.

    A set built with ``from_params`` is not an estimator waiting for data: calling ``fit`` on it
    raises ``ValueError`` instead of silently replacing it (``sklearn.base.clone`` gives the
    unfitted estimator with the same options).
    """

    shape: str = "support"
    #: keys of :meth:`to_dict` that a report table shows as this shape's parameters (the ones a
    #: shape does not have are skipped)
    summary_keys: tuple = ("radius", "rinf", "half_angle", "paper_half_angle", "n_dropped", "ridge")

    @abc.abstractmethod
    def fit(self, X, y=None):
        """Fit the set to hidden states ``X`` (N, d) float; returns ``self`` (see each shape)."""

    # -- fitted-state helpers ---------------------------------------------------------------
    def _check_fitted(self):
        check_is_fitted(self, "n_features_in_")

    def _start_fit(self, X) -> tuple[np.ndarray, float]:
        """Refuse to refit a ready set, validate ``X``; returns ``(H float64, t0)``."""
        if vars(self).get("_from_params", False):
            raise ValueError(
                f"this {type(self).__name__} was built with {type(self).__name__}.from_params: it is "
                "a ready set, not an estimator to fit. Fit a new estimator instead "
                f"({type(self).__name__}(...).fit(X), or sklearn.base.clone(this).fit(X))"
            )
        return check_hidden(X, "X"), time.perf_counter()

    def _record_fit(self, n_samples, n_fit, quantile: float, solver: str, t0: float):
        self.n_samples_ = None if n_samples is None else int(n_samples)
        self.n_fit_ = None if n_fit is None else int(n_fit)
        self.n_dropped_ = 0 if n_samples is None else int(n_samples - n_fit)
        self.quantile_ = float(quantile)
        self.solver_ = solver
        self.fit_seconds_ = 0.0 if t0 is None else time.perf_counter() - t0
        self.offset_ = -(1.0 + CONTAINS_TOL)

    def _record_given(self, d: int):
        """Bookkeeping of a set built with ``from_params`` (no data)."""
        self.n_features_in_ = int(d)
        self._record_fit(None, None, 1.0, "given", None)
        self._from_params = True

    @property
    def dim(self) -> int:
        """The ambient dimension ``d`` (int). Raises ``NotFittedError`` before a fit."""
        self._check_fitted()
        return int(self.n_features_in_)

    @property
    @abc.abstractmethod
    def log_volume(self) -> float:
        """Lebesgue volume of the set in ``R^d``, in nats (never overflows)."""

    def _check_points(self, X, name: str = "X", *, allow_1d: bool = True) -> np.ndarray:
        self._check_fitted()
        _refuse_sparse(X, name)
        X = check_array(X, name, ndim=(1, 2))
        if X.ndim == 1 and not allow_1d:
            raise ValueError(
                f"{name}: expected a 2-d array of shape (N, {self.n_features_in_}), got shape "
                f"{X.shape}. Reshape your data: X.reshape(1, -1) for a single point"
            )
        if X.ndim == 1:
            X = X[None, :]
        d = self.n_features_in_
        if X.shape[1] != d:
            raise ValueError(
                f"{name} has {X.shape[1]} features, but {type(self).__name__} is expecting {d} "
                f"features as input (points of dimension d={d}, shape (N, {d}); got shape {X.shape})"
            )
        return X

    @abc.abstractmethod
    def _gauge(self, X: np.ndarray) -> np.ndarray:
        """The gauge of validated points ``X`` (N, d) float64: ``<= 1`` exactly inside."""

    # -- membership -------------------------------------------------------------------------
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
            of ``|x| / r`` and ``angle / alpha``; the final-norm shell ``sqrt(sum y^2 / d)``.

        Raises
        ------
        ValueError
            Wrong dimension, NaN/inf. TypeError: not a float array (float16 refused).
        sklearn.exceptions.NotFittedError
            Before ``fit`` (a ``ValueError``).
        """
        return self._gauge(self._check_points(X))

    def contains(self, X, tol: float = CONTAINS_TOL) -> np.ndarray:
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
            ``X`` of the wrong dimension, NaN/inf, negative ``tol``; ``NotFittedError`` before a fit.
        TypeError
            ``X`` not a real float array (float16 refused).
        """
        tol = check_positive(tol, "tol", allow_zero=True)
        return self.gauge(X) <= 1.0 + tol

    def score_samples(self, X) -> np.ndarray:
        """``-gauge(X)``: larger for points deeper inside (scikit-learn's convention).

        Parameters
        ----------
        X : array_like of float, shape (N, d)
            2-d (scikit-learn's rule; :meth:`gauge` and :meth:`contains` also take one point).

        Returns
        -------
        numpy.ndarray of float64, shape (N,)

        Raises
        ------
        ValueError, TypeError
            As :meth:`gauge`, and a 1-d ``X``.
        """
        return -self._gauge(self._check_points(X, allow_1d=False))

    def decision_function(self, X) -> np.ndarray:
        """``1 + CONTAINS_TOL - gauge(X)``: ``>= 0`` exactly for points inside (with the slack).

        Parameters
        ----------
        X : array_like of float, shape (N, d)

        Returns
        -------
        numpy.ndarray of float64, shape (N,)
            ``score_samples(X) - offset_``.

        Raises
        ------
        ValueError, TypeError
            As :meth:`score_samples`.
        """
        return self.score_samples(X) - self.offset_

    def predict(self, X) -> np.ndarray:
        """``+1`` for points inside the support, ``-1`` outside.

        Parameters
        ----------
        X : array_like of float, shape (N, d)

        Returns
        -------
        numpy.ndarray of int64, shape (N,)
            ``+1`` where ``decision_function(X) >= 0`` (equivalently ``contains(X)``).

        Raises
        ------
        ValueError, TypeError
            As :meth:`score_samples`.
        """
        return np.where(self.decision_function(X) >= 0.0, 1, -1).astype(np.int64)

    # -- sampling ---------------------------------------------------------------------------
    @abc.abstractmethod
    def sample(self, n: int, seed=None) -> np.ndarray:
        """``n`` points uniform in the support (see each shape)."""

    def _check_sample_args(self, n):
        self._check_fitted()
        return check_positive_int(n, "n")

    # -- what the rest of embgeom asks ------------------------------------------------------
    @abc.abstractmethod
    def packing_bound_terms(self, eps) -> dict:
        """Volumetric bounds on ``log P(self, eps)`` by name (nats); see each shape."""

    def origin_ellipsoid_map(self) -> np.ndarray | None:
        """The linear map ``G`` when the support is an origin-centred ellipsoid ``G B``, else None.

        With ``S = G B`` (``B`` the unit ball) and a bias-free decoder, whose cells are cones with
        apex at the origin, the share of cell ``t`` in ``S`` is the standard Gaussian measure of
        ``{x : (w_t - w_s)^T G x >= 0 for all s}`` (uniform in ``G B`` and Gaussian ``G x`` give
        the same distribution of directions up to the linear map).

        Returns
        -------
        numpy.ndarray of float64, shape (d, d), or None
            ``G`` (a dense ``d x d`` matrix; ``d = 4096`` is 128 MiB), or ``None`` for a support
            that is not of that form (the default).
        """
        self._check_fitted()
        return None

    def star_about_origin(self) -> bool:
        """Whether the support contains a ball around the origin and meets every ray from it.

        Then, for a bias-free decoder (cells are cones with apex at the origin), a cell meets
        the support's interior exactly when it has an interior at all: the exact scan of
        :meth:`embgeom.cells.Decoder.unargmaxable` works on directions.

        Returns
        -------
        bool
            ``False`` by default.
        """
        self._check_fitted()
        return False

    def lp_region(self) -> BoxRegion | None:
        """The support as linear constraints ``lower <= R x <= upper``, when it is a polytope of
        that form (the exact scan's LPs and the Chebyshev centre are then exact), else None.

        Returns
        -------
        BoxRegion or None
            ``None`` by default.
        """
        self._check_fitted()
        return None

    # -- JSON form --------------------------------------------------------------------------
    @abc.abstractmethod
    def _params(self) -> dict:
        """The set's parameters by name (arrays allowed), for :meth:`to_dict`."""

    def to_dict(self) -> dict:
        """A JSON-able summary: shape, dim, log_volume (nats), parameters and fit details.

        Returns
        -------
        dict
            Arrays become lists of floats.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before ``fit``.
        """
        self._check_fitted()
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

    # -- fit_support's options ----------------------------------------------------------------
    @classmethod
    def _from_fit_options(cls, *, center: str, quantile, solver, **kw) -> "Support":
        """The estimator :func:`fit_support` builds for this shape (free centre by default)."""
        if center == "origin":
            raise ValueError(
                f"center='origin' is only for the ball (and the cone, always at the origin), not {cls.shape!r}"
            )
        return cls(quantile=quantile, solver=solver, **kw)

    # -- conformal calibration ----------------------------------------------------------------
    @abc.abstractmethod
    def scaled(self, factor) -> "Support":
        """The sublevel set ``{x : gauge(x) <= factor}`` as a new ready support.

        For a ball, an ellipsoid, a box and the final-norm shell this is the homothety of ratio
        ``factor`` about the centre; for a cone both the radius and the half-angle are multiplied
        by ``factor`` (the half-angle capped at pi). Either way ``self.scaled(s).contains(X)``
        is ``self.gauge(X) <= s`` (up to the relative slack), which is what split-conformal
        calibration (:func:`embgeom.supports.calibrate_support`) needs; the gauges themselves
        satisfy ``self.scaled(s).gauge(X) == self.gauge(X) / s`` except for a cone whose
        half-angle was capped.

        Parameters
        ----------
        factor : float
            > 0 and finite.

        Returns
        -------
        Support
            A set built with ``from_params`` (``fit`` on it raises ``ValueError``).

        Raises
        ------
        ValueError, TypeError
            ``factor <= 0``, NaN/inf or not a number; ``NotFittedError`` before a fit.
        """
