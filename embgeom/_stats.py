"""Binomial confidence intervals: the one home of the Wilson and Clopper-Pearson intervals.

Every interval on a proportion in embgeom comes from here: the per-token cell shares of
:func:`embgeom.volumes.cell_volumes` (two-sided, :func:`binomial_interval`), the held-out
validity of a support (one-sided, :func:`clopper_pearson_lower`) and the accuracy curves of the
copying and cramming experiments (:func:`wilson_interval`). The public names are re-exported by
:mod:`embgeom.volumes` and :mod:`embgeom.supports`; this module defines them once.

References
----------
C. J. Clopper, E. S. Pearson, "The use of confidence or fiducial limits illustrated in the case of
the binomial", Biometrika 26 (1934). E. B. Wilson, "Probable inference, the law of succession,
and statistical inference", JASA 22 (1927). L. D. Brown, T. T. Cai, A. DasGupta, "Interval
Estimation for a Binomial Proportion", Statistical Science 16 (2001).
"""

from __future__ import annotations

import math

import numpy as np

from ._validation import check_positive_int, check_probability

__all__ = ["wilson_interval", "binomial_interval", "clopper_pearson_lower"]


def wilson_interval(successes, trials, confidence: float = 0.95):
    """Wilson score interval for binomial proportions ``successes / trials``.

    Parameters
    ----------
    successes : array_like of int or float
        Successes, ``0 <= successes <= trials`` (a proportion times ``trials`` is accepted).
    trials : int or array_like of int
        Trials (>= 1), broadcast against ``successes``.
    confidence : float, default 0.95
        Coverage ``1 - alpha``, in (0, 1).

    Returns
    -------
    lower, upper : numpy.ndarray of float64
        Same shape as the broadcast inputs, in [0, 1]; exactly 0 at ``successes = 0`` and 1 at
        ``successes = trials``.

    Raises
    ------
    ValueError
        ``trials < 1``, ``successes`` outside ``[0, trials]``, or ``confidence`` not in (0, 1).

    References
    ----------
    E. B. Wilson, JASA 22 (1927); Brown, Cai, DasGupta, Statistical Science 16 (2001), eq. (4).

    Examples
    --------
    >>> lo, hi = wilson_interval(0, 10)
    >>> float(lo), round(float(hi), 4)
    (0.0, 0.2775)
    """
    from scipy import stats

    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    if not (np.all(np.isfinite(k)) and np.all(np.isfinite(n))):
        raise ValueError("successes, trials: expected finite numbers")
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n):
        raise ValueError("successes, trials: expected 0 <= successes <= trials and trials >= 1")
    conf = check_probability(confidence, "confidence", open_right=True)
    z = stats.norm.ppf(0.5 + conf / 2)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(np.maximum(p * (1 - p) / n + z * z / (4 * n * n), 0.0)) / denom
    lower = np.where(k <= 0, 0.0, np.clip(centre - half, 0.0, 1.0))  # exact ends, no round-off
    upper = np.where(k >= n, 1.0, np.clip(centre + half, 0.0, 1.0))
    return lower, upper


def binomial_interval(counts, n: int, confidence: float = 0.95, method: str = "clopper-pearson"):
    """Two-sided confidence interval for binomial proportions.

    Parameters
    ----------
    counts : array_like of int, shape (K,)
        Successes, ``0 <= counts <= n``.
    n : int
        Trials (>= 1).
    confidence : float, default 0.95
        Coverage ``1 - alpha``.
    method : {"clopper-pearson", "wilson"}
        ``"clopper-pearson"``: exact, ``[B(alpha/2; k, n-k+1), B(1-alpha/2; k+1, n-k)]`` with
        ``B`` the beta quantile (Clopper & Pearson 1934); coverage >= ``confidence`` for every
        ``p``. ``"wilson"``: the score interval (:func:`wilson_interval`), closer to nominal on
        average.

    Returns
    -------
    lower, upper : numpy.ndarray of float64, shape (K,)
        ``0 <= lower <= k/n <= upper <= 1``. For ``k = 0`` the Clopper-Pearson upper bound is
        ``1 - (alpha/2)^(1/n)``.

    Raises
    ------
    TypeError
        ``counts`` not integers.
    ValueError
        Counts outside ``[0, n]``, bad ``confidence`` or ``method``.

    Examples
    --------
    >>> lo, hi = binomial_interval([0], 100)
    >>> float(lo[0]), bool(abs(hi[0] - (1 - 0.025 ** (1 / 100))) < 1e-12)
    (0.0, True)
    """
    from scipy import stats

    n = check_positive_int(n, "n")
    conf = check_probability(confidence, "confidence", open_right=True)
    k = np.asarray(counts)
    if k.dtype.kind not in "iu":
        raise TypeError(f"counts: expected integers, got dtype {k.dtype}")
    if k.size and (k.min() < 0 or k.max() > n):
        raise ValueError(f"counts: expected values in [0, n={n}]")
    k = k.astype(np.float64)
    alpha = 1.0 - conf
    if method == "clopper-pearson":
        with np.errstate(invalid="ignore"):
            lo = np.where(k > 0, stats.beta.ppf(alpha / 2, k, n - k + 1), 0.0)
            hi = np.where(k < n, stats.beta.ppf(1 - alpha / 2, k + 1, n - k), 1.0)
    elif method == "wilson":
        lo, hi = wilson_interval(k, n, conf)
    else:
        raise ValueError(f"method: expected 'clopper-pearson' or 'wilson', got {method!r}")
    return np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)


def clopper_pearson_lower(k, n, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson lower confidence bound on a binomial proportion.

    Parameters
    ----------
    k : int
        Successes, ``0 <= k <= n``.
    n : int
        Trials, >= 1.
    confidence : float, default 0.95
        In (0, 1).

    Returns
    -------
    float
        ``B(1 - confidence; k, n - k + 1)`` (the beta quantile), 0 for ``k = 0``; at ``k = n``
        it is ``(1 - confidence)^(1/n)``. ``P(q >= bound) >= confidence`` for every true ``q``.

    Raises
    ------
    ValueError, TypeError
        ``n < 1``, ``k`` outside ``[0, n]`` or not an integer, ``confidence`` outside (0, 1).

    Examples
    --------
    >>> round(clopper_pearson_lower(300, 300), 6) == round(0.05 ** (1 / 300), 6)
    True
    """
    from scipy import stats

    n = check_positive_int(n, "n")
    k = check_positive_int(k, "k", minimum=0)
    if k > n:
        raise ValueError(f"k: expected 0 <= k <= n={n}, got {k}")
    conf = check_probability(confidence, "confidence", open_right=True)
    if k == 0:
        return 0.0
    if k == n:  # closed form, exact
        return float(math.exp(math.log1p(-conf) / n))
    return float(stats.beta.ppf(1.0 - conf, k, n - k + 1))
