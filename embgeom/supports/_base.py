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
from sklearn.utils.validation import _get_feature_names, check_is_fitted

from .._json import to_jsonable
from .._special import row_norms, vector_norm
from .._validation import as_array, check_allocation, check_array, check_positive, check_positive_int

try:  # scikit-learn >= 1.6: a function of sklearn.utils.validation
    from sklearn.utils.validation import _check_feature_names as _sk_check_feature_names
except ImportError:  # pragma: no cover - scikit-learn 1.3 to 1.5: a method of BaseEstimator

    def _sk_check_feature_names(estimator, X, *, reset):
        estimator._check_feature_names(X, reset=reset)


__all__ = ["Support", "BoxRegion", "CONTAINS_TOL", "ComplexDataError", "row_norms", "vector_norm",
           "refuse_degenerate", "affine_hull", "normalise", "unscale", "as_real_points",
           "feature_names_of", "scale_lengths"]

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


class ComplexDataError(TypeError, ValueError):
    """Complex points: a wrong dtype (``TypeError``, embgeom's rule) that scikit-learn's
    convention reports as a ``ValueError`` ("Complex data not supported"); both catch it."""


_TORCH_INTS = frozenset(f"torch.{t}" for t in ("int8", "int16", "int32", "int64", "uint8", "uint16",
                                               "uint32", "uint64"))


def _object_to_float(arr: np.ndarray, name: str) -> np.ndarray:
    """An object array of numbers as float64; text and other objects refused by name."""
    for v in arr.flat:  # a Python loop, on object arrays only
        # the rules of a typed array hold inside an object one: booleans and float16 refused
        if isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{name}: expected real floats, got dtype object holding a bool "
                            f"({v!r}); booleans are not coordinates")
        if isinstance(v, np.float16):
            raise TypeError(f"{name}: float16 input is refused (11 significant bits), also inside "
                            "an object array; cast it to float32 or float64 explicitly")
        if isinstance(v, (str, bytes)):
            raise TypeError(
                f"{name}: expected a real floating-point array, got dtype object holding a "
                f"{type(v).__name__} ({v!r:.30}); numbers stored as text are not converted"
            )
    try:
        return arr.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{name}: expected a real floating-point array, got dtype object that does not convert "
            f"to float64 ({exc})"
        ) from None


def as_real_points(X, name: str = "X"):
    """Points as scikit-learn's estimators take them, before :func:`embgeom._validation.check_array`.

    Integer arrays (numpy, torch, pandas columns, nullable ``Int64`` included) and object arrays
    of numbers are converted to float64, as ``sklearn.utils.check_array`` does (integers beyond
    ``2^53`` round). Everything else is returned unchanged for ``check_array``, which refuses
    float16 and bfloat16 by name, booleans, NaN and infinity.

    Parameters
    ----------
    X : array_like, torch.Tensor or pandas DataFrame/Series
    name : str
        The argument's name, in every message.

    Returns
    -------
    array_like
        ``X`` itself, or a float64 ndarray for integer and object input.

    Raises
    ------
    TypeError
        Sparse input; an object array holding text or objects that are not numbers.
    ComplexDataError
        Complex input (a ``TypeError`` and a ``ValueError``).
    """
    _refuse_sparse(X, name)
    if X is None:
        return X
    if hasattr(X, "detach") and hasattr(X, "cpu"):  # a torch tensor
        dt = str(getattr(X, "dtype", ""))
        if dt.startswith("torch.complex"):
            raise ComplexDataError(f"{name}: Complex data not supported (dtype {dt}); expected real floats")
        return X.detach().cpu().double() if dt in _TORCH_INTS else X
    if type(X).__module__.split(".")[0] == "pandas" and hasattr(X, "to_numpy"):
        dtypes = list(X.dtypes) if hasattr(X, "columns") else [X.dtype]
        kinds = [getattr(d, "kind", "O") for d in dtypes]
        if "c" in kinds:
            raise ComplexDataError(f"{name}: Complex data not supported (pandas columns); expected real floats")
        if any(k in "iu" for k in kinds) and all(
                k in "iu" or (k == "f" and getattr(d, "itemsize", 8) >= 4) for k, d in zip(kinds, dtypes)):
            return X.to_numpy(dtype=np.float64, na_value=np.nan)  # a missing value: NaN, refused
        return X  # floats (and everything refused) are check_array's
    arr = as_array(X, name)
    kind = arr.dtype.kind
    if kind in "iu":
        return arr.astype(np.float64)
    if kind == "c":
        raise ComplexDataError(
            f"{name}: Complex data not supported (dtype {arr.dtype}); expected a real floating-point array")
    if kind == "O":
        return _object_to_float(arr, name)
    return arr


def feature_names_of(X) -> np.ndarray | None:
    """The column names of a DataFrame ``X`` (object array), or ``None`` (scikit-learn's rule:
    only when every column name is a string)."""
    return _get_feature_names(X)


def scale_lengths(x, factor: float, what: str):
    """``factor * x`` for positive lengths ``x``, refusing a result outside float64's range.

    Raises
    ------
    ValueError
        ``factor * x`` overflows to infinity or underflows to zero, naming ``factor`` and ``what``.
    """
    with np.errstate(over="ignore", under="ignore"):
        out = np.multiply(x, factor)
    if not (np.all(np.isfinite(out)) and np.all(out > 0)):
        lo, hi = float(np.min(x)), float(np.max(x))
        raise ValueError(
            f"factor: {factor:.3g} times the {what} (from {lo:.3g} to {hi:.3g}) leaves the float64 "
            "range (it would overflow to inf or underflow to 0)"
        )
    return float(out) if np.ndim(out) == 0 else out


def check_hidden(H, name: str = "X") -> np.ndarray:
    """Validate points to fit ``(N, d)``: real (integers converted), finite, N >= 2, d >= 1.

    Integer and object-of-numbers input is converted to float64 (:func:`as_real_points`, as
    scikit-learn does); float16, booleans and complex numbers are refused by name. The
    messages for zero columns, a single row, sparse and complex input use scikit-learn's
    wording (``"0 feature(s)"``, ``"1 sample"``, ``"sparse"``, ``"Complex data not supported"``)
    so that its estimator checks recognise them.

    Returns
    -------
    numpy.ndarray of float64, shape (N, d)
    """
    H = check_array(as_real_points(H, name), name, ndim=2, allow_empty=True)
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
    feature_names_in_ : ndarray of str objects, shape (d,)
        The column names of ``X`` when it was a DataFrame whose column names are all strings
        (scikit-learn's rule); absent otherwise. Every method that takes points then checks
        them: a DataFrame with other, missing or reordered columns raises ``ValueError``, an
        array without names warns. A set derived by :meth:`scaled` keeps them.
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

    Input follows scikit-learn's conventions: integer ``X`` is converted to float64, a
    DataFrame's column names are kept in ``feature_names_in_`` and checked on every later call
    (``sklearn.utils.validation``'s own check), float16 and complex ``X`` are refused by name.
    Where the outlier semantics differ: a fit with ``quantile=1`` encloses every training point,
    so ``fit_predict`` and ``predict`` on the training set give no ``-1``.

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
        """Refuse to refit a ready set, validate ``X``, record its column names (or forget
        those of a previous fit); returns ``(H float64, t0)``."""
        if vars(self).get("_from_params", False):
            raise ValueError(
                f"this {type(self).__name__} was built with {type(self).__name__}.from_params: it is "
                "a ready set, not an estimator to fit. Fit a new estimator instead "
                f"({type(self).__name__}(...).fit(X), or sklearn.base.clone(this).fit(X))"
            )
        t0 = time.perf_counter()
        H = check_hidden(X, "X")
        self._check_names(X, "X", reset=True)
        return H, t0

    def _check_names(self, X, name: str = "X", *, reset: bool = False) -> None:
        """Set (``reset``) or check ``feature_names_in_`` against ``X``'s column names with
        scikit-learn's own check; its ``ValueError``/``TypeError`` is raised naming ``name``."""
        try:
            _sk_check_feature_names(self, X, reset=reset)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{name}: {exc}") from None

    def _derived(self, out: "Support") -> "Support":
        """``out`` (a set made from this one, e.g. by :meth:`scaled`) with this one's
        ``feature_names_in_``, so that it checks the same columns."""
        names = vars(self).get("feature_names_in_")
        if names is not None:
            out.feature_names_in_ = names
        return out

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
        """Validate points for a fitted set: the column names first (a DataFrame with fewer
        columns says which are missing), then the array (integers converted), then ``d``."""
        self._check_fitted()
        self._check_names(X, name)
        X = check_array(as_real_points(X, name), name, ndim=(1, 2))
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
            Wrong dimension, NaN/inf, a DataFrame whose columns are not ``feature_names_in_``
            (in order). TypeError: not a real array (float16 refused; integers are converted).
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
        return self._contains(self._check_points(X), tol)

    def _contains(self, X: np.ndarray, tol: float) -> np.ndarray:
        """:meth:`contains` on validated points ``X`` (N, d) float64 and a checked ``tol``."""
        return self._gauge(X) <= 1.0 + tol

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
        n = check_positive_int(n, "n")
        # an (n, d) array beyond this machine's memory: numpy's MemoryError (or, past 2**63
        # bytes, "Maximum allowed dimension exceeded") after minutes of paging, refused first
        check_allocation(n * max(int(self.dim), 1) * 8, "n", n, f"an (n, {self.dim}) float64 array")
        return n

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
        """A strict-JSON summary: shape, dim, log_volume (nats), parameters and fit details.

        Returns
        -------
        dict
            Plain JSON types only, through :func:`embgeom._json.to_jsonable` (the one
            converter): arrays become lists, and a value that is not finite becomes ``None``
            (``gap`` of a cvxpy fit, which has no certificate; ``paper_half_angle`` of a cone
            built from parameters), so ``json.dumps(..., allow_nan=False)`` accepts it. A
            calibrated set (:func:`embgeom.supports.calibrate_support`) adds ``calibration``.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before ``fit``.
        """
        self._check_fitted()
        out = {"shape": self.shape, "dim": self.dim, "log_volume": self.log_volume}
        out.update(self._params())
        out.update(
            n_samples=self.n_samples_,
            n_fit=self.n_fit_,
            n_dropped=self.n_dropped_,
            quantile=self.quantile_,
            solver=self.solver_,
            fit_seconds=self.fit_seconds_,
        )
        calibration = vars(self).get("calibration_")
        if calibration is not None:
            out["calibration"] = calibration
        return to_jsonable(out)

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
