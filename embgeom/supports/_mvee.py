"""Minimum-volume enclosing ellipsoid (MVEE) solvers: Todd-Yildirim with drop steps, and cvxpy.

The MVEE is affine-equivariant (the MVEE of ``x T + b`` is the MVEE of ``x`` mapped by the same
map), so :func:`mvee` solves it for the *whitened* points ``z_i = sqrt(N) U_i`` (``U`` from the
thin SVD of the centred points, sample covariance the identity) and maps the result back. In
those coordinates the problem is well conditioned whatever the axis ratio of the data: the
Todd-Yildirim steps and the Sherman-Morrison updates see an almost round cloud (300 points in
d = 30 with axes from 1e-3 to 1e3, rotated: the same number of steps as the isotropic copy), and
the returned ellipsoid is described by its axes and semi-axes, never by an ill-conditioned
``A``. :class:`embgeom.supports.Ellipsoid` calls :func:`mvee`.

The certified gap is a true bound, computed from the final weights ``u`` in any coordinates:
every ellipsoid ``{x : (x - c)^T A (x - c) <= 1}`` holding the points has
``tr(A Sigma(u)) <= sum_i u_i (x_i - c)^T A (x_i - c) <= 1`` for the weighted covariance
``Sigma(u)``, so ``det A <= det(Sigma(u))^{-1} r^{-r}`` (AM-GM) and its log-volume is at least
``log kappa_r + r/2 log r + 1/2 log det Sigma(u)`` (equality at the optimum; Todd 2016, Ch. 2).
The ratio of two volumes is invariant under the affine map, so the gap measured in the whitened
coordinates is the gap in the data's.

References
----------
M. J. Todd and E. A. Yildirim, "On Khachiyan's algorithm for the computation of minimum-volume
enclosing ellipsoids", Discrete Applied Mathematics 155 (2007).
P. Kumar and E. A. Yildirim, "Minimum-volume enclosing ellipsoids and core sets", J. Optim.
Theory Appl. 126 (2005).
M. J. Todd, "Minimum-Volume Ellipsoids: Theory and Algorithms", SIAM (2016), Ch. 2 (duality).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._progress import tqdm_kwargs
from .._special import log_unit_ball_volume
from ._base import cvxpy_solve, import_cvxpy

__all__ = ["MVEEFit", "kumar_yildirim_init", "todd_yildirim", "mvee"]


class MVEEFit(NamedTuple):
    """A minimum-volume enclosing ellipsoid ``{c + v : sum_j ((v . a_j) / s_j)^2 <= 1}``.

    Attributes
    ----------
    center : ndarray of float64, shape (d,)
    axes : ndarray of float64, shape (r, d)
        Orthonormal rows ``a_j`` (the principal axes), ``r`` the affine rank of the points.
    semi_axes : ndarray of float64, shape (r,)
        Descending.
    log_lower : float
        A lower bound (nats) on the r-dimensional log-volume of *every* ellipsoid in the points'
        affine hull that holds them (the dual certificate, see the module docstring); NaN when
        the solver gave no weights.
    eps : float
        Final relative optimality gap of Todd-Yildirim (NaN for cvxpy).
    n_iter : int
    solver : str
    """

    center: np.ndarray
    axes: np.ndarray
    semi_axes: np.ndarray
    log_lower: float
    eps: float
    n_iter: int
    solver: str

    @property
    def log_volume(self) -> float:
        """r-dimensional log-volume (nats)."""
        r = self.semi_axes.size
        return log_unit_ball_volume(r) + float(np.sum(np.log(self.semi_axes)))

    @property
    def gap_nats(self) -> float:
        """``log_volume - log_lower >= log_volume - log vol(MVEE) >= 0`` (nats): a true bound."""
        return max(self.log_volume - self.log_lower, 0.0) if np.isfinite(self.log_lower) else float("nan")


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


def todd_yildirim(Z: np.ndarray, tol: float = 1e-7, max_iter: int = 1_000_000, seed: int = 0,
                  progress: bool = False):
    """Dual weights of the MVEE of the rows of ``Z`` by Todd-Yildirim with drop steps.

    Works on the lifted points ``q_i = (z_i, 1)`` in ``R^m``, ``m = r + 1``, and the dual
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
    recomputed from scratch before the stop is accepted, and once more at the end.

    Initialisation: the Kumar-Yildirim core set (Kumar & Yildirim 2005).

    Parameters
    ----------
    Z : ndarray of float64, shape (N, r)
        Points of full affine rank ``r``, best whitened (centred, covariance about the identity:
        the iteration is affine-invariant in exact arithmetic, and well conditioned there).

    Returns
    -------
    u : ndarray of float64, shape (N,)
        Weights on the simplex.
    eps : float
        Final relative gap (recomputed from scratch).
    n_iter : int
        Steps taken.
    """
    n, d = Z.shape
    m = d + 1
    Q = np.empty((n, m))
    Q[:, :d] = Z
    Q[:, d] = 1.0
    u = np.zeros(n)
    core = kumar_yildirim_init(Z, np.random.default_rng(seed))
    u[core] = 1.0 / core.size
    try:
        Minv, om = _ty_refresh(Q, u)
    except np.linalg.LinAlgError:
        u[:] = 1.0 / n
        Minv, om = _ty_refresh(Q, u)
    k = 1 if m <= 64 else 32
    steps = 0
    batches = 0
    fresh = True
    eps = np.inf
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=None, desc="ellipsoid (Todd-Yildirim)", unit="step", leave=False,
                   **tqdm_kwargs(progress))
    while steps < max_iter:
        active = u > 0
        v_up = om / m - 1.0
        v_dn = np.where(active, 1.0 - om / m, -np.inf)
        eps = max(float(v_up.max()), float(v_dn.max()))
        if eps <= tol:
            if fresh:
                break
            Minv, om = _ty_refresh(Q, u)
            fresh = True
            continue
        fresh = False
        B = _ty_candidates(v_up, v_dn, active, k)
        u, om, Minv, taken = _ty_batch(Q, u, om, Minv, B, tol)
        steps += taken
        batches += 1
        if bar is not None:
            bar.update(taken)
            bar.set_postfix(eps=f"{eps:.2e}")
        if batches % (200 if k == 1 else 25) == 0:  # refresh against drift
            u = np.clip(u, 0, None)
            u /= u.sum()
            Minv, om = _ty_refresh(Q, u)
            fresh = True
    if bar is not None:
        bar.close()
    u = np.clip(u, 0, None)
    u /= u.sum()
    try:
        _, om = _ty_refresh(Q, u)
        act = u > 0
        eps = max(float(om.max()) / m - 1.0, 1.0 - float(om[act].min()) / m)
    except np.linalg.LinAlgError:  # pragma: no cover - the weights span the points by construction
        eps = float("inf")
    return u, float(eps), steps


def _ty_refresh(Q: np.ndarray, u: np.ndarray):
    """``M(u)^{-1}`` (symmetrised) and the Mahalanobis norms ``omega = diag(Q M^{-1} Q^T)``,
    from scratch; raises ``LinAlgError`` when the active points do not span ``R^m``."""
    act = np.flatnonzero(u > 0)
    M = Q[act].T @ (u[act, None] * Q[act])
    Minv = np.linalg.inv(M)
    Minv = 0.5 * (Minv + Minv.T)
    return Minv, np.einsum("ij,ij->i", Q @ Minv, Q)


def _ty_candidates(v_up: np.ndarray, v_dn: np.ndarray, active: np.ndarray, k: int) -> np.ndarray:
    """The batch's candidate points: the ``k`` worst increase violations ``v_up`` and the
    ``max(k // 2, 1)`` worst decrease violations ``v_dn`` among the active points, sorted."""
    n = v_up.size
    kk = min(k, n)
    up = np.argpartition(-v_up, kk - 1)[:kk] if kk < n else np.arange(n)
    act_idx = np.flatnonzero(active)
    kd = min(max(k // 2, 1), act_idx.size)
    dn = act_idx[np.argpartition(-v_dn[act_idx], kd - 1)[:kd]] if kd < act_idx.size else act_idx
    return np.unique(np.concatenate([up, dn]))


def _ty_batch(Q: np.ndarray, u: np.ndarray, om: np.ndarray, Minv: np.ndarray, B: np.ndarray,
              tol: float):
    """Up to ``2 |B|`` Todd-Yildirim steps on the candidates ``B``, with exact line searches.

    ``Q M^{-1} q_B`` and ``M^{-1} q_B`` are formed once (two GEMMs) and kept current by rank-one
    BLAS updates, stored scaled by ``1 / s``; ``omega`` follows by Sherman-Morrison, and
    ``M^{-1}`` is updated once at the end, in product form. The batch ends when its best
    candidate violates the optimality conditions by at most ``tol`` or by less than half of the
    worst point overall. ``u`` is updated in place; returns ``(u, omega, M^{-1}, steps)``.
    """
    from scipy.linalg.blas import dger

    m = Q.shape[1]
    G = np.asfortranarray(Minv @ Q[B].T)  # (m, b): M^{-1} q_B, stored scaled by 1/s
    V = np.asfortranarray(Q @ G)  # (n, b): Q M^{-1} q_B, stored scaled by 1/s
    s = 1.0
    used, coefs = [], []
    scale = 1.0
    steps = 0
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
    return u, om, Minv, steps


def _from_weights(Z: np.ndarray, u: np.ndarray):
    """The ellipsoid ``{z : (z - c)^T Sigma(u)^{-1} (z - c) <= r g}`` of the weights ``u``.

    ``c = Z^T u``, ``Sigma(u)`` the weighted covariance, ``g`` the smallest factor that holds
    every row. Returns ``(c, semi_axes, V, log_lower)``: semi-axes (descending) and the matching
    axes as the columns of ``V``, and the dual lower bound
    ``log kappa_r + r/2 log r + 1/2 log det Sigma(u)`` on every enclosing ellipsoid's log-volume.
    """
    r = Z.shape[1]
    c = Z.T @ u
    D = Z - c
    Sig = (D.T * u) @ D
    Sig = 0.5 * (Sig + Sig.T)
    lam, V = np.linalg.eigh(Sig)
    if not lam[0] > 0:
        raise np.linalg.LinAlgError("the weighted covariance is singular")
    Y = D @ V / np.sqrt(lam)
    g = float(np.einsum("ij,ij->i", Y, Y).max()) / r  # max (z - c)^T (r Sigma)^{-1} (z - c)
    semi = np.sqrt(r * lam * g)
    order = np.argsort(semi)[::-1]
    log_lower = log_unit_ball_volume(r) + 0.5 * r * math.log(r) + 0.5 * float(np.sum(np.log(lam)))
    return c, semi[order], V[:, order], log_lower


def mvee(mu: np.ndarray, U: np.ndarray, sv: np.ndarray, Vt: np.ndarray, *, solver: str = "fast",
         tol: float = 1e-7, max_iter: int = 1_000_000, progress: bool = False) -> MVEEFit:
    """MVEE of the points ``mu + U diag(sv) Vt`` (a thin SVD of the centred points), whitened.

    Parameters
    ----------
    mu : ndarray of float64, shape (d,)
        The mean of the points.
    U : ndarray of float64, shape (N, r)
        Left singular vectors of the centred points (orthonormal columns), ``r`` their rank.
    sv : ndarray of float64, shape (r,)
        The (positive) singular values.
    Vt : ndarray of float64, shape (r, d)
        Right singular vectors (orthonormal rows): a basis of the affine hull's directions.
    solver : {"fast", "cvxpy"}
        Todd-Yildirim (:func:`todd_yildirim`) or cvxpy's ``log_det`` (maximise ``log det B``
        s.t. ``|B z_i + b| <= 1``) on the whitened points ``z = sqrt(N) U``.
    tol, max_iter, progress
        Of :func:`todd_yildirim`.

    Returns
    -------
    MVEEFit
        In the units of the points; ``log_lower`` and the ellipsoid are r-dimensional (in the
        affine hull). The farthest point lies on the boundary up to rounding (callers check
        containment in their own coordinates).
    """
    n, r = U.shape
    Z = U * math.sqrt(n)  # whitened: mean 0, covariance I
    if solver == "cvxpy":
        c, semi, V, log_lower, name = _cvxpy_whitened(Z)
        eps, it, used = float("nan"), 0, f"cvxpy:{name}"
    else:
        u, eps, it = todd_yildirim(Z, tol=tol, max_iter=max_iter, progress=progress)
        c, semi, V, log_lower = _from_weights(Z, u)
        used = "fast"
    g = sv / math.sqrt(n)  # z -> y = z diag(g) Vt
    M = (semi[:, None] * V.T) * g[None, :]  # rows: semi-axis vectors in the hull's coordinates
    _, sig, Qt = np.linalg.svd(M)
    center = mu + (c * g) @ Vt
    return MVEEFit(center, Qt @ Vt, sig, log_lower + float(np.sum(np.log(g))), float(eps), int(it), used)


def _cvxpy_whitened(Z: np.ndarray):
    """MVEE of whitened rows by cvxpy: maximise ``log det B`` s.t. ``|B z_i + b| <= 1``.

    Returns ``(c, semi_axes, V, log_lower, solver)``; the lower bound uses the constraints' dual
    values, normalised to the simplex, as the weights ``u`` (NaN when the solver gives none).
    """
    cp = import_cvxpy()
    n, r = Z.shape
    B = cp.Variable((r, r), PSD=True)
    b = cp.Variable(r)
    cons = [cp.norm(Z @ B + b[None, :], 2, axis=1) <= 1]
    prob = cp.Problem(cp.Maximize(cp.log_det(B)), cons)
    solver = cvxpy_solve(prob, "Ellipsoid")
    Bv = np.asarray(B.value, dtype=np.float64)
    Bv = 0.5 * (Bv + Bv.T)
    beta, V = np.linalg.eigh(Bv)
    if not beta[0] > 0:
        raise RuntimeError("Ellipsoid: cvxpy returned a singular B (degenerate points)")
    c = -V @ ((V.T @ np.asarray(b.value, dtype=np.float64)) / beta)
    Y = (Z - c) @ V * beta  # coordinates in the unit ball
    g = math.sqrt(float(np.einsum("ij,ij->i", Y, Y).max()))
    semi = g / beta
    order = np.argsort(semi)[::-1]
    log_lower = float("nan")
    dual = cons[0].dual_value
    if dual is not None:
        u = np.clip(np.asarray(dual, dtype=np.float64).ravel(), 0, None)
        if u.size == n and u.sum() > 0:
            try:
                log_lower = _from_weights(Z, u / u.sum())[3]
            except np.linalg.LinAlgError:
                pass
    return c, semi[order], V[:, order], log_lower, solver
