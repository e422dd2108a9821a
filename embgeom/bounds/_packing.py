"""Packing numbers and Theorem 4.5: how many distinguishable prompt vectors a support holds.

Precision model (the paper's): two vectors that differ by less than ``eps`` in every coordinate
cannot be told apart, so the vectors that matter form a set whose points are pairwise at
L-infinity distance >= ``eps`` (e.g. a grid of step ``eps``). ``P(S, eps)`` is the largest such
set inside ``S`` (the L-infinity packing number). A set that is ``eps``-separated in L-infinity is
also ``eps``-separated in L2, so every bound on the Euclidean packing number is a bound on ``P``
too; :func:`log_packing_number` takes the smallest of several *rigorous* volumetric bounds, which
each support computes for its own shape (``Support.packing_bound_terms``):

- (V2) ``P <= vol(S + B(eps/2)) / vol(B(eps/2))`` (disjoint Euclidean balls of radius eps/2),
- (Vinf) ``P <= vol(S + Q(eps)) / eps^d`` (disjoint cubes of side eps, ``Q(eps) = [-eps/2,
  eps/2]^d`` in the model's coordinates), with ``Q(eps)`` inside ``B(sqrt(d) eps/2)`` where the
  shape gives no closed form.

``variant="paper"`` gives the paper's formulas (docs/theory.md, section 4) verbatim instead (some of them approximations).

References
----------
M. Meyer, M. Michelessa, C. Chaux, V. Y. F. Tan, "How Many Different Outputs Can a Transformer
Generate?", ICML 2026 (arXiv 2605.22223), Sec. 4: Theorem 4.5. R. Vershynin, "High-Dimensional
Probability" (2018), Prop. 4.2.12. R. Schneider, "Convex Bodies: the Brunn-Minkowski Theory"
(2014), Sec. 4.2.
"""

from __future__ import annotations

import math

import numpy as np

from .._special import log1p_ratio
from .._validation import check_positive, check_positive_int
from ._checks import (_check_eps, _check_log_packing, _check_rate, _check_vocab, _log_count,
                      _per_token)
from ._rate import CellVolumeRate

__all__ = ["packing_bound_terms", "log_packing_number", "accessible_log_count", "slope_bound",
           "slope_from_log_packing", "theorem45_log_count"]


def packing_bound_terms(support, eps) -> dict:
    """Every volumetric bound on ``log P(support, eps)`` computed for this shape, by name.

    Parameters
    ----------
    support : embgeom.supports.Support
        A fitted (or built with ``from_params``) support; the shape computes its own terms
        (``support.packing_bound_terms(eps)``).
    eps : float
        Precision, > 0 (same units as the support).

    Returns
    -------
    dict
        ``{"paper": float, <rigorous term name>: float, ...}`` in nats. ``"paper"`` is the paper's (docs/theory.md, section 4)
        formula; the other entries are each a rigorous upper bound on the L-infinity packing
        number (see :func:`log_packing_number` and ``docs/theory.md`` for their derivations).
        :func:`log_packing_number` returns the smallest rigorous one.

    Raises
    ------
    TypeError
        ``support`` is not a support (no ``packing_bound_terms`` method).
    ValueError
        ``eps <= 0`` or not finite, an unfitted support (``NotFittedError``).
    """
    eps = _check_eps(eps)
    if not hasattr(type(support), "packing_bound_terms"):
        raise TypeError(
            "support: expected an embgeom.supports.Support (with a packing_bound_terms method), "
            f"got {type(support).__name__}"
        )
    return dict(support.packing_bound_terms(eps))


def log_packing_number(support, eps, *, variant: str = "rigorous") -> float:
    """Upper bound on the log packing number ``log P(S, eps)`` (nats) of a support.

    ``P(S, eps)`` is the largest number of points of ``S`` pairwise at L-infinity distance
    ``>= eps`` (the vectors a precision-``eps`` computation can tell apart; docs/theory.md,
    sections 2 "Supports and precision" and 4 "Packing bounds per support"). The support computes its terms itself
    (:func:`packing_bound_terms`).

    Parameters
    ----------
    support : embgeom.supports.Support
        ``Ball``, ``Box``, ``Ellipsoid``, ``Cone`` (apex at the origin) or ``FinalNormShell``,
        fitted or built with ``from_params``.
    eps : float
        Precision, > 0, in the support's units (see :func:`precision_eps`).
    variant : {"rigorous", "paper"}, default "rigorous"
        ``"rigorous"``: the smallest of the rigorous volumetric bounds of
        :func:`packing_bound_terms`. ``"paper"``: the paper's formula as written (docs/theory.md, section 4).

    Returns
    -------
    float
        ``log P`` upper bound in nats (finite for any ``d``).

    Raises
    ------
    TypeError
        Not a support.
    ValueError
        ``eps <= 0`` or non-finite, unknown variant, an unfitted support (``NotFittedError``).

    Notes
    -----
    The formulas (derivations in ``docs/theory.md``; ``rho = eps/2``, ``rho' = sqrt(d) eps/2``):

    - **ball** radius ``r``: paper (Theorem 4.5) ``d log(1 + 2r/eps)``, which is also the exact
      V2 bound ``vol(B(r + rho))/vol(B(rho))`` (rigorous). Rigorous extra: the Steiner formula
      ``vol(Q(eps) + B(r)) / eps^d = sum_j C(d,j) kappa_{d-j} (r/eps)^{d-j}`` (Vinf, exact), much
      smaller in high dimension because a ball is far smaller than its bounding cube.
    - **box** with extents ``a_i`` (docs/theory.md 4.2): ``sum_i log(1 + a_i/eps)``, rigorous (Vinf,
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
    >>> cube = Box.from_params(-np.ones(3), np.ones(3))
    >>> bool(round(log_packing_number(cube, 0.5), 10) == round(3 * np.log(5.0), 10))
    True
    """
    if variant not in ("rigorous", "paper"):
        raise ValueError(f"variant: expected 'rigorous' or 'paper', got {variant!r}")
    terms = packing_bound_terms(support, eps)
    if variant == "paper":
        return float(terms["paper"])
    vals = [v for k, v in terms.items() if k != "paper"]
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
        Bad ``support``, ``eps <= 0``, ``m < 1``, ``m log P`` beyond float64 (above 1.8e308
        nats; refused as :func:`n_star` refuses it, not returned as ``inf``).

    Notes
    -----
    Paper, Theorem 4.5: the output is a deterministic function of the ``m``-tuple of prompt
    vectors, each one of at most ``P`` distinguishable values, so at most ``P^m`` outputs.
    """
    m = check_positive_int(m, "m")
    return _log_count(m, log_packing_number(support, eps, variant=variant),
                      "m and log_packing_number", "m log P")


def slope_bound(support, eps, vocab_size, rate=None, *, variant: str = "rigorous",
                conservative: bool = False) -> float:
    """Cor. 4.6: the slope ``C = log P(S, eps) / log|V|`` of the linear law ``n* = C m``.

    Parameters
    ----------
    support : embgeom.supports.Support
    eps : float
        > 0.
    vocab_size : int
        ``|V|``, >= 2.
    rate : float or CellVolumeRate, optional
        Nats per token replacing ``log|V|`` (the non-uniform-cell refinement: ``C_refined = C
        log|V| / lambda``): a number, or the :class:`~embgeom.bounds.CellVolumeRate` of
        :func:`cell_volume_rate` (its ``rate``, or ``rate_conservative`` with
        ``conservative=True``).
    variant : {"rigorous", "paper"}
    conservative : bool, default False
        With a ``CellVolumeRate``: divide by its ``rate_conservative`` (the smallest lambda its
        intervals allow: the largest, safest refined slope).

    Returns
    -------
    float
        Tokens per prompt vector.

    Raises
    ------
    TypeError, ValueError
        Bad support, ``eps <= 0``, ``vocab_size < 2``, ``rate <= 0`` or not finite,
        ``conservative=True`` without a ``CellVolumeRate``.

    Notes
    -----
    With ``rate=None`` this is a rigorous bound on the longest length at which *all* ``|V|^n``
    sequences are accessible. With ``rate=lambda`` it is the paper's refinement, a heuristic for
    *typical* (median) sequences, not a counting bound (``docs/theory.md``).
    """
    V = _check_vocab(vocab_size)
    lam = _rate_value(rate, V, conservative)
    return float(_per_token(log_packing_number(support, eps, variant=variant), lam, "C",
                            "log_packing_number and rate"))


def slope_from_log_packing(log_packing, vocab_size, rate=None, *, conservative: bool = False) -> float:
    """The slope ``C = log P / lambda`` from a log packing number already computed.

    :func:`slope_bound` without the packing number: for a ``log P`` from
    :func:`log_packing_number` or :func:`theorem45_log_count` (the cube's closed form), so that a
    caller holding several of them (the report) divides in one place.

    Parameters
    ----------
    log_packing : float
        ``log P(S, eps)`` in nats, finite and >= 0.
    vocab_size : int
        ``|V|``, >= 2.
    rate : float or CellVolumeRate, optional
        As in :func:`slope_bound`; default ``log|V|``.
    conservative : bool, default False
        As in :func:`slope_bound`.

    Returns
    -------
    float
        Tokens per prompt vector.

    Raises
    ------
    TypeError, ValueError
        ``log_packing`` not a finite number >= 0, ``vocab_size < 2``, ``rate <= 0`` or not
        finite, ``conservative=True`` without a ``CellVolumeRate``.

    Examples
    --------
    >>> round(slope_from_log_packing(20.0, 100, 5.0), 12)
    4.0
    """
    V = _check_vocab(vocab_size)
    return float(_per_token(_check_log_packing(log_packing), _rate_value(rate, V, conservative),
                            "C", "log_packing and rate"))


def _rate_value(rate, V: int, conservative: bool) -> float:
    """lambda (nats per token) from ``None`` (``log|V|``), a number or a CellVolumeRate."""
    if not isinstance(conservative, bool):
        raise TypeError(f"conservative: expected a bool, got {type(conservative).__name__}")
    if isinstance(rate, CellVolumeRate):
        lam = rate.rate_conservative if conservative else rate.rate
        if not math.isfinite(lam):
            which = "rate_conservative" if conservative else "rate"
            raise ValueError(f"rate: the CellVolumeRate's {which} is {lam}, no finite slope")
        return _check_rate(lam, V)
    if conservative:
        raise ValueError("conservative: needs a CellVolumeRate (a number has no conservative end)")
    return _check_rate(rate, V)


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
        Non-integer or < 1 ``d``/``m``; ``r <= 0``; ``eps <= 0``; a log-count beyond float64
        (above 1.8e308 nats), refused instead of returned as ``inf``.

    Examples
    --------
    >>> bool(round(theorem45_log_count(2, 3, 1.0, 0.5), 12) == round(6 * np.log(5.0), 12))
    True
    """
    d = check_positive_int(d, "d")
    m = check_positive_int(m, "m")
    r = check_positive(r, "r")
    eps = _check_eps(eps)
    # in logs: r / eps may exceed 1.8e308; d m times its log may too, and is refused then
    return _log_count(d * m, log1p_ratio(r, eps, 2.0), "d, m, r and eps", "d m log(1 + 2r/eps)")
