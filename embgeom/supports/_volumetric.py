"""Volumetric packing bounds shared by several shapes (a ball's, an ellipsoid's).

Each shape's ``packing_bound_terms(eps)`` builds its dict from these: the ball's bounds are also
the circumscribed-ball terms of the box, the ellipsoid, the cone and the shell; the ellipsoid's are
also the RMSNorm shell's. The derivations are in ``docs/theory.md`` and in
:func:`embgeom.bounds.log_packing_number`'s Notes (V2: disjoint balls of radius eps/2; Vinf:
disjoint cubes of side eps).

References
----------
R. Vershynin, "High-Dimensional Probability" (2018), Prop. 4.2.12 (volumetric packing bounds).
R. Schneider, "Convex Bodies: the Brunn-Minkowski Theory" (2014), Sec. 4.2 (Steiner formula).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from .._special import _log_kappa, log_binomial_row, log_elementary_symmetric, softplus

__all__ = ["ball_terms", "ellipsoid_terms", "ellipsoid_projection_terms",
           "log_enclosing_ellipsoid_ratio", "is_axis_aligned"]


def ball_terms(d: int, r: float, eps: float) -> dict:
    """Rigorous bounds (nats) for a Euclidean ball of radius ``r`` in ``R^d``.

    ``v2_ball = d log(1 + 2r/eps)`` (exact V2); ``vinf_steiner`` the Steiner formula
    ``vol(Q(eps) + B(r)) / eps^d = sum_j C(d,j) kappa_{d-j} (r/eps)^{d-j}`` (exact Vinf).
    """
    # in logs throughout: r / eps overflows for r = 1e30, eps = 1e-300
    log_r_eps = math.log(r) - math.log(eps)
    v2 = d * float(softplus(math.log(2.0) + log_r_eps))
    j = np.arange(d + 1)
    vinf = float(special.logsumexp(log_binomial_row(d) + _log_kappa(d - j) + (d - j) * log_r_eps))
    return {"v2_ball": v2, "vinf_steiner": vinf}


def log_enclosing_ellipsoid_ratio(log_u: np.ndarray, log_c: float) -> float:
    """``min_t sum_i 1/2 log(u_i^2 / t + c / (1 - t))`` over ``t in (0, 1)``.

    With ``u_i = s_i / rho'`` and ``c = (rho / rho')^2`` this is
    ``log vol(E') - log kappa_d - d log rho'`` for the ellipsoid ``E'`` with semi-axes
    ``sqrt(s_i^2 / t + rho^2 / (1 - t))``, which contains ``E + B(rho)`` for every ``t``:
    the support functions satisfy ``|s o u| + rho |u| <= sqrt(sum (s_i^2/t + rho^2/(1-t)) u_i^2)``
    by ``(x + y)^2 <= x^2/t + y^2/(1-t)``. Any ``t`` gives a valid bound; the minimum is searched
    on a logit grid and refined with Brent's method. With all ``u_i = U`` and ``c = 1`` the
    minimum is exactly ``d log(1 + U)`` (Cauchy-Schwarz; the Euclidean ball).
    """
    from scipy import optimize

    two_lu = 2.0 * log_u

    def f(z):
        # t = expit(z): 1/t = 1 + e^-z, 1/(1-t) = 1 + e^z, written with softplus for stability
        return 0.5 * float(np.sum(np.logaddexp(two_lu + softplus(-z), log_c + softplus(z))))

    grid = np.linspace(-40.0, 40.0, 321)
    vals = np.array([f(z) for z in grid])
    i = int(np.argmin(vals))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    res = optimize.minimize_scalar(f, bounds=(lo, hi), method="bounded",
                                   options={"xatol": 1e-10})
    return float(min(vals[i], res.fun))


def ellipsoid_projection_terms(log_s_over_eps: np.ndarray, *, aligned: bool) -> dict:
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
    log_e2 = log_elementary_symmetric(2.0 * log_s_over_eps)
    out["vinf_projections"] = float(special.logsumexp(
        _log_kappa(k) + 0.5 * (log_binomial_row(d) + log_e2)))
    if aligned:
        log_e1 = log_elementary_symmetric(log_s_over_eps)
        out["vinf_projections_aligned"] = float(special.logsumexp(_log_kappa(k) + log_e1))
    return out


def ellipsoid_terms(semi_axes: np.ndarray, eps: float, *, aligned: bool = False) -> dict:
    """Rigorous bounds (nats) for an ellipsoid with the given semi-axes (any orientation;
    ``aligned``: its axes are the model's coordinate axes)."""
    d = semi_axes.shape[0]
    with np.errstate(divide="ignore"):
        log_s = np.log(semi_axes)
    log_eps = math.log(eps)
    # V2: rho = eps/2, scale rho: u = s/rho, c = 1
    v2 = log_enclosing_ellipsoid_ratio(log_s - (log_eps - math.log(2.0)), 0.0)
    # Vinf: Q(eps) inside B(rho'), rho' = sqrt(d) eps / 2; divide by eps^d; scale eps
    vinf = float(_log_kappa(d)) + log_enclosing_ellipsoid_ratio(log_s - log_eps, math.log(0.25 * d))
    out = {"v2_ellipsoid": v2, "vinf_ellipsoid": vinf}
    out.update(ellipsoid_projection_terms(log_s - log_eps, aligned=aligned))
    return out


def is_axis_aligned(axes) -> bool:
    """True when every row of ``axes`` (d, d) is (up to 1e-9) a signed coordinate vector."""
    A = np.abs(np.asarray(axes, dtype=np.float64))
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        return False
    return bool(np.all(np.abs(A.max(axis=1) - 1.0) < 1e-9) and np.all(A.sum(axis=1) < 1 + 1e-9))


def circumball_terms(d: int, r: float, eps: float, suffix: str) -> dict:
    """:func:`ball_terms` of a ball holding the support, keys suffixed (``"_circumball"``...)."""
    if not r > 0:
        return {}
    return {f"{k}{suffix}": v for k, v in ball_terms(d, r, eps).items()}
