"""Packing bounds: how many distinct outputs a finite-precision model can produce.

From the geometry of the embedding space (a support ``S`` holding the vectors, a precision
``eps``) to hard numbers: the packing number ``P(S, eps)``, Theorem 4.5's count of accessible
sequences for ``m`` prompt vectors, the linear law ``n*(m) = C m`` (Cor. 4.6), the non-uniform
cell refinement (the rate ``lambda``), and a computable form of Cor. 4.10 (unbounded context).
Everything is in log space (nats), so ``d = 4096``, ``|V| = 262144``, ``m = 1000`` never
overflows. The derivations are written out in ``docs/theory.md``.

Precision model (the paper's): two vectors that differ by less than ``eps`` in every coordinate
cannot be told apart, so the vectors that matter form a set whose points are pairwise at
L-infinity distance >= ``eps`` (e.g. a grid of step ``eps``). ``P(S, eps)`` is the largest such
set inside ``S`` (the L-infinity packing number). A set that is ``eps``-separated in L-infinity is
also ``eps``-separated in L2, so every bound on the Euclidean packing number is a bound on ``P``
too; :func:`log_packing_number` takes the smallest of several *rigorous* volumetric bounds:

- (V2) ``P <= vol(S + B(eps/2)) / vol(B(eps/2))`` (disjoint Euclidean balls of radius eps/2),
- (Vinf) ``P <= vol(S + Q(eps)) / eps^d`` (disjoint cubes of side eps, ``Q(eps) = [-eps/2,
  eps/2]^d`` in the model's coordinates), with ``Q(eps)`` inside ``B(sqrt(d) eps/2)`` where the
  shape gives no closed form.

``variant="paper"`` gives THEORY.md's formulas verbatim instead (some of them approximations).

This module is numpy/scipy only (no torch).

References
----------
M. Meyer, M. Michelessa, C. Chaux, V. Y. F. Tan, "How Many Different Outputs Can a Transformer
Generate?", ICML 2026 (arXiv 2605.22223), Sec. 4: Theorem 4.5, Cor. 4.6, Cor. 4.10 and the
refinements. Volumetric packing bounds: e.g. R. Vershynin, "High-Dimensional Probability"
(2018), Prop. 4.2.12. Steiner formula: R. Schneider, "Convex Bodies: the Brunn-Minkowski
Theory" (2014), Sec. 4.2.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from scipy import optimize, signal, special

from ._markdown import md_table as _md_table
from ._validation import check_array, check_positive, check_positive_int, check_seed
from .supports import log_cap_fraction

__all__ = [
    "PUBLISHED",
    "FORMAT_BITS",
    "precision_eps",
    "log_packing_number",
    "packing_bound_terms",
    "accessible_log_count",
    "slope_bound",
    "theorem45_log_count",
    "linear_law_slope",
    "n_star",
    "accessible_fraction_bound",
    "CellVolumeRate",
    "cell_volume_rate",
    "log_multiset_count",
    "threshold_length_unbounded",
    "plot_accessible_fraction",
    "bounds_report_section",
]

#: Published numbers (THEORY.md, from the paper): empirical slope ``c_emp`` (tokens per prompt
#: vector, random text), hidden size ``d``, vocabulary size ``vocab_size``, and the paper's
#: non-uniform-cell rate ``rate_lambda`` (nats per token) where it was given.
PUBLISHED: dict[str, dict] = {
    "pythia-160m": {"c_emp": 90.4, "d": 768, "vocab_size": 50304, "rate_lambda": 12.87},
    "pythia-410m": {"c_emp": 112.4, "d": 1024, "vocab_size": 50304, "rate_lambda": None},
    "pythia-1b": {"c_emp": 287.4, "d": 2048, "vocab_size": 50304, "rate_lambda": None},
    "pythia-1.4b": {"c_emp": 261.4, "d": 2048, "vocab_size": 50304, "rate_lambda": None},
    "pythia-2.8b": {"c_emp": 197.9, "d": 2560, "vocab_size": 50304, "rate_lambda": None},
    "pythia-6.9b": {"c_emp": 283.55, "d": 4096, "vocab_size": 50304, "rate_lambda": None},
    "qwen2.5-0.5b": {"c_emp": 71.0, "d": 896, "vocab_size": 151936, "rate_lambda": 16.50},
    "qwen2.5-1.5b": {"c_emp": 79.6, "d": 1536, "vocab_size": 151936, "rate_lambda": None},
    "llama-3.2-1b": {"c_emp": 137.8, "d": 2048, "vocab_size": 128256, "rate_lambda": 15.79},
    "gemma-3-270m": {"c_emp": 44.54, "d": 640, "vocab_size": 262144, "rate_lambda": None},
}

#: Significant bits (mantissa + implicit bit) of the float formats.
FORMAT_BITS: dict[str, int] = {
    "float64": 53, "fp64": 53, "double": 53,
    "float32": 24, "fp32": 24, "float": 24, "single": 24,
    "tf32": 11,
    "float16": 11, "fp16": 11, "half": 11,
    "bfloat16": 8, "bf16": 8,
}

_SHAPE_ALIASES = {
    "ball": "ball", "sphere": "ball",
    "box": "box", "cube": "box",
    "ellipsoid": "ellipsoid",
    "cone": "cone",
    "final_norm_shell": "shell", "final_norm": "shell", "finalnormshell": "shell",
    "shell": "shell", "final-norm shell": "shell",
}


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------
def _log_kappa(d):
    """Log-volume of the unit ball in ``R^d`` (``d`` may be an int array; ``kappa_0 = 1``)."""
    d = np.asarray(d, dtype=np.float64)
    return 0.5 * d * math.log(math.pi) - special.gammaln(0.5 * d + 1.0)


def _check_eps(eps) -> float:
    return check_positive(eps, "eps")


def _check_vocab(vocab_size) -> int:
    return check_positive_int(vocab_size, "vocab_size", minimum=2)


def _check_rate(rate, vocab_size) -> float:
    """The per-token rate (nats): ``log|V|`` by default, or a positive number."""
    if rate is None:
        return math.log(vocab_size)
    return check_positive(rate, "rate")


def _log_binom_array(n: int) -> np.ndarray:
    """``log C(n, j)`` for ``j = 0..n``."""
    j = np.arange(n + 1, dtype=np.float64)
    return special.gammaln(n + 1.0) - special.gammaln(j + 1.0) - special.gammaln(n - j + 1.0)


def _log_elementary_symmetric(log_a: np.ndarray) -> np.ndarray:
    """``log e_j(a)`` for ``j = 0..d`` (elementary symmetric polynomials), in the log domain.

    Recursion ``e_j(a_1..a_i) = e_j(a_1..a_{i-1}) + a_i e_{j-1}(a_1..a_{i-1})``; O(d^2).
    """
    d = log_a.shape[0]
    L = np.full(d + 1, -np.inf)
    L[0] = 0.0
    with np.errstate(invalid="ignore"):
        for i, la in enumerate(log_a):
            L[1 : i + 2] = np.logaddexp(L[1 : i + 2], la + L[0 : i + 1])
    return L


def _softplus(z):
    return np.logaddexp(0.0, z)


def _log_enclosing_ellipsoid_ratio(log_u: np.ndarray, log_c: float) -> float:
    """``min_t sum_i 1/2 log(u_i^2 / t + c / (1 - t))`` over ``t in (0, 1)``.

    With ``u_i = s_i / rho'`` and ``c = (rho / rho')^2`` this is
    ``log vol(E') - log kappa_d - d log rho'`` for the ellipsoid ``E'`` with semi-axes
    ``sqrt(s_i^2 / t + rho^2 / (1 - t))``, which contains ``E + B(rho)`` for every ``t``:
    the support functions satisfy ``|s o u| + rho |u| <= sqrt(sum (s_i^2/t + rho^2/(1-t)) u_i^2)``
    by ``(x + y)^2 <= x^2/t + y^2/(1-t)``. Any ``t`` gives a valid bound; the minimum is searched
    on a logit grid and refined with Brent's method. With all ``u_i = U`` and ``c = 1`` the
    minimum is exactly ``d log(1 + U)`` (Cauchy-Schwarz; the Euclidean ball).
    """
    two_lu = 2.0 * log_u

    def f(z):
        # t = expit(z): 1/t = 1 + e^-z, 1/(1-t) = 1 + e^z, written with softplus for stability
        return 0.5 * float(np.sum(np.logaddexp(two_lu + _softplus(-z), log_c + _softplus(z))))

    grid = np.linspace(-40.0, 40.0, 321)
    vals = np.array([f(z) for z in grid])
    i = int(np.argmin(vals))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    res = optimize.minimize_scalar(f, bounds=(lo, hi), method="bounded",
                                   options={"xatol": 1e-10})
    return float(min(vals[i], res.fun))


def _log1mexp(x):
    """``log(1 - exp(x))`` for ``x <= 0`` (stable)."""
    x = float(x)
    if x >= 0.0:
        return -np.inf
    return math.log(-math.expm1(x)) if x > -0.693 else math.log1p(-math.exp(x))


# --------------------------------------------------------------------------------------------
# precision
# --------------------------------------------------------------------------------------------
def _format_bits(dtype_or_bits) -> int:
    if isinstance(dtype_or_bits, bool):
        raise TypeError("dtype_or_bits: expected a dtype, a format name or an int of bits, got bool")
    if isinstance(dtype_or_bits, (numbers.Integral, np.integer)):
        return check_positive_int(dtype_or_bits, "dtype_or_bits")
    if isinstance(dtype_or_bits, str):
        key = dtype_or_bits
    else:
        try:
            key = np.dtype(dtype_or_bits).name
        except TypeError:
            key = str(dtype_or_bits)  # e.g. torch.float32 -> "torch.float32" (no torch import)
    key = key.strip().lower().replace("torch.", "").replace("numpy.", "").replace("np.", "")
    if key not in FORMAT_BITS:
        raise ValueError(
            f"dtype_or_bits: unknown float format {dtype_or_bits!r}; expected an int of "
            f"significant bits or one of {sorted(FORMAT_BITS)}"
        )
    return FORMAT_BITS[key]


def precision_eps(radius, dtype_or_bits) -> float:
    """The precision ``eps = radius * 2**-bits`` of a float format at magnitude ``radius``.

    Parameters
    ----------
    radius : float
        The largest coordinate magnitude (the paper's ``r_inf``), > 0.
    dtype_or_bits : int, str, numpy dtype or torch dtype
        Significant bits (mantissa plus the implicit bit), or a format: float32 24, bfloat16 8,
        float16 11, float64 53 (names as in :data:`FORMAT_BITS`; ``torch.float32`` is read by
        name, torch is never imported).

    Returns
    -------
    float
        ``eps`` in the units of ``radius``.

    Raises
    ------
    TypeError, ValueError
        ``radius <= 0``, non-finite, an unknown format, or bits < 1.

    Notes
    -----
    The paper's convention ``eps = r_inf 2^-11`` (THEORY.md, "Precision") is ``bits=11``. With
    ``p`` significant bits the spacing of floats near ``r`` is between ``r 2^-p`` and
    ``r 2^(1-p)``; ``r 2^-p`` is the smaller (so the count it gives is the larger, conservative).

    Examples
    --------
    >>> precision_eps(2.0, 11) == 2.0 / 2048
    True
    >>> precision_eps(1.0, "bfloat16")
    0.00390625
    """
    r = check_positive(radius, "radius")
    bits = _format_bits(dtype_or_bits)
    return r * 2.0 ** (-bits)


# --------------------------------------------------------------------------------------------
# cap fraction
# --------------------------------------------------------------------------------------------
def _cap(d: int, half_angle: float) -> float:
    """``log`` of the cap fraction, one implementation: :func:`embgeom.supports.log_cap_fraction`
    (argument order ``(half_angle, d)`` there)."""
    return float(log_cap_fraction(half_angle, d))


# --------------------------------------------------------------------------------------------
# packing numbers
# --------------------------------------------------------------------------------------------
def _ball_terms(d: int, r: float, eps: float) -> dict:
    """Rigorous bounds for a Euclidean ball of radius ``r``."""
    v2 = d * math.log1p(2.0 * r / eps)
    # Steiner: vol(Q(eps) + B(r)) = sum_j C(d,j) eps^j kappa_{d-j} r^{d-j}; divide by eps^d
    j = np.arange(d + 1)
    vinf = float(special.logsumexp(_log_binom_array(d) + _log_kappa(d - j)
                                   + (d - j) * math.log(r / eps)))
    return {"v2_ball": v2, "vinf_steiner": vinf}


def _ellipsoid_terms(semi_axes: np.ndarray, eps: float, *, aligned: bool = False) -> dict:
    """Rigorous bounds for an ellipsoid with the given semi-axes (any orientation; ``aligned``:
    its axes are the model's coordinate axes)."""
    d = semi_axes.shape[0]
    with np.errstate(divide="ignore"):
        log_s = np.log(semi_axes)
    # V2: rho = eps/2, scale rho: u = s/rho, c = 1
    v2 = _log_enclosing_ellipsoid_ratio(log_s - math.log(0.5 * eps), 0.0)
    # Vinf: Q(eps) inside B(rho'), rho' = sqrt(d) eps / 2; divide by eps^d; scale eps
    vinf = float(_log_kappa(d)) + _log_enclosing_ellipsoid_ratio(
        log_s - math.log(eps), math.log(0.25 * d))
    out = {"v2_ellipsoid": v2, "vinf_ellipsoid": vinf}
    out.update(_ellipsoid_projection_terms(log_s - math.log(eps), aligned=aligned))
    return out


def _ellipsoid_projection_terms(log_s_over_eps: np.ndarray, *, aligned: bool) -> dict:
    """Vinf bounds for an ellipsoid from the volumes of its coordinate projections.

    The cube ``Q(eps)`` is the sum of ``d`` coordinate segments of length ``eps``, and adding a
    segment ``[0, v]`` to a convex body ``K`` adds ``|v| vol_{d-1}(K | v^perp)`` (Cavalieri), so
    ``vol(E + Q(eps)) = sum_{I subset [d]} eps^{d-|I|} vol_|I|(E | R^I)`` (projections onto the
    coordinate subspaces). For ``E = M^{1/2} B`` the projection onto ``R^I`` has volume
    ``kappa_|I| sqrt(det M_II)``. Cauchy-Schwarz over the ``C(d,k)`` subsets of size ``k`` and
    ``sum_{|I|=k} det M_II = e_k(s^2)`` (sum of principal minors) give, for any orientation,
    ``P <= sum_k kappa_k sqrt(C(d,k) e_k(s^2/eps^2))`` (exact for a ball: the Steiner formula).
    Axis-aligned: ``det M_II = prod_{i in I} s_i^2`` exactly, so ``P <= sum_k kappa_k e_k(s/eps)``.
    """
    d = log_s_over_eps.shape[0]
    k = np.arange(d + 1)
    out = {}
    log_e2 = _log_elementary_symmetric(2.0 * log_s_over_eps)
    out["vinf_projections"] = float(special.logsumexp(
        _log_kappa(k) + 0.5 * (_log_binom_array(d) + log_e2)))
    if aligned:
        log_e1 = _log_elementary_symmetric(log_s_over_eps)
        out["vinf_projections_aligned"] = float(special.logsumexp(_log_kappa(k) + log_e1))
    return out


def _is_axis_aligned(axes) -> bool:
    """True when every row of ``axes`` is (up to 1e-9) a signed coordinate vector."""
    if axes is None:
        return False
    A = np.abs(np.asarray(axes, dtype=np.float64))
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        return False
    return bool(np.all(np.abs(A.max(axis=1) - 1.0) < 1e-9) and np.all(A.sum(axis=1) < 1 + 1e-9))


def _box_terms(extents: np.ndarray, rotation, eps: float) -> dict:
    d = extents.shape[0]
    out = {}
    if rotation is None:
        out["vinf_box"] = float(np.sum(np.log1p(extents / eps)))
        return out
    R = np.asarray(rotation, dtype=np.float64)
    # Vinf: the model-axis cube Q(eps) seen in the box's frame fits in a box of half-sides
    # eps/2 ||R_i||_1, so S + Q(eps) fits in the box with sides a_i + eps ||R_i||_1
    out["vinf_box_rotated"] = float(np.sum(np.log(extents / eps + np.abs(R).sum(axis=1))))
    # V2: Steiner formula, vol(box + B(rho)) = sum_j e_j(a) kappa_{d-j} rho^{d-j}
    j = np.arange(d + 1)
    rho = 0.5 * eps
    log_e = _log_elementary_symmetric(np.log(extents / rho))
    out["v2_box_steiner"] = float(special.logsumexp(log_e + _log_kappa(d - j)) - _log_kappa(d))
    rho_p = 0.5 * math.sqrt(d) * eps
    log_e2 = _log_elementary_symmetric(np.log(extents / eps))
    # Vinf exact as a zonotope: box + Q(eps) has generators a_i R_i and eps e_j; its volume is
    # sum over d-subsets of |det|, i.e. sum_k sum_{|A|=k,|I|=k} prod_A (a_i/eps) |det R_{A,I}|
    # (times eps^d); Cauchy-Schwarz and Cauchy-Binet (sum_I det^2 R_{A,I} = 1, orthonormal rows)
    # bound the inner sum by sqrt(C(d,k))
    out["vinf_box_zonotope"] = float(special.logsumexp(log_e2 + 0.5 * _log_binom_array(d)))
    out["vinf_box_steiner"] = float(special.logsumexp(
        log_e2 + _log_kappa(d - j) + (d - j) * math.log(rho_p / eps)))
    return out


def _cone_convex_log_volume(d: int, r: float, alpha: float, rho: float) -> float:
    """Upper bound on ``log vol(K + B(rho))`` for ``K = cone(alpha) cap B(r)``, ``alpha <= pi/2``.

    ``cone + B(rho)`` lies in the same cone with its apex moved back by ``delta = rho/sin alpha``
    (a convex cone contains ``x + B(delta a, delta sin alpha)`` for every ``x`` in it), and every
    point is within ``r + rho`` of the origin, hence within ``r + rho + delta`` of the new apex:
    ``vol <= kappa_d (r + rho + delta)^d frac(alpha)``.
    """
    delta = rho / math.sin(alpha)
    return float(_log_kappa(d)) + d * math.log(r + rho + delta) + _cap(d, alpha)


def _cone_reflex_log_volume(d: int, r: float, alpha: float, rho: float) -> float:
    """Upper bound on ``log vol(K + B(rho))`` for ``alpha >= pi/2``.

    ``K`` misses the open convex cone of half-angle ``beta = pi - alpha`` around ``-axis``; the
    points of that cone moved ``delta = rho / sin beta`` further along ``-axis`` are at distance
    ``>= rho`` from ``K``, and that moved cone holds a sector of radius ``r + rho - delta`` inside
    ``B(r + rho)``: ``vol <= kappa_d (r+rho)^d [1 - frac(beta) ((r+rho-delta)/(r+rho))^d]``.
    """
    base = float(_log_kappa(d)) + d * math.log(r + rho)
    beta = math.pi - alpha
    if beta <= 0.0:
        return base
    delta = rho / math.sin(beta)
    if delta >= r + rho:
        return base
    cut = _cap(d, beta) + d * math.log1p(-delta / (r + rho))
    return base + _log1mexp(cut)


def _cone_terms(d: int, r: float, alpha: float, eps: float) -> dict:
    out = {}
    pairs = {"v2": (0.5 * eps, float(_log_kappa(d)) + d * math.log(0.5 * eps)),
             "vinf": (0.5 * math.sqrt(d) * eps, d * math.log(eps))}
    for name, (rho, log_den) in pairs.items():
        vals = []
        if alpha <= 0.5 * math.pi:
            # any cone containing K gives a valid bound: minimise over alpha' in [alpha, pi/2]
            f = lambda al: _cone_convex_log_volume(d, r, al, rho)  # noqa: E731
            vals.append(f(alpha))
            res = optimize.minimize_scalar(f, bounds=(alpha, 0.5 * math.pi), method="bounded")
            vals.append(min(float(res.fun), f(0.5 * math.pi)))
        if alpha >= 0.5 * math.pi:
            vals.append(_cone_reflex_log_volume(d, r, alpha, rho))
        out[f"{name}_cone"] = min(vals) - log_den
    return out


def _shell_semi_axes(support) -> tuple[np.ndarray, int, str]:
    """Semi-axes of the final-norm ellipsoid and its dimension (d, or d-1 for LayerNorm)."""
    kind = getattr(support, "kind_", None)
    gain = np.abs(np.asarray(support.gain_, dtype=np.float64))
    d = gain.shape[0]
    radius = float(getattr(support, "radius_", math.sqrt(d)))
    if kind == "rmsnorm":
        return radius * np.sort(gain)[::-1], d, kind
    if kind == "layernorm":
        # x_hat lies in the mean-zero hyperplane 1^perp; h - b = g o x_hat. The image of the
        # (d-1)-ball of radius sqrt(d) is a (d-1)-ellipsoid whose semi-axes are sqrt(d) times the
        # nonzero singular values of diag(g) restricted to 1^perp, i.e. the square roots of the
        # nonzero eigenvalues of diag(g^2) - g g^T / d.
        M = np.diag(gain**2) - np.outer(gain, gain) / d
        ev = np.clip(np.linalg.eigvalsh(M), 0.0, None)[::-1][: d - 1]
        return radius * np.sqrt(ev), d - 1, kind
    raise ValueError(f"support: a final-norm shell needs kind_ 'rmsnorm' or 'layernorm', got {kind!r}")


def _shell_terms(support, eps: float) -> dict:
    s, k, kind = _shell_semi_axes(support)
    d = int(np.asarray(support.gain_).shape[0])
    with np.errstate(divide="ignore"):
        log_s = np.log(s)
    out = {}
    if kind == "rmsnorm":
        out.update(_ellipsoid_terms(s, eps, aligned=True))  # diag(g): axes are coordinate axes
        return out
    # LayerNorm: a k = d-1 dimensional ellipsoid E' in a hyperplane. E' + B_d(rho) lies in
    # (E' + B_k(rho)) x [-rho, rho] (normal direction); bound the k-dimensional part as above.
    rho = 0.5 * eps
    g2 = _log_enclosing_ellipsoid_ratio(log_s - math.log(rho), 0.0)  # minus log kappa_k, k log rho
    out["v2_hyperplane"] = float(_log_kappa(k) - _log_kappa(d) + math.log(2.0) + g2)
    rho_p = 0.5 * math.sqrt(d) * eps
    gi = _log_enclosing_ellipsoid_ratio(log_s - math.log(eps), math.log(0.25 * d))
    out["vinf_hyperplane"] = float(_log_kappa(k) + gi + math.log(2.0 * rho_p / eps))
    # coordinate projections of the flat ellipsoid (M = d (diag(g^2) - g g^T/d), rank d-1):
    # the projection argument needs only the eigenvalues, one of which is 0
    log_s_full = np.concatenate([log_s, [-np.inf]]) - math.log(eps)
    out.update(_ellipsoid_projection_terms(log_s_full, aligned=False))
    return out


def _shape_of(support) -> str:
    shape = getattr(support, "shape", None)
    if not isinstance(shape, str):
        raise TypeError(
            "support: expected an embgeom.supports.Support (with a string attribute 'shape'), "
            f"got {type(support).__name__}"
        )
    key = _SHAPE_ALIASES.get(shape.lower())
    if key is None:
        raise ValueError(f"support: unknown shape {shape!r}; expected one of {sorted(set(_SHAPE_ALIASES))}")
    return key


def _require(support, *names):
    for n in names:
        if getattr(support, n, None) is None:
            raise ValueError(f"support: {type(support).__name__} has no fitted attribute {n!r}; fit it first")


def packing_bound_terms(support, eps) -> dict:
    """Every volumetric bound on ``log P(support, eps)`` computed for this shape, by name.

    Parameters
    ----------
    support : embgeom.supports.Support
        A fitted (or directly built) support; dispatched on ``support.shape``.
    eps : float
        Precision, > 0 (same units as the support).

    Returns
    -------
    dict
        ``{"paper": float, <rigorous term name>: float, ...}`` in nats. ``"paper"`` is THEORY.md's
        formula; the other entries are each a rigorous upper bound on the L-infinity packing
        number (see :func:`log_packing_number` and ``docs/theory.md`` for their derivations).
        :func:`log_packing_number` returns the smallest rigorous one.

    Raises
    ------
    TypeError, ValueError
        As :func:`log_packing_number`.
    """
    eps = _check_eps(eps)
    kind = _shape_of(support)
    if kind == "ball":
        _require(support, "radius_")
        d = int(support.dim)
        r = check_positive(support.radius_, "support.radius_")
        out = {"paper": d * math.log1p(2.0 * r / eps)}
        out.update(_ball_terms(d, r, eps))
    elif kind == "box":
        _require(support, "lower_", "upper_")
        a = np.asarray(support.upper_, dtype=np.float64) - np.asarray(support.lower_, dtype=np.float64)
        if not np.all(np.isfinite(a)) or np.any(a < 0):
            raise ValueError("support: box extents upper_ - lower_ must be finite and >= 0")
        rot = getattr(support, "rotation_", None)
        out = {"paper": float(np.sum(np.log1p(a / eps)))}
        out.update(_box_terms(a, rot, eps))
        if rot is not None:
            # the box lies in the ball of radius |a|/2 around its centre
            rb = 0.5 * float(np.linalg.norm(a))
            if rb > 0:
                out.update({f"{k}_circumball": v for k, v in _ball_terms(a.size, rb, eps).items()})
    elif kind == "ellipsoid":
        _require(support, "semi_axes_")
        s = np.asarray(support.semi_axes_, dtype=np.float64)
        if not np.all(np.isfinite(s)) or np.any(s < 0):
            raise ValueError("support: ellipsoid semi_axes_ must be finite and >= 0")
        out = {"paper": float(np.sum(np.log1p(2.0 * s / eps)))}
        out.update(_ellipsoid_terms(s, eps, aligned=_is_axis_aligned(getattr(support, "axes_", None))))
        smax = float(np.max(s))
        if smax > 0:
            out.update({f"{k}_circumball": v for k, v in _ball_terms(s.size, smax, eps).items()})
    elif kind == "cone":
        _require(support, "radius_", "half_angle_")
        d = int(support.dim)
        r = check_positive(support.radius_, "support.radius_")
        alpha = float(support.half_angle_)
        if not (0.0 < alpha <= math.pi * (1 + 1e-12)):
            raise ValueError(f"support: cone half_angle_ must lie in (0, pi], got {alpha}")
        alpha = min(alpha, math.pi)
        lf = _cap(d, alpha)
        out = {"paper": d * math.log1p(2.0 * r / eps) + lf, "log_cap_fraction": lf}
        out.update(_cone_terms(d, r, alpha, eps))
        out.update({f"{k}_ball": v for k, v in _ball_terms(d, r, eps).items()})
    else:  # shell
        _require(support, "gain_")
        s, k, kind_ = _shell_semi_axes(support)
        out = {"paper": float(np.sum(np.log1p(2.0 * s / eps))), "shell_dim": k}
        out.update(_shell_terms(support, eps))
        smax = float(np.max(s))
        if smax > 0:
            out.update({f"{kk}_circumball": v for kk, v in _ball_terms(s.size if kind_ == "rmsnorm" else k + 1, smax, eps).items()})
    return out


def log_packing_number(support, eps, *, variant: str = "rigorous") -> float:
    """Upper bound on the log packing number ``log P(S, eps)`` (nats) of a support.

    ``P(S, eps)`` is the largest number of points of ``S`` pairwise at L-infinity distance
    ``>= eps`` (the vectors a precision-``eps`` computation can tell apart; THEORY.md,
    "Precision" and "Packing number"). Dispatches on ``support.shape``.

    Parameters
    ----------
    support : embgeom.supports.Support
        ``Ball`` (``radius_``), ``Box`` (``lower_``, ``upper_``, ``rotation_``), ``Ellipsoid``
        (``semi_axes_``), ``Cone`` (``half_angle_``, ``radius_``; apex at the origin) or
        ``FinalNormShell`` (``kind_``, ``gain_``, ``radius_``).
    eps : float
        Precision, > 0, in the support's units (see :func:`precision_eps`).
    variant : {"rigorous", "paper"}, default "rigorous"
        ``"rigorous"``: the smallest of the rigorous volumetric bounds of
        :func:`packing_bound_terms`. ``"paper"``: THEORY.md's formula as written.

    Returns
    -------
    float
        ``log P`` upper bound in nats (finite for any ``d``).

    Raises
    ------
    TypeError
        Not a support.
    ValueError
        ``eps <= 0`` or non-finite, unknown shape or variant, an unfitted support, or invalid
        fitted attributes.

    Notes
    -----
    The formulas (derivations in ``docs/theory.md``; ``rho = eps/2``, ``rho' = sqrt(d) eps/2``):

    - **ball** radius ``r``: paper (Theorem 4.5) ``d log(1 + 2r/eps)``, which is also the exact
      V2 bound ``vol(B(r + rho))/vol(B(rho))`` (rigorous). Rigorous extra: the Steiner formula
      ``vol(Q(eps) + B(r)) / eps^d = sum_j C(d,j) kappa_{d-j} (r/eps)^{d-j}`` (Vinf, exact), much
      smaller in high dimension because a ball is far smaller than its bounding cube.
    - **box** with extents ``a_i`` (THEORY.md): ``sum_i log(1 + a_i/eps)``, rigorous (Vinf,
      exact) when the box is axis-aligned; for a rotated box it is *not* rigorous (the eps-cubes
      of the model's grid are not aligned with the box), and the rigorous bound is the smallest
      of ``sum_i log(a_i/eps + ||R_i||_1)``, the zonotope volume
      ``log sum_k sqrt(C(d,k)) e_k(a/eps)`` (Cauchy-Binet), the Steiner formula
      ``sum_j e_j(a) kappa_{d-j} rho^{d-j}`` (V2 and Vinf), and the circumscribed ball.
    - **ellipsoid** with semi-axes ``s_i``: paper ``sum_i log(1 + 2 s_i/eps)``, an approximation
      (the Minkowski sum ``E + B(rho)`` is *not* inside the ellipsoid with semi-axes
      ``s_i + rho``). Rigorous: ``E + B(rho)`` lies in the ellipsoid with semi-axes
      ``sqrt(s_i^2/t + rho^2/(1-t))`` for every ``t in (0,1)``, giving
      ``min_t sum_i 1/2 log(4 s_i^2/(t eps^2) + 1/(1-t))`` (V2; equal to the ball's formula for
      equal axes, and within a few nats of the paper's formula otherwise), its Vinf analogue with
      ``rho'``, and the circumscribed ball.
    - **cone** of half-angle ``alpha`` in the ball of radius ``r``: paper
      ``d log(1 + 2r/eps) + log(1/2 I_{sin^2 alpha}((d-1)/2, 1/2))``, an approximation (the
      eps/2-balls of points near the cone's surface stick out of it). Rigorous: ``cone + B(rho)``
      lies in the cone with its apex moved back by ``rho/sin alpha``, giving
      ``log frac(alpha) + d log(1 + 2r/eps + 1/sin alpha)`` (V2), its Vinf analogue, a reflex
      version for ``alpha > pi/2``, and the ball's bounds.
    - **final-norm shell** (RMSNorm: the surface of the ellipsoid with semi-axes
      ``sqrt(d)|g_i|``; LayerNorm: a (d-2)-surface in a hyperplane): bounded by the solid
      ellipsoid (rigorous, as above); for LayerNorm the (d-1)-dimensional ellipsoid in its
      hyperplane, times a slab of width ``2 rho``. The surface itself is thinner by at most
      about one coordinate's worth, ``log(2R/eps) - 1/2 log(2 pi d)`` nats, which is not used.

    Examples
    --------
    >>> from embgeom.supports import Box
    >>> import numpy as np
    >>> cube = Box(-np.ones(3), np.ones(3))
    >>> round(log_packing_number(cube, 0.5), 10) == round(3 * np.log(5.0), 10)
    True
    """
    if variant not in ("rigorous", "paper"):
        raise ValueError(f"variant: expected 'rigorous' or 'paper', got {variant!r}")
    terms = packing_bound_terms(support, eps)
    if variant == "paper":
        return float(terms["paper"])
    vals = [v for k, v in terms.items() if k not in ("paper", "log_cap_fraction", "shell_dim")]
    return float(min(vals))


def accessible_log_count(support, eps, m, *, variant: str = "rigorous") -> float:
    """Theorem 4.5: log of the number of distinct output sequences reachable with ``m`` prompt
    vectors in ``support`` at precision ``eps``: ``m log P(S, eps)`` (nats).

    Parameters
    ----------
    support : embgeom.supports.Support
    eps : float
        > 0.
    m : int
        Number of prompt (soft prompt / memory) vectors, >= 1.
    variant : {"rigorous", "paper"}
        Passed to :func:`log_packing_number`.

    Returns
    -------
    float
        Nats.

    Raises
    ------
    TypeError, ValueError
        Bad ``support``, ``eps <= 0``, ``m < 1``.

    Notes
    -----
    Paper, Theorem 4.5: the output is a deterministic function of the ``m``-tuple of prompt
    vectors, each one of at most ``P`` distinguishable values, so at most ``P^m`` outputs.
    """
    m = check_positive_int(m, "m")
    return m * log_packing_number(support, eps, variant=variant)


def slope_bound(support, eps, vocab_size, rate=None, *, variant: str = "rigorous") -> float:
    """Cor. 4.6: the slope ``C = log P(S, eps) / log|V|`` of the linear law ``n* = C m``.

    Parameters
    ----------
    support : embgeom.supports.Support
    eps : float
        > 0.
    vocab_size : int
        ``|V|``, >= 2.
    rate : float, optional
        Nats per token replacing ``log|V|`` (the non-uniform-cell refinement: pass
        :func:`cell_volume_rate`'s ``rate``; then ``C_refined = C log|V| / lambda``).
    variant : {"rigorous", "paper"}

    Returns
    -------
    float
        Tokens per prompt vector.

    Raises
    ------
    TypeError, ValueError
        Bad support, ``eps <= 0``, ``vocab_size < 2``, ``rate <= 0``.

    Notes
    -----
    With ``rate=None`` this is a rigorous bound on the longest length at which *all* ``|V|^n``
    sequences are accessible. With ``rate=lambda`` it is the paper's refinement, a heuristic for
    *typical* (median) sequences, not a counting bound (``docs/theory.md``).
    """
    V = _check_vocab(vocab_size)
    lam = _check_rate(rate, V)
    return log_packing_number(support, eps, variant=variant) / lam


def theorem45_log_count(d, m, r, eps) -> float:
    """Theorem 4.5 for the cube/ball of radius ``r``: ``d m log(1 + 2r/eps)`` (nats).

    Parameters
    ----------
    d : int
        Hidden size, >= 1.
    m : int
        Prompt vectors, >= 1.
    r : float
        Radius (L-infinity for the cube, L2 for the ball), > 0.
    eps : float
        Precision, > 0.

    Returns
    -------
    float
        Log of the number of accessible output sequences, nats.

    Raises
    ------
    TypeError, ValueError
        Non-integer or < 1 ``d``/``m``; ``r <= 0``; ``eps <= 0``.

    Examples
    --------
    >>> round(theorem45_log_count(2, 3, 1.0, 0.5), 12) == round(6 * np.log(5.0), 12)
    True
    """
    d = check_positive_int(d, "d")
    m = check_positive_int(m, "m")
    r = check_positive(r, "r")
    eps = _check_eps(eps)
    return d * m * math.log1p(2.0 * r / eps)


def linear_law_slope(d, r, eps, vocab_size, rate=None) -> float:
    """Cor. 4.6 for the cube/ball: ``C = d log(1 + 2r/eps) / log|V|`` tokens per prompt vector.

    Parameters
    ----------
    d : int
        >= 1.
    r, eps : float
        > 0.
    vocab_size : int
        >= 2.
    rate : float, optional
        Replaces ``log|V|`` (nats per token).

    Returns
    -------
    float

    Raises
    ------
    TypeError, ValueError
        As :func:`theorem45_log_count`, plus ``vocab_size < 2`` and ``rate <= 0``.
    """
    V = _check_vocab(vocab_size)
    return theorem45_log_count(d, 1, r, eps) / _check_rate(rate, V)


def _check_log_packing(log_packing) -> float:
    if isinstance(log_packing, bool) or not isinstance(log_packing, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"log_packing: expected a real number (nats), got {type(log_packing).__name__}")
    v = float(log_packing)
    if not np.isfinite(v) or v < 0:
        raise ValueError(f"log_packing: expected a finite number >= 0 (nats), got {v}")
    return v


def _m_array(m) -> np.ndarray:
    arr = np.asarray(m)
    if arr.dtype.kind not in "iu" or arr.size == 0:
        raise TypeError(f"m: expected an integer or an array of integers, got {m!r}")
    if np.any(arr < 1):
        raise ValueError(f"m: expected integers >= 1, got min {arr.min()}")
    return arr.astype(np.float64)


def n_star(m, log_packing, vocab_size, rate=None) -> np.ndarray:
    """The cliff ``n*(m) = m log P / log|V|`` (Cor. 4.6), in tokens.

    Parameters
    ----------
    m : int or array_like of int
        Prompt vectors, each >= 1.
    log_packing : float
        ``log P(S, eps)`` in nats (from :func:`log_packing_number`).
    vocab_size : int
        >= 2.
    rate : float, optional
        Nats per token replacing ``log|V|``.

    Returns
    -------
    ndarray of float64, shape of ``m``
        The longest length at which all sequences can be accessible (real-valued; the integer
        length is its floor).

    Raises
    ------
    TypeError, ValueError
        ``m < 1``, ``log_packing < 0`` or NaN, ``vocab_size < 2``, ``rate <= 0``.
    """
    mm = _m_array(m)
    lp = _check_log_packing(log_packing)
    lam = _check_rate(rate, _check_vocab(vocab_size))
    return mm * lp / lam


def accessible_fraction_bound(n, m, log_packing, vocab_size, rate=None, *, log: bool = False):
    """Upper bound on the accessible fraction of the ``|V|^n`` sequences of length ``n``.

    ``min(1, exp(m log P - n log|V|)) = exp(-(n - n*) log|V|)`` past ``n*`` (Cor. 4.6).

    Parameters
    ----------
    n : int or array_like of int
        Sequence lengths, >= 1.
    m : int
        Prompt vectors, >= 1 (broadcast against ``n``).
    log_packing : float
        ``log P`` (nats).
    vocab_size : int
        >= 2.
    rate : float, optional
        Replaces ``log|V|`` (the refinement; then a heuristic for typical sequences).
    log : bool, default False
        Return the natural log of the fraction (never underflows) instead of the fraction.

    Returns
    -------
    ndarray of float64
        Broadcast shape of ``n`` and ``m``; fraction in [0, 1] (or its log, <= 0).

    Raises
    ------
    TypeError, ValueError
        As :func:`n_star`, and ``n < 1``.
    """
    nn = np.asarray(n)
    if nn.dtype.kind not in "iu" or nn.size == 0:
        raise TypeError(f"n: expected an integer or an array of integers, got {n!r}")
    if np.any(nn < 1):
        raise ValueError(f"n: expected lengths >= 1, got min {nn.min()}")
    mm = _m_array(m)
    lp = _check_log_packing(log_packing)
    lam = _check_rate(rate, _check_vocab(vocab_size))
    logf = np.minimum(0.0, mm * lp - nn.astype(np.float64) * lam)
    return logf if log else np.exp(logf)


# --------------------------------------------------------------------------------------------
# the non-uniform cell rate lambda
# --------------------------------------------------------------------------------------------
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
    ``-log`` of the median of that product grows by about ``lambda`` per token (THEORY.md,
    "non-uniform cells"). Used as ``C_refined = C_shape log|V| / lambda``.

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


# --------------------------------------------------------------------------------------------
# Cor. 4.10: unbounded context (mean-field view)
# --------------------------------------------------------------------------------------------
def log_multiset_count(log_points, n) -> np.ndarray:
    """``log C(n + P, n)``: the number of multisets of size ``<= n`` drawn from ``P`` points,
    equivalently of integer vectors ``c >= 0`` in ``R^P`` with ``sum c <= n`` (nats).

    Parameters
    ----------
    log_points : float
        ``log P`` (nats, >= 0); ``P`` may be astronomically large (``log P`` in the thousands)
        and need not be an integer (it is then the generalised binomial via Gamma functions,
        increasing in ``P``).
    n : int or array_like of int
        Sizes, >= 0.

    Returns
    -------
    ndarray of float64
        Shape of ``n``.

    Raises
    ------
    TypeError, ValueError
        ``log_points`` negative or NaN; ``n`` negative or not integer.

    Notes
    -----
    ``log C(n+P, n) = -log(n+P+1) - betaln(P+1, n+1)`` while ``P`` is a float; for ``log P > 700``
    the rigorous upper form ``n log P - log n! + n(n+1)/(2P)`` (from
    ``log(P+j) <= log P + j/P``), whose last term is below 1e-290.
    """
    lp = _check_log_packing(log_points)
    nn = np.asarray(n)
    if nn.dtype.kind not in "iu":
        raise TypeError(f"n: expected integers, got {n!r}")
    if np.any(nn < 0):
        raise ValueError(f"n: expected integers >= 0, got min {nn.min()}")
    nf = nn.astype(np.float64)
    if lp <= 700.0:
        P = math.exp(lp)
        return -np.log(nf + P + 1.0) - special.betaln(P + 1.0, nf + 1.0)
    return nf * lp - special.gammaln(nf + 1.0) + nf * (nf + 1.0) * 0.5 * math.exp(-lp)


def threshold_length_unbounded(log_packing, vocab_size, *, weight_bits: int = 11,
                               context_length=None, rate=None) -> dict:
    """Cor. 4.10 made computable: a length beyond which almost no sequence is accessible, for
    prompts of any length (mean-field view).

    Parameters
    ----------
    log_packing : float
        ``log P(S, eps)`` of one prompt vector's support (nats, from
        :func:`log_packing_number`).
    vocab_size : int
        ``|V|``, >= 2.
    weight_bits : int, default 11
        Resolution of the empirical measure's weights: weights are resolved to
        ``delta = 2**-weight_bits`` (assumption A3 in ``docs/theory.md``); ``K = 2**weight_bits``.
    context_length : int or array_like of int, optional
        If given, also the bound for prompts of at most ``L`` vectors (no A3 needed there), and
        the minimum of the two.
    rate : float, optional
        Nats per token replacing ``log|V|``.

    Returns
    -------
    dict
        ``log_count`` (nats): log of the number of distinguishable prompt measures,
        ``log C(K + P, K)`` (or ``min`` with ``log C(L + P, L)`` when ``context_length`` is given;
        an array then); ``n_threshold`` = ``log_count / log|V|`` (tokens): past it the
        accessible fraction is at most ``exp(-(n - N) log|V|)``; ``weight_levels`` ``K``;
        ``log_count_unbounded`` and ``n_threshold_unbounded`` (the A3 bound alone);
        ``ordered_equivalent_m`` = ``log_count_unbounded / log_packing`` (how many ordered prompt
        vectors of Theorem 4.5 carry the same count).

    Raises
    ------
    TypeError, ValueError
        ``log_packing < 0``/NaN, ``vocab_size < 2``, ``weight_bits < 1`` or > 62,
        ``context_length < 1``, ``rate <= 0``.

    Notes
    -----
    Assumptions (derivation in ``docs/theory.md``): (A1) the map from prompt to output is
    permutation invariant in the prompt vectors, so it depends only on their empirical measure
    (mean-field view of attention, no positional information); (A2) each prompt vector is one
    of at most ``P`` distinguishable points (precision ``eps``); (A3) two measures whose weights
    agree after flooring to multiples of ``delta`` give the same output; (A4) greedy decoding
    is deterministic. Under A1, A2, A4 a prompt of length ``<= L`` is a multiset: at most
    ``C(L + P, L)`` outputs; with A3 at most ``C(K + P, K)`` for any length. Then ``N`` is the
    length at which ``|V|^N`` reaches that count.
    """
    lp = _check_log_packing(log_packing)
    V = _check_vocab(vocab_size)
    lam = _check_rate(rate, V)
    bits = check_positive_int(weight_bits, "weight_bits")
    if bits > 62:
        raise ValueError(f"weight_bits: expected <= 62, got {bits}")
    K = 2**bits
    log_unb = float(log_multiset_count(lp, K))
    out = {
        "log_count_unbounded": log_unb,
        "n_threshold_unbounded": log_unb / lam,
        "weight_levels": K,
        "ordered_equivalent_m": log_unb / lp if lp > 0 else float("nan"),
        "rate": lam,
    }
    if context_length is None:
        out["log_count"] = log_unb
        out["n_threshold"] = log_unb / lam
        return out
    L = np.asarray(context_length)
    if L.dtype.kind not in "iu" or L.size == 0:
        raise TypeError(f"context_length: expected integers, got {context_length!r}")
    if np.any(L < 1):
        raise ValueError(f"context_length: expected integers >= 1, got min {L.min()}")
    log_L = np.minimum(log_multiset_count(lp, L), log_unb)
    out["context_length"] = L
    out["log_count"] = log_L
    out["n_threshold"] = log_L / lam
    return out


# --------------------------------------------------------------------------------------------
# figure and report section
# --------------------------------------------------------------------------------------------
def plot_accessible_fraction(curves: dict, vocab_size, path, *, m_values=(1, 2, 4, 8),
                             n_max=None) -> str:
    """Plot the accessible-fraction bound ``log10 fraction`` against ``n`` and save a PNG.

    Parameters
    ----------
    curves : dict[str, tuple[float, float | None]]
        Label -> ``(log_packing, rate)`` (nats; ``rate=None`` means ``log|V|``).
    vocab_size : int
        >= 2.
    path : str or Path
        PNG file to write.
    m_values : sequence of int
        Prompt-vector counts drawn for each curve.
    n_max : int, optional
        Largest length on the x axis (default: 1.3 times the largest ``n*``).

    Returns
    -------
    str
        The path written.

    Raises
    ------
    ValueError
        Empty ``curves``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not curves:
        raise ValueError("curves: expected at least one curve")
    V = _check_vocab(vocab_size)
    ms = [check_positive_int(m, "m_values") for m in m_values]
    if n_max is None:
        n_max = int(1.3 * max(float(n_star(max(ms), lp, V, rate)) for lp, rate in curves.values())) + 2
    n = np.unique(np.linspace(1, n_max, 600).astype(np.int64))
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    styles = ["-", "--", ":", "-."]
    for ci, (label, (lp, rate)) in enumerate(curves.items()):
        for mi, m in enumerate(ms):
            y = accessible_fraction_bound(n, m, lp, V, rate, log=True) / math.log(10)
            ax.plot(n, y, styles[mi % len(styles)], color=f"C{ci % 10}",
                    label=f"{label}, m={m}" if len(ms) > 1 else label, lw=1.3)
    ax.set_xlabel("sequence length n (tokens)")
    ax.set_ylabel("log10 accessible fraction (upper bound)")
    ax.set_ylim(bottom=max(ax.get_ylim()[0], -60), top=2)
    ax.set_title("Accessible fraction bound (Thm 4.5 / Cor 4.6)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def bounds_report_section(unembedding_facts: dict, supports: dict, rinf, fractions=None,
                          lower=None, upper=None, published_c_emp=None, out_dir=".", *,
                          dtype="float32", k_max: int = 32, n_samples=None,
                          m_values=tuple(range(1, 9)), valid=None) -> dict:
    """The bounds section of a model report: slopes per support, lambda, n*, the figure.

    Parameters
    ----------
    unembedding_facts : dict
        Needs ``hidden_size`` (or ``d``) and ``vocab_size``; ``name`` is used if present.
    supports : dict[str, Support]
        Fitted supports by name; every entry is bounded (a failure is recorded, not raised).
    valid : collection of str, optional
        Names (``"cube"`` included) of the supports that passed a held-out containment check
        (see :func:`embgeom.report.build_report`). Only these compete for ``tightest``; the others
        are still bounded and tabulated, marked not valid. ``None``: all are taken as valid.
    rinf : float
        The L-infinity radius of the hidden states, > 0: the cube ``[-rinf, rinf]^d`` is the
        ``"cube"`` column and ``eps`` is derived from it.
    fractions, lower, upper : array_like of float, shape (|V|,), optional
        Cell-volume fractions and their Monte Carlo interval ends; with them the refined slopes
        ``C log|V| / lambda`` are computed.
    published_c_emp : float, optional
        Empirical slope (tokens per prompt vector) to compare against.
    out_dir : str or Path
        Folder for ``accessible_fraction.png``.
    dtype : str, default "float32"
        The model's compute dtype, for the second precision.
    k_max : int, default 32
        Passed to :func:`cell_volume_rate`.
    n_samples : int, optional
        Passed to :func:`cell_volume_rate`.
    m_values : sequence of int
        The ``m`` for the ``n_star`` table.

    Returns
    -------
    dict
        JSON-able: ``eps`` ({"paper": r_inf 2^-11, "dtype": r_inf 2^-bits, "dtype_name"}),
        ``log_packing`` / ``slope`` / ``slope_dtype`` / ``slope_paper_formula`` /
        ``slope_refined`` / ``ratio`` / ``n_star`` (dicts by shape), ``rate_lambda``, ``rate``
        (the :class:`CellVolumeRate` dict), ``threshold_unbounded`` (Cor. 4.10 for the tightest
        shape), ``c_emp``, ``tightest``, ``errors``, ``figure``, ``markdown``.

    Raises
    ------
    TypeError, ValueError
        Missing facts, ``rinf <= 0``, bad fractions.
    """
    d = unembedding_facts.get("hidden_size", unembedding_facts.get("d"))
    d = check_positive_int(d, "unembedding_facts['hidden_size']")
    V = _check_vocab(unembedding_facts.get("vocab_size"))
    rinf = check_positive(rinf, "rinf")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    logV = math.log(V)
    eps_paper = precision_eps(rinf, 11)
    eps_dtype = precision_eps(rinf, dtype)
    shapes: dict[str, object] = {}
    errors: dict[str, str] = {}
    lp_paper, lp_dtype, lp_formula = {}, {}, {}
    lp_paper["cube"] = theorem45_log_count(d, 1, rinf, eps_paper)
    lp_dtype["cube"] = theorem45_log_count(d, 1, rinf, eps_dtype)
    lp_formula["cube"] = lp_paper["cube"]
    for name, sup in (supports or {}).items():
        try:
            lp_paper[name] = log_packing_number(sup, eps_paper)
            lp_dtype[name] = log_packing_number(sup, eps_dtype)
            lp_formula[name] = log_packing_number(sup, eps_paper, variant="paper")
            shapes[name] = getattr(sup, "shape", "?")
        except (TypeError, ValueError, AttributeError) as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    rate = None
    lam = None
    if fractions is not None:
        rate = cell_volume_rate(fractions, k_max, lower=lower, upper=upper, n_samples=n_samples)
        lam = rate.rate if np.isfinite(rate.rate) else None
    c_emp = None if published_c_emp is None else check_positive(published_c_emp, "published_c_emp")
    slope = {k: v / logV for k, v in lp_paper.items()}
    slope_dtype = {k: v / logV for k, v in lp_dtype.items()}
    slope_formula = {k: v / logV for k, v in lp_formula.items()}
    slope_ref = {k: (v / lam if lam else None) for k, v in lp_paper.items()}
    slope_ref_cons = {}
    if rate is not None and np.isfinite(rate.rate_conservative):
        slope_ref_cons = {k: v / rate.rate_conservative for k, v in lp_paper.items()}
    ratio = {k: (v / c_emp if c_emp else None) for k, v in slope.items()}
    ratio_ref = {k: (v / c_emp if (c_emp and v) else None) for k, v in slope_ref.items()}
    nstar = {k: n_star(np.asarray(m_values), v, V).tolist() for k, v in lp_paper.items()}
    is_valid = {k: (valid is None or k in valid) for k in lp_paper}
    candidates = [k for k in lp_paper if is_valid[k]] or list(lp_paper)
    tight = min(candidates, key=lp_paper.get)
    thr = threshold_length_unbounded(lp_paper[tight], V, weight_bits=11)
    curves = {f"{tight} (log|V|)": (lp_paper[tight], None), f"cube (log|V|)": (lp_paper["cube"], None)}
    if lam:
        curves[f"{tight} (lambda)"] = (lp_paper[tight], lam)
    fig = plot_accessible_fraction(curves, V, out / "accessible_fraction.png", m_values=(1, 4))

    rows = []
    for k in lp_paper:
        rows.append([k, shapes.get(k, "box (cube)"), "yes" if is_valid[k] else "NO",
                     lp_paper[k], slope_formula[k], slope[k],
                     slope_dtype[k], slope_ref[k] if slope_ref[k] else "-",
                     ratio[k] if ratio[k] else "-",
                     ("BROKEN " if ratio[k] and ratio[k] < 1 else "") + (f"{ratio_ref[k]:.3g}" if ratio_ref[k] else "-")])
    md = ["## Packing bounds", "",
          f"Precision eps = r_inf 2^-11 = {eps_paper:.4g} (paper's convention; r_inf = {rinf:.4g}); "
          f"{dtype} gives eps = {eps_dtype:.4g}. |V| = {V:,}, log|V| = {logV:.4f}, d = {d}.",
          "C = log P / log|V| in tokens per prompt vector (rigorous bound on log P unless the "
          "column says 'paper formula'); refined: log P / lambda (heuristic, typical sequences). "
          "A support marked not held-out valid missed fresh hidden states: its C is no bound. "
          + ("C_emp: the published empirical slope (THEORY.md)." if c_emp else
             "C / C_emp: no published empirical slope for this model (run `embgeom cram` for "
             "ours)."), "",
          _md_table(["support", "shape", "held-out valid", "log P (nats)", "C paper formula", "C rigorous",
                     f"C ({dtype} eps)", "C refined", "C / C_emp", "C refined / C_emp"], rows), ""]
    if rate is not None:
        md.append(f"lambda = {rate.rate:.4g} nats/token (R^2 {rate.r2:.4f}; conservative "
                  f"{rate.rate_conservative:.4g}; asymptotic -mean log f = {rate.rate_asymptotic:.4g}; "
                  f"{rate.n_zero} zero fractions filled by {rate.zero_fill}) vs log|V| = {logV:.4g}.")
    md.append(f"Cor. 4.10 (mean-field, weights at 2^-11): N = {thr['n_threshold']:.4g} tokens "
              f"for the {tight} support.")
    md += ["", "n*(m) for m = " + ", ".join(map(str, m_values)) + ":", "",
           _md_table(["support"] + [f"m={m}" for m in m_values],
                     [[k] + [float(x) for x in v] for k, v in nstar.items()]),
           "", "![accessible fraction](accessible_fraction.png)"]
    return {
        "eps": {"paper": eps_paper, "dtype": eps_dtype, "dtype_name": str(dtype), "rinf": rinf},
        "log_packing": lp_paper,
        "slope": slope,
        "slope_dtype": slope_dtype,
        "slope_paper_formula": slope_formula,
        "slope_refined": slope_ref,
        "slope_refined_conservative": slope_ref_cons,
        "rate_lambda": lam,
        "rate": None if rate is None else rate.to_dict(),
        "log_vocab": logV,
        "c_emp": c_emp,
        "ratio": ratio,
        "ratio_refined": ratio_ref,
        "n_star": {"m": list(m_values), **nstar},
        "threshold_unbounded": {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in thr.items()},
        "tightest": tight,
        "heldout_valid": is_valid,
        "errors": errors,
        "figure": Path(fig).name,
        "markdown": "\n".join(md),
    }
