"""numba kernels behind :mod:`embgeom._rare_event` (exact elliptical slice sampling, linear constraints).

One chain of the sampler sits at a point ``x`` of a polyhedron ``{x : a_s . x + c_s >= 0}`` and
draws ``nu ~ N(0, I)``. On the ellipse ``x(theta) = x cos(theta) + nu sin(theta)`` constraint ``s``
reads ``p_s cos(theta) + q_s sin(theta) + c_s >= 0`` with ``p_s = a_s . x`` and ``q_s = a_s . nu``
(two matrix products computed by the caller). Writing ``p_s cos + q_s sin = R_s cos(theta - phi_s)``
(``R_s = sqrt(p_s^2 + q_s^2)``, ``phi_s = atan2(q_s, p_s)``), the constraint fails exactly on the
open arc of centre ``phi_s + pi`` and half-width ``arccos(c_s / R_s)`` when ``R_s > c_s >= 0``,
and never otherwise. The feasible set of the ellipse is the circle minus the union of those arcs;
the kernel draws ``theta`` uniformly on it: the exact linear-constraint elliptical slice sampler
of Gessner, Kanjilal and Hennig ("Integrals over Gaussians under linear domain constraints",
AISTATS 2020, Sec. 3), which leaves ``N(0, I)`` restricted to the polyhedron invariant and needs
no rejection step.

``theta = 0`` (the current point) is feasible, so in exact arithmetic no arc contains 0 and every
arc lies inside ``(0, 2 pi)``; an arc that does contain 0 through round-off is clipped to
``[0, 2 pi]`` (the chain then cannot stay put, but every other feasible angle keeps its weight).
If round-off leaves no feasible angle at all the chain stays where it is (``theta = 0``).
"""

from __future__ import annotations

import math

import numpy as np

from ._numba import njit

__all__ = ["ess_angles", "fold_smallest_margins", "fold_smallest_margins_t", "hmc_trajectories",
           "scan_smallest_margins"]

_TWO_PI = 2.0 * math.pi


@njit("float64[::1](float64[:, ::1], float64[:, ::1], float64[::1], float64[::1])", nogil=True)
def ess_angles(P, Q, shift, u):
    """One exact elliptical-slice angle per chain under linear constraints.

    For chain ``i`` the feasible set is ``F_i = {theta in [0, 2 pi) : P[i, s] cos(theta) +
    Q[i, s] sin(theta) + shift[s] >= 0 for all s}``; the kernel returns the point of ``F_i`` at
    arc-length ``u[i] |F_i|`` counted from 0 (so ``u`` uniform on [0, 1) gives ``theta`` uniform
    on ``F_i``).

    Parameters
    ----------
    P : float64 (N, M), C-contiguous
        ``a_s . x_i``: constraint values at the current points.
    Q : float64 (N, M), C-contiguous
        ``a_s . nu_i``: constraint values at the auxiliary Gaussian draws.
    shift : float64 (M,)
        ``c_s >= 0`` (``inf`` switches a constraint off).
    u : float64 (N,)
        Uniform numbers in [0, 1).

    Returns
    -------
    theta : float64 (N,)
        Angles in [0, 2 pi); 0 when round-off left no feasible angle.
    """
    N, M = P.shape
    theta = np.zeros(N)
    for i in range(N):
        lo = np.empty(M)
        hi = np.empty(M)
        k = 0
        for s in range(M):
            c = shift[s]
            p = P[i, s]
            q = Q[i, s]
            R = math.sqrt(p * p + q * q)
            if not R > c:
                continue  # the whole ellipse satisfies this constraint (also c = inf)
            half = math.acos(c / R)
            centre = math.atan2(q, p) + math.pi  # in [0, 2 pi]
            a = centre - half
            b = centre + half
            if a < 0.0:
                a = 0.0
            if b > _TWO_PI:
                b = _TWO_PI
            if b > a:
                lo[k] = a
                hi[k] = b
                k += 1
        if k == 0:
            theta[i] = u[i] * _TWO_PI
            continue
        order = np.argsort(lo[:k])
        # gaps between the merged arcs: first pass measures, second pass locates
        total = 0.0
        cur = 0.0
        for j in range(k):
            s = order[j]
            if lo[s] > cur:
                total += lo[s] - cur
            if hi[s] > cur:
                cur = hi[s]
        total += _TWO_PI - cur
        if not total > 0.0:
            theta[i] = 0.0
            continue
        target = u[i] * total
        cur = 0.0
        found = False
        for j in range(k):
            s = order[j]
            if lo[s] > cur:
                g = lo[s] - cur
                if target < g:
                    theta[i] = cur + target
                    found = True
                    break
                target -= g
            if hi[s] > cur:
                cur = hi[s]
        if not found:
            th = cur + target
            theta[i] = th if th < _TWO_PI else cur
    return theta


@njit("void(float32[:, ::1], float32[::1], float64[::1], int64, float64[:, ::1], int64[:, ::1])",
      nogil=True)
def fold_smallest_margins(Z, zt, inv_norm, offset, best_val, best_idx):
    """Fold one logits block into the ``k`` smallest normalised margins of each point.

    For point ``i`` and token ``offset + j`` the normalised margin is
    ``(zt[i] - Z[i, j]) * inv_norm[j]``: the signed distance-like value
    ``(w_t - w_s) . y / |G^T (w_t - w_s)|`` of the cell constraint of token ``s = offset + j``
    (``inv_norm[j] == 0`` skips a token: ``t`` itself and exact ties). ``best_val[i]`` is kept
    sorted ascending, ``best_idx[i]`` holds the matching token ids; ties keep the earlier token.

    Parameters
    ----------
    Z : float32 (nb, vb), C-contiguous
        ``X_block @ WG_block.T`` for tokens ``offset .. offset + vb - 1``.
    zt : float32 (nb,)
        ``X_block @ WG[t]``, computed by the same float32 product.
    inv_norm : float64 (vb,)
        ``1 / |G^T (w_t - w_s)|`` (0 to skip).
    offset : int64
        Token id of column 0.
    best_val : float64 (nb, k), updated in place
        Running ``k`` smallest margins, ascending (start at ``inf``).
    best_idx : int64 (nb, k), updated in place
        Their token ids (start at -1).
    """
    nb, vb = Z.shape
    k = best_val.shape[1]
    for i in range(nb):
        z0 = np.float64(zt[i])
        worst = best_val[i, k - 1]
        for j in range(vb):
            w = inv_norm[j]
            if w == 0.0:
                continue
            m = (z0 - np.float64(Z[i, j])) * w
            if m < worst:
                pos = k - 1
                while pos > 0 and best_val[i, pos - 1] > m:
                    best_val[i, pos] = best_val[i, pos - 1]
                    best_idx[i, pos] = best_idx[i, pos - 1]
                    pos -= 1
                best_val[i, pos] = m
                best_idx[i, pos] = offset + j
                worst = best_val[i, k - 1]


@njit("void(float32[:, ::1], float32[::1], float64[::1], int64, float64[:, ::1], int64[:, ::1])",
      nogil=True)
def fold_smallest_margins_t(ZT, zt, inv_norm, offset, best_val, best_idx):
    """:func:`fold_smallest_margins` on a transposed block: ``ZT = WG_block @ X_block.T``.

    The scan of :class:`embgeom._rare_event._Cone` multiplies a block of rows by the points
    in this orientation (``(vb, k) x (k, nb)``): for a few points it is 2-3 times faster than
    ``X_block @ WG_block.T`` in OpenBLAS (a 4-point product over SmolLM2's 49,152 rows took
    20 ms instead of 51). Same result: for every point the ``k`` smallest normalised margins
    ``(zt[i] - ZT[j, i]) * inv_norm[j]``, ascending, ties keeping the earlier token.

    Parameters
    ----------
    ZT : float32 (vb, nb), C-contiguous
        ``WG_block @ X_block.T`` for tokens ``offset .. offset + vb - 1``.
    zt, inv_norm, offset, best_val, best_idx
        As in :func:`fold_smallest_margins`.
    """
    vb, nb = ZT.shape
    k = best_val.shape[1]
    for j in range(vb):
        w = inv_norm[j]
        if w == 0.0:
            continue
        for i in range(nb):
            m = (np.float64(zt[i]) - np.float64(ZT[j, i])) * w
            if m < best_val[i, k - 1]:
                pos = k - 1
                while pos > 0 and best_val[i, pos - 1] > m:
                    best_val[i, pos] = best_val[i, pos - 1]
                    best_idx[i, pos] = best_idx[i, pos - 1]
                    pos -= 1
                best_val[i, pos] = m
                best_idx[i, pos] = offset + j


@njit("void(float32[:, ::1], float32[:, ::1], float32[::1], float64[::1], float64[:, ::1], "
      "int64[:, ::1])", readonly=(0,), nogil=True, fastmath=True)
def scan_smallest_margins(WG, X, zt, inv_norm, best_val, best_idx):
    """The ``k`` smallest normalised margins of a few points over every row of ``WG``, fused.

    What the blocked product plus :func:`fold_smallest_margins_t` computes, in one pass that
    reads each row once and keeps no logits buffer: for a handful of points the scan is
    memory-bound, and BLAS's small-``n`` products are not (4 points against SmolLM2's 113 MB
    ``W G``: about 10 ms here against 20-50 ms for the blocked products). The dot products
    are float32 sums in any order (``fastmath``), as good a float32 product as BLAS's.

    Parameters
    ----------
    WG : float32 (V, k), C-contiguous (read-only accepted)
        Every row ``G^T w_s``.
    X : float32 (n, k), C-contiguous
        The points.
    zt : float32 (n,)
        ``X @ WG[t]``.
    inv_norm : float64 (V,)
        ``1 / |G^T (w_t - w_s)|`` (0 to skip).
    best_val, best_idx : float64 (n, k), int64 (n, k), updated in place
        As in :func:`fold_smallest_margins` (start at ``inf`` and -1); token ids are row ids.
    """
    V, d = WG.shape
    n = X.shape[0]
    k = best_val.shape[1]
    for j in range(V):
        w = inv_norm[j]
        if w == 0.0:
            continue
        for i in range(n):
            acc = np.float32(0.0)
            for c in range(d):
                acc += WG[j, c] * X[i, c]
            m = (np.float64(zt[i]) - np.float64(acc)) * w
            if m < best_val[i, k - 1]:
                pos = k - 1
                while pos > 0 and best_val[i, pos - 1] > m:
                    best_val[i, pos] = best_val[i, pos - 1]
                    best_idx[i, pos] = best_idx[i, pos - 1]
                    pos -= 1
                best_val[i, pos] = m
                best_idx[i, pos] = j


@njit("float64(float64, float64, float64, float64)", inline="always")
def _crossing(p, q, c, tmin):
    """The time ``t`` in ``(1e-12, tmin)`` at which ``p cos t + q sin t + c`` first falls to 0
    from inside, or -1 (:func:`hmc_trajectories`). The sqrt-free tests skip only constraints
    that the exact tests (``R > c`` and the bound ``(p + c) / R``) skip too: their margin of
    1e-9 is far above the round-off of ``R``, so the kernel finds the same walls as one that
    took every square root."""
    R2 = p * p + q * q
    if c * c >= R2 * (1.0 + 1e-9):  # R <= c: never crossed (c = inf: switched off)
        return -1.0
    pc = p + c
    if pc > 0.0 and pc * pc >= (tmin * tmin) * R2 * (1.0 + 1e-9):  # not before tmin
        return -1.0
    R = math.sqrt(R2)
    if not R > c:
        return -1.0
    # |d/dt (a_s . x(t))| <= R: no crossing before (p + c) / R
    if pc >= tmin * R:
        return -1.0
    t = math.atan2(q, p) + math.acos(-c / R)
    if t < 0.0:
        t += _TWO_PI
    elif t >= _TWO_PI:
        t -= _TWO_PI
    if t > 1e-12 and t < tmin:
        return t
    return -1.0


@njit("Tuple((float64, int64))(float64[::1], float64[::1], float64[::1], float64)", inline="always")
def _first_crossing(Pi, Qi, shift, left):
    tmin = left
    jmin = -1
    for s in range(Pi.shape[0]):
        t = _crossing(Pi[s], Qi[s], shift[s], tmin)
        if t >= 0.0:
            tmin = t
            jmin = s
    return tmin, jmin


@njit("Tuple((float64, int64))(float64[::1], float64[::1], float64[::1], float64, float64, "
      "float64, float64[:], float64)", inline="always")
def _rotate_reflect_cross(Pi, Qi, shift, ct, st, refl, gram_j, left):
    """Rotate the constraint values by the angle of ``(ct, st)``, reflect the velocity values
    (``q_s -= refl (a_s . a_j)``) and find the next wall within ``left``, in one pass."""
    tmin = left
    jmin = -1
    for s in range(Pi.shape[0]):
        p = Pi[s]
        q = Qi[s]
        pn = p * ct + q * st
        qn = q * ct - p * st - refl * gram_j[s]
        Pi[s] = pn
        Qi[s] = qn
        t = _crossing(pn, qn, shift[s], tmin)
        if t >= 0.0:
            tmin = t
            jmin = s
    return tmin, jmin


@njit("int64[::1](float64[:, ::1], float64[:, ::1], float64[:, ::1], float64[:, ::1], "
      "float64[:, ::1], float64[:, :], float64[::1], float64, int64)", nogil=True)
def hmc_trajectories(X, Vel, P, Q, A, gram, shift, duration, max_bounces):
    """Exact Hamiltonian trajectories of ``N(0, I)`` restricted to a polyhedron, with reflections.

    The Hamiltonian ``|x|^2 / 2 + |v|^2 / 2`` moves a point along ``x(t) = x cos t + v sin t``
    (velocity ``v(t) = -x sin t + v cos t``) until it meets a wall ``a_s . x + c_s = 0``; there
    the velocity is reflected, ``v <- v - 2 (a_s . v) a_s`` (``|a_s| = 1``), and the flow goes
    on until ``duration`` is spent (Pakman and Paninski, "Exact Hamiltonian Monte Carlo for
    truncated multivariate Gaussians", JCGS 23 (2014), Sec. 2). Constraint ``s`` along the
    current ellipse is ``R_s cos(t - phi_s) + c_s`` with ``R_s cos(phi_s) = p_s = a_s . x`` and
    ``R_s sin(phi_s) = q_s = a_s . v``; it is next crossed from inside at
    ``t = phi_s + arccos(-c_s / R_s)`` (mod 2 pi), and never when ``R_s <= c_s``. The constraint
    values are rotated and reflected with the trajectory, reflections through the Gram matrix
    (``q_s <- q_s - 2 q_j (a_s . a_j)``), so no matrix product is needed inside the loop.
    Since ``|d/dt (p_s cos t + q_s sin t)| <= R_s``, constraint ``s`` cannot be crossed before
    ``(p_s + c_s) / R_s``; constraints whose bound exceeds the earliest crossing found so far
    skip the trigonometry.

    Parameters
    ----------
    X, Vel : float64 (N, k), updated in place
        Positions (feasible) and initial velocities (``N(0, I)`` draws); on return the end
        points and end velocities.
    P, Q : float64 (N, M), updated in place
        ``A X^T`` and ``A Vel^T`` transposed (constraint values of positions and velocities).
    A : float64 (M, k)
        Unit-norm constraint rows.
    gram : float64 (M, M)
        ``A A^T``.
    shift : float64 (M,)
        ``c_s >= 0`` (``inf`` switches a constraint off).
    duration : float
        Trajectory length ``T`` (``pi / 2`` turns an unconstrained Gaussian into a fresh draw).
    max_bounces : int
        Cap on reflections per trajectory. A trajectory that would need more is *rejected*:
        the chain stays at its start (``X`` and ``P`` restored; ``Vel`` and ``Q`` are left
        where the trajectory stopped). Stopping at the cap instead is no exact move (in a
        cone a thousand times thinner than wide every trajectory hit it, and the chains
        stopped at state-dependent times: 4 nats low on a 16-d cell of an ellipsoid of axis
        ratio 1e7, 16 nats on a 2-d wedge).
        Rejecting is exact: the reversed trajectory meets the same walls, so the number of
        reflections, and with it the rejection, is symmetric (a Metropolis step with an
        acceptance of 0 or 1), and ``N(0, I)`` on the polyhedron stays invariant.

    Returns
    -------
    bounces : int64 (N,)
        Reflections per chain; ``max_bounces`` marks a rejected trajectory.
    """
    N, M = P.shape
    k = X.shape[1]
    bounces = np.zeros(N, dtype=np.int64)
    x0 = np.empty(k)
    p0 = np.empty(M)
    for i in range(N):
        left = duration
        for j in range(k):
            x0[j] = X[i, j]
        for s in range(M):
            p0[s] = P[i, s]
        Pi, Qi = P[i], Q[i]
        tmin, jmin = _first_crossing(Pi, Qi, shift, left)
        while True:
            ct = math.cos(tmin)
            st = math.sin(tmin)
            for j in range(k):
                x = X[i, j]
                v = Vel[i, j]
                X[i, j] = x * ct + v * st
                Vel[i, j] = v * ct - x * st
            left -= tmin
            if jmin < 0:  # no wall before the end: rotate to it
                for s in range(M):
                    p = Pi[s]
                    q = Qi[s]
                    Pi[s] = p * ct + q * st
                    Qi[s] = q * ct - p * st
                break
            # the wall's velocity value at the hit, reflected when it points outwards
            qj = Qi[jmin] * ct - Pi[jmin] * st
            refl = 2.0 * qj if qj < 0.0 else 0.0
            if refl != 0.0:
                for j in range(k):
                    Vel[i, j] -= refl * A[jmin, j]
            bounces[i] += 1
            if bounces[i] >= max_bounces and left > 0.0:
                # rejected: back to the start (an exact move, see max_bounces)
                for j in range(k):
                    X[i, j] = x0[j]
                for s in range(M):
                    Pi[s] = p0[s]
                break
            # one pass: rotate to the hit, reflect, and look for the next wall
            tmin, jmin = _rotate_reflect_cross(Pi, Qi, shift, ct, st, refl, gram[jmin], left)
            if not left > 0.0:
                break
    return bounces
