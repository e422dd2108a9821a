"""Split-conformal calibration of a fitted support: a stated coverage for fresh hidden states.

A support fitted to a sample is a tight set around *that* sample; a fresh hidden state may fall
outside it. Split-conformal calibration turns it into a set with a finite-sample guarantee: fit
the shape on one sample, compute the gauge ``g(x)`` (``<= 1`` exactly inside, see
:meth:`Support.gauge`) of every point of a second, independent *calibration* sample, and scale
the shape to the sublevel set ``{x : g(x) <= q}`` where ``q`` is the ``k``-th smallest of the
``n`` calibration gauges, ``k = ceil((n + 1)(1 - alpha))``. If the calibration points and a fresh
point are exchangeable (drawn from the same distribution, independently of the fit), then

    P(fresh point inside the calibrated set) >= 1 - alpha,

whatever the shape, the fit or the distribution (and ``<= 1 - alpha + 1/(n + 1)`` when the
gauges have no ties). The probability is over the calibration sample and the fresh point
together (marginal coverage).

References
----------
V. Vovk, A. Gammerman, G. Shafer, "Algorithmic Learning in a Random World", Springer (2005),
Ch. 2 and 4 (inductive conformal prediction). A. N. Angelopoulos, S. Bates, "A Gentle
Introduction to Conformal Prediction and Distribution-Free Uncertainty Quantification",
arXiv:2107.07511 (2021), Sec. 1 and Theorem D.1. J. Lei, M. G'Sell, A. Rinaldo, R. J. Tibshirani,
L. Wasserman, "Distribution-Free Predictive Inference for Regression", JASA 113 (2018), Sec. 2.2.
"""

from __future__ import annotations

import math

import numpy as np

from .._validation import check_probability, check_seed
from ._base import Support, check_hidden

__all__ = ["calibrate_support", "conformal_rank", "split_for_calibration"]


def conformal_rank(n: int, alpha) -> int:
    """The rank ``k = ceil((n + 1)(1 - alpha))`` of the conformal quantile among ``n`` scores.

    Parameters
    ----------
    n : int
        Calibration sample size, >= 1.
    alpha : float
        Miscoverage level in (0, 1).

    Returns
    -------
    int
        ``k`` in ``[1, n]``: the calibrated set is the sublevel set at the ``k``-th smallest score.

    Raises
    ------
    ValueError
        ``alpha`` outside (0, 1), or ``k > n`` (too few calibration points for this ``alpha``:
        ``n >= 1/alpha - 1`` is needed, e.g. 99 for ``alpha = 0.01``).
    """
    alpha = _check_alpha(alpha)
    n = int(n)
    # the small slack keeps (n + 1)(1 - alpha) that is an integer up to rounding from moving up
    k = int(math.ceil((n + 1) * (1.0 - alpha) - 1e-9))
    k = max(k, 1)
    if k > n:
        need = int(math.ceil(1.0 / alpha - 1.0 - 1e-9))
        raise ValueError(
            f"alpha={alpha}: a calibration sample of {n} points is too small; split-conformal "
            f"calibration at this level needs at least {need} points (ceil((n + 1)(1 - alpha)) <= n)"
        )
    return k


def _check_alpha(alpha, name: str = "alpha") -> float:
    """A miscoverage level in (0, 1); errors name ``name`` (``fit_support`` calls it ``calibrate``)."""
    return check_probability(alpha, name, open_right=True)


def calibrate_support(support: Support, H_calibration, alpha) -> Support:
    """Scale a fitted support so that a fresh exchangeable point is inside with prob. >= 1 - alpha.

    Parameters
    ----------
    support : Support
        A fitted support (any shape with :meth:`~Support.gauge` and :meth:`~Support.scaled`).
        It must not have seen ``H_calibration``.
    H_calibration : array_like of float, shape (n, d)
        Calibration points, independent of the fit, drawn like the points the guarantee is for;
        integers are converted to float64; a DataFrame must have the support's
        ``feature_names_in_``.
    alpha : float
        Miscoverage level in (0, 1).

    Returns
    -------
    Support
        ``support.scaled(q)`` with ``q`` the ``k``-th smallest gauge of the calibration points,
        ``k = ceil((n + 1)(1 - alpha))`` (:func:`conformal_rank`). Its attribute
        ``calibration_`` (dict) records ``alpha``, ``n_calibration``, ``rank`` (``k``),
        ``scale`` (``q``), ``coverage_bounds`` (``[k/(n+1), min(1, (k+1)/(n+1))]``: the
        guaranteed marginal coverage, and its upper end for gauges without ties) and the shape's
        uncalibrated ``log_volume_raw`` (nats).

    Raises
    ------
    ValueError, TypeError
        Bad ``H_calibration`` (NaN/inf, fewer than 2 rows, wrong width, float16, other column
        names than the support's), ``alpha``
        outside (0, 1), a calibration sample too small for ``alpha``, a zero quantile (all
        calibration points at the centre); ``NotFittedError`` for an unfitted support.

    Notes
    -----
    Split-conformal prediction with the gauge as nonconformity score (Vovk et al. 2005;
    Angelopoulos and Bates 2021, Sec. 1; see the module docstring). The guarantee is marginal
    and needs exchangeability: it says nothing about points drawn differently (hidden states of
    other prompt lengths, another model), which the report checks separately on fresh states.

    Examples
    --------
    >>> import numpy as np
    >>> from embgeom.supports import Ball
    >>> rng = np.random.default_rng(0)
    >>> ball = Ball().fit(rng.standard_normal((200, 3)))
    >>> cal = calibrate_support(ball, rng.standard_normal((99, 3)), alpha=0.1)
    >>> cal.calibration_["rank"]
    90
    """
    if not isinstance(support, Support):
        raise TypeError(f"support: expected an embgeom.supports.Support, got {type(support).__name__}")
    alpha = _check_alpha(alpha)
    Hc = check_hidden(H_calibration, "H_calibration")
    d = support.dim
    if Hc.shape[1] != d:
        raise ValueError(f"H_calibration: expected {d} columns (the support's dimension), got {Hc.shape[1]}")
    support._check_names(H_calibration, "H_calibration")  # a DataFrame: the support's columns
    n = Hc.shape[0]
    k = conformal_rank(n, alpha)
    scores = support._gauge(Hc)
    q = float(np.partition(scores, k - 1)[k - 1])
    if not q > 0:
        raise ValueError("H_calibration: the conformal quantile of the gauges is 0 (the calibration "
                         "points sit at the centre); the calibrated set would be empty")
    out = support.scaled(q)
    out.calibration_ = {
        "alpha": alpha,
        "n_calibration": int(n),
        "rank": int(k),
        "scale": q,
        "coverage_bounds": [k / (n + 1), min(1.0, (k + 1) / (n + 1))],
        "log_volume_raw": float(support.log_volume),
        "n_fit": support.n_fit_,
    }
    return out


def split_for_calibration(n: int, calibration_fraction, seed) -> tuple[np.ndarray, np.ndarray]:
    """Random split of ``n`` rows into a fit part and a calibration part.

    Parameters
    ----------
    n : int
        Number of rows, >= 4.
    calibration_fraction : float in (0, 1)
        Share of the rows for calibration: ``n_cal = round(calibration_fraction n)``, at least 2
        and at most ``n - 2``.
    seed : seed
        Anything ``numpy.random.default_rng`` takes.

    Returns
    -------
    fit_idx, cal_idx : numpy.ndarray of int64
        Sorted row indices. The rule (documented, so that it can be reproduced): ``perm =
        numpy.random.default_rng(seed).permutation(n)``; the calibration rows are ``perm[:n_cal]``,
        the fit rows ``perm[n_cal:]``.

    Raises
    ------
    ValueError
        ``calibration_fraction`` outside (0, 1), ``n < 4``.
    """
    f = check_probability(calibration_fraction, "calibration_fraction", open_right=True)
    if n < 4:
        raise ValueError(f"H: split-conformal calibration needs at least 4 points, got {n}")
    n_cal = min(max(int(round(f * n)), 2), n - 2)
    perm = check_seed(seed).permutation(n)
    return np.sort(perm[n_cal:]).astype(np.int64), np.sort(perm[:n_cal]).astype(np.int64)
