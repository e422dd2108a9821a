"""The exact unargmaxable scan of :meth:`embgeom.cells.Decoder.unargmaxable`, in named phases.

1. :func:`prepare` (once, on the driver): the distinct rows ``(w_t, b_t)`` and each token's
   representative, the region where ``h`` may lie (:func:`embgeom.cells._region._region`), the fast
   float32 decoder over the distinct rows, the whitening ``(mu, Cinv)`` of the witness
   directions and the rounding-error constants. About ``|V| d^2`` flops; its result
   (:class:`ScanSetup`) is what every task reads, shipped once (``ray.put``).
2. :func:`select_tokens`: the ids to decide; exact duplicates of a lower id are marked
   ``"duplicate"`` here, the rest become positions into the distinct rows.
3. :func:`witness_phase`, one task per chunk of positions: candidate points and margin ascent,
   each accepted only with a float32 margin above Higham's worst-case rounding error.
4. On the driver, in token order: the tokens without a witness, the first ``max_lp`` of them go
   to the LP phase and the rest are ``"undecided"`` (the global cap of the serial scan).
5. :func:`lp_phase`, one task per chunk of those tokens: the cutting-plane LP of each token.

Chunks of the witness phase are whole multiples of ``batch_size`` and chunks of the LP phase
whole multiples of :data:`LP_BATCH`, aligned with the serial loop's batches: every float32 and
float64 product is computed on the same rows as in one unchunked call, so the verdicts (and the
status codes) are the same for every executor and every ``chunk_size``.

Reference: M. Meyer et al., ICML 2026, Sec. 4; Grivas et al., ACL 2022 (unargmaxable tokens);
N. J. Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., Sec. 3.1 (``gamma_n``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .. import _kernels
from .._validation import check_int_array, check_positive_int
from ._region import _check_bias_at_scale, _region, _Region, max_margin_lp
from ._rows import _UNIT_ROUNDOFF32, STATUS_NAMES, UnargmaxableResult, _gamma, distinct_rows

__all__ = ["ScanSetup", "prepare", "select_tokens", "witness_phase", "lp_phase", "scan"]

#: Tokens per batch of the LP phase's competitor pre-selection (one product of ``LP_BATCH`` points).
LP_BATCH = 64
#: Default tokens per witness-phase task (rounded up to a multiple of ``batch_size``).
CHUNK_SIZE = 2048

_STATUS = {name: np.int8(i) for i, name in enumerate(STATUS_NAMES)}


def _witness_pass(dec_u, Y: np.ndarray, ts: np.ndarray, region: _Region, bias_max: float, row_max: float):
    """Check candidate points (region coordinates) for a batch; returns (ok, best_idx, second_idx)."""
    H = Y if region.R is None else Y @ region.R
    H32 = H.astype(np.float32)
    b1, i1, b2, i2 = dec_u.top2(H32)
    hn = np.linalg.norm(H32.astype(np.float64), axis=1)
    err = _gamma(dec_u.dim + 2, _UNIT_ROUNDOFF32) * (row_max * hn + bias_max) * 1.01 + 1e-30
    ok = (i1 == ts) & ((b1.astype(np.float64) - b2.astype(np.float64)) > 2.0 * err)
    if not region.directions:  # points in a box region: they must lie inside it
        lb, ub = region.lb, region.ub
        Yc = H32.astype(np.float64) if region.R is None else H32.astype(np.float64) @ region.R.T
        ok &= np.all((Yc >= lb) & (Yc <= ub), axis=1)
    return ok, i1, i2


def _box_points(D: np.ndarray, region: _Region, corner: bool) -> np.ndarray:
    """Points inside the box along directions ``D`` from its centre (0.999 of the way to the wall)."""
    centre = 0.5 * (region.lb + region.ub)
    half = 0.5 * (region.ub - region.lb)
    if corner:
        return centre + 0.999 * half * np.sign(D)
    scale = np.max(np.abs(D) / np.maximum(half, 1e-300), axis=1, keepdims=True)
    scale[scale == 0] = 1.0
    return centre + 0.999 * D / scale


def _row_distances(Wr: np.ndarray, t: int, c: np.ndarray | None = None) -> np.ndarray:
    """``|(w_t - w_s, c_t - c_s)|`` for every row ``s`` (float64 (V,)), without a (V, d)
    temporary; the bias column only when ``c`` is given (the homogenised LP's rows)."""
    wt = Wr[t]
    out = np.empty(Wr.shape[0])
    for v0 in range(0, Wr.shape[0], 4096):
        out[v0:v0 + 4096] = np.einsum("ij,ij->i", D := wt - Wr[v0:v0 + 4096], D)
    if c is not None:
        out += (c[t] - c) ** 2
    return np.sqrt(out)


#: Most relaxation steps of :func:`_repair_witness` per cutting-plane iteration.
REPAIR_STEPS = 200


def _repair_witness(region: _Region, t: int, y: np.ndarray, *, err_per_norm: float,
                    norms: np.ndarray | None = None):
    """A proven witness near the LP point ``y``, by relaxation steps (Agmon 1954, Motzkin and
    Schoenberg 1954), or None. Only for a decoder without bias, whose cells are cones.

    Why: the LP maximises the *absolute* margin ``min_s (w_t - w_s) . y`` over its working set.
    When ``t`` has near-duplicate rows (SmolLM2's tokens 7-16: rows 1e-3 apart, a norm of 3.3),
    those bound the optimum (``1.3e-4`` at every iteration) and every other row is free: HiGHS
    returns an arbitrary vertex of a large optimal face, cutting planes add rows that do not
    move the optimum, and token 8 stayed "undecided" after 21 iterations and the 300 s limit,
    the longest phase of ``make run``. A relaxation step projects ``y`` onto the halfspace of the
    most violated *normalised* constraint, ``y += (delta - m_j) a_j`` with ``a_j`` the unit row
    ``(w_t - w_j) / |w_t - w_j|`` and ``m_j = a_j . y``; from that LP's first point it found a
    witness for token 8 in 17 steps. A point counts only after the check of :func:`_lp_token`
    (every row, float64, Higham's bound), scaled into the box first (the constraints are
    homogeneous, so a positive scale changes no sign), so the verdict is as exact as the LP's.
    """
    if region.c is not None or region.homog or not np.all((region.lb < 0) & (region.ub > 0)):
        return None
    Wr = region.Wr
    wt = Wr[t]
    if norms is None:
        norms = _row_distances(Wr, t)
    ok = norms > 0
    ok[t] = False
    inv = np.where(ok, 1.0 / np.where(ok, norms, 1.0), 0.0)
    y = y / max(float(np.linalg.norm(y)), 1e-300)
    delta = 1e-6
    for _ in range(REPAIR_STEPS):
        m = np.where(ok, (wt @ y - Wr @ y) * inv, np.inf)
        j = int(np.argmin(m))
        if m[j] > delta / 2:
            break
        y = y + (delta - m[j]) * inv[j] * (wt - Wr[j])
    else:
        return None
    # into the box (homogeneous constraints: any positive scale keeps every margin's sign)
    with np.errstate(divide="ignore"):
        lim = np.where(y > 0, region.ub / y, np.where(y < 0, region.lb / y, np.inf))
    y = y * min(1.0, 0.999 * float(lim.min()))
    mm = wt @ y - Wr @ y
    mm[~ok] = np.inf
    return y if mm.min() > err_per_norm * float(np.linalg.norm(y)) + 1e-300 else None


def _lp_token(region: _Region, t: int, S0: np.ndarray, tol: float, time_limit: float, k_add: int):
    """Cutting-plane LP for token ``t`` (an index into ``region.Wr``), over :func:`max_margin_lp`
    on *unit* constraint rows: ``maximise s subject to (a_s . x + s |a_s| <= r_s)`` with
    ``a_s = (w_s - w_t [, c_s - c_t])``, ``x = (y [, tau])`` and ``r_s = [c_t - c_s]``, each row
    divided by ``|a_s|``, for the working set S of competitors. Returns (status, y, n_iter).

    ``s`` is then a distance in the region's unit coordinates (the depth of the relaxed cell,
    the radius of a ball about ``x`` inside every working-set halfspace), so ``s <= tol`` means
    no ball of radius ``tol`` fits, whatever the lengths of the rows. With the absolute margin
    (every row's weight 1) two rows one float32 ulp apart bound ``s`` by ``|w_t - w_s|`` (1e-10
    for an entry of 1e-3), below HiGHS's 1e-7 feasibility tolerance: cells with room in them
    were reported ``"lp_empty"``, even at ``tol = 0``."""
    Wr, c = region.Wr, region.c
    V, d = Wr.shape
    wt = Wr[t]
    ct = 0.0 if c is None else c[t]
    S = np.unique(S0[(S0 >= 0) & (S0 != t)])
    homog = region.homog
    bounds = [(float(lo), float(hi)) for lo, hi in zip(region.lb, region.ub)]
    if homog:
        bounds.append((0.0, 1.0))
    t0 = time.perf_counter()
    gam = _gamma(d + 2, 2.0**-53)
    row_max = float(np.max(np.linalg.norm(Wr, axis=1)))
    bias_max = 0.0 if c is None else float(np.max(np.abs(c)))
    nrm = _row_distances(Wr, t, c if homog else None)
    # a row equal to w_t with another bias (no support's tau): weight 1, its rhs decides alone
    unit = np.where(nrm > 0, nrm, 1.0)
    for it in range(1, 10_000):
        A = np.empty((S.size, d + (1 if homog else 0)))
        A[:, :d] = Wr[S] - wt
        if homog:
            A[:, d] = c[S] - ct
            rhs = np.zeros(S.size)
        else:
            rhs = np.zeros(S.size) if c is None else ct - c[S]
        A /= unit[S, None]
        # |r_s| / |a_s| past 1e12 region widths: never binding (> 0) or empty whatever x (< 0)
        rhs = np.clip(rhs / unit[S], -1e12, 1e12)
        left = time_limit - (time.perf_counter() - t0)
        if left <= 0:
            return "undecided", None, it
        ok, x, s_opt = max_margin_lp(A, rhs, 1.0, bounds, time_limit=left)
        if not ok:
            return "undecided", None, it
        if s_opt <= tol:
            return "lp_empty", None, it
        y = x[:d]
        tau = x[d] if homog else 1.0
        m = Wr @ (-y) + wt @ y  # (w_t - w_s) . y for all s
        if c is not None:
            m += tau * (ct - c)
        m[t] = np.inf
        err = 4.0 * gam * (row_max * float(np.linalg.norm(y)) + bias_max) + 1e-300
        if m.min() > err:
            return "lp_witness", y, it
        if it & (it - 1) == 0:  # iterations 1, 2, 4, 8, ...: at most log2 failed repairs
            y_r = _repair_witness(region, t, y, err_per_norm=4.0 * gam * row_max,
                                  norms=nrm if c is None else None)
            if y_r is not None:
                return "lp_witness", y_r, it
        # add the most violated constraints (in depth, m_s / |a_s|) not yet present
        depth = m / unit
        order = np.argsort(depth)[: k_add + S.size]
        bad = (depth[order] <= s_opt) | (m[order] <= err)
        new = np.setdiff1d(order[bad], S, assume_unique=False)[:k_add]
        if new.size == 0:
            return "undecided", y, it
        S = np.union1d(S, new)
    return "undecided", None, it




# ---------------------------------------------------------------------------------------------
# phase 1: the set-up every task reads
# ---------------------------------------------------------------------------------------------
@dataclass
class ScanSetup:
    """What :func:`prepare` computes once and every task of the scan reads.

    Attributes
    ----------
    n_tokens : int
        ``|V|`` of the decoder.
    uniq : numpy.ndarray of int64, shape (n_u,)
        Sorted ids of the first occurrence of each distinct row ``(w_t, b_t)``.
    rep : numpy.ndarray of int64, shape (n_tokens,)
        Per token, the id of its representative (the lowest id with the same row).
    region : embgeom.cells._region._Region
        The distinct rows in region coordinates (float64 (n_u, d)), the bias, the box.
    dec_u : embgeom.cells.Decoder
        The fast float32 decoder over the distinct rows (bias dropped when witnesses are
        directions of cones).
    row_max, bias_max : float
        ``max_s |w_s|`` and ``max_s |b_s|`` (0 for directions), for the rounding-error bound.
    mu : numpy.ndarray of float64, shape (d,)
        Mean distinct row (region coordinates).
    Cinv : numpy.ndarray of float64, shape (d, d)
        Inverse of the ridge-regularised covariance of the distinct rows (the whitening of the
        first witness direction ``(w_t - mu) Cinv``).
    """

    n_tokens: int
    uniq: np.ndarray
    rep: np.ndarray
    region: _Region
    dec_u: object  # embgeom.cells.Decoder (not imported: the decoder imports this module)
    row_max: float
    bias_max: float
    mu: np.ndarray
    Cinv: np.ndarray

    @property
    def n_distinct(self) -> int:
        """Number of distinct rows ``n_u``."""
        return int(self.uniq.size)


def prepare(dec, support=None) -> ScanSetup:
    """Phase 1: distinct rows, region, fast decoder and whitening (once per scan).

    Parameters
    ----------
    dec : Decoder
    support : Support, optional
        As :meth:`Decoder.unargmaxable`.

    Returns
    -------
    ScanSetup

    Raises
    ------
    TypeError, ValueError
        Unsupported support, or one of another dimension (:func:`embgeom.cells._region._region`).
    """
    d = dec.dim
    uniq, rep = distinct_rows(dec.W_, dec.bias_)
    W64 = dec.W_[uniq].astype(np.float64)
    b64 = None if dec.bias_ is None else dec.bias_[uniq].astype(np.float64)
    region = _region(dec, support, W64, b64, cones=True)
    # the fast float32 decoder over the distinct rows (bias ignored when witnesses are directions)
    # (in the region's unit coordinates: the bias is region.c, checked against float32's range)
    c_u = None if region.directions or region.c is None else region.c
    if c_u is not None:
        _check_bias_at_scale(c_u, region)
    # the rows at the region's unit scale (exact: a power of two), so the witnesses' logits
    # are the LPs' logits
    W_u = np.ldexp(dec.W_[uniq], -region.w_exp).astype(np.float32)
    dec_u = type(dec)(W_u, c_u, point_block=dec.point_block, vocab_block=dec.vocab_block)
    row_max = float(np.max(np.linalg.norm(region.Wr, axis=1)))
    bias_max = 0.0 if c_u is None else float(np.max(np.abs(c_u)))
    Wr = region.Wr
    mu = Wr.mean(axis=0)
    cov = np.cov(Wr.T) if uniq.size > 1 else np.eye(d)
    cov = np.atleast_2d(cov)
    ridge = 1e-6 * max(float(np.trace(cov)) / d, 1e-30)
    Cinv = np.linalg.inv(cov + ridge * np.eye(d))
    return ScanSetup(dec.n_tokens, uniq, rep, region, dec_u, row_max, bias_max, mu, Cinv)


# ---------------------------------------------------------------------------------------------
# phase 2: the tokens to decide
# ---------------------------------------------------------------------------------------------
def select_tokens(setup: ScanSetup, tokens=None) -> tuple[np.ndarray, np.ndarray]:
    """Phase 2: the status array with duplicates marked, and the positions left to decide.

    Parameters
    ----------
    setup : ScanSetup
    tokens : array_like of int, optional
        Ids to decide (default all); sorted and de-duplicated.

    Returns
    -------
    status : numpy.ndarray of int8, shape (n_tokens,)
        ``"duplicate"`` for requested exact duplicates of a lower id, ``"witness"`` for every
        requested token when all rows are equal, ``"skipped"`` elsewhere.
    pos : numpy.ndarray of int64, shape (k,)
        Positions into ``setup.uniq`` of the requested representatives still to decide, in
        token order.

    Raises
    ------
    TypeError
        ``tokens`` not an integer array.
    ValueError
        ``tokens`` empty or not 1-d, ids outside ``[0, n_tokens)``.
    """
    V = setup.n_tokens
    status = np.full(V, _STATUS["skipped"], dtype=np.int8)
    if tokens is None:
        want = np.arange(V, dtype=np.int64)
    else:
        if np.ndim(tokens) == 0:  # one id, or a count (as cell_volumes' tokens=3 would be)
            raise TypeError(f"tokens: expected a 1-D array of token ids (e.g. [{tokens!r}] for "
                            f"one token), got {type(tokens).__name__} {tokens!r}")
        # the one integer-array rule (an empty list is "empty", not "not integers")
        want = np.unique(check_int_array(tokens, "tokens", ndim=1, low=0, high=V))
    rep = setup.rep
    status[want[rep[want] != want]] = _STATUS["duplicate"]
    todo_ids = want[rep[want] == want]
    pos = np.searchsorted(setup.uniq, todo_ids).astype(np.int64)  # index into the unique rows
    if setup.n_distinct == 1:  # one distinct row: it wins everywhere
        status[todo_ids] = _STATUS["witness"]
        pos = pos[:0]
    return status, pos


# ---------------------------------------------------------------------------------------------
# phase 3: witnesses (one task per chunk of positions)
# ---------------------------------------------------------------------------------------------
def witness_phase(pos: np.ndarray, *, setup: ScanSetup, witness_steps: int, batch_size: int):
    """Phase 3: a proven witness point for each position, where the fast pass finds one.

    For each batch of ``batch_size`` positions: the whitened direction ``(w_t - mu) Cinv``,
    ``w_t - mu`` and ``w_t`` (as directions, or as points inside the box), then
    ``witness_steps`` steps of normalised margin ascent towards the current strongest
    competitor for the stragglers. A point counts only when its float32 margin exceeds twice
    Higham's bound ``gamma_{d+2} (max|w| |h| + max|b|)`` on the rounding error.

    Parameters
    ----------
    pos : numpy.ndarray of int64, shape (k,)
        Positions into ``setup.uniq`` (a chunk of :func:`select_tokens`'s ``pos``; its length a
        multiple of ``batch_size`` except for the last chunk, so that the batches are those of
        one unchunked call).
    setup : ScanSetup
    witness_steps : int
    batch_size : int

    Returns
    -------
    won : numpy.ndarray of bool, shape (k,)
        A witness was found.
    last : numpy.ndarray of float64, shape (k, d)
        The last point tried (region coordinates): the LP phase ranks competitors there.
    """
    region, dec_u, Wr = setup.region, setup.dec_u, setup.region.Wr
    mu, Cinv, row_max, bias_max = setup.mu, setup.Cinv, setup.row_max, setup.bias_max
    d = Wr.shape[1]
    pos = np.asarray(pos, dtype=np.int64)
    won = np.zeros(pos.size, dtype=bool)
    last = np.zeros((pos.size, d))
    for s0 in range(0, pos.size, batch_size):
        idx = pos[s0 : s0 + batch_size]
        D0 = (Wr[idx] - mu) @ Cinv
        cands = [D0, Wr[idx] - mu, Wr[idx]]
        ok_b = np.zeros(idx.size, dtype=bool)
        cur = D0.copy()
        comp = None
        for D in cands:
            sub = np.flatnonzero(~ok_b)
            if sub.size == 0:
                break
            if region.directions:
                Ys = [D[sub]]
            else:
                Ys = [_box_points(D[sub], region, corner=False), _box_points(D[sub], region, corner=True)]
            for Y in Ys:
                live = ~ok_b[sub]
                if not live.any():
                    break
                ok, i1, i2 = _witness_pass(dec_u, Y[live], idx[sub[live]], region, bias_max, row_max)
                ok_b[sub[live][ok]] = True
                if comp is None:  # first pass: every token of the batch, at the whitened point
                    comp = np.where(i1 == idx, i2, i1)
        # margin ascent from the whitened direction for the stragglers
        rest = np.flatnonzero(~ok_b)
        if rest.size and witness_steps and comp is not None:
            if region.directions:
                h = cur[rest] / np.maximum(np.linalg.norm(cur[rest], axis=1, keepdims=True), 1e-300)
            else:
                h = _box_points(cur[rest], region, corner=False)
            cpt = comp[rest]
            alive = np.ones(rest.size, dtype=bool)
            for step in range(witness_steps):
                cand = np.flatnonzero(alive)
                if cand.size == 0:
                    break
                g = Wr[idx[rest[cand]]] - Wr[np.maximum(cpt[cand], 0)]
                g /= np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-300)
                eta = 0.3 / math.sqrt(step + 1)
                if region.directions:
                    hn = h[cand] + eta * g
                    hn /= np.maximum(np.linalg.norm(hn, axis=1, keepdims=True), 1e-300)
                else:
                    centre = 0.5 * (region.lb + region.ub)
                    half = 0.5 * (region.ub - region.lb)
                    hn = centre + np.clip(h[cand] - centre + eta * half * g / np.maximum(np.abs(g).max(axis=1, keepdims=True), 1e-300),
                                          -0.999 * half, 0.999 * half)
                h[cand] = hn
                ok, i1, i2 = _witness_pass(dec_u, hn, idx[rest[cand]], region, bias_max, row_max)
                alive[cand[ok]] = False
                ok_b[rest[cand[ok]]] = True
                cpt[cand] = np.where(i1 == idx[rest[cand]], i2, i1)
            last[s0 + rest] = h
        won[s0 : s0 + idx.size] = ok_b
        still = np.flatnonzero(~ok_b)
        if still.size and not (rest.size and witness_steps):
            last[s0 + still] = D0[still]
    return won, last


# ---------------------------------------------------------------------------------------------
# phase 5: linear programs (one task per chunk of the tokens without a witness)
# ---------------------------------------------------------------------------------------------
def lp_phase(pos: np.ndarray, last: np.ndarray, *, setup: ScanSetup, tol: float, lp_time_limit: float):
    """Phase 5: the cutting-plane LP of each position (:func:`_lp_token`).

    The first constraints of token ``t`` are its ``max(d // 2, 64)`` strongest competitors at
    its last witness candidate (``last``), ranked ``LP_BATCH`` tokens at a time.

    Parameters
    ----------
    pos : numpy.ndarray of int64, shape (k,)
        Positions into ``setup.uniq`` (length a multiple of :data:`LP_BATCH` except for the
        last chunk).
    last : numpy.ndarray of float64, shape (k, d)
        From :func:`witness_phase`.
    setup : ScanSetup
    tol : float
    lp_time_limit : float
        Seconds per token.

    Returns
    -------
    status : numpy.ndarray of int8, shape (k,)
        ``"lp_witness"``, ``"lp_empty"`` or ``"undecided"`` per position.
    iterations : numpy.ndarray of int64, shape (k,)
        Cutting-plane iterations per token.
    """
    region = setup.region
    Wr = region.Wr
    n_u, d = Wr.shape
    k0 = min(n_u - 1, max(d // 2, 64))
    k_add = min(n_u - 1, 64)
    pos = np.array(pos, dtype=np.int64)  # a writable copy: Ray hands out read-only arrays, numba takes writable ones
    status = np.empty(pos.size, dtype=np.int8)
    iters = np.zeros(pos.size, dtype=np.int64)
    for s0 in range(0, pos.size, LP_BATCH):
        chunk = pos[s0 : s0 + LP_BATCH]
        scores = last[s0 : s0 + LP_BATCH] @ Wr.T
        if region.c is not None and not region.directions:
            scores += region.c
        S0s = _kernels.topk_competitors(np.ascontiguousarray(scores), chunk, int(k0))
        for j, t_u in enumerate(chunk.tolist()):
            st, _, it = _lp_token(region, t_u, S0s[j], tol, lp_time_limit, k_add)
            status[s0 + j] = _STATUS[st]
            iters[s0 + j] = it
    return status, iters


# ---------------------------------------------------------------------------------------------
# the scan
# ---------------------------------------------------------------------------------------------
def _aligned_chunks(n: int, size: int, unit: int) -> dict:
    """``{i: slice}`` over ``range(n)`` in pieces of ``size`` rounded up to a multiple of ``unit``."""
    size = unit * max(1, -(-size // unit))
    return {i: slice(s, min(s + size, n)) for i, s in enumerate(range(0, n, size))}


def scan(dec: Decoder, support=None, *, tokens=None, witness_steps: int = 30, batch_size: int = 256,
         max_lp: int | None = None, lp_time_limit: float = 300.0, tol: float = 1e-9,
         progress: bool = True, executor="local", chunk_size: int | None = None) -> UnargmaxableResult:
    """The exact scan (arguments checked by :meth:`Decoder.unargmaxable`), phase by phase.

    ``chunk_size`` tokens per witness task (rounded up to a multiple of ``batch_size``; default
    :data:`CHUNK_SIZE`), and ``max(LP_BATCH, chunk_size // 32)`` rounded to a multiple of
    :data:`LP_BATCH` tokens per LP task. The :class:`ScanSetup` is put once (``ray.put`` on
    Ray) and read by every task of both phases.
    """
    from ..parallel import executor_scope

    t_start = time.perf_counter()
    chunk_size = CHUNK_SIZE if chunk_size is None else check_positive_int(chunk_size, "chunk_size")
    with executor_scope(executor) as ex:
        setup = prepare(dec, support)
        status, pos = select_tokens(setup, tokens)
        uniq = setup.uniq
        extra = {"n_distinct_rows": setup.n_distinct}
        t_prep = time.perf_counter()
        shared = {"setup": ex.put(setup) if pos.size else setup}
        t_put = time.perf_counter()
        # witnesses, one task per chunk of positions
        parts = _aligned_chunks(pos.size, chunk_size, batch_size)
        out = ex.map_keyed(witness_phase, {i: (pos[s],) for i, s in parts.items()}, shared=shared,
                           kwargs={"witness_steps": witness_steps, "batch_size": batch_size},
                           progress=progress, desc="unargmaxable: witnesses")
        won = np.concatenate([out[i][0] for i in parts]) if parts else np.zeros(0, bool)
        last = np.concatenate([out[i][1] for i in parts]) if parts else np.zeros((0, dec.dim))
        status[uniq[pos[won]]] = _STATUS["witness"]
        t_wit = time.perf_counter()
        # the global LP cap, in token order
        need = np.flatnonzero(~won)
        n_lp = 0
        if need.size:
            if max_lp is not None and need.size > max_lp:
                status[uniq[pos[need[max_lp:]]]] = _STATUS["undecided"]
                need = need[:max_lp]
            parts = _aligned_chunks(need.size, max(LP_BATCH, chunk_size // 32), LP_BATCH)
            out = ex.map_keyed(lp_phase, {i: (pos[need[s]], last[need[s]]) for i, s in parts.items()},
                               shared=shared, kwargs={"tol": tol, "lp_time_limit": lp_time_limit},
                               progress=progress, desc="unargmaxable: LPs")
            iters = []
            if parts:
                status[uniq[pos[need]]] = np.concatenate([out[i][0] for i in parts])
                iters = np.concatenate([out[i][1] for i in parts]).tolist()
            n_lp = int(need.size)
            extra["lp_iterations_mean"] = float(np.mean(iters)) if iters else 0.0
        t_end = time.perf_counter()
    extra["executor"] = ex.name
    extra["phase_seconds"] = {"prepare": t_prep - t_start, "put": t_put - t_prep,
                              "witness": t_wit - t_put, "lp": t_end - t_wit}
    empty = np.isin(status, [_STATUS["lp_empty"], _STATUS["duplicate"]])
    n_und = int((status == _STATUS["undecided"]).sum())
    return UnargmaxableResult(
        tokens=np.flatnonzero(empty).astype(np.int64), status=status, n_lp=n_lp, n_undecided=n_und,
        seconds=time.perf_counter() - t_start, support=setup.region.name, extra=extra,
    )
