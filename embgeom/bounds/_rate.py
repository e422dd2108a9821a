"""The non-uniform cell rate ``lambda`` (nats per token): the paper's refinement of ``log|V|``."""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np

from .._json import to_jsonable
from .._validation import check_array, check_positive, check_positive_int, check_seed

__all__ = ["CellVolumeRate", "cell_volume_rate", "cell_volume_rate_from_logs"]


@dataclass
class CellVolumeRate:
    """Result of :func:`cell_volume_rate` (all rates in nats per token).

    Attributes
    ----------
    estimator : {"uniform counts", "log-shares"}
        Which estimator produced it: :func:`cell_volume_rate` from uniform Monte Carlo
        fractions (zero fractions filled, ``zero_fill``; ``rate_interval`` and, with a bootstrap,
        ``rate_bootstrap``) or :func:`cell_volume_rate_from_logs` from per-token log-shares (no
        fill; ``rate_ci`` with ``ci_level`` when bootstrapped). Consumers read this field
        instead of guessing from the others.
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
        ``log`` of the median of the product of ``k`` fractions (<= 0; ``-inf`` possible: a
        product of 0, or a log below the float range, -1.8e308 nats).
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
    vocab_size : int
        ``|V|``.
    n_tokens_used : int
        Tokens behind the estimate (``|V|``, or the size of the token sample).
    token_sample : bool
        The log-shares are a uniform sample of the vocabulary's (``n_tokens_used < |V|``).
    normalized : bool
        The shares were divided by their (estimated) sum before the median curve.
    log_total : float
        ``log`` of the sum of the shares before that division (estimated from the sample as
        ``log(|V| mean_t f_t)`` when ``token_sample``); 0 for a proper distribution.
    rate_ci : tuple of float or None
        ``ci_level`` percentile interval of lambda over bootstrap replicates; ``ci_includes``
        lists the sources of error the replicates redraw (token sampling, per-token Monte Carlo
        error).
    ci_level : float or None
    ci_includes : list of str
    n_unresolved : int
        Tokens whose estimator gave up (only an upper end): their upper end stands in.
    n_empty : int
        Tokens whose cell is proven empty (share 0, log-share ``-inf``).
    log_total_ci : tuple of float or None
        ``ci_level`` bootstrap interval of ``log_total`` (same replicates as ``rate_ci``): where
        it excludes 0 the per-token estimates are off as a whole (or the sample is unlucky).
    """

    estimator: str
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
    vocab_size: int = 0
    n_tokens_used: int = 0
    token_sample: bool = False
    normalized: bool = False
    log_total: float = float("nan")
    rate_ci: tuple | None = None
    ci_level: float | None = None
    ci_includes: list = field(default_factory=list)
    n_unresolved: int = 0
    n_empty: int = 0
    log_total_ci: tuple | None = None

    @property
    def rate_conservative(self) -> float:
        """The smallest lambda among the point value, the discretisation bracket, the
        upper-interval value and the lower end of ``rate_ci``: the one that gives the largest
        (safest) refined slope."""
        vals = [self.rate, self.rate_bracket[0]]
        if self.rate_interval is not None:
            vals.append(self.rate_interval[0])
        if self.rate_ci is not None:
            vals.append(self.rate_ci[0])
        return float(min(vals))

    @property
    def unresolved_share(self) -> float:
        """Share of the tokens behind the estimate that have no resolved share, in [0, 1].

        ``"log-shares"``: ``n_unresolved / n_tokens_used`` (the sampled tokens whose estimator
        gave up; their upper ends stand in). ``"uniform counts"``: ``n_zero / vocab_size`` (the
        tokens without a hit; filled by ``zero_fill``).
        """
        if self.estimator == "log-shares":
            return self.n_unresolved / self.n_tokens_used
        return self.n_zero / self.vocab_size

    def to_dict(self) -> dict:
        """The fields, ``rate_conservative`` and ``unresolved_share`` as a strict-JSON dict.

        Built by :func:`embgeom._json.to_jsonable`, the one converter: arrays become lists and
        a value that is not finite becomes ``None`` (null), never a string. Here ``null`` is
        ``-inf`` in ``log_median``, ``log_median_low`` and ``log_median_high`` (the median
        product of ``k`` shares is 0), ``+inf`` in a rate (``rate``, an end of
        ``rate_bracket``, ``rate_interval`` or ``rate_ci``: proven-empty cells were drawn), and
        "not computed" in ``log_total`` (NaN by default).

        Returns
        -------
        dict
            ``json.dumps(..., allow_nan=False)`` accepts it.
        """
        out = asdict(self)
        out["rate_conservative"] = self.rate_conservative
        out["unresolved_share"] = self.unresolved_share
        return to_jsonable(out)


def _check_fractions(fractions, name: str, sum_tol: float | None) -> np.ndarray:
    f = check_array(fractions, name, ndim=1)
    if f.size < 2:
        raise ValueError(f"{name}: expected at least 2 tokens, got {f.size}")
    if np.any(f < 0):
        raise ValueError(f"{name}: fractions must be >= 0, got min {f.min()}")
    if np.any(f > 1 + 1e-12):
        raise ValueError(f"{name}: fractions must be <= 1, got max {f.max()}")
    if sum_tol is not None:
        sum_tol = check_positive(sum_tol, "sum_tol", allow_zero=True)
    if sum_tol is not None and abs(float(f.sum()) - 1.0) > sum_tol:
        raise ValueError(
            f"{name}: cell-volume fractions must sum to 1 (tolerance {sum_tol}), got {f.sum():.9g}"
        )
    return f


def _check_side(bad: np.ndarray, name: str, rel: str, end: np.ndarray, f: np.ndarray) -> None:
    """Refuse the interval end ``name`` where ``bad`` (it lies on the wrong side of ``f``)."""
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}: expected {name} {rel} fractions for every token (an interval "
                         f"end on its side of the estimate), got the opposite for "
                         f"{int(bad.sum())} token(s), e.g. token {i}: {name} {end[i]:.6g}, "
                         f"fraction {f[i]:.6g}")


def _lower_quantile_exact(vals: np.ndarray, level: float) -> float:
    """Smallest ``s`` with ``P(S <= s) >= level`` for equally likely values."""
    s = np.sort(vals)
    idx = max(int(math.ceil(level * s.size - 1e-9)) - 1, 0)
    return float(s[idx])


def _median_curve(x: np.ndarray, k_max: int, max_support: int, exact_limit: int,
                  which=("point", "low", "high")):
    """log medians of the k-fold sums of the equally likely values ``x`` (may hold -inf).

    Returns (point, low, high, exact_k): ``point`` from atoms rounded to the nearest grid node,
    ``low``/``high`` from atoms rounded down/up (stochastic order brackets the true median).
    Only the curves named in ``which`` are computed beyond the exact ``k`` (the others stay
    ``-inf`` there). ``x`` must be small enough for ``k_max`` times it to be finite (the callers
    scale it, :func:`_scaled_curve`).

    Beyond the exact ``k`` the finite atoms go on a grid between their largest and smallest
    value. Atoms far below the rest (a gap wider than ``k_max - 1`` times the span above it,
    :func:`_near_count`) are left off that grid like ``-inf`` atoms while at least half of the
    ``k``-fold sums hold none of them: every sum with one lies below every sum without, so the
    median is a quantile of the sums without, on a grid of the near atoms' span (a single far
    log-share of ``-1e20`` made the grid step ``2e16`` nats and the median of ``-3.9``-nat atoms
    0). Grid values are counted down from the largest atom (``k top - j h``), so they keep its
    digits however far below the smallest atom lies.
    """
    n = x.size
    finite = np.isfinite(x)
    q_fin = finite.mean()  # probability that one draw is finite
    xf = np.sort(x[finite])[::-1]  # largest first
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
    todo = [int(k) for k in ks if k not in exact_k]
    if not todo or xf.size == 0:
        return point, low, high, exact_k
    n_near = _near_count(xf, k_max)
    q_near = n_near / n  # probability that one draw is a near atom
    results = {"point": point, "low": low, "high": high}
    # per k: the atoms whose sums hold the median and its level among them (None: -inf)
    plan = {}
    for k in todo:
        p_fin, p_near = q_fin**k, q_near**k
        if 1.0 - p_fin >= 0.5 - 1e-12:  # at least half the sums hold an empty cell
            plan[k] = None
        elif n_near < xf.size and 1.0 - p_near < 0.5 - 1e-12:  # the median has no far atom
            plan[k] = (n_near, (0.5 - (1.0 - p_near)) / p_near)
        else:
            plan[k] = (xf.size, (0.5 - (1.0 - p_fin)) / p_fin)
    for m in sorted({p[0] for p in plan.values() if p is not None}):
        ks_m = [k for k in todo if plan[k] is not None and plan[k][0] == m]
        levels = {k: plan[k][1] for k in ks_m}
        for key, vals in _grid_quantiles(xf[:m], levels, max_support, which).items():
            for k, v in vals.items():
                results[key][k - 1] = v
    return point, low, high, exact_k


def _near_count(xf: np.ndarray, k_max: int) -> int:
    """How many of the largest atoms ``xf`` (sorted, largest first, finite) are "near": the
    most ``j < len(xf)`` for which ``xf[j-1] - xf[j] > (k_max - 1) (xf[0] - xf[j-1])``, so that a
    sum of ``k <= k_max`` atoms holding one of the rest lies below every sum of ``k`` near
    atoms; ``len(xf)`` when there is no such gap."""
    if xf.size < 2:
        return int(xf.size)
    gaps = xf[:-1] - xf[1:]  # gap below atom j - 1, j = 1..len - 1
    spans = xf[0] - xf[:-1]  # span of the j largest atoms
    ok = np.flatnonzero(gaps > (k_max - 1) * spans)
    return int(ok[-1] + 1) if ok.size else int(xf.size)


def _grid_quantiles(xf: np.ndarray, levels: dict, max_support: int, which) -> dict:
    """``{curve: {k: lower level-quantile of the k-fold sum}}`` of the equally likely atoms
    ``xf`` (finite, largest first) on a grid of ``max_support`` nodes, for ``k`` in ``levels``;
    atoms rounded to the nearest node (``point``), down (``low``) or up (``high``)."""
    top = float(xf[0])
    span = top - float(xf[-1])
    B = max_support if span > 0 else 1
    h = span / (B - 1) if B > 1 else 1.0
    w = (top - xf) / h if B > 1 else np.zeros_like(xf)  # nodes below the top, in [0, B - 1]
    wts = np.full(xf.size, 1.0 / xf.size)
    # index i = B - 1 - (nodes below the top): ascending values, as the cumulative sum needs
    rounding = {"point": lambda v: np.rint(v), "low": lambda v: np.ceil(v - 1e-9),
                "high": lambda v: np.floor(v + 1e-9)}
    from scipy import signal  # FFT convolution; imported here so that import stays light

    out = {}
    k_last = max(levels)
    for key in which:
        i1 = (B - 1) - np.clip(rounding[key](w), 0, B - 1).astype(np.int64)
        p1 = np.bincount(i1, wts, minlength=B)
        pk = p1.copy()
        out[key] = {}
        for k in range(1, k_last + 1):
            if k > 1:
                pk = signal.fftconvolve(pk, p1) if B > 1 else pk
                pk = np.clip(pk, 0.0, None)
                pk /= pk.sum()
            if k not in levels:
                continue
            cdf = np.cumsum(pk)
            i = min(int(np.searchsorted(cdf, levels[k] - 1e-9)), pk.size - 1)
            out[key][k] = k * top - (k * (B - 1) - i) * h
    return out


#: Log-shares beyond this magnitude (nats) are divided by a power of two before the median
#: curve and the fit (:func:`_scaled_curve`): ``k_max`` times them, and the squares of the fit,
#: would overflow float64 (a log-share of -1e300, a share that is 0 to any precision, still
#: gives its rate).
_SCALE_LIMIT = 2.0**480


def _scaled_curve(v: np.ndarray, k_max: int, max_support: int, exact_limit: int,
                  which=("point", "low", "high")):
    """:func:`_median_curve` of ``v`` in units of ``2**e``: ``(point, low, high, exact_k, e)``.

    ``e = 0`` (``v`` as given) unless its largest finite magnitude exceeds
    :data:`_SCALE_LIMIT`; then ``v 2**-e`` lies in [-1, 0]. A power of two divides exactly and
    the median curve is homogeneous (a median of sums, a grid of the atoms' span), so the
    curve in units of ``2**e`` is the curve of ``v`` divided by ``2**e``: it is read back with
    :func:`_unscaled` and fitted with ``_fit_rate(..., e)``.
    """
    finite = v[np.isfinite(v)]
    big = float(np.max(np.abs(finite))) if finite.size else 0.0
    e = math.frexp(big)[1] if big > _SCALE_LIMIT else 0
    return (*_median_curve(np.ldexp(v, -e) if e else v, k_max, max_support, exact_limit, which), e)


def _unscaled(v, e: int):
    """``v 2**e``; a log beyond float64 (below -1.8e308 nats: a product that is 0 to any
    precision) becomes ``-inf``."""
    if not e:
        return v
    with np.errstate(over="ignore"):
        return np.ldexp(v, e)


def _fit_rate(ks: np.ndarray, y: np.ndarray, e: int = 0) -> tuple[float, float, float, float, float]:
    """(slope, intercept, r2, slope through origin, r2 through origin) of y = -log median,
    ``y`` in units of ``2**e`` (:func:`_scaled_curve`; slopes and intercept are returned in
    nats, ``inf`` beyond float64)."""
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
    slope, icpt, s0 = (float(_unscaled(np.float64(v), e)) for v in (slope, icpt, s0))
    return slope, icpt, float(r2), s0, float(r20)


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
                     upper=None, n_samples=None, n_boot: int | None = None, seed=0,
                     exact_limit: int = 2**20, sum_tol: float = 1e-6,
                     normalize: bool | None = None) -> CellVolumeRate:
    """The non-uniform-cell rate ``lambda`` (nats per token).

    Draw ``k`` tokens uniformly from the vocabulary and multiply their cell-volume fractions;
    ``-log`` of the median of that product grows by about ``lambda`` per token (docs/theory.md,
    section 5 "The non-uniform-cell refinement and lambda"). Used as ``C_refined = C_shape log|V| / lambda``.

    Parameters
    ----------
    fractions : array_like of float, shape (|V|,), or embgeom.volumes.CellVolumes
        Cell-volume fractions (e.g. ``embgeom.volumes.CellVolumes.fractions``), >= 0, summing to
        1 within ``sum_tol``. A result object with a ``cell_volume_rate`` method (a
        :class:`~embgeom.volumes.CellVolumes`) answers for itself: this function returns
        ``fractions.cell_volume_rate(k_max, n_boot=..., seed=..., ...)``, which knows its
        estimator (rare-event log-shares go to :func:`cell_volume_rate_from_logs`, uniform counts
        come back here with their intervals and sample count); ``lower``, ``upper`` and
        ``n_samples`` must then be left out (they are the object's own).
    k_max : int, default 32
        Largest number of tokens ``k``, 1 to :data:`K_MAX_LIMIT` (256); the fit uses
        ``k = 1..k_max``.
    max_support : int, default 4096
        Grid size (atoms) of the discretised distribution of one log-fraction when the exact
        enumeration is too large.
    lower, upper : array_like of float, shape (|V|,), optional
        Monte Carlo interval ends of the fractions (e.g. 95%). ``upper`` also replaces the zero
        fractions (see Notes); both give ``rate_interval``.
    n_samples : int, optional
        Monte Carlo sample count behind ``fractions``: zero fractions are replaced by ``3 /
        n_samples`` when ``upper`` is not given, and it enables the bootstrap.
    n_boot : int, optional
        Parametric bootstrap replicates (counts ~ Multinomial(n_samples, fractions)); needs
        ``n_samples``. ``None``: 0 (no bootstrap) for fractions; for a ``CellVolumes``, its
        estimator's default (see :meth:`~embgeom.volumes.CellVolumes.cell_volume_rate`). An
        explicit 0 always means no bootstrap.
    seed : int, Generator or None, default 0
        Seed of the bootstrap.
    exact_limit : int, default 2**20
        Enumerate all ``|V|^k`` products exactly while ``|V|^k <= exact_limit``.
    sum_tol : float, default 1e-6
        Tolerance on ``sum(fractions) = 1``.
    normalize : bool, optional
        Divide the fractions by their sum after the zero fill (and each interval end and
        bootstrap replicate by its own), so that lambda comes from a proper distribution; the
        sum before is ``exp(log_total)``. ``None``: True for fractions; for a ``CellVolumes``,
        its estimator's default.

    Returns
    -------
    CellVolumeRate

    Raises
    ------
    TypeError, ValueError
        Not a 1-D float array, NaN/inf, negative entries, fewer than 2 tokens, a sum away from
        1, ``k_max`` outside [1, 256], ``max_support < 2``, mismatched ``lower``/``upper`` shapes,
        ``lower > upper``, ``lower > fractions`` or ``upper < fractions`` for a token (beyond a
        relative 1e-9), ``n_boot > 0`` without ``n_samples``; ``lower``, ``upper`` or
        ``n_samples`` given with a ``CellVolumes``.

    Notes
    -----
    *Method.* The log-fraction of a uniformly drawn token is a discrete distribution with
    ``|V|`` equally likely atoms; the product of ``k`` fractions is the ``k``-fold sum of
    log-fractions (multiplicative convolution in the log domain). While ``|V|^k`` is small it is
    enumerated exactly; beyond that the atoms are put on a uniform grid of ``max_support`` nodes
    between the smallest and largest log-fraction and convolved with FFTs (atoms far below the
    rest are left off the grid for the ``k`` whose median holds none of them, as
    :func:`cell_volume_rate_from_logs` explains under *Far-apart log-shares*). Rounding every atom
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
    refined ``C``: the conservative direction for each token. The filled fractions sum to more
    than 1 (to about 2 for SmolLM2 with 100,000 samples, where 34,124 of 49,152 tokens get no
    hit), which shifts every log-fraction up by the same ``log sum`` and lowers lambda by about
    that much, even ``rate_asymptotic`` below ``log|V|``: against Jensen, so a defect, not
    caution. ``normalize=True`` (the default) divides by the sum, restoring a proper
    distribution (``rate_asymptotic >= log|V|`` again); the zero fill then only spreads the
    unseen tokens' mass. With many zeros the figure is an indication at best: use the rare-event
    log-shares (:func:`cell_volume_rate_from_logs`) where the cells are cones.

    *Uncertainty.* ``rate_interval`` recomputes lambda with all fractions at their upper interval
    ends (conservative end) and at their lower ends (zeros kept as ``-inf`` there, which can make
    that end infinite). These are per-token (not simultaneous) intervals, so the pair is an
    indication, not a calibrated confidence interval. The bootstrap gives a standard error.

    The refinement is the paper's heuristic for typical (median) sequences; it is not a counting
    bound (``docs/theory.md``).
    """
    if callable(getattr(type(fractions), "cell_volume_rate", None)):  # a result that answers
        given = [n for n, v in (("lower", lower), ("upper", upper), ("n_samples", n_samples))
                 if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: not accepted with a {type(fractions).__name__}, "
                             "which carries its own intervals and sample count")
        return fractions.cell_volume_rate(k_max, n_boot=n_boot, seed=seed, max_support=max_support,
                                          exact_limit=exact_limit, sum_tol=sum_tol,
                                          normalize=normalize)
    n_boot = 0 if n_boot is None else n_boot
    normalize = True if normalize is None else normalize
    if not isinstance(normalize, (bool, np.bool_)):
        raise TypeError(f"normalize: expected True, False or None, got {normalize!r}")
    f = _check_fractions(fractions, "fractions", sum_tol)
    k_max = _check_k_max(k_max)
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
    if lo is not None and up is not None and np.any(lo > up):
        raise ValueError(f"lower and upper: expected lower <= upper for every token, got lower > "
                         f"upper for {int(np.sum(lo > up))} token(s)")
    # an interval holds its estimate (to a relative 1e-9: the ends are computed apart from it)
    if lo is not None:
        _check_side(lo > f * (1 + 1e-9), "lower", "<=", lo, f)
    if up is not None:
        _check_side(up < f * (1 - 1e-9), "upper", ">=", up, f)
    if n_boot > 0 and n_samples is None:
        raise ValueError("n_boot: a bootstrap needs n_samples (the Monte Carlo sample count)")

    g, fill, nz = _fill_zeros(f, up, n_samples)
    log_total = float(np.log(g.sum()))
    ks = np.arange(1, k_max + 1)

    def rate_of(vals: np.ndarray):
        if normalize and vals.sum() > 0:
            vals = vals / vals.sum()
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
        asym = float(-np.mean(np.log(g / g.sum() if normalize else g)))
    return CellVolumeRate(
        estimator="uniform counts",
        rate=slope, intercept=icpt, r2=r2, rate_origin=s0, r2_origin=r20, k=ks.astype(np.int64),
        log_median=point, log_median_low=low, log_median_high=high, rate_bracket=bracket,
        rate_interval=interval, rate_bootstrap=boot, rate_asymptotic=asym,
        log_vocab=math.log(f.size), n_zero=nz, zero_fill=fill, exact_k=exact_k,
        vocab_size=int(f.size), n_tokens_used=int(f.size), normalized=bool(normalize),
        log_total=log_total, n_empty=0,
    )


def _check_logs(log_fractions, log_lower, log_upper, vocab_size):
    """Validated (x, lo, hi, V): the sampled tokens' log-shares and interval ends (nats)."""
    x = check_array(log_fractions, "log_fractions", ndim=1, finite=False)
    arrays = {}
    for name, a in (("log_lower", log_lower), ("log_upper", log_upper)):
        if a is None:
            arrays[name] = None
            continue
        a = check_array(a, name, ndim=1, finite=False)
        if a.shape != x.shape:
            raise ValueError(f"{name}: expected shape {x.shape} (as log_fractions), got {a.shape}")
        arrays[name] = a
    lo, hi = arrays["log_lower"], arrays["log_upper"]
    # a token is in the sample when it has a figure: a log-share, or (unresolved) an upper end
    in_sample = ~np.isnan(x) if hi is None else ~(np.isnan(x) & np.isnan(hi))
    if vocab_size is None:
        vocab_size = x.size
    V = check_positive_int(vocab_size, "vocab_size", minimum=2)
    x, lo, hi = x[in_sample], (None if lo is None else lo[in_sample]), (None if hi is None else hi[in_sample])
    if x.size < 2:
        raise ValueError(f"log_fractions: expected at least 2 tokens with a figure, got {x.size}")
    if x.size > V:
        raise ValueError(f"vocab_size: {V} is smaller than the {x.size} tokens given")
    unresolved = np.isnan(x)
    if unresolved.any() and (hi is None or np.isnan(hi[unresolved]).any()):
        raise ValueError("log_fractions: nan (unresolved) needs a log_upper end for that token")
    tol = 1e-9
    for name, a in (("log_fractions", x), ("log_lower", lo), ("log_upper", hi)):
        if a is not None and np.any(a[~np.isnan(a)] > tol):
            raise ValueError(f"{name}: log-shares must be <= 0 (a share <= 1), got max {np.nanmax(a)}")
    if lo is not None and np.isnan(lo[~unresolved]).any():
        raise ValueError("log_lower: nan for a token with a log-share")
    if hi is not None and np.isnan(hi).any():
        raise ValueError("log_upper: nan for a token with a log-share")
    with np.errstate(invalid="ignore"):
        if lo is not None and np.any(lo[~unresolved] > x[~unresolved] + tol):
            raise ValueError("log_lower: expected log_lower <= log_fractions")
        if hi is not None and np.any(hi[~unresolved] < x[~unresolved] - tol):
            raise ValueError("log_upper: expected log_upper >= log_fractions")
    return x, lo, hi, V


#: Largest ``k_max`` accepted: the median curve's cost grows about as ``k_max^2`` (13 s at
#: 200 on 50 tokens, minutes beyond 500), and lambda's fit has settled long before (32 is the
#: default; docs/theory.md, section 5).
K_MAX_LIMIT = 256


def _check_k_max(k_max) -> int:
    k_max = check_positive_int(k_max, "k_max")
    if k_max > K_MAX_LIMIT:
        raise ValueError(f"k_max: expected at most {K_MAX_LIMIT} (the cost grows as k_max^2 and "
                         f"the fit of lambda has settled long before), got {k_max}")
    return k_max


def _log_total(v: np.ndarray, V: int) -> float:
    """``log(|V| mean_t exp(v_t))``: the estimated log of the shares' sum (0 when proper)."""
    from scipy.special import logsumexp

    return float(logsumexp(v) + math.log(V) - math.log(v.size))


def _normalised(v: np.ndarray, V: int, norm: bool) -> np.ndarray:
    """The log-shares divided by their estimated sum when ``norm``, else as given.

    Shifted by their largest finite value first: ``v - max`` is exact where the values are
    within a factor 2 of each other (Sterbenz), so log-shares of ``-1e20`` each renormalise to
    ``-log|V|`` (``v - log_total`` lost the ``log|V|`` below the ulp of ``1e20``).
    """
    if not norm:
        return v
    finite = v[np.isfinite(v)]
    if finite.size == 0:  # every share 0 (a replicate of empty cells): nothing to divide
        return v
    with np.errstate(invalid="ignore"):
        u = v - float(finite.max())
    return u - _log_total(u, V)


def _log_share_bootstrap(x, lo, hi, unresolved, empty, V: int, norm: bool, sample: bool, ks,
                         n_boot: int, confidence: float, token_confidence: float,
                         max_support: int, exact_limit: int, rng):
    """The bootstrap of :func:`cell_volume_rate_from_logs` (its Notes, *Interval*).

    Returns ``(rate_bootstrap, rate_ci, ci_includes, log_total_ci)``: the replicates' (mean,
    std), their percentile interval at ``confidence``, the parts of the error included, and the
    percentile interval of the estimated log-sum. Tokens with a log-share but no lower end
    (``lo = -inf``: the share may be 0) are computed at both ends of their interval in every
    replicate; the intervals are then the envelope of the two ends' percentile intervals.
    """
    from scipy import stats

    n = x.size
    se = np.zeros(n)
    includes = []
    wide = np.zeros(n, bool)
    if lo is not None:
        z = float(stats.norm.ppf(0.5 + token_confidence / 2))
        ok = ~unresolved & ~empty & np.isfinite(lo)
        se[ok] = (x[ok] - lo[ok]) / z
        wide = ~unresolved & ~empty & np.isneginf(lo)
    if sample:
        includes.append(f"token sampling (bootstrap over the {n} sampled tokens of {V})")
    if np.any(se > 0):
        includes.append("per-token Monte Carlo error (each log-share redrawn from its interval)")
    ends = [None]
    if wide.any():
        ends = _wide_ends(x, hi, wide, norm)
        includes.append(f"{int(wide.sum())} token(s) without a lower end (log_lower -inf: a share "
                        f"that may be 0), each replicate computed with them at share 0, at their "
                        f"estimate, at their upper end "
                        f"{'(log_upper)' if hi is not None else '(share 1)'}"
                        f"{' and at the mean share' if norm else ''}: the envelope of those")
    if norm:
        includes.append("renormalisation (each replicate divided by its own estimated sum)")
    # the redraw in units of 2**s: se of a log-share near -1.8e308 times a normal overflowed
    big = np.abs(np.concatenate([x[np.isfinite(x)], se]))
    s = math.frexp(float(big.max()))[1] if big.size and big.max() > _SCALE_LIMIT else 0
    xs, ses = np.ldexp(x, -s), np.ldexp(se, -s)
    vals = np.empty((len(ends), n_boot))
    totals = np.empty((len(ends), n_boot))
    for b in range(n_boot):
        idx = rng.integers(0, n, n) if sample else np.arange(n)
        xb = x[idx]
        if np.any(se > 0):
            with np.errstate(invalid="ignore"):
                xb = _unscaled(np.minimum(xs[idx] + ses[idx] * rng.standard_normal(n), 0.0), s)
            xb = np.where(np.isneginf(x[idx]), -np.inf, xb)
        for j, end in enumerate(ends):
            xe = xb if end is None else np.where(wide[idx], end[idx], xb)
            # replicates on a coarser grid (<= 1024 atoms: a few hundredths of a nat per atom
            # on real models, far below the sampling spread) and exact only at k = 1: the cost
            totals[j, b] = _log_total(xe, V)
            pb, _, _, _, e = _scaled_curve(_normalised(xe, V, norm), ks.size,
                                           min(max_support, 1024), min(exact_limit, n),
                                           which=("point",))
            vals[j, b] = _fit_rate(ks, -pb, e)[0]
    alpha = 1.0 - float(confidence)

    def q(v, p):  # an order statistic, not an interpolation: an infinite rate (proven-empty
        return float(np.quantile(v, p, method="inverted_cdf"))  # cells drawn) stays inf

    ci = (min(q(v, alpha / 2) for v in vals), max(q(v, 1 - alpha / 2) for v in vals))
    total_ci = (min(q(t, alpha / 2) for t in totals), max(q(t, 1 - alpha / 2) for t in totals))
    return _mean_std(vals.ravel()), ci, includes, total_ci


def _wide_ends(x: np.ndarray, hi, wide: np.ndarray, norm: bool) -> list:
    """The log-shares with the ``wide`` tokens (a log-share but no lower end: the share lies
    anywhere in ``[0, exp(hi)]``, ``hi`` 0 when not given) set to the values where lambda takes
    its extremes over that range: share 0 (``-inf``: the largest lambda), their estimate, their
    upper end (the smallest lambda without renormalisation, where lambda falls as any share
    grows) and, renormalised, the sample's mean share capped at the upper end (lambda, about
    ``-mean log f + log sum f``, is smallest where a share is near the mean share, and grows
    towards both 0 and 1)."""
    cap = np.where(wide, hi if hi is not None else 0.0, x)
    ends = [np.where(wide, -np.inf, x), x, cap]
    if norm:
        from scipy.special import logsumexp

        fin = x[np.isfinite(x)]
        ends.append(np.where(wide, np.minimum(cap, float(logsumexp(fin)) - math.log(fin.size)), x))
    return ends


def _mean_std(vals: np.ndarray) -> tuple[float, float]:
    """``(mean, std)`` (``ddof=1``; 0 for one value) of bootstrap rates, in units of a power of
    two where they are near the float range (the squares of rates of 1e300 overflowed);
    infinite rates (proven-empty cells drawn) give a mean of inf and a spread of nan."""
    finite = vals[np.isfinite(vals)]
    big = float(np.max(np.abs(finite))) if finite.size else 0.0
    e = math.frexp(big)[1] if big > _SCALE_LIMIT else 0
    v = np.ldexp(vals, -e)
    with np.errstate(invalid="ignore"):
        mean, std = np.mean(v), (np.std(v, ddof=1) if v.size > 1 else 0.0)
    return float(_unscaled(np.float64(mean), e)), float(_unscaled(np.float64(std), e))


def cell_volume_rate_from_logs(log_fractions, k_max: int = 32, *, log_lower=None, log_upper=None,
                               vocab_size=None, normalize="auto", n_boot: int = 200,
                               confidence: float = 0.95, token_confidence: float = 0.95,
                               max_support: int = 4096, exact_limit: int = 2**20,
                               seed=0) -> CellVolumeRate:
    """lambda (nats per token) from per-token log-shares: every token's, or a uniform sample's.

    The same functional as :func:`cell_volume_rate` (draw ``k`` tokens uniformly, multiply
    their cell shares; ``-log`` of the median of the product grows by lambda per token;
    docs/theory.md, section 5), computed from log-shares such as the rare-event estimates
    of :func:`embgeom.volumes.cell_volumes` (``log_fractions``, ``log_lower``, ``log_upper``),
    with no zero filling: a share is used as estimated, ``-inf`` only for a cell proven empty.

    Parameters
    ----------
    log_fractions : array_like of float, shape (n,)
        Log-shares in nats (<= 0): ``log(vol(E_t ∩ S) / vol(S))``. ``-inf``: a cell proven
        empty. ``nan``: a token without a figure; it is left out unless ``log_upper`` is finite
        there (an unresolved token: its upper end stands in, the conservative side). A
        ``(|V|,)`` array with ``nan`` outside a token sample (``CellVolumes.log_fractions``)
        is the same as the sample's entries with ``vocab_size=|V|``.
    k_max : int, default 32
        Largest number of tokens ``k``, 1 to :data:`K_MAX_LIMIT` (256); the fit uses
        ``k = 1..k_max``.
    log_lower, log_upper : array_like of float, shape (n,), optional
        Per-token two-sided ``token_confidence`` interval ends (nats). With them the bootstrap
        also redraws each token's log-share within its interval. A ``log_lower`` of ``-inf``
        beside a finite log-share (no lower end: the share may be 0) widens ``rate_ci`` to
        cover that token anywhere in its interval, possibly to ``inf`` (Notes, *Interval*).
    vocab_size : int, optional
        ``|V|``; default ``n``. When the ``n`` tokens with figures are fewer than ``|V|`` they
        are taken as a uniform sample without replacement of the vocabulary (seeded, independent
        of the shares: the caller's promise), and the bootstrap resamples them.
    normalize : {"auto", True, False}, default "auto"
        Divide the shares by their estimated sum ``|V| mean_t f_t`` (``exp(log_total)``) before
        the median curve. ``"auto"``: when every token of the vocabulary has a figure (then the
        sum is known to be 1 and its departure is estimation error; dividing makes the
        distribution proper, so ``rate_asymptotic >= log|V|`` by Jensen). With a token sample
        the estimated sum is itself noisy (dominated by the few largest cells), so ``"auto"``
        does not divide and reports ``log_total`` as a check (it should be near 0).
    n_boot : int, default 200
        Bootstrap replicates for ``rate_ci`` (0: none).
    confidence : float, default 0.95
        Level of ``rate_ci`` (percentile interval).
    token_confidence : float, default 0.95
        Level of the per-token intervals: the redraw uses the standard error
        ``(log_fractions - log_lower) / z`` with ``z`` the normal quantile of that level.
    max_support, exact_limit : int
        As in :func:`cell_volume_rate` (grid size; exact enumeration while ``n^k <= exact_limit``).
    seed : int, Generator or None, default 0
        Seed of the bootstrap.

    Returns
    -------
    CellVolumeRate
        ``rate`` (lambda), ``rate_ci`` with ``ci_includes``, ``rate_asymptotic`` (``-mean log
        f``), ``log_total``, ``token_sample``, ``n_tokens_used``, ``vocab_size``,
        ``log_total_ci``, ``log_vocab = log|V|``, ``n_unresolved``, ``n_empty``; ``n_zero`` is 0 and
        ``zero_fill`` ``"none"``; ``rate_interval`` is None (see Notes).

    Raises
    ------
    TypeError, ValueError
        Not 1-D float arrays; a log-share > 0 or ``+inf``; mismatched shapes; fewer than 2
        tokens with figures; ``vocab_size`` below their number; a ``nan`` log-share without an
        upper end; ``log_lower > log_fractions`` or ``log_upper < log_fractions``;
        ``k_max`` outside [1, 256];
        ``n_boot < 0``; levels outside (0, 1); an unknown ``normalize``.

    Notes
    -----
    *From a sample.* ``log`` of the product of ``k`` uniformly drawn tokens' shares is a sum of
    ``k`` i.i.d. draws of the log-share of a uniform token. With a uniform token sample, the
    sample's empirical distribution estimates that law, so the median curve is computed from
    the sample exactly as :func:`cell_volume_rate` does from the whole vocabulary (enumeration
    for small ``k``, grid convolutions with a bracketing beyond; the definition of docs/theory.md, section 5, draws
    with replacement, as the empirical law does). lambda is then a smooth functional of that
    law (about ``-E log f`` at large ``k``), estimated with an error of order
    ``sd(log f) / sqrt(n)``: about 2 nats / sqrt(1000) = 0.06 nats on SmolLM2.

    *Interval.* Each bootstrap replicate (i) resamples the ``n`` tokens with replacement (the
    token-sampling error; skipped when every token is given), (ii) redraws each token's
    log-share from ``N(point, se^2)`` truncated at 0, ``se`` from its interval (the per-token
    Monte Carlo error; unresolved tokens keep their upper end, empty cells ``-inf``) and (iii)
    renormalises when ``normalize`` applies; ``rate_ci`` is the percentile interval of the
    replicates' lambda, ``rate_bootstrap`` their (mean, std), and ``ci_includes`` names the
    parts included. Not included: a bias of the per-token estimator beyond its interval, the
    finite ``k_max`` of the fit, the grid (``rate_bracket`` reports that). The per-token
    extreme-ends pair of :func:`cell_volume_rate` (``rate_interval``) is not formed here: after
    renormalisation a common shift of all log-shares cancels, and without it the pair treats
    per-token errors as perfectly correlated; the redraw treats them as independent, which they
    are (each token has its own seed).

    *Tokens without a lower end.* A token with a log-share but ``log_lower = -inf`` (its share
    may be 0) has no spread to redraw from: treating it as exact made ``rate_ci`` as narrow as
    if it were. Its share may lie anywhere in ``[0, exp(log_upper)]`` (``[0, 1]`` without
    ``log_upper``), so every replicate is computed with all such tokens at share 0 (``-inf``,
    the largest lambda: infinite once empty cells reach the median), at their estimate, at their
    upper end and, with renormalisation, at the sample's mean share below that end (lambda is
    smallest near it); ``rate_ci`` and ``log_total_ci`` are the envelopes of those percentile
    intervals and ``rate_bootstrap`` pools their replicates. The cost is 3 (4 renormalised)
    bootstraps instead of one, only when such tokens exist.

    *Far-apart log-shares.* Log-shares of very different size (one of ``-1e20`` among values of
    a few nats, or ``-1e300``) keep their digits: the grid of the median curve leaves out the
    atoms far below the rest (below a gap wider than ``k_max - 1`` times the span above it) for
    the ``k`` at which fewer than half of the sums of ``k`` shares hold one, as it leaves out
    empty cells, and counts its nodes down from the largest atom; log-shares beyond ``2**480``
    nats are divided by a power of two (exactly) for the curve, the fit and the bootstrap, so
    nothing overflows. A ``log_median`` below ``-1.8e308`` nats (a product that is 0 to any
    precision) is reported as ``-inf``.

    Examples
    --------
    >>> import numpy as np
    >>> r = cell_volume_rate_from_logs(np.full(50, -np.log(50)), 8, n_boot=0)
    >>> bool(round(r.rate, 9) == round(np.log(50), 9))
    True
    """
    x, lo, hi, V = _check_logs(log_fractions, log_lower, log_upper, vocab_size)
    k_max = _check_k_max(k_max)
    max_support = check_positive_int(max_support, "max_support", minimum=2)
    exact_limit = check_positive_int(exact_limit, "exact_limit")
    n_boot = check_positive_int(n_boot, "n_boot", minimum=0)
    for name, c in (("confidence", confidence), ("token_confidence", token_confidence)):
        if isinstance(c, bool) or not isinstance(c, (int, float, np.floating)) or not 0 < float(c) < 1:
            raise ValueError(f"{name}: expected a level in (0, 1), got {c!r}")
    if normalize not in ("auto", True, False):
        raise ValueError(f"normalize: expected 'auto', True or False, got {normalize!r}")
    n = x.size
    sample = n < V
    norm = (not sample) if normalize == "auto" else bool(normalize)
    unresolved = np.isnan(x)
    x = np.where(unresolved, hi if hi is not None else np.nan, x)  # upper ends stand in
    empty = np.isneginf(x)
    if empty.all():
        raise ValueError("log_fractions: every cell is empty (-inf): no share to draw")
    ks = np.arange(1, k_max + 1)
    xn = _normalised(x, V, norm)
    point, low, high, exact_k, e = _scaled_curve(xn, k_max, max_support, exact_limit)
    slope, icpt, r2, s0, r20 = _fit_rate(ks, -point, e)
    bracket = (_fit_rate(ks, -high, e)[0], _fit_rate(ks, -low, e)[0])
    boot, ci, includes, total_ci = None, None, [], None
    if n_boot > 0:
        boot, ci, includes, total_ci = _log_share_bootstrap(
            x, lo, hi, unresolved, empty, V, norm, sample, ks, n_boot, confidence,
            token_confidence, max_support, exact_limit, check_seed(seed))
    with np.errstate(invalid="ignore"):  # the mean in units of 2**e: a sum of -1e308s overflowed
        asym = float(-_unscaled(np.mean(np.ldexp(xn, -e)), e))
    return CellVolumeRate(
        estimator="log-shares",
        rate=slope, intercept=icpt, r2=r2, rate_origin=s0, r2_origin=r20, k=ks.astype(np.int64),
        log_median=_unscaled(point, e), log_median_low=_unscaled(low, e),
        log_median_high=_unscaled(high, e), rate_bracket=bracket,
        rate_interval=None, rate_bootstrap=boot, rate_asymptotic=asym, log_vocab=math.log(V),
        n_zero=0, zero_fill="none", exact_k=exact_k, vocab_size=int(V), n_tokens_used=int(n),
        token_sample=bool(sample), normalized=bool(norm), log_total=_log_total(x, V),
        rate_ci=ci, ci_level=float(confidence) if ci else None, ci_includes=includes,
        n_unresolved=int(unresolved.sum()), n_empty=int(empty.sum()), log_total_ci=total_ci,
    )
