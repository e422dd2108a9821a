"""Special functions in log space: the one home of the volumes, areas and sums the geometry needs
(and of the overflow-free Euclidean norms they rest on).

Everything here returns natural logarithms (nats) and is written so that it never overflows or
underflows where the answer is representable: ``d = 4096`` unit-ball volumes, caps whose mass is
``1e-700``, elementary symmetric polynomials of 4096 numbers. numpy/scipy.special only; no module
of embgeom writes a second copy of these formulas.

References
----------
NIST DLMF (https://dlmf.nist.gov): 5.2 (Gamma), 8.17 (incomplete beta), 15.2 (hypergeometric
series). S. Li, "Concise formulas for the area and volume of a hyperspherical cap", Asian J.
Math. Stat. 4 (2011). M. Maechler, "Accurately computing log(1 - exp(-|a|))", Rmpfr vignette
(2012).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from ._validation import check_positive_int

__all__ = [
    "log_unit_ball_volume",
    "log_sphere_area",
    "log_cap_fraction",
    "log_betainc_small",
    "log_binomial_row",
    "log_elementary_symmetric",
    "log1mexp",
    "softplus",
    "log1p_ratio",
    "row_norms",
    "vector_norm",
]


def _log_kappa(d):
    """``log vol(B_d) = d/2 log(pi) - lgamma(d/2 + 1)`` for a number or array ``d`` (no checks)."""
    d = np.asarray(d, dtype=np.float64)
    return 0.5 * d * math.log(math.pi) - special.gammaln(0.5 * d + 1.0)


def log_unit_ball_volume(d):
    """Log-volume (nats) of the unit ball in ``R^d``: ``d/2 log(pi) - lgamma(d/2 + 1)``.

    Parameters
    ----------
    d : int or array_like of int
        Dimension: an int >= 1, or an integer array with entries >= 0 (``kappa_0 = 1``, the
        convention of the Steiner formula).

    Returns
    -------
    float or numpy.ndarray of float64
        ``log vol(B_d)`` in nats, a float for an int ``d``, else an array of ``d``'s shape;
        finite for any ``d`` (computed with ``gammaln``).

    Raises
    ------
    TypeError
        ``d`` not an integer (or an integer array).
    ValueError
        An int ``d < 1``, or an array entry ``< 0``.

    Notes
    -----
    DLMF 5.19.4 (volume of the unit ball ``pi^{d/2} / Gamma(d/2 + 1)``).

    Examples
    --------
    >>> round(float(np.exp(log_unit_ball_volume(3))), 12) == round(4 / 3 * math.pi, 12)
    True
    """
    if np.ndim(d) == 0:
        return float(_log_kappa(check_positive_int(d, "d")))
    arr = np.asarray(d)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"d: expected integers, got dtype {arr.dtype}")
    if np.any(arr < 0):
        raise ValueError(f"d: expected integers >= 0, got min {arr.min()}")
    return _log_kappa(arr)


def log_sphere_area(d: int) -> float:
    """Log of the (d-1)-dimensional area of the unit sphere ``S^{d-1}`` in ``R^d`` (nats).

    Parameters
    ----------
    d : int
        Ambient dimension, >= 1.

    Returns
    -------
    float
        ``log(2 pi^{d/2} / Gamma(d/2))`` (DLMF 5.19.4 with ``|S^{d-1}| = d vol(B_d)``).

    Raises
    ------
    TypeError, ValueError
        ``d`` not an integer >= 1.
    """
    d = check_positive_int(d, "d")
    return math.log(2.0) + 0.5 * d * math.log(math.pi) - float(special.gammaln(0.5 * d))


def log_betainc_small(a: float, b: float, x, log_x=None) -> np.ndarray:
    """``log I_x(a, b)`` (regularised incomplete beta) by a log-space series, for ``b <= 1``.

    ``I_x = x^a (1-x)^b / (a B(a,b)) sum_n (a+b)_n/(a+1)_n x^n`` (DLMF 8.17.8 with 15.2.1). For
    ``b <= 1`` the terms decrease monotonically (ratio ``(a+b+n)/(a+1+n) x < x``); the sum lies in
    ``[1, 1/(1-x)]`` and is accumulated in floats, the prefactor in logs, so the result is finite
    where ``scipy.special.betainc`` underflows to 0.

    Parameters
    ----------
    a, b : float
        Beta parameters, ``a > 0`` and ``0 < b <= 1`` (not checked: a private workhorse of
        :func:`log_cap_fraction`).
    x : float or array_like of float
        Points in ``[0, 1)``.
    log_x : array_like of float, optional
        ``log x``, same shape, where the caller has it more precisely than ``log(x)``: where
        ``x`` underflows to 0 (``x = sin^2 alpha`` for ``alpha < 1e-154``) the result is then
        ``a log_x - log a - log B(a, b)``, finite, in place of ``-inf``.

    Returns
    -------
    numpy.ndarray of float64, shape of ``atleast_1d(x)``
        ``log I_x(a, b)`` in nats; ``-inf`` at ``x = 0``.
    """
    x = np.atleast_1d(np.asarray(x, dtype=np.float64))
    out = np.full(x.shape, -np.inf)
    if log_x is None:
        with np.errstate(divide="ignore"):
            log_x = np.log(x)
    log_x = np.broadcast_to(np.asarray(log_x, dtype=np.float64), x.shape)
    pos = log_x > -np.inf
    if not pos.any():
        return out
    xp = x[pos]
    xmax = float(xp.max())
    if xmax <= 0.0:  # every x underflowed: the series is 1, the prefactor is the leading term
        out[pos] = a * log_x[pos] - math.log(a) - special.betaln(a, b)
        return out
    n_terms = int(min(2_000_000, max(10, math.ceil(-40.0 / math.log(xmax)) + 10))) if xmax < 1 else 2_000_000
    s = np.ones_like(xp)
    t = np.ones_like(xp)
    for k in range(n_terms):
        t = t * ((a + b + k) / (a + 1.0 + k)) * xp
        s += t
        if k % 64 == 63 and float((t / s).max()) < 1e-17:
            break
    out[pos] = a * log_x[pos] + b * np.log1p(-xp) - math.log(a) - special.betaln(a, b) + np.log(s)
    return out


def log_cap_fraction(half_angle, d: int):
    """Log of the fraction of the unit ball (equivalently of the sphere ``S^{d-1}``) inside a
    circular cone of the given half-angle.

    ``f(alpha) = 1/2 I_{sin^2 alpha}((d-1)/2, 1/2)`` for ``alpha <= pi/2`` (regularised incomplete
    beta; S. Li, "Concise formulas for the area and volume of a hyperspherical cap", Asian J.
    Math. Stat. 4 (2011)), and ``1 - f(pi - alpha)`` for ``alpha > pi/2``. Computed in logs: where
    ``betainc`` underflows (tiny caps in high ``d``) a log-space series
    (:func:`log_betainc_small`) takes over, so ``d = 576``, ``alpha = 0.3`` is finite. This is the
    paper's cone refinement (docs/theory.md, section 4.4).

    Parameters
    ----------
    half_angle : float or array_like of float
        Half-angle(s) in radians, in ``[0, pi]``.
    d : int
        Dimension, >= 2.

    Returns
    -------
    float or numpy.ndarray of float64
        ``log f`` in nats (``-inf`` at ``alpha = 0``, ``0`` at ``alpha = pi``); a float for a
        scalar ``half_angle``.

    Raises
    ------
    ValueError
        Angles outside ``[0, pi]`` or NaN, ``d < 2``.
    TypeError
        ``d`` not an integer.

    Examples
    --------
    >>> round(float(np.exp(log_cap_fraction(math.pi / 2, 7))), 12)
    0.5
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
        # log x = 2 log sin: sin^2 underflows below alpha ~ 1e-154, sin itself only at 5e-324
        with np.errstate(divide="ignore"):
            log_x = 2.0 * np.log(np.sin(narrow[small]))
        logI[small] = log_betainc_small(a, b, x[small], log_x)
    logI = np.where(narrow >= 0.5 * math.pi, 0.0, logI)  # sin^2 = 1 up to rounding
    logf = math.log(0.5) + logI
    wide = al > 0.5 * math.pi
    logf = np.where(wide, np.log1p(-np.exp(np.minimum(logf, 0.0))), logf)
    return float(logf[0]) if scalar else logf


def log_binomial_row(n: int) -> np.ndarray:
    """``log C(n, j)`` for ``j = 0..n`` (nats).

    Parameters
    ----------
    n : int
        >= 0 (not checked: callers pass a dimension).

    Returns
    -------
    numpy.ndarray of float64, shape (n + 1,)
        ``lgamma(n+1) - lgamma(j+1) - lgamma(n-j+1)``.
    """
    j = np.arange(n + 1, dtype=np.float64)
    return special.gammaln(n + 1.0) - special.gammaln(j + 1.0) - special.gammaln(n - j + 1.0)


def log_elementary_symmetric(log_a) -> np.ndarray:
    """``log e_j(a)`` for ``j = 0..d``: elementary symmetric polynomials of ``a``, in logs.

    Recursion ``e_j(a_1..a_i) = e_j(a_1..a_{i-1}) + a_i e_{j-1}(a_1..a_{i-1})`` with
    ``logaddexp``; O(d^2), never overflows.

    Parameters
    ----------
    log_a : array_like of float, shape (d,)
        ``log a_i`` (``-inf`` allowed for ``a_i = 0``).

    Returns
    -------
    numpy.ndarray of float64, shape (d + 1,)
        ``log e_0 = 0``, ..., ``log e_d = sum log a_i``.
    """
    log_a = np.asarray(log_a, dtype=np.float64)
    d = log_a.shape[0]
    L = np.full(d + 1, -np.inf)
    L[0] = 0.0
    with np.errstate(invalid="ignore"):
        for i, la in enumerate(log_a):
            L[1 : i + 2] = np.logaddexp(L[1 : i + 2], la + L[0 : i + 1])
    return L


def softplus(z):
    """``log(1 + exp(z))`` without overflow (``numpy.logaddexp(0, z)``).

    Parameters
    ----------
    z : float or array_like of float

    Returns
    -------
    float or numpy.ndarray of float64
    """
    return np.logaddexp(0.0, z)


def log1p_ratio(a, b, factor: float = 1.0):
    """``log(1 + factor a / b)`` for positive ``a``, ``b``: ``softplus(log factor + log a - log b)``.

    ``math.log1p(2 r / eps)`` overflows to ``inf`` once ``r / eps`` passes ``1.8e308`` (a radius
    of ``1e30`` at ``eps = 1e-300``: the true value is about 760 nats); here the ratio is never
    formed: ``log(1 + x) = log x + log1p(1/x)`` for large ``x``, ``log1p(x)`` for small.

    Parameters
    ----------
    a, b : float or array_like of float
        Positive (not checked: callers pass validated lengths).
    factor : float, default 1.0
        Positive constant (``2`` for ``log(1 + 2 r / eps)``).

    Returns
    -------
    float or numpy.ndarray of float64
        Nats; finite for every positive finite ``a``, ``b``.
    """
    with np.errstate(divide="ignore"):
        out = softplus(math.log(factor) + np.log(np.asarray(a, dtype=np.float64))
                       - np.log(np.asarray(b, dtype=np.float64)))
    return float(out) if np.ndim(out) == 0 else out


def log1mexp(x) -> float:
    """``log(1 - exp(x))`` for ``x <= 0``, stable at both ends (Maechler 2012).

    Parameters
    ----------
    x : float
        <= 0; ``x >= 0`` gives ``-inf`` (the difference is not positive).

    Returns
    -------
    float
        ``log(-expm1(x))`` for ``x > -log 2``, else ``log1p(-exp(x))``.
    """
    x = float(x)
    if x >= 0.0:
        return -math.inf
    return math.log(-math.expm1(x)) if x > -0.693 else math.log1p(-math.exp(x))


def row_norms(X: np.ndarray) -> np.ndarray:
    """Euclidean norm of each row of ``X`` (N, d), without overflow or underflow.

    ``numpy.linalg.norm(X, axis=1)`` squares the entries, so rows of size ``1e160`` give ``inf``
    and rows of size ``1e-160`` lose every digit to underflow. Each row is divided by its
    largest absolute entry first (``|x| = m |x / m|``): exact for every finite input whose norm
    is representable.

    Returns
    -------
    numpy.ndarray of float64, shape (N,)
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 1:
        X = X[None, :]
    m = np.abs(X).max(axis=1) if X.shape[1] else np.zeros(X.shape[0])
    safe = np.where(m > 0, m, 1.0)
    Y = X / safe[:, None]
    with np.errstate(over="ignore"):
        return m * np.sqrt(np.einsum("ij,ij->i", Y, Y))


def vector_norm(x) -> float:
    """Euclidean norm of one vector without overflow or underflow (see :func:`row_norms`)."""
    return float(row_norms(np.ravel(np.asarray(x, dtype=np.float64)))[0])
