"""Minimum-volume enclosing ellipsoid (MVEE) solvers: Todd-Yildirim with drop steps, and cvxpy.

Both return ``(center, A)`` with ``A`` scaled so that the farthest point lies exactly on the
boundary of ``{x : (x - c)^T A (x - c) <= 1}``; :class:`embgeom.supports.Ellipsoid` calls them.

References
----------
M. J. Todd and E. A. Yildirim, "On Khachiyan's algorithm for the computation of minimum-volume
enclosing ellipsoids", Discrete Applied Mathematics 155 (2007).
P. Kumar and E. A. Yildirim, "Minimum-volume enclosing ellipsoids and core sets", J. Optim.
Theory Appl. 126 (2005).
"""

from __future__ import annotations

import numpy as np

from ._base import cvxpy_solve, import_cvxpy

__all__ = ["kumar_yildirim_init", "mvee_fast", "mvee_cvxpy"]


def kumar_yildirim_init(Y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices of the Kumar-Yildirim initial core set (at most ``2 d`` points).

    For ``d`` directions, each orthogonal to the span of the previous extreme differences, keep
    the points of largest and smallest projection (Kumar & Yildirim 2005, Algorithm 3.1).
    """
    n, d = Y.shape
    idx = []
    basis = np.zeros((0, d))
    for _ in range(d):
        b = rng.standard_normal(d)
        if basis.shape[0]:
            b -= basis.T @ (basis @ b)
        nb = np.linalg.norm(b)
        if nb == 0:
            break
        proj = Y @ (b / nb)
        i, j = int(np.argmax(proj)), int(np.argmin(proj))
        idx += [i, j]
        v = Y[i] - Y[j]
        if basis.shape[0]:
            v -= basis.T @ (basis @ v)
        nv = np.linalg.norm(v)
        if nv > 1e-12 * (np.linalg.norm(Y[i]) + np.linalg.norm(Y[j]) + 1e-300):
            basis = np.vstack([basis, v / nv])
    return np.unique(np.asarray(idx, dtype=np.int64))


def mvee_fast(X: np.ndarray, tol: float = 1e-7, max_iter: int = 1_000_000, seed: int = 0,
               progress: bool = False):
    """Minimum-volume enclosing ellipsoid by the Todd-Yildirim algorithm with drop steps.

    Works on the lifted points ``q_i = (x_i - mean, 1)`` in ``R^m``, ``m = d + 1``, and the dual
    ``max_u log det M(u)``, ``M(u) = sum_i u_i q_i q_i^T`` over the simplex, whose gradient is the
    vector of Mahalanobis norms ``omega_i = q_i^T M(u)^{-1} q_i``. Each step moves weight to the
    point of largest ``omega`` (increase) or from the active point of smallest ``omega``
    (decrease, possibly dropping it) with the exact line search
    ``lambda = (omega_j - m) / (m (omega_j - 1))``; ``M^{-1}`` and ``omega`` follow by
    Sherman-Morrison rank-one updates. Steps are taken in batches: ``omega``'s rank-one updates
    need ``Q M^{-1} q_j`` for the stepped points, computed for a batch of candidates at once (one
    GEMM instead of a GEMV per step) and kept current by rank-one BLAS updates, so the exact
    sequence of line searches is unchanged; a batch ends when its best candidate violates the
    optimality conditions by less than half of the worst point overall.

    Stops when ``max_i omega_i <= m (1 + tol)`` and ``min_{u_i > 0} omega_i >= m (1 - tol)``
    (``tol``-approximate optimality and complementarity, Todd & Yildirim 2007); ``omega`` is
    recomputed from scratch before the stop is accepted.

    Initialisation: the Kumar-Yildirim core set (Kumar & Yildirim 2005).

    Returns ``(center, A, eps, n_iter)`` with ``A`` already scaled so that the largest
    ``(x - c)^T A (x - c)`` over the points is exactly 1.
    """
    from scipy.linalg.blas import dger

    n, d = X.shape
    m = d + 1
    shift = X.mean(axis=0)
    Y = X - shift
    Q = np.empty((n, m))
    Q[:, :d] = Y
    Q[:, d] = 1.0
    u = np.zeros(n)
    core = kumar_yildirim_init(Y, np.random.default_rng(seed))
    u[core] = 1.0 / core.size

    def refresh(u):
        act = np.flatnonzero(u > 0)
        M = Q[act].T @ (u[act, None] * Q[act])
        Minv = np.linalg.inv(M)
        Minv = 0.5 * (Minv + Minv.T)
        om = np.einsum("ij,ij->i", Q @ Minv, Q)
        return Minv, om

    try:
        Minv, om = refresh(u)
    except np.linalg.LinAlgError:
        u[:] = 1.0 / n
        Minv, om = refresh(u)
    k = 1 if m <= 64 else 32
    steps = 0
    batches = 0
    fresh = True
    eps = np.inf
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=None, desc="ellipsoid (Todd-Yildirim)", unit="step", leave=False)
    while steps < max_iter:
        active = u > 0
        v_up = om / m - 1.0
        v_dn = np.where(active, 1.0 - om / m, -np.inf)
        eps = max(float(v_up.max()), float(v_dn.max()))
        if eps <= tol:
            if fresh:
                break
            Minv, om = refresh(u)
            fresh = True
            continue
        fresh = False
        kk = min(k, n)
        up = np.argpartition(-v_up, kk - 1)[:kk] if kk < n else np.arange(n)
        act_idx = np.flatnonzero(active)
        kd = min(max(k // 2, 1), act_idx.size)
        dn = act_idx[np.argpartition(-v_dn[act_idx], kd - 1)[:kd]] if kd < act_idx.size else act_idx
        B = np.unique(np.concatenate([up, dn]))
        G = np.asfortranarray(Minv @ Q[B].T)  # (m, b): M^{-1} q_B, stored scaled by 1/s
        V = np.asfortranarray(Q @ G)  # (n, b): Q M^{-1} q_B, stored scaled by 1/s
        s = 1.0
        used, coefs = [], []
        scale = 1.0
        for _ in range(2 * B.size):
            omB = om[B]
            cu = omB / m - 1.0
            cd = np.where(u[B] > 0, 1.0 - omB / m, -np.inf)
            lu, ld = int(np.argmax(cu)), int(np.argmax(cd))
            lcol, viol = (lu, cu[lu]) if cu[lu] >= cd[ld] else (ld, cd[ld])
            worst = max(float(om.max()) / m - 1.0, 1.0 - float(om[u > 0].min()) / m)
            if viol <= tol or viol < 0.5 * worst:
                break
            j = int(B[lcol])
            w = om[j]
            lam = (w - m) / (m * (w - 1.0))
            if lam < 0:
                lam = max(lam, -u[j] / (1.0 - u[j]))  # drop step: u_j reaches 0
            den = (1.0 - lam) + lam * w
            vj = V[:, lcol] * s
            row = V[B, lcol].copy()
            gj = G[:, lcol] * s
            om = (om - (lam / den) * vj * vj) / (1.0 - lam)
            a = -(lam / den) * s
            V = dger(a, V[:, lcol].copy(), row, a=V, overwrite_a=1)
            G = dger(a, G[:, lcol].copy(), row, a=G, overwrite_a=1)
            s /= 1.0 - lam
            # M^{-1}_t = (M^{-1}_{t-1} - (lam/den) g g^T) / (1 - lam), accumulated in product form
            coefs = [c / (1.0 - lam) for c in coefs]
            coefs.append(lam / den / (1.0 - lam))
            used.append(gj)
            scale /= 1.0 - lam
            u *= 1.0 - lam
            u[j] += lam
            if u[j] < 0:
                u[j] = 0.0
            steps += 1
        if used:
            Gu = np.array(used).T
            Minv = scale * Minv - (Gu * np.asarray(coefs)) @ Gu.T
            Minv = 0.5 * (Minv + Minv.T)
        batches += 1
        if bar is not None:
            bar.update(len(used))
            bar.set_postfix(eps=f"{eps:.2e}")
        if batches % (200 if k == 1 else 25) == 0:  # refresh against drift
            u = np.clip(u, 0, None)
            u /= u.sum()
            Minv, om = refresh(u)
            fresh = True
    if bar is not None:
        bar.close()
    c = Y.T @ u
    Sig = (Y.T * u) @ Y - np.outer(c, c)
    A = np.linalg.inv(Sig) / d
    A = 0.5 * (A + A.T)
    D = Y - c
    A /= float(np.einsum("ij,ij->i", D @ A, D).max())
    return c + shift, A, float(eps), steps


def mvee_cvxpy(X: np.ndarray):
    """MVEE by cvxpy: maximise ``log det B`` s.t. ``|B x_i + b| <= 1``; ``A = B^2``, ``c = -B^{-1} b``."""
    cp = import_cvxpy()
    n, d = X.shape
    shift = X.mean(axis=0)
    scale = float(np.abs(X - shift).max())
    Y = (X - shift) / scale
    B = cp.Variable((d, d), PSD=True)
    b = cp.Variable(d)
    prob = cp.Problem(cp.Maximize(cp.log_det(B)), [cp.norm(Y @ B + b[None, :], 2, axis=1) <= 1])
    solver = cvxpy_solve(prob, "Ellipsoid")
    Bv = np.asarray(B.value, dtype=np.float64)
    Bv = 0.5 * (Bv + Bv.T)
    c = -np.linalg.solve(Bv, np.asarray(b.value, dtype=np.float64))
    A = (Bv @ Bv) / scale**2
    center = c * scale + shift
    D = X - center
    A /= float(np.einsum("ij,ij->i", D @ A, D).max())
    return center, A, solver

