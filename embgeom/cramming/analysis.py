"""Statistics of cramming results: accessibility curves, n50 and the empirical slope C_emp.

numpy and scipy only (no torch): ``import embgeom.cramming.analysis`` works on a machine
without torch, e.g. to refit saved ``cram_summary.json`` curves.

- :class:`AccessibilityCurve`: successes per target length, with Wilson intervals.
- :func:`n50`: logistic fit of accessibility vs length, with a bootstrap interval.
- :func:`fit_slope`: ``C_emp`` (tokens per memory vector) with intervals and R^2, and the ratio
  against ``C_theory``.
- :func:`theory_slope`: ``C_theory`` from :mod:`embgeom.bounds`.

Sources: the linear law n50 = C m of M. Meyer et al., "How Many Different Outputs Can a
Transformer Generate?", ICML 2026, Cor. 4.6 and Sec. 5; the protocol of Y. Kuratov et al.,
ACL 2025 (arXiv 2502.13063).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, special, stats

from embgeom._threads import single_blas_thread
from embgeom._validation import check_positive, check_positive_int, check_probability, check_seed

__all__ = ["AccessibilityCurve", "HorizonCurve", "n50", "fit_slope", "theory_slope"]


@dataclass
class AccessibilityCurve:
    """Accessibility vs target length for one number of memory vectors.

    Attributes
    ----------
    n_mem : int
    lengths : numpy.ndarray of int64, shape (K,)
        Target lengths (tokens), ascending.
    successes : numpy.ndarray of int64, shape (K,)
        Targets reaching 100% teacher-forced token accuracy (the paper's criterion).
    successes_generation : numpy.ndarray of int64, shape (K,)
        Targets reproduced by greedy generation from the memory vectors alone.
    trials : numpy.ndarray of int64, shape (K,)
    accessibility, lower, upper : numpy.ndarray of float64, shape (K,)
        successes / trials and its Wilson 95% interval.
    settings : dict
    """

    n_mem: int
    lengths: np.ndarray
    successes: np.ndarray
    successes_generation: np.ndarray
    trials: np.ndarray
    settings: dict = field(default_factory=dict)

    @property
    def accessibility(self) -> np.ndarray:
        """float64 (K,): successes / trials."""
        return self.successes / np.maximum(self.trials, 1)

    @property
    def intervals(self):
        """``(lower, upper)``, float64 (K,) each: the Wilson 95% interval per length."""
        from embgeom._stats import wilson_interval

        return wilson_interval(self.successes, self.trials)

    def to_dict(self) -> dict:
        """JSON-able form: the arrays as lists, with accessibility and its interval (through
        :mod:`embgeom._json`: non-finite numbers are ``null``)."""
        from embgeom._json import to_jsonable

        lo, hi = self.intervals
        return to_jsonable({
            "n_mem": int(self.n_mem),
            "lengths": self.lengths.tolist(),
            "successes": self.successes.tolist(),
            "successes_generation": self.successes_generation.tolist(),
            "trials": self.trials.tolist(),
            "accessibility": self.accessibility.tolist(),
            "lower": lo.tolist(),
            "upper": hi.tolist(),
            "settings": self.settings,
        })


def _curve_arrays(curve):
    if isinstance(curve, AccessibilityCurve):
        x, k, N = curve.lengths, curve.successes, curve.trials
    elif isinstance(curve, dict):
        try:
            x, k, N = curve["lengths"], curve["successes"], curve["trials"]
        except KeyError as e:
            raise ValueError(f"curve: dict lacks the key {e}") from None
    else:
        raise TypeError(
            f"curve: expected an AccessibilityCurve or a dict with lengths/successes/trials, "
            f"got {type(curve).__name__}"
        )
    x = np.asarray(x, np.float64)
    k = np.asarray(k, np.float64)
    N = np.asarray(N, np.float64)
    if x.ndim != 1 or x.size == 0 or k.shape != x.shape or N.shape != x.shape:
        raise ValueError("curve: lengths, successes and trials must be 1-D of the same length >= 1")
    if not (np.isfinite(x).all() and np.isfinite(k).all() and np.isfinite(N).all()):
        raise ValueError("curve: lengths, successes and trials must be finite (no NaN or inf)")
    if np.any(x <= 0) or np.any(N < 1) or np.any(k < 0) or np.any(k > N):
        raise ValueError("curve: expected lengths > 0, trials >= 1 and 0 <= successes <= trials")
    return x, k, N


def _logistic_fit(x, k, N, s_min: float):
    """Binomial MLE of p(n) = 1 / (1 + exp((n - n50) / s)); returns (n50, s) or None if censored."""
    p = k / N
    if np.all(p >= 0.5) or np.all(p < 0.5):
        return None
    span = float(x.max() - x.min()) or 1.0

    def nll(theta):
        # -sum[k log sigma(-z) + (N - k) log sigma(z)], z = (x - loc) / s, and its gradient in
        # (loc, log s): d/dz = N sigma(z) - (N - k), dz/dloc = -1/s, dz/dlog s = -z
        loc, log_s = theta
        zz = (x - loc) / np.exp(log_s)
        val = -float(np.sum(k * special.log_expit(-zz) + (N - k) * special.log_expit(zz)))
        g = N * special.expit(zz) - (N - k)
        return val, np.array([-float(g.sum()) / np.exp(log_s), -float(g @ zz)])

    # start: linear interpolation of the first 0.5 crossing
    i = int(np.argmax(p < 0.5))
    if i == 0:
        loc0 = float(x[0])
    else:
        x0, x1, p0, p1 = x[i - 1], x[i], p[i - 1], p[i]
        loc0 = float(x0 + (p0 - 0.5) / max(p0 - p1, 1e-12) * (x1 - x0))
    s_max = max(span, 2 * s_min)
    best = None
    for s0 in (max(s_min, span / 8), max(s_min, span / 2)):
        r = optimize.minimize(
            nll, x0=[loc0, math.log(s0)], method="L-BFGS-B", jac=True,
            bounds=[(x.min() - span, x.max() + span), (math.log(s_min), math.log(s_max))],
        )
        if best is None or r.fun < best.fun:
            best = r
    return float(best.x[0]), float(math.exp(best.x[1]))


#: The fewest bootstrap resamples a reported interval may rest on (0: no interval at all). With
#: n_boot=1 the "95%" interval was one redraw (lower == upper); below about 100 the 2.5% and
#: 97.5% quantiles are the extreme one or two draws, so the interval is mostly noise.
MIN_BOOT = 100


def check_n_boot(n_boot, name: str = "n_boot") -> int:
    """``n_boot`` as an int: 0 (no interval: ``lower`` and ``upper`` are None) or at least
    :data:`MIN_BOOT`.

    Raises
    ------
    TypeError
        Not an integer.
    ValueError
        Negative, or between 1 and ``MIN_BOOT - 1``; the message names ``name``.
    """
    n = check_positive_int(n_boot, name, minimum=0)
    if 0 < n < MIN_BOOT:
        raise ValueError(f"{name}: expected 0 (no interval) or at least {MIN_BOOT} bootstrap "
                         f"resamples, got {n} (a percentile interval from so few draws is "
                         "mostly noise)")
    return n


def n50(curve, *, n_boot: int = 200, seed=0, confidence: float = 0.95, s_min: float = 0.5) -> dict:
    """The length where accessibility crosses 50%, from a logistic fit, with a bootstrap interval.

    Fits ``p(n) = 1 / (1 + exp((n - n50) / s))`` to the per-length success counts by binomial
    maximum likelihood (``scipy.optimize.minimize``, L-BFGS-B), with the scale ``s`` bounded
    below by ``s_min`` tokens (lengths are integers: a sharper transition is not resolvable).
    The interval is a parametric bootstrap: each length's successes are redrawn
    Binomial(trials, observed fraction) and refitted ``n_boot`` times (seeded); percentile
    interval. Perfectly separated data (every target crammed up to length a, none from the next
    tested length b) carry no information on where in (a, b) the crossing is: n50 is then the
    midpoint and the interval is ``[a, b]`` (``separated`` True).

    Parameters
    ----------
    curve : AccessibilityCurve or dict with ``lengths``, ``successes``, ``trials``
    n_boot : int, default 200
        Bootstrap resamples: 0 (no interval: ``lower`` and ``upper`` are None, except for
        separated data, whose interval is the gap) or at least :data:`MIN_BOOT` (100).
    seed : seed, default 0
        Seed of the bootstrap draws: anything ``numpy.random.default_rng`` accepts.
    confidence : float in (0, 1), default 0.95
        Level of the bootstrap interval (1 would ask for the whole range of the replicates).
    s_min : float, default 0.5
        Lower bound of the logistic scale (tokens).

    Returns
    -------
    dict
        ``n50`` (tokens; NaN when censored), ``lower``, ``upper`` (bootstrap interval; a
        bootstrap draw with no crossing counts as +inf or -inf; None with ``n_boot=0``), ``scale`` (tokens),
        ``censored`` (None, ``"above"``: accessibility >= 0.5 at every tested length, so
        n50 > max length; ``"below"``: < 0.5 everywhere), ``separated`` (bool), ``n_boot``,
        ``confidence``.

    Raises
    ------
    TypeError, ValueError
        Malformed curve or settings; ``n_boot`` negative or in ``1 .. MIN_BOOT - 1``.
    """
    x, k, N = _curve_arrays(curve)
    n_boot = check_n_boot(n_boot)
    confidence = check_probability(confidence, "confidence", open_right=True)
    s_min = check_positive(s_min, "s_min")
    rng = check_seed(seed)
    with single_blas_thread():  # L-BFGS-B on 2 parameters: thread start-up dominates
        return _n50_fit(x, k, N, s_min, rng, n_boot, confidence)


def _n50_fit(x, k, N, s_min, rng, n_boot, confidence) -> dict:
    base = {"n_boot": n_boot, "confidence": confidence, "lengths_max": float(x.max()),
            "lengths_min": float(x.min())}
    fit = _logistic_fit(x, k, N, s_min)
    if fit is None:
        censored = "above" if np.all(k / N >= 0.5) else "below"
        return {"n50": float("nan"), "lower": float("nan"), "upper": float("nan"),
                "scale": float("nan"), "censored": censored, "separated": False, **base}
    loc, scale = fit
    p = k / N
    gap = _separation_gap(x, p)
    if gap is not None:
        # every length up to a passes, every length from b fails: the likelihood cannot place
        # n50 inside (a, b), so report the midpoint and the whole gap, not a bootstrap of zeros
        return {"n50": 0.5 * (gap[0] + gap[1]), "lower": gap[0], "upper": gap[1],
                "scale": s_min, "censored": None, "separated": True, **base}
    boots = np.empty(n_boot)
    for b in range(n_boot):
        kb = rng.binomial(N.astype(np.int64), p).astype(np.float64)
        fb = _logistic_fit(x, kb, N, s_min)
        if fb is None:
            boots[b] = np.inf if np.all(kb / N >= 0.5) else -np.inf
        else:
            boots[b] = fb[0]
    if n_boot:
        a = (1 - confidence) / 2
        lower, upper = (float(np.quantile(boots, q, method="inverted_cdf")) for q in (a, 1 - a))
    else:  # no interval was asked for: none, rather than NaN bounds that look like a failure
        lower = upper = None
    return {"n50": loc, "lower": lower, "upper": upper, "scale": scale, "censored": None,
            "separated": False, **base}


def _separation_gap(x, p):
    """``(a, b)`` when accessibility is 1 at every length <= a and 0 at every length >= b
    (a < b adjacent in the data), else None."""
    ones, zeros = p == 1, p == 0
    if not (ones | zeros).all():
        return None
    i = int(np.argmax(zeros))
    if i == 0 or not ones[:i].all() or not zeros[i:].all():
        return None
    return float(x[i - 1]), float(x[i])


def fit_slope(n50_by_m, *, confidence: float = 0.95, c_theory: float | None = None) -> dict:
    """Empirical slope ``C_emp`` (tokens per memory vector) of n50 vs m.

    Fits ``n50 = C_emp m`` through the origin (the paper's linear law, Cor. 4.6 and Sec. 5) by
    least squares, ``C_emp = sum(m n50) / sum(m^2)``, with a Student-t interval (k - 1 degrees
    of freedom), and also the affine fit ``n50 = a m + b`` (``scipy.stats.linregress``).

    Parameters
    ----------
    n50_by_m : mapping {m: float or dict with key "n50"}
        At least two finite n50 values; keys are ints (or digit strings, as in a JSON summary).
    confidence : float in (0, 1), default 0.95
        Level of the t interval of the slope (infinite at 1).
    c_theory : float, optional
        Theoretical slope (e.g. from :func:`theory_slope`); adds ``ratio = c_theory / c_emp``
        (>= 1 for a valid bound) and its interval.

    Returns
    -------
    dict
        ``m``, ``n50`` lists; ``c_emp``, ``c_emp_lower``, ``c_emp_upper``; ``r2`` (centred:
        1 - SS_res / sum (n50 - mean)^2, of the fit through the origin; can be negative),
        ``r2_uncentred`` (1 - SS_res / sum n50^2, the usual R^2 of a fit through the origin);
        ``affine``: ``slope``, ``intercept``, their intervals, ``r2``; and ``c_theory``,
        ``ratio``, ``ratio_lower``, ``ratio_upper`` when ``c_theory`` is given.

    Raises
    ------
    TypeError
        Not a mapping.
    ValueError
        Fewer than two points, a non-finite n50 (e.g. a censored curve), m < 1.
    """
    if not hasattr(n50_by_m, "items"):
        raise TypeError(f"n50_by_m: expected a mapping {{m: n50}}, got {type(n50_by_m).__name__}")
    ms, ys = [], []
    items = []
    for m, v in n50_by_m.items():
        if isinstance(m, str) and m.strip().isdigit():  # keys of a JSON summary
            m = int(m)
        items.append((check_positive_int(m, "n50_by_m key (m)"), v))
    seen = [m for m, _ in items]
    if len(set(seen)) != len(seen):
        raise ValueError(f"n50_by_m: m given twice (keys {sorted(seen)}, e.g. 1 and '1')")
    for m, v in sorted(items, key=lambda kv: kv[0]):
        if isinstance(v, dict):
            if "n50" not in v:
                raise TypeError(f"n50_by_m: the value for m={m} is a dict without the key 'n50'")
            y = v["n50"]
        else:
            y = v
        if y is not None and (isinstance(y, (str, bool, np.bool_))
                              or not isinstance(y, (numbers.Real, np.floating, np.integer))):
            raise TypeError(f"n50_by_m: n50 for m={m} must be a number, got {type(y).__name__}")
        if y is not None and np.isfinite(float(y)) and float(y) <= 0:
            raise ValueError(f"n50_by_m: n50 for m={m} must be > 0 tokens, got {y}")
        if y is None or not np.isfinite(float(y)):
            raise ValueError(
                f"n50_by_m: n50 for m={m} is not finite ({y}); a censored accessibility curve "
                "needs longer (or shorter) lengths"
            )
        ms.append(float(m))
        ys.append(float(y))
    if len(ms) < 2:
        raise ValueError(f"n50_by_m: expected at least two values of m, got {len(ms)}")
    confidence = check_probability(confidence, "confidence", open_right=True)
    m_arr, y = np.array(ms), np.array(ys)
    k = m_arr.size
    c = float(m_arr @ y / (m_arr @ m_arr))
    res = y - c * m_arr
    ss_res = float(res @ res)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    se = math.sqrt(ss_res / (k - 1) / float(m_arr @ m_arr))
    tq = float(stats.t.ppf(0.5 + confidence / 2, k - 1))
    out = {
        "m": [int(v) for v in ms],
        "n50": ys,
        "c_emp": c,
        "c_emp_lower": c - tq * se,
        "c_emp_upper": c + tq * se,
        "r2": (1 - ss_res / ss_tot) if ss_tot > 0 else float("nan"),
        "r2_uncentred": 1 - ss_res / float(y @ y),
        "confidence": confidence,
    }
    lr_ = stats.linregress(m_arr, y)
    if k > 2:
        ta = float(stats.t.ppf(0.5 + confidence / 2, k - 2))
        s_lo, s_hi = lr_.slope - ta * lr_.stderr, lr_.slope + ta * lr_.stderr
        b_lo, b_hi = lr_.intercept - ta * lr_.intercept_stderr, lr_.intercept + ta * lr_.intercept_stderr
    else:
        s_lo = s_hi = b_lo = b_hi = float("nan")
    out["affine"] = {
        "slope": float(lr_.slope), "slope_lower": float(s_lo), "slope_upper": float(s_hi),
        "intercept": float(lr_.intercept), "intercept_lower": float(b_lo),
        "intercept_upper": float(b_hi), "r2": float(lr_.rvalue**2),
    }
    if c_theory is not None:
        ct = check_positive(c_theory, "c_theory")
        out["c_theory"] = ct
        out["ratio"] = ct / c
        out["ratio_lower"] = ct / out["c_emp_upper"] if out["c_emp_upper"] > 0 else float("nan")
        out["ratio_upper"] = ct / out["c_emp_lower"] if out["c_emp_lower"] > 0 else float("inf")
    return out


def theory_slope(support, eps: float, vocab_size: int, *, rate: float | None = None) -> float:
    """Theoretical slope ``C_theory`` (tokens per vector) from :mod:`embgeom.bounds`.

    Calls ``embgeom.bounds.slope_bound(support, eps, vocab_size, rate=rate)``: the linear law
    ``C <= log P(S, eps) / log|V|`` (Cor. 4.6; with ``rate`` = lambda, the non-uniform-cell
    refinement in place of log|V|; a heuristic for typical sequences, not a counting bound).

    Parameters
    ----------
    support : embgeom.supports.Support
    eps : float
        Precision (see ``embgeom.bounds.precision_eps``; the paper's ``r_inf * 2**-11``).
    vocab_size : int
    rate : float, optional
        Nats per token replacing log|V| (cell-volume rate lambda).

    Returns
    -------
    float
        C_theory in tokens per memory vector.

    Raises
    ------
    ValueError, TypeError
        Bad support, eps, vocab_size or rate.
    """
    eps = check_positive(eps, "eps")
    vocab_size = check_positive_int(vocab_size, "vocab_size", minimum=2)
    from embgeom import bounds  # numpy-only; imported here so cramming loads without it

    return float(bounds.slope_bound(support, eps, vocab_size, rate=rate))




@dataclass
class HorizonCurve:
    """Per-target horizons of one m (:func:`embgeom.cramming.horizons`) and what they give.

    A target's *horizon* h is the longest prefix of it that was crammed (tokens). Because
    accessibility is monotone in prefixes, ``accessibility(n) = P(h >= n)`` exactly, and n50 is
    the median horizon.

    Attributes
    ----------
    n_mem : int
        m, the memory vectors per target.
    horizons : numpy.ndarray of int64, shape (N,)
        One horizon per finished target (tokens), in target order.
    censored : numpy.ndarray of bool, shape (N,)
        The horizon is a lower bound (the run reached ``max_length`` or its total step cap).
    max_length : int
        The longest prefix tried.
    n_targets : int
        Targets planned (``N < n_targets`` while a run is unfinished).
    records : list of dict
        The per-target JSONL records (steps per length, CPU-seconds, stop reason, ...).
    settings : dict
    n_boot : int
        Bootstrap resamples for :meth:`n50`: 0 (no interval, bounds None) or at least
        :data:`MIN_BOOT` (100).
    seed : int
        Seed of the bootstrap.
    memory : dict {int: numpy.ndarray of float32, shape (m, d)}
        The horizon's memory vectors of each target run in the call that made the curve.
    targets : numpy.ndarray of int64, shape (B, max_length), or None
    """

    n_mem: int
    horizons: np.ndarray
    censored: np.ndarray
    max_length: int
    n_targets: int
    records: list = field(default_factory=list, repr=False)
    settings: dict = field(default_factory=dict, repr=False)
    n_boot: int = 1000
    seed: int = 0
    memory: dict = field(default_factory=dict, repr=False)
    targets: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def from_records(cls, records, *, n_mem: int, max_length: int, n_targets: int | None = None,
                     settings: dict | None = None, n_boot: int = 1000, seed: int = 0):
        """From horizon records (dicts with ``horizon`` and ``censored``), in target order.

        Raises
        ------
        ValueError
            A record without ``horizon``, or a negative horizon; ``n_boot`` negative or in
            ``1 .. MIN_BOOT - 1``.
        """
        n_boot = check_n_boot(n_boot)
        records = sorted(records, key=lambda r: r.get("target_index", 0))
        try:
            h = np.array([int(r["horizon"]) for r in records], np.int64)
        except KeyError:
            raise ValueError("records: every record needs a 'horizon'") from None
        if np.any(h < 0):
            raise ValueError("records: horizons must be >= 0")
        c = np.array([bool(r.get("censored", False)) for r in records], bool)
        return cls(int(n_mem), h, c, int(max_length),
                   len(records) if n_targets is None else int(n_targets), list(records),
                   dict(settings or {}), int(n_boot), int(seed))

    @property
    def complete(self) -> bool:
        """Every planned target has a horizon."""
        return self.horizons.size >= self.n_targets

    def accessibility(self, lengths=None):
        """``(lengths, P(h >= n), lower, upper)``: the curve with Wilson 95% intervals.

        ``lengths`` default: 1 .. max_length; integers in [1, max_length] (past ``max_length``
        nothing was tried: a ValueError names ``lengths``). float64 arrays of shape (K,)
        (lengths int64).
        """
        from embgeom._stats import wilson_interval

        if lengths is None:
            n = np.arange(1, self.max_length + 1)
        else:
            from embgeom._validation import check_int_array

            n = check_int_array(lengths, "lengths", ndim=1, low=1, high=self.max_length + 1)
        N = self.horizons.size
        if N == 0:
            raise ValueError("horizons: no finished target yet")
        k = (self.horizons[None, :] >= n[:, None]).sum(1)
        lo, hi = wilson_interval(k, np.full_like(k, N))
        return n, k / N, lo, hi

    def as_accessibility_curve(self, lengths=None) -> "AccessibilityCurve":
        """The curve as an :class:`AccessibilityCurve` (successes = #{h >= n}, trials = N),
        so :func:`n50`, :func:`fit_slope` and the plots take it."""
        n, p, _, _ = self.accessibility(lengths)
        N = self.horizons.size
        k = np.rint(p * N).astype(np.int64)
        return AccessibilityCurve(self.n_mem, n, k, k.copy(), np.full(n.size, N, np.int64),
                                  dict(self.settings))

    def n50(self, confidence: float = 0.95) -> dict:
        """The median horizon (tokens) with a percentile-bootstrap interval over targets.

        Returns
        -------
        dict
            ``n50`` (``numpy.median`` of the horizons: the length where ``P(h >= n)`` crosses
            0.5), ``lower``, ``upper``, ``n_targets`` (finished), ``censored`` (True when a
            censored horizon lies at or below the median: n50 is then a lower bound),
            ``confidence``, ``n_boot``. ``lower`` and ``upper`` are None when ``n_boot`` is 0.

        Raises
        ------
        ValueError
            ``n_boot`` (the attribute) negative or in ``1 .. MIN_BOOT - 1``; no horizon yet.
        """
        confidence = check_probability(confidence, "confidence", open_right=True)
        n_boot = check_n_boot(self.n_boot)
        h = self.horizons.astype(np.float64)
        if h.size == 0:
            raise ValueError("horizons: no finished target yet")
        med = float(np.median(h))
        rng = np.random.default_rng(self.seed)
        if n_boot:
            boots = np.median(h[rng.integers(0, h.size, (n_boot, h.size))], axis=1)
            a = (1 - confidence) / 2
            lo, hi = (float(np.quantile(boots, q, method="inverted_cdf")) for q in (a, 1 - a))
        else:
            lo = hi = None
        # a censored horizon is a lower bound: n50 is one too when raising the censored
        # horizons without limit would change the median
        cens = bool(self.censored.any() and
                    float(np.median(np.where(self.censored, np.inf, h))) != med)
        return {"n50": med, "lower": lo, "upper": hi, "n_targets": int(h.size),
                "censored": cens, "confidence": confidence, "n_boot": self.n_boot}

    def cpu_seconds(self) -> dict:
        """CPU-seconds per target (median, mean, total) from the records (None if absent)."""
        cs = np.array([r.get("cpu_s", np.nan) for r in self.records], np.float64)
        if cs.size == 0 or not np.isfinite(cs).any():
            return {"median": None, "mean": None, "total": None}
        return {"median": float(np.nanmedian(cs)), "mean": float(np.nanmean(cs)),
                "total": float(np.nansum(cs))}

    def to_dict(self) -> dict:
        """JSON-able summary: horizons, censoring, n50 with its interval, the curve, CPU."""
        out = {"n_mem": self.n_mem, "max_length": self.max_length,
               "n_targets": self.n_targets, "n_finished": int(self.horizons.size),
               "horizons": self.horizons.tolist(), "censored": self.censored.tolist(),
               "settings": self.settings, "cpu_s": self.cpu_seconds()}
        if self.horizons.size:
            n, p, lo, hi = self.accessibility()
            out.update(n50=self.n50(), lengths=n.tolist(), accessibility=p.tolist(),
                       lower=lo.tolist(), upper=hi.tolist())
        from embgeom._json import to_jsonable

        return to_jsonable(out)
