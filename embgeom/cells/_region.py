"""Where ``h`` may lie, at unit scale, and the one cutting-plane LP of the cells layer.

:func:`_region` turns a support into a box of linear constraints (or the free space of a
cone) in coordinates where the box and the rows are at unit scale (powers of two, exact).
:func:`max_margin_lp` is the only linear program the library builds on cells: the exact scan
(:mod:`embgeom.cells._scan`), the Chebyshev centre (:func:`_chebyshev_center`) and the
emptiness check of a working-set cone (:func:`cone_is_empty`, used by the rare-event
estimator) are all ``maximise s subject to A x + w s <= r``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._scaling import nearest_power_of_two_exponent

__all__ = ["max_margin_lp", "cone_is_empty"]


def max_margin_lp(A: np.ndarray, rhs: np.ndarray, weights, bounds, *, s_max: float | None = None,
                  time_limit: float | None = None):
    """``maximise s subject to A x + weights * s <= rhs``, ``x`` within ``bounds`` (HiGHS).

    Parameters
    ----------
    A : numpy.ndarray of float64, shape (k, n)
    rhs : numpy.ndarray of float64, shape (k,)
    weights : float or numpy.ndarray of float64, shape (k,)
        The coefficient of the margin ``s`` in each row (1 for a plain margin, ``|a_i|`` for
        the radius of an inscribed ball).
    bounds : sequence of n pairs (lo, hi), None for unbounded
    s_max : float, optional
        Upper bound on ``s`` (keeps a homogeneous problem bounded).
    time_limit : float, optional
        Seconds for HiGHS.

    Returns
    -------
    (ok, x, s)
        ``ok`` False when HiGHS did not solve it (time limit, numerical trouble); then ``x`` and
        ``s`` are None. ``x`` float64 (n,), ``s`` float.
    """
    from scipy.optimize import linprog

    k, n = A.shape
    Aub = np.empty((k, n + 1))
    Aub[:, :n] = A
    Aub[:, n] = weights
    cost = np.zeros(n + 1)
    cost[-1] = -1.0
    opts = {} if time_limit is None else {"time_limit": float(time_limit)}
    res = linprog(cost, A_ub=Aub, b_ub=rhs, bounds=list(bounds) + [(None, s_max)],
                  method="highs", options=opts)
    if res.status != 0:
        return False, None, None
    return True, res.x[:n], float(-res.fun)


def cone_is_empty(A: np.ndarray, tol: float = 1e-9) -> bool:
    """Whether the cone ``{x : A x >= 0}`` has an empty interior (one :func:`max_margin_lp`).

    ``max tau`` subject to ``A x >= tau`` (unit rows), ``-1 <= x_i <= 1``, ``tau <= 1``; the
    interior is empty iff ``tau* <= tol``. The cone of a subset of a cell's constraints contains
    the cell, so an empty subset cone proves the cell empty.

    Parameters
    ----------
    A : numpy.ndarray of float64, shape (M, k)
        Unit constraint rows.
    tol : float, default 1e-9

    Returns
    -------
    bool
    """
    M, k = A.shape
    if M == 0:
        return False
    ok, _, s = max_margin_lp(-A, np.zeros(M), 1.0, [(-1.0, 1.0)] * k, s_max=1.0)
    return bool(ok and s <= tol)


@dataclass
class _Region:
    """Where ``h`` may lie, in region coordinates ``y`` (``h = y @ R`` for a rotated box)."""

    Wr: np.ndarray  # float64 (V, d): rows in region coordinates
    c: np.ndarray | None  # float64 (V,) bias, or None
    lb: np.ndarray  # float64 (d,)
    ub: np.ndarray  # float64 (d,)
    homog: bool  # free space with a bias: homogenising variable tau in [0, 1]
    R: np.ndarray | None  # rotation (rows = box axes) or None
    name: str
    directions: bool  # witnesses are directions of a cone (bias ignored), not points
    scale_exp: int = 0  # region coordinates are true coordinates / 2^scale_exp
    w_exp: int = 0  # Wr and c are the true rows and bias / 2^w_exp (the logits' unit scale)


def _unit_rows(region: "_Region") -> "_Region":
    """The region with its rows and bias divided by the power of two nearest ``max_s |w_s|``.

    Dividing every logit ``w_s . h + b_s`` by the same positive number changes no cell, no
    argmax and no LP's feasibility, so every LP of the library (the scan, the Chebyshev centre)
    sees rows of norm about 1 whatever the scale of ``W``: HiGHS reads coefficients near 1e30 as
    a model error, and its tolerances are absolute. Exact (a power of two), so the answers are those of the
    unscaled problem.
    """
    norms = np.linalg.norm(region.Wr, axis=1)
    j = nearest_power_of_two_exponent(float(norms.max()) if norms.size else 0.0)
    if j == 0:
        return region
    region.Wr = np.ldexp(region.Wr, -j)
    region.c = None if region.c is None else np.ldexp(region.c, -j)
    region.w_exp = j
    return region


def _scaled_box(lb: np.ndarray, ub: np.ndarray, b64: np.ndarray | None):
    """The box and the bias divided by the power of two nearest the box's size.

    ``h = 2^k u`` turns ``(w_t - w_s) . h + (b_t - b_s) >= r |w_t - w_s|`` into
    ``(w_t - w_s) . u + (b_t - b_s) / 2^k >= (r / 2^k) |w_t - w_s|``: the same cells and the
    same answers, with the LPs, the witnesses and the tolerances at unit scale (a box of
    half-width 1e-160 or 1e160 would otherwise fall below HiGHS's absolute tolerances or
    overflow the float32 witness check). Exact (a power of two). Returns ``(lb, ub, c, k)``.
    """
    k = nearest_power_of_two_exponent(float(max(np.abs(lb).max(), np.abs(ub).max())))
    c = None if b64 is None else np.ldexp(b64, -k)
    return np.ldexp(lb, -k), np.ldexp(ub, -k), c, k


def _region(dec, support, W64: np.ndarray, b64: np.ndarray | None, *, radius: float = 1.0,
            cones: bool = False) -> _Region:
    """Where the exact scan looks: the support answers through ``lp_region()`` (a box of linear
    constraints) or ``star_about_origin()`` (a bias-free decoder's cells are cones). The rows
    and bias come back at unit scale (:func:`_unit_rows`).

    ``cones=True`` (the scan, which asks only whether a cell meets the support's interior): a
    bias-free decoder and a box with the origin strictly inside give the free space's region,
    since a cone with an interior meets every neighbourhood of its apex. The box's own LP
    (``[-1e-3, 1e3]^4``: sides 1e6 apart) left cells that are empty in free space
    "undecided"; the Chebyshev centre needs the box itself and keeps it."""
    return _unit_rows(_region_raw(dec, support, W64, b64, radius=radius, cones=cones))


def _region_raw(dec, support, W64: np.ndarray, b64: np.ndarray | None, *,
                radius: float = 1.0, cones: bool = False) -> _Region:
    d = W64.shape[1]
    ones = np.ones(d)
    if support is None:
        if radius == 1.0:  # the scan's free space: unit box (and tau for a bias), nothing to scale
            return _Region(W64, b64, -ones, ones, b64 is not None, None, "none", True)
        lb, ub, c, k = _scaled_box(-radius * ones, radius * ones, b64)
        return _Region(W64, c, lb, ub, b64 is not None, None, "none", True, k)
    if not all(hasattr(type(support), m) for m in ("lp_region", "star_about_origin")):
        raise TypeError(
            "support: expected an embgeom.supports.Support (with .dim, .lp_region(), "
            f".star_about_origin()), got {type(support).__name__}"
        )
    if int(support.dim) != d:
        raise ValueError(f"support: has dimension {support.dim}, the decoder's hidden size is d={d}")
    label = type(support).__name__
    box = support.lp_region()
    if box is not None:
        R = box.rotation
        lb = np.asarray(box.lower, dtype=np.float64)
        ub = np.asarray(box.upper, dtype=np.float64)
        if cones and b64 is None and np.all(lb < 0) and np.all(ub > 0):
            return _Region(W64, None, -ones, ones, False, None, label, True)
        Wr = W64 if R is None else W64 @ np.asarray(R, dtype=np.float64).T
        lb, ub, c, k = _scaled_box(lb, ub, b64)
        return _Region(np.ascontiguousarray(Wr), c, lb, ub, False, R, label, False, k)
    if b64 is None and support.star_about_origin():
        # cells are cones with apex 0 and the support meets every ray from an interior origin:
        # a cell meets the support's interior iff it has an interior at all
        return _Region(W64, None, -radius * ones, radius * ones, False, None, label, True)
    raise TypeError(
        f"support: the exact scan handles no support, a support with linear constraints (Box), or "
        f"(bias None) a support star-shaped about an interior origin (origin-centred ball or "
        f"ellipsoid, RMSNorm final-norm shell without bias); got {label}"
        + (" with a bias" if b64 is not None else "")
    )


def _check_bias_at_scale(c: np.ndarray, region: _Region, name: str = "support", limit: float = 3e38,
                         floor: float = float(np.finfo(np.float32).tiny)) -> None:
    """Refuse a box whose size is out of all proportion to the bias (beyond float32's range).

    In the box's unit coordinates the bias is ``b / 2^k``; the witnesses are checked by the
    float32 decoder, which cannot hold it when ``|b| / 2^k`` passes 3.4e38 (a box far smaller
    than the bias: ``W h`` is below the bias's own rounding everywhere in it) or when nonzero
    entries fall below 1.2e-38 (a box far larger: the bias is below the rounding of ``W h``).
    """
    a = np.abs(c)
    nz = a[a > 0]
    if nz.size and (float(nz.max()) >= limit or float(nz.min()) < floor):
        raise ValueError(
            f"{name}: the box (size about 2^{region.scale_exp}) is out of proportion to the bias "
            f"(|b| from {float(nz.min()) * 2.0**region.scale_exp:.3g} to {float(nz.max()) * 2.0**region.scale_exp:.3g}): "
            "in its unit coordinates the bias leaves the range where W h and b can be compared "
            "(float32 for the witnesses, HiGHS's 1e15 for the LPs); use a box closer to the "
            "scale of b / |w|"
        )


def _chebyshev_center(dec, t, support, *, radius: float, max_iter: int):
    """The Chebyshev centre of cell t in the box (cutting planes over :func:`max_margin_lp`)."""

    V, d = dec.n_tokens, dec.dim
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
        raise TypeError(f"t: expected an integer token id, got {type(t).__name__}")
    t = int(t)
    if not 0 <= t < V:
        raise ValueError(f"t: expected a token id in [0, {V}), got {t}")
    W64 = dec.W_.astype(np.float64)
    b64 = None if dec.bias_ is None else dec.bias_.astype(np.float64)
    region = _region(dec, support, W64, b64, radius=radius)
    if support is not None and region.directions:
        raise TypeError("support: chebyshev_center handles None (a box of half-width radius) or a "
                        "support with linear constraints (Box)")
    Wr, c = region.Wr, region.c
    if c is not None:  # HiGHS reads |x| >= 1e20 as infinite; a bias of 1e15 box-widths is beyond it
        _check_bias_at_scale(c, region, "support" if support is not None else "radius", limit=1e15, floor=0.0)
    wt = Wr[t]
    ct = 0.0 if c is None else c[t]
    diff = wt - Wr
    norms = np.linalg.norm(diff, axis=1)
    cdiff = np.zeros(V) if c is None else ct - c
    active = norms > 0  # the other rows equal to t's are no half-space: handled here
    twin = ~active
    twin[t] = False
    if np.any(twin & (cdiff < 0)):
        # a row equal to t's with a larger bias wins everywhere: no r satisfies 0 >= r 0 + cdiff
        centre = 0.5 * (region.lb + region.ub)
        h = centre if region.R is None else centre @ region.R
        return np.ldexp(h, region.scale_exp), float("-inf")
    lower = np.flatnonzero(twin[:t] & (cdiff[:t] == 0))
    if lower.size:
        # an exact duplicate of a lower id: ties go to the lowest id, so E_t is empty; it ties
        # (depth 0) at the deepest point of the lowest twin's cell
        h, _ = _chebyshev_center(dec, int(lower[0]), support, radius=radius, max_iter=max_iter)
        return h, 0.0
    # start from the top competitors at the centre of the box along w_t - mean
    centre = 0.5 * (region.lb + region.ub)
    y0 = centre + 0.5 * (wt - Wr.mean(axis=0))
    slack0 = diff @ y0 + cdiff
    cand = np.flatnonzero(active)
    S = cand[np.argsort(slack0[cand] / norms[cand])[: min(cand.size, 2 * d + 16)]]
    # the ball inside the box: y_i + r <= ub_i, -y_i + r <= -lb_i
    Abox = np.vstack([np.eye(d), -np.eye(d)])
    bbox = np.concatenate([region.ub, -region.lb])
    for _ in range(max_iter):
        ok, y, r = max_margin_lp(np.vstack([-diff[S], Abox]), np.concatenate([cdiff[S], bbox]),
                                 np.concatenate([norms[S], np.ones(2 * d)]), [(None, None)] * d)
        if not ok:
            raise ValueError("chebyshev_center: the LP failed (HiGHS did not solve it)")
        viol = diff @ y + cdiff - r * norms
        viol[~active] = np.inf
        scale = 1e-9 * (1.0 + np.abs(y).max() * norms.max())
        bad = np.flatnonzero(viol < -scale)
        bad = np.setdiff1d(bad[np.argsort(viol[bad])][: max(d // 2, 32)], S)
        if bad.size == 0:
            h = y if region.R is None else y @ region.R
            k = region.scale_exp  # back to true coordinates (exact)
            return np.ldexp(h, k), math.ldexp(float(r), k) + 0.0  # + 0.0: no -0.0 depth
        S = np.union1d(S, bad)
    raise ValueError(f"chebyshev_center: no convergence in {max_iter} cutting-plane iterations")
