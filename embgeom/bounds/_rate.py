"""The non-uniform cell rate ``lambda`` (nats per token): the paper's refinement of ``log|V|``."""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np

from .._validation import check_array, check_positive_int, check_seed

__all__ = ["CellVolumeRate", "cell_volume_rate"]


@dataclass
class CellVolumeRate:
    """Result of :func:`cell_volume_rate` (all rates in nats per token).

    Attributes
    ----------
    rate : float
        ``lambda``: least-squares slope (with intercept) of ``-log median_k`` against ``k``.
    intercept : float
        The fit's intercept (nats).
    r2 : float
        Coefficient of determination of that fit.
    rate_origin, r2_origin : float
        The same fit through the origin (``lambda_0 = sum k y_k / sum k^2``).
    k : ndarray of int64, shape (k_max,)
    log_median : ndarray of float64, shape (k_max,)
        ``log`` of the median of the product of ``k`` fractions (<= 0; ``-inf`` possible).
    log_median_low, log_median_high : ndarray of float64, shape (k_max,)
        Discretisation bracket (atoms rounded down / up to the grid); equal when exact.
    rate_bracket : tuple of float
        ``(lambda from log_median_high, lambda from log_median_low)``.
    rate_interval : tuple of float or None
        ``(lambda with the upper interval ends, lambda with the lower ends)`` of the Monte
        Carlo fractions; the first is the conservative one (smaller lambda, larger C).
    rate_bootstrap : tuple of float or None
        ``(mean, std)`` of lambda over a parametric (multinomial) bootstrap.
    rate_asymptotic : float
        ``-mean_t log f_t = log|V| + KL(uniform || f)``, the slope's large-``k`` limit.
    log_vocab : float
        ``log |V|``.
    n_zero : int
        Tokens with a zero fraction, and ``zero_fill`` says how they were replaced.
    exact_k : list of int
        The ``k`` for which the median was computed by full enumeration.
    """

    rate: float
    intercept: float
    r2: float
    rate_origin: float
    r2_origin: float
    k: np.ndarray
    log_median: np.ndarray
    log_median_low: np.ndarray
    log_median_high: np.ndarray
    rate_bracket: tuple
    rate_interval: tuple | None
    rate_bootstrap: tuple | None
    rate_asymptotic: float
    log_vocab: float
    n_zero: int
    zero_fill: str
    exact_k: list = field(default_factory=list)

    @property
    def rate_conservative(self) -> float:
        """The smallest lambda among the point value, the discretisation bracket and the
        upper-interval value: the one that gives the largest (safest) refined slope."""
        vals = [self.rate, self.rate_bracket[0]]
        if self.rate_interval is not None:
            vals.append(self.rate_interval[0])
        return float(min(vals))

    def to_dict(self) -> dict:
        """A JSON-able dict (arrays as lists; infinities as the strings ``"inf"``/``"-inf"``)."""

        def conv(v):
            if isinstance(v, np.ndarray):
                return [conv(x) for x in v.tolist()]
            if isinstance(v, (tuple, list)):
                return [conv(x) for x in v]
            if isinstance(v, (float, np.floating)):
                v = float(v)
                if math.isinf(v):
                    return "inf" if v > 0 else "-inf"
                return None if math.isnan(v) else v
            if isinstance(v, np.integer):
                return int(v)
            return v

        out = {k: conv(v) for k, v in asdict(self).items()}
        out["rate_conservative"] = conv(self.rate_conservative)
        return out


def _check_fractions(fractions, name: str, sum_tol: float | None) -> np.ndarray:
    f = check_array(fractions, name, ndim=1)
    if f.size < 2:
        raise ValueError(f"{name}: expected at least 2 tokens, got {f.size}")
    if np.any(f < 0):
        raise ValueError(f"{name}: fractions must be >= 0, got min {f.min()}")
    if np.any(f > 1 + 1e-12):
        raise ValueError(f"{name}: fractions must be <= 1, got max {f.max()}")
    if sum_tol is not None and abs(float(f.sum()) - 1.0) > sum_tol:
        raise ValueError(
            f"{name}: cell-volume fractions must sum to 1 (tolerance {sum_tol}), got {f.sum():.9g}"
        )
    return f


def _lower_quantile_exact(vals: np.ndarray, level: float) -> float:
    """Smallest ``s`` with ``P(S <= s) >= level`` for equally likely values."""
    s = np.sort(vals)
    idx = max(int(math.ceil(level * s.size - 1e-9)) - 1, 0)
    return float(s[idx])


def _median_curve(x: np.ndarray, k_max: int, max_support: int, exact_limit: int):
    """log medians of the k-fold sums of the equally likely values ``x`` (may hold -inf).

    Returns (point, low, high, exact_k): ``point`` from atoms rounded to the nearest grid node,
    ``low``/``high`` from atoms rounded down/up (stochastic order brackets the true median).
    """
    n = x.size
    finite = np.isfinite(x)
    q_fin = finite.mean()  # probability that one draw is finite
    xf = x[finite]
    ks = np.arange(1, k_max + 1)
    point = np.full(k_max, -np.inf)
    low = np.full(k_max, -np.inf)
    high = np.full(k_max, -np.inf)
    exact_k: list[int] = []
    # exact enumeration while n^k is small
    sums = np.zeros(1)
    for k in ks:
        if n ** int(k) > exact_limit:
            break
        sums = (sums[:, None] + x[None, :]).ravel()
        with np.errstate(invalid="ignore"):
            v = _lower_quantile_exact(sums, 0.5)
        point[k - 1] = low[k - 1] = high[k - 1] = v
        exact_k.append(int(k))
    todo = [k for k in ks if k not in exact_k]
    if not todo or xf.size == 0:
        return point, low, high, exact_k
    xmin, xmax = float(xf.min()), float(xf.max())
    span = xmax - xmin
    B = max_support if span > 0 else 1
    h = span / (B - 1) if B > 1 else 1.0
    z = (xf - xmin) / h if B > 1 else np.zeros_like(xf)
    w = np.full(xf.size, 1.0 / xf.size)
    pmfs = {
        "point": np.bincount(np.clip(np.rint(z), 0, B - 1).astype(np.int64), w, minlength=B),
        "low": np.bincount(np.clip(np.floor(z + 1e-9), 0, B - 1).astype(np.int64), w, minlength=B),
        "high": np.bincount(np.clip(np.ceil(z - 1e-9), 0, B - 1).astype(np.int64), w, minlength=B),
    }
    results = {"point": point, "low": low, "high": high}
    from scipy import signal  # FFT convolution; imported here so that import stays light

    for key, p1 in pmfs.items():
        pk = p1.copy()
        for k in range(1, k_max + 1):
            if k > 1:
                pk = signal.fftconvolve(pk, p1) if B > 1 else pk
                pk = np.clip(pk, 0.0, None)
                pk /= pk.sum()
            if k in exact_k:
                continue
            # the k-fold sum is -inf with probability 1 - q_fin^k, else distributed as pk
            p_fin = q_fin**k
            p_inf = 1.0 - p_fin
            if p_inf >= 0.5 - 1e-12:
                results[key][k - 1] = -np.inf
                continue
            level = (0.5 - p_inf) / p_fin
            cdf = np.cumsum(pk)
            i = int(np.searchsorted(cdf, level - 1e-9))
            i = min(i, pk.size - 1)
            results[key][k - 1] = k * xmin + i * h
    return point, low, high, exact_k


def _fit_rate(ks: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float, float]:
    """(slope, intercept, r2, slope through origin, r2 through origin) of y = -log median."""
    if not np.all(np.isfinite(y)):
        return np.inf, np.nan, np.nan, np.inf, np.nan
    k = ks.astype(np.float64)
    if k.size >= 2:
        A = np.vstack([k, np.ones_like(k)]).T
        (slope, icpt), *_ = np.linalg.lstsq(A, y, rcond=None)
        res = y - (slope * k + icpt)
        ss_tot = float(np.sum((y - y.mean()) ** 2))
        r2 = 1.0 - float(np.sum(res**2)) / ss_tot if ss_tot > 0 else 1.0
    else:
        slope, icpt, r2 = float(y[0] / k[0]), 0.0, 1.0
    s0 = float(np.sum(k * y) / np.sum(k * k))
    res0 = y - s0 * k
    ss0 = float(np.sum(y**2))
    r20 = 1.0 - float(np.sum(res0**2)) / ss0 if ss0 > 0 else 1.0
    return float(slope), float(icpt), float(r2), s0, r20


def _fill_zeros(f: np.ndarray, upper, n_samples) -> tuple[np.ndarray, str, int]:
    zero = f <= 0
    nz = int(zero.sum())
    if nz == 0:
        return f, "none", 0
    g = f.copy()
    if upper is not None:
        g[zero] = upper[zero]
        if np.any(g[zero] <= 0):
            raise ValueError("upper: the upper interval end of a zero fraction must be > 0")
        return g, "upper", nz
    if n_samples is not None:
        g[zero] = 3.0 / n_samples  # rule of three: 95% upper bound for 0 hits in n draws
        return g, "rule_of_three", nz
    g[zero] = float(f[~zero].min())
    warnings.warn(
        f"cell_volume_rate: {nz} zero fraction(s) replaced by the smallest positive fraction; "
        "pass upper= (Monte Carlo upper interval ends) or n_samples= for a conservative fill",
        RuntimeWarning, stacklevel=3,
    )
    return g, "min_positive", nz


def cell_volume_rate(fractions, k_max: int = 32, *, max_support: int = 4096, lower=None,
                     upper=None, n_samples=None, n_boot: int = 0, seed=0,
                     exact_limit: int = 2**20, sum_tol: float = 1e-6) -> CellVolumeRate:
    """The non-uniform-cell rate ``lambda`` (nats per token).

    Draw ``k`` tokens uniformly from the vocabulary and multiply their cell-volume fractions;
    ``-log`` of the median of that product grows by about ``lambda`` per token (docs/theory.md,
    section 5 "The non-uniform-cell refinement and lambda"). Used as ``C_refined = C_shape log|V| / lambda``.

    Parameters
    ----------
    fractions : array_like of float, shape (|V|,)
        Cell-volume fractions (e.g. ``embgeom.volumes.CellVolumes.fractions``), >= 0, summing to
        1 within ``sum_tol``.
    k_max : int, default 32
        Largest number of tokens ``k``; the fit uses ``k = 1..k_max``.
    max_support : int, default 4096
        Grid size (atoms) of the discretised distribution of one log-fraction when the exact
        enumeration is too large.
    lower, upper : array_like of float, shape (|V|,), optional
        Monte Carlo interval ends of the fractions (e.g. 95%). ``upper`` also replaces the zero
        fractions (see Notes); both give ``rate_interval``.
    n_samples : int, optional
        Monte Carlo sample count behind ``fractions``: zero fractions are replaced by ``3 /
        n_samples`` when ``upper`` is not given, and it enables the bootstrap.
    n_boot : int, default 0
        Parametric bootstrap replicates (counts ~ Multinomial(n_samples, fractions)); needs
        ``n_samples``.
    seed : int, Generator or None, default 0
        Seed of the bootstrap.
    exact_limit : int, default 2**20
        Enumerate all ``|V|^k`` products exactly while ``|V|^k <= exact_limit``.
    sum_tol : float, default 1e-6
        Tolerance on ``sum(fractions) = 1``.

    Returns
    -------
    CellVolumeRate

    Raises
    ------
    TypeError, ValueError
        Not a 1-D float array, NaN/inf, negative entries, fewer than 2 tokens, a sum away from
        1, ``k_max < 1``, ``max_support < 2``, mismatched ``lower``/``upper`` shapes,
        ``n_boot > 0`` without ``n_samples``.

    Notes
    -----
    *Method.* The log-fraction of a uniformly drawn token is a discrete distribution with
    ``|V|`` equally likely atoms; the product of ``k`` fractions is the ``k``-fold sum of
    log-fractions (multiplicative convolution in the log domain). While ``|V|^k`` is small it is
    enumerated exactly; beyond that the atoms are put on a uniform grid of ``max_support`` nodes
    between the smallest and largest log-fraction and convolved with FFTs. Rounding every atom
    down (up) to the grid gives a sum that is stochastically smaller (larger), so the true median
    is bracketed by ``log_median_low``/``log_median_high``; atoms that already lie on the grid
    (uniform or two-level fractions) make the result exact. The median is the lower median
    (smallest ``s`` with ``P(S <= s) >= 1/2``).

    *Fit.* ``-log median_k = lambda k + c`` by least squares with an intercept: the median of a
    sum of ``k`` i.i.d. terms is ``k E + O(1)`` (the O(1) is the skewness correction of the
    median), so the intercept absorbs the constant and the slope is the per-token rate at large
    ``k``, the regime of long sequences; a fit through the origin (also returned) would fold the
    constant into the slope. The large-``k`` limit is ``-mean log f = log|V| + KL(U || f)``
    (``rate_asymptotic``), never below ``log|V|`` (Jensen).

    *Zero fractions.* A token never hit by the Monte Carlo has fraction 0, log-fraction
    ``-inf``, which would push the median down and *increase* lambda, i.e. shrink the refined
    slope ``C log|V| / lambda``: anti-conservative for an upper bound on ``C``. Zeros are
    therefore replaced by a value that is at least as large as the truth with high probability:
    the upper interval end (``upper``), else ``3 / n_samples`` (rule of three), else (with a
    warning) the smallest positive fraction. Larger fractions give a smaller lambda, a larger
    refined ``C``: the conservative direction. The fractions are not renormalised after the fill.

    *Uncertainty.* ``rate_interval`` recomputes lambda with all fractions at their upper interval
    ends (conservative end) and at their lower ends (zeros kept as ``-inf`` there, which can make
    that end infinite). These are per-token (not simultaneous) intervals, so the pair is an
    indication, not a calibrated confidence interval. The bootstrap gives a standard error.

    The refinement is the paper's heuristic for typical (median) sequences; it is not a counting
    bound (``docs/theory.md``).
    """
    f = _check_fractions(fractions, "fractions", sum_tol)
    k_max = check_positive_int(k_max, "k_max")
    max_support = check_positive_int(max_support, "max_support", minimum=2)
    exact_limit = check_positive_int(exact_limit, "exact_limit")
    n_boot = check_positive_int(n_boot, "n_boot", minimum=0)
    if n_samples is not None:
        n_samples = check_positive_int(n_samples, "n_samples")
    lo = up = None
    if upper is not None:
        up = _check_fractions(upper, "upper", None)
        if up.shape != f.shape:
            raise ValueError(f"upper: expected shape {f.shape}, got {up.shape}")
    if lower is not None:
        lo = _check_fractions(lower, "lower", None)
        if lo.shape != f.shape:
            raise ValueError(f"lower: expected shape {f.shape}, got {lo.shape}")
    if n_boot > 0 and n_samples is None:
        raise ValueError("n_boot: a bootstrap needs n_samples (the Monte Carlo sample count)")

    g, fill, nz = _fill_zeros(f, up, n_samples)
    ks = np.arange(1, k_max + 1)

    def rate_of(vals: np.ndarray):
        with np.errstate(divide="ignore"):
            x = np.log(vals)
        p, lo_, hi_, ex = _median_curve(x, k_max, max_support, exact_limit)
        return p, lo_, hi_, ex

    point, low, high, exact_k = rate_of(g)
    slope, icpt, r2, s0, r20 = _fit_rate(ks, -point)
    bracket = (_fit_rate(ks, -high)[0], _fit_rate(ks, -low)[0])
    interval = None
    if up is not None or lo is not None:
        up_rate = _fit_rate(ks, -rate_of(np.maximum(up, g) if up is not None else g)[0])[0]
        lo_rate = _fit_rate(ks, -rate_of(lo)[0])[0] if lo is not None else slope
        interval = (up_rate, lo_rate)
    boot = None
    if n_boot > 0:
        rng = check_seed(seed)
        vals = []
        for _ in range(n_boot):
            c = rng.multinomial(n_samples, f / f.sum())
            fb = c / n_samples
            fb = np.where(fb > 0, fb, g if fill != "none" else 3.0 / n_samples)
            vals.append(_fit_rate(ks, -rate_of(fb)[0])[0])
        vals = np.asarray(vals)
        boot = (float(np.mean(vals)), float(np.std(vals, ddof=1)) if n_boot > 1 else 0.0)
    with np.errstate(divide="ignore"):
        asym = float(-np.mean(np.log(g)))
    return CellVolumeRate(
        rate=slope, intercept=icpt, r2=r2, rate_origin=s0, r2_origin=r20, k=ks.astype(np.int64),
        log_median=point, log_median_low=low, log_median_high=high, rate_bracket=bracket,
        rate_interval=interval, rate_bootstrap=boot, rate_asymptotic=asym,
        log_vocab=math.log(f.size), n_zero=nz, zero_fill=fill, exact_k=exact_k,
    )
