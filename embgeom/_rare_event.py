"""Rare-event estimator of decoder-cell shares: the Gaussian measure of a polyhedral cone.

With no bias and an origin-centred ellipsoidal support ``S = G B`` (``B`` the unit ball, ``G`` a
``(d, k)`` linear map: ``r I`` for the origin ball, the gain map for the final-norm shell), the
decoder cell of token ``t`` is a cone, and its share of ``S`` is the standard Gaussian measure of

    C_t = {x in R^k : a_s . x >= 0 for every s != t},   a_s = G^T (w_t - w_s),

because ``y = G x`` with ``x ~ N(0, I)`` has the direction law of ``S`` and cones only see
directions (docs/theory.md, section 1). Shares of real cells run from ``e^-8`` to ``e^-17`` and
below, far out of reach of uniform counting, so this module estimates ``log P(x in C_t)`` by
multilevel splitting (Holmes-Diaconis-Ross, adaptive levels) with exact elliptical slice sampling
for linear constraints (LIN-ESS):

1. ``N`` chains start as independent ``N(0, I)`` draws. The level function is the smallest
   normalised constraint value ``m(x) = min_{s in S} a_s . x / |a_s|``; the nested domains are
   ``D_k = {x : a_s . x / |a_s| >= -c_s}`` with per-constraint shifts ``c_s`` that only decrease.
2. Each level sets ``gamma`` so that a fraction ``level_prob`` of the chains has ``m >= -gamma``
   (never below 0), lowers every shift to ``gamma``, records the fraction inside, keeps the
   survivors where they are, replaces every killed chain by a copy of a survivor of its own
   group (independent groups of chains) and moves the copies with ``n_moves`` exact steps
   (reflected Hamiltonian trajectories, :func:`embgeom._rare_kernels.hmc_trajectories`, or
   LIN-ESS, :func:`embgeom._rare_kernels.ess_angles`), which leave ``N(0, I)`` restricted to
   ``D_k`` invariant. ``log p`` is the sum of the logs of the recorded fractions: adaptive
   multilevel splitting, whose product of fractions is unbiased for ``p`` under exact moves
   (Brehier et al. 2016). Moving every chain after each level instead (sequential Monte
   Carlo) makes the product too large by about ``(1 + 1 / (level_prob N - 1))^L`` for ``L``
   levels of ``N`` chains, even with exact draws: each level's sample quantile is used twice.
3. When ``gamma`` reaches 0 the chains are in the cone of the constraints in ``S``. If ``S`` is
   every constraint this is ``C_t``. Otherwise (large vocabularies) ``S`` is a *working set*:
   ``C_S`` contains ``C_t``, so ``P(C_S)`` is an upper bound on the share, and the estimator
   checks the chains against every row of ``W`` (the full float32 product, as the decoder
   computes it) and multiplies by the fraction that is really in ``C_t``. When too few are, the
   levels go on with the margin over all of ``W`` as level function.

The working set is chosen by a *pilot* run whose estimate is not used: after every
:data:`PROBE_EVERY` levels one chain in each of ``n_probes`` groups is checked against every
row, and the constraints that cut it off from the cone (its smallest normalised margins) join
``S``; so do the rows that cut off the chains of a full check that finds too few in the cell.
The counted runs start from the pilot's ``S``, fixed before they draw, and never add to it:
their domains are nested and chosen in advance, so the product of the recorded fractions is
unbiased for ``P(C_t)`` whatever ``S`` is, and ``S`` only sets the cost. Constraints chosen from
the counted chains themselves would cut exactly those chains and bias the product low (by 0.65
nats on a SmolLM2 cell at 128 chains: :func:`_token_runs`). A full check first tries the rows
that cut off earlier chains and scans all of ``W`` only for the chains that pass them
(:meth:`_Cone.check`).

Interval: chains form ``n_groups`` independent groups (resampling never crosses groups), so the
groups' linearised contributions to ``log p`` are independent and their spread measures the
variance, MCMC correlation included; the interval is the estimate plus or minus a Student-t
quantile (``n_groups - 1`` degrees of freedom) times that standard error.

References
----------
- A. Gessner, O. Kanjilal, P. Hennig, "Integrals over Gaussians under Linear Domain Constraints",
  AISTATS 2020 (LIN-ESS and its use inside Holmes-Diaconis-Ross, Sec. 3-4).
- Holmes-Diaconis-Ross splitting: P. Diaconis and S. Holmes, "Three examples of Monte-Carlo
  Markov chains" (1995); Z. I. Botev and D. P. Kroese, "Efficient Monte Carlo simulation via the
  generalized splitting method", Statistics and Computing 22 (2012).
- F. Cerou, A. Guyader, "Adaptive multilevel splitting for rare event analysis", Stochastic
  Analysis and Applications 25 (2007) (adaptive levels at a fixed conditional probability).
- C.-E. Brehier, M. Gazeau, L. Goudenege, T. Lelievre, M. Rousset, "Unbiasedness of some
  generalized adaptive multilevel splitting algorithms", Annals of Applied Probability 26 (2016)
  (the kill-and-copy scheme, ties killed with the level, and its unbiased estimate of ``p``).
- I. Murray, R. P. Adams, D. MacKay, "Elliptical slice sampling", AISTATS 2010.
- M. Meyer et al., "How Many Different Outputs Can a Transformer Generate?", ICML 2026, Sec. 4
  (decoder cells and their volumes).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from . import _rare_kernels
from .cells._region import cone_is_empty
from ._progress import tqdm_kwargs
from ._threads import single_blas_thread
from ._validation import check_array, check_positive, check_positive_int, check_probability

__all__ = ["ConeMeasure", "log_cone_gaussian_measure"]

#: Most chains per run: (n_chains, k) float64 states of 2**20 x 576 are already 4.5 GiB, and
#: more runs (``max_runs``) narrow an interval as well as more chains per run do.
MAX_CHAINS = 2**20

#: Tokens per block of the full check (a (chains, VOCAB_BLOCK) float32 buffer stays in cache).
VOCAB_BLOCK = 4096
#: Levels between the pilot's probes (the first is before the first level). Each probe is a pass
#: over all of W; every second level found as good a working set for 15% less (16 SmolLM2
#: tokens: 0.26 instead of 0.30 core-seconds per first run, the same standard errors after).
PROBE_EVERY = 2
#: The pilot's full check is accepted only when at least this fraction of its chains is in the
#: cell (``min_full_fraction`` if larger); below it the rows cutting the others off join and the
#: pilot goes on. A richer working set makes the counted runs' last step larger: on 12 SmolLM2
#: tokens 0.2 instead of 0.05 cut the points scanned against all of W per token from 725 to 328
#: (fewer counted runs falling back to levels on the full margin) and the cost by a quarter.
PILOT_MIN_FULL = 0.2
#: Chains of the pilot run (n_chains when fewer): it only chooses the working set, and a pilot
#: of 1,024 chains cost as much as the run it served (more rejected checks, up to the cap).
PILOT_CHAINS = 128
#: Margins kept per chain of a full check: the rows among them screen later checks (8 caught
#: about half of the chains outside the cell in later SmolLM2 runs, 32 about two thirds).
CHECK_K = 32
#: Scans of at most this many points (the probes) take the fused kernel
#: :func:`embgeom._rare_kernels.scan_smallest_margins`; more points, the blocked BLAS products.
FUSED_SCAN_POINTS = 4
#: After this many levels (share below 2^-64 at level_prob 0.5, far below real cells), at every
#: doubling after, and whenever the levels stall, an LP checks whether the working-set cone is
#: empty: then so is the cell, and the splitting would never reach it.
EMPTY_CHECK_LEVELS = 64
#: Factor on the groups' standard error. It was 1.2 for the sampler that moved every chain
#: (the shared levels' randomness escaped the group spread); with kill-and-copy the real spread
#: of log p over 75-150 seeds at 128 chains is 0.83-1.08 times the group standard error
#: (docs/theory.md, section 5.1), so none is applied.
SE_INFLATION = 1.0
#: Without a working set, cones with at most this many constraint entries (``M k``) get the
#: emptiness LP before the first level (an LP this small takes milliseconds).
EARLY_LP_WORK = 100_000
#: A float32 W whose max|W| is within 2^+-UNSCALED_RANGE of [0.5, 1) is not rescaled
#: (:func:`prepare_cones`): the products stay far from float32's overflow and subnormals.
UNSCALED_RANGE = 16
#: Largest Gram matrix (constraints) built without a working set (16384^2 float64: 2 GiB).
MAX_GRAM = 16384
#: ``working_set="auto"`` takes a working set when a cone has more constraints than this (or
#: than ``max_constraints``, if fewer). It was the cap itself until the cap's default rose to
#: 4,096: a small vocabulary (2,049-4,096 rows) keeps the working set it had, instead of moves
#: over every constraint.
AUTO_WORKING_SET = 2048
#: Least cap on reflections per exact-HMC trajectory: a trajectory that needs more is rejected
#: (the chain stays where it was, an exact move: :func:`embgeom._rare_kernels.hmc_trajectories`).
MAX_BOUNCES = 1000
#: The cap grows where reflections are cheap (:func:`_bounce_cap`): a reflection costs about
#: ``M + k`` operations (``M`` constraints, ``k`` dimensions), and a trajectory may spend this
#: many, up to :data:`MAX_BOUNCES_CHEAP` reflections.
BOUNCE_WORK = 2_000_000
MAX_BOUNCES_CHEAP = 100_000
#: Fraction of a move's trajectories rejected at :data:`MAX_BOUNCES` above which the run's HMC
#: time halves for the later moves (:meth:`_Splitter.moves`).
MAX_REJECTED = 0.1
#: HMC time below which a run warns that its cone is too thin for the moves to mix: after
#: seven halvings from pi / 2. With the cap at 1,000 reflections a wedge 2^16 times thinner than
#: wide reached it and erred low by 0.2-0.6 nats with intervals that missed; neither LIN-ESS nor
#: an exact Gibbs move of the radius fixed it, a cap scaled to the reflections' cost
#: (:func:`_bounce_cap`) did where the working set is small.
HMC_MIN_TIME = 0.5 * math.pi / 128


@dataclass
class ConeMeasure:
    """Per-token log Gaussian measure of decoder cones (:func:`log_cone_gaussian_measure`).

    Attributes
    ----------
    token_ids : numpy.ndarray of int64, shape (T,)
    log_share : numpy.ndarray of float64, shape (T,)
        Estimate of ``log P(x in C_t)`` in nats (the share of the support held by cell ``t``).
        ``-inf`` only for cells proven empty (an exact duplicate row with a lower id takes every
        tie, or an LP finds no interior point); ``nan`` where the estimator gave up (``side``).
    log_lower, log_upper : numpy.ndarray of float64, shape (T,)
        Two-sided ``confidence`` interval on ``log_share`` (nats).
    std_err : numpy.ndarray of float64, shape (T,)
        Standard error of ``log_share`` from the spread across independent groups of chains.
    side : numpy.ndarray of str, shape (T,)
        Which way each figure can err: ``"two-sided"`` (checked against every row of ``W``: the
        error is Monte Carlo only), ``"upper"`` (the working-set cone only, no full check: an
        upper bound up to Monte Carlo error), ``"empty"`` (proven empty), ``"unresolved"`` (the
        level cap was reached: ``log_upper`` is still an upper bound, ``log_share`` is ``nan``),
        ``"exact"`` (a cone in ``k <= 2`` dimensions, :data:`EXACT_MAX_DIM`: its angle, computed
        exactly up to float64 rounding, :func:`_planar_log_measure`; interval of width 0, no
        runs).
    n_levels : numpy.ndarray of int64, shape (T,)
        Splitting levels recorded (the full check counts as one).
    n_constraints_used : numpy.ndarray of int64, shape (T,)
        Size of the final working set (``|V| - 1`` minus ties when every constraint is used).
    n_full_checks : numpy.ndarray of int64, shape (T,)
        Points checked against every row of ``W`` (probes and final checks).
    log_check_fraction : numpy.ndarray of float64, shape (T,)
        Log of the fraction of the working-set cone's chains found in the real cell by the
        final full check (0 without a working set): how far (nats) the working-set cone's
        measure, an upper bound, lies above the share.
    seconds : numpy.ndarray of float64, shape (T,)
        Wall time per token.
    n_runs : numpy.ndarray of int64, shape (T,)
        Blocks of ``n_chains`` chains that the token's splitting runs took (1 without
        ``target_se``; 0 for cells found empty before any run; a run may hold several blocks,
        :func:`_token_runs`), the pilot included (with a
        working set one more run, of ``min(n_chains, PILOT_CHAINS)`` chains, chooses the working
        set and is not counted in the estimate, :func:`_token_runs`): its budget is at most
        ``n_runs * n_chains`` chains. ``n_levels`` and
        ``log_check_fraction`` are those of the first counted run, ``n_full_checks`` the sum
        over all runs, ``n_constraints_used`` the largest.
    confidence : float
    params : dict
        The sampler's settings (chains, groups, level probability, moves) and the root seed
        (``seed_entropy``, ``seed_spawn_key``: ``SeedSequence(seed_entropy,
        spawn_key=seed_spawn_key)`` reruns the same draws).
    """

    token_ids: np.ndarray
    log_share: np.ndarray
    log_lower: np.ndarray
    log_upper: np.ndarray
    std_err: np.ndarray
    side: np.ndarray
    n_levels: np.ndarray
    n_constraints_used: np.ndarray
    n_full_checks: np.ndarray
    log_check_fraction: np.ndarray
    seconds: np.ndarray
    n_runs: np.ndarray
    confidence: float
    params: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-able summary (medians and counts; the per-token arrays stay in numpy), through
        :func:`embgeom._json.to_jsonable`: a median of no resolved token is ``None``."""
        from ._json import to_jsonable

        fin = np.isfinite(self.log_share)
        with np.errstate(invalid="ignore"):
            width = self.log_upper - self.log_lower
        return to_jsonable({
            "n_tokens": int(self.token_ids.size),
            "n_resolved": int(fin.sum()),
            "median_log_share": float(np.median(self.log_share[fin])) if fin.any() else float("nan"),
            "median_interval_width": float(np.median(width[fin])) if fin.any() else float("nan"),
            "median_seconds": float(np.median(self.seconds)) if self.seconds.size else float("nan"),
            "total_seconds": float(self.seconds.sum()),
            "total_runs": int(self.n_runs.sum()),
            "max_runs_taken": int(self.n_runs.max()) if self.n_runs.size else 0,
            "n_tokens_with_extra_runs": int((self.n_runs > 1).sum()),
            "sides": {str(s): int((self.side == s).sum()) for s in np.unique(self.side)},
            "confidence": self.confidence,
            **self.params,
        })


# --------------------------------------------------------------------------------------------
# one token's cone
# --------------------------------------------------------------------------------------------
class _Cone:
    """The constraints of one token's cone in the Gaussian coordinates ``x`` (``y = G x``)."""

    def __init__(self, WG32: np.ndarray, row_sq: np.ndarray, W32: np.ndarray, t: int):
        self.WG32 = WG32
        self.t = t
        V = WG32.shape[0]
        wt = WG32[t].astype(np.float64)
        dots = (WG32 @ WG32[t]).astype(np.float64)
        nsq = np.maximum(row_sq[t] + row_sq - 2.0 * dots, 0.0)
        # near-duplicates: recompute exactly (cancellation), then find exact ties
        scale = max(float(row_sq[t]), float(row_sq.max()) * 1e-12, 1e-300)
        near = np.flatnonzero(nsq <= 1e-6 * scale)
        tie = np.zeros(V, dtype=bool)
        for s in near:
            diff = wt - WG32[s].astype(np.float64)
            n2 = float(diff @ diff)
            nsq[s] = n2
            # a tie only where the rows of W G are equal: distinct float32 rows are distinct
            # cells in exact arithmetic, however small their difference against the largest row
            # (two rows 1e-20 times it, pointing opposite ways, used to tie; so did (1, 0.5e-25)
            # and (1, 2e-25), whose cells are quarter-planes). diff is exact for float32 rows
            # within 29 binary orders of each other, and non-zero for distinct ones beyond that.
            if s == t or n2 == 0.0 or np.array_equal(W32[s], W32[t]):
                tie[s] = True
        tie[t] = True
        self.empty = bool(np.any(np.flatnonzero(tie) < t))  # a tied lower id wins every tie
        norms = np.sqrt(nsq)
        self.inv_norm = np.where(tie, 0.0, 1.0 / np.where(tie, 1.0, norms))
        self.n_constraints = int(V - tie.sum())
        self.wt = wt
        self.zt_row = np.ascontiguousarray(WG32[t])

    def rows(self, S: np.ndarray) -> np.ndarray:
        """Normalised constraint rows ``a_s / |a_s|`` for ``s`` in ``S``: float64 (|S|, k)."""
        A = self.wt[None, :] - self.WG32[S].astype(np.float64)
        n = np.linalg.norm(A, axis=1)
        return A / n[:, None]

    def all_constraints(self) -> np.ndarray:
        """Token ids of every constraint (ties and ``t`` left out), int64."""
        return np.flatnonzero(self.inv_norm > 0)

    def scan(self, X: np.ndarray, k: int):
        """Check points against every row of ``W``.

        Returns the ``k`` smallest normalised margins per point (float64 (n, k), ascending) and
        their token ids (int64 (n, k)); the point is in the cell iff the first margin is >= 0.
        Up to :data:`FUSED_SCAN_POINTS` points take the fused kernel (one memory-bound pass over
        the rows), more the blocked products ``WG_block @ X.T`` (the orientation OpenBLAS runs
        fastest for few columns) folded by :func:`embgeom._rare_kernels.fold_smallest_margins_t`.
        """
        n = X.shape[0]
        X32 = np.ascontiguousarray(X, dtype=np.float32)
        zt = X32 @ self.zt_row
        best_val = np.full((n, k), np.inf)
        best_idx = np.full((n, k), -1, dtype=np.int64)
        if n <= FUSED_SCAN_POINTS:
            _rare_kernels.scan_smallest_margins(self.WG32, X32, zt, self.inv_norm, best_val, best_idx)
            return best_val, best_idx
        XT = np.ascontiguousarray(X32.T)
        V = self.WG32.shape[0]
        buf = np.empty((min(VOCAB_BLOCK, V), n), dtype=np.float32)
        for v0 in range(0, V, VOCAB_BLOCK):
            wb = self.WG32[v0 : v0 + VOCAB_BLOCK]
            out = buf[: wb.shape[0]]
            np.matmul(wb, XT, out=out)
            _rare_kernels.fold_smallest_margins_t(out, zt, self.inv_norm[v0 : v0 + VOCAB_BLOCK], v0, best_val, best_idx)
        return best_val, best_idx


    def check(self, X: np.ndarray, k: int, known: np.ndarray):
        """:meth:`scan` for the chains of a full check, screened first by the rows ``known``.

        A point with a negative margin on a row of ``known`` (token ids: constraints that cut
        off earlier chains of this token) is outside the cell, and the ``k`` smallest margins
        over ``known`` are returned for it; only the points that pass every row of ``known`` are
        scanned against all of ``W``. The verdict (first margin >= 0) is the scan's, at a
        fraction of its cost when most chains fall on rows already seen. Returns ``(val, ids,
        scanned)``, ``scanned`` (bool (n,)) the points scanned against all of ``W``.
        """
        n = X.shape[0]
        if known.size == 0 or n == 0:
            val, ids = self.scan(X, k)
            return val, ids, np.ones(n, dtype=bool)
        X32 = np.ascontiguousarray(X, dtype=np.float32)
        zt = X32 @ self.zt_row
        val = np.full((n, k), np.inf)
        ids = np.full((n, k), -1, dtype=np.int64)
        ZT = np.ascontiguousarray(self.WG32[known] @ X32.T)
        _rare_kernels.fold_smallest_margins_t(ZT, zt, self.inv_norm[known], 0, val, ids)
        ids = np.where(ids >= 0, known[np.maximum(ids, 0)], -1)
        scanned = val[:, 0] >= 0
        if scanned.any():
            val[scanned], ids[scanned] = self.scan(X[scanned], k)
        return val, ids, scanned


#: Cones of at most this many dimensions (``k``, the range of ``G``) are measured exactly
#: (:func:`_planar_log_measure`), not sampled.
EXACT_MAX_DIM = 2


def _exact_normal(cone: _Cone, s: int):
    """``w_t - w_s`` (rows of ``W G`` in float32) as two exact fractions: float64 differences of
    float32 values lose digits once their exponents differ by more than 29 bits."""
    from fractions import Fraction

    return tuple(Fraction(float(cone.wt[c])) - Fraction(float(cone.WG32[s, c])) for c in (0, 1))


def _exact_cross_dot(a, b) -> tuple[float, float]:
    """``a x b`` and ``a . b`` of two exact 2-vectors (fractions), each rounded once."""
    return float(a[0] * b[1] - a[1] * b[0]), float(a[0] * b[0] + a[1] * b[1])


#: Normals whose float angles are closer than this (rad) are put in order exactly.
_ANGLE_TIE = 1e-13


def _planar_log_measure(cone: _Cone) -> float:
    """Exact ``log P(x in C_t)`` (nats) of a cone in ``k <= 2`` dimensions, ``x ~ N(0, I_k)``.

    The Gaussian measure of a cone is the uniform measure of its directions. ``k = 1``: the
    constraints ``a_s x >= 0`` (scalars) leave the half-line of their common sign, share 1/2,
    or only the origin (-inf); no constraint leaves all of R, share 1. ``k = 2``: each
    constraint keeps a half-circle of directions; the normals ``a_s`` leave an arc only when
    they lie in an open half-circle, i.e. when the turn from one normal to the next (in angle
    order) exceeds pi somewhere, and the arc's angle is that turn less pi:
    ``atan2(|a_i x a_j|, -a_i . a_j)`` for the two normals ``a_i, a_j`` that bound it. The
    normals are exact (fractions of the float32 rows), their angle order is exact (float angles
    closer than :data:`_ANGLE_TIE` are ordered by the sign of their exact cross product, so
    normals whose angles round alike cannot swap), and the turn's sign and the cross and dot
    products are exact before one rounding: a wedge ``1e-15`` of the circle keeps about 15
    digits, and an empty cell is never given a share. Share: the angle over ``2 pi``. Ties
    (``inv_norm == 0``) are no constraints. O(V log V) per token.
    """
    import functools

    live = np.flatnonzero(cone.inv_norm > 0)
    if live.size == 0:
        return 0.0
    A = cone.wt[None, :] - cone.WG32[live].astype(np.float64)  # rounded: the angle order only
    if A.shape[1] == 1:  # a float difference has the exact sign of the exact one
        a = A[:, 0]
        return math.log(0.5) if bool(np.all(a > 0) or np.all(a < 0)) else -math.inf
    n = A.shape[0]
    ang = np.arctan2(A[:, 1], A[:, 0])
    srt = np.sort(ang)
    gaps = np.diff(np.concatenate([srt, srt[:1] + 2 * math.pi]))
    g = int(np.argmax(gaps))
    # angles from the middle of the widest gap: no run of near-equal angles wraps around
    rel = np.mod(ang - (srt[g] + 0.5 * gaps[g]), 2 * math.pi)
    order = np.argsort(rel, kind="stable")
    exact = {}

    def normal(i):
        if i not in exact:
            exact[i] = _exact_normal(cone, int(live[i]))
        return exact[i]

    def ccw(i, j):  # i before j when j is counter-clockwise of i (they are < pi apart)
        a, b = normal(i), normal(j)
        c = a[0] * b[1] - a[1] * b[0]
        return -1 if c > 0 else (1 if c < 0 else 0)

    r = rel[order]
    runs = np.flatnonzero(np.diff(r) > _ANGLE_TIE) + 1
    for lo, hi in zip(np.r_[0, runs], np.r_[runs, n]):
        if hi - lo > 1:
            order[lo:hi] = sorted(order[lo:hi].tolist(), key=functools.cmp_to_key(ccw))
    # candidate turns: consecutive normals (the last to the first across the origin of rel)
    # whose float turn is near or above pi; at most one exceeds pi exactly, and an empty cell's
    # turns are all at most pi. Two may round to pi (a wedge of 1e-31): the exact sign decides.
    i, j = int(order[-1]), int(order[0])
    if i == j or (ccw(i, j) == 0 and _exact_cross_dot(normal(i), normal(j))[1] > 0):
        return math.log(0.5)  # one normal, or all of one direction: a half-plane
    rs = rel[order]
    cands = [(int(order[k]), int(order[k + 1])) for k in
             np.flatnonzero(np.diff(rs) >= math.pi - 1e-12)]
    if 2 * math.pi - (rs[-1] - rs[0]) >= math.pi - 1e-12:
        cands.append((i, j))
    for a, b in cands:
        cr, dt = _exact_cross_dot(normal(a), normal(b))
        if cr < 0.0:  # the turn from a_a counter-clockwise to a_b exceeds pi
            return math.log(math.atan2(-cr, -dt)) - math.log(2 * math.pi)
    return -math.inf


# --------------------------------------------------------------------------------------------
# the splitting sampler
# --------------------------------------------------------------------------------------------
def _bounce_cap(M: int, k: int) -> int:
    """Reflections allowed per trajectory with ``M`` working constraints in ``k`` dimensions:
    ``BOUNCE_WORK / (M + k)`` within ``[MAX_BOUNCES, MAX_BOUNCES_CHEAP]``.

    A cone far thinner than wide needs thousands of reflections per quarter-turn; rejecting
    them shortens the HMC time until the chains hardly mix. With few constraints they cost
    little: a wedge 8,192 times thinner than wide, rotated into 16-d (3 rows), went from 0.15
    nats low with coverage 0.65 at a cap of 1,000 to 0.01 and 1.00 (20 seeds, 3x the time); at
    2^16 in 8-d to +0.00 and 0.90. At SmolLM2's size (``M + k >= 600``) the cap stays within
    a few thousand, and no trajectory there came near 1,000.
    """
    return int(min(MAX_BOUNCES_CHEAP, max(MAX_BOUNCES, BOUNCE_WORK // max(M + k, 1))))


def _stalled(gammas: list) -> bool:
    """Whether the levels have stopped approaching the cone (an empty cone's sign).

    For a non-empty cone ``gamma`` reaches 0 in a few levels with steady relative steps; for an
    empty one it converges to a positive limit. Stalled: the last four levels all positive and
    less than 10% lower than three levels before.
    """
    if len(gammas) < 4 or min(gammas[-4:]) <= 0.0:
        return False
    return gammas[-4] >= gammas[-1] >= 0.9 * gammas[-4]


class _GramBuffer:
    """One Gram-matrix buffer that the working sets of a call's tokens reuse, one after another
    (:func:`measure_cones`): a token's pilot writes its corner, its counted runs read it, and the
    next token overwrites it. Every entry a working set reads (its ``M x M`` corner) is written
    when its rows join, so the buffer is never cleared. A fresh ``cap x cap`` array per token
    cost a page fault per 4 KiB of the corner it used, every token (0.1 s per SmolLM2 token
    here: 2,000 constraints touch 32 MB)."""

    def __init__(self):
        self.buf = np.empty((0, 0))

    def get(self, cap: int) -> np.ndarray:
        if self.buf.shape[0] < cap:
            self.buf = np.empty((cap, cap))
        return self.buf


class _Constraints:
    """The working set: unit constraint rows, their shifts and Gram matrix, in growing buffers.

    Rows only join (with shift ``inf``) and shifts only decrease, so the domains
    ``{x : A x + shift >= 0}`` are nested whatever joins when.
    """

    def __init__(self, cone: _Cone, capacity: int, gram: bool,
                 gram_buffer: _GramBuffer | None = None):
        self.cone = cone
        self.gram_buffer = gram_buffer
        self.cap = capacity
        self.M = 0
        self.in_S = np.zeros(cone.WG32.shape[0], dtype=bool)
        self._ids = np.zeros(0, dtype=np.int64)
        self._A = np.zeros((0, cone.WG32.shape[1]))
        self._A32 = np.zeros((0, cone.WG32.shape[1]), dtype=np.float32)
        self._shift = np.zeros(0)
        self._gram = np.zeros((0, 0)) if gram else None
        self.frozen = False  # a copy (:meth:`copy`) shares its rows and takes none

    @property
    def A(self) -> np.ndarray:
        return self._A[: self.M]

    @property
    def A32(self) -> np.ndarray:
        """:attr:`A` rounded to float32: the moves' velocity products (:meth:`_Splitter.moves`)."""
        return self._A32[: self.M]

    @property
    def shift(self) -> np.ndarray:
        return self._shift[: self.M]

    @property
    def ids(self) -> np.ndarray:
        """Token ids of the constraints, in the order they joined."""
        return self._ids[: self.M]

    @property
    def gram(self) -> np.ndarray:
        return self._gram[: self.M, : self.M]

    def lower_shifts(self, gamma: float):
        np.minimum(self._shift[: self.M], gamma, out=self._shift[: self.M])

    def copy(self) -> "_Constraints":
        """The same rows and Gram matrix with every shift at ``inf``: the working set a later
        run of the same token starts from (:func:`_token_runs`), without recomputing them.

        The copy shares the rows, ids and Gram matrix with this set (no copy of a
        Gram matrix of up to ``max_constraints^2`` float64: 128 MiB at 4096) and owns
        only its shifts; it is *frozen*: a counted run never adds a constraint (its domains
        must be fixed before it draws), and :meth:`add` on a frozen set raises.
        """
        new = object.__new__(_Constraints)
        new.cone, new.cap, new.M = self.cone, self.cap, self.M
        new.gram_buffer = self.gram_buffer
        new._ids, new._A, new._gram = self._ids, self._A, self._gram  # rows past M: not its own
        new._A32 = self._A32
        new.in_S = self.in_S.copy()  # |V| bools: a later row of this set is not the copy's
        new._shift = np.full_like(self._shift, np.inf)
        new.frozen = True
        return new

    def _grow(self, need: int):
        size = self._A.shape[0]
        if need <= size:
            return
        new = min(self.cap, max(need, 2 * size, 256))
        k = self._A.shape[1]
        for name, shape in (("_A", (new, k)), ("_A32", (new, k)), ("_shift", (new,)), ("_ids", (new,))):
            old = getattr(self, name)
            buf = np.zeros(shape, dtype=old.dtype)
            buf[: self.M] = old[: self.M]
            setattr(self, name, buf)
        if self._gram is not None and self._gram.shape[0] < new:
            # allocated once at full capacity: np.zeros maps untouched pages lazily, so only the
            # used corner costs memory, and no copy is made as the set grows; with a
            # _GramBuffer, the call's one buffer (its corner is written as rows join)
            if self.gram_buffer is not None and self.cap <= MAX_GRAM:
                buf = self.gram_buffer.get(self.cap)
            else:
                buf = np.zeros((self.cap, self.cap))
            if buf is not self._gram:
                buf[: self.M, : self.M] = self._gram[: self.M, : self.M]
            self._gram = buf

    def add(self, ids: np.ndarray) -> int:
        """Add the constraints of these token ids (``-1`` and members are skipped); returns how many."""
        if self.frozen:
            raise RuntimeError("a counted run's working set is fixed before it draws")
        ids = np.unique(ids[ids >= 0])
        ids = ids[~self.in_S[ids]][: self.cap - self.M]
        n = ids.size
        if n == 0:
            return 0
        self._grow(self.M + n)
        M0, M1 = self.M, self.M + n
        rows = self.cone.rows(ids)
        self._A[M0:M1] = rows
        self._A32[M0:M1] = rows
        self._shift[M0:M1] = np.inf
        self._ids[M0:M1] = ids
        if self._gram is not None:
            cross = self._A[:M0] @ rows.T
            self._gram[:M0, M0:M1] = cross
            self._gram[M0:M1, :M0] = cross.T
            self._gram[M0:M1, M0:M1] = rows @ rows.T
        self.in_S[ids] = True
        self.M = M1
        return n


def _replace_killed(inside: np.ndarray, n_groups: int, rng: np.random.Generator):
    """Which chains a level kills, and the survivors their replacements copy.

    Adaptive multilevel splitting keeps the survivors of a level where they are and replaces
    every killed chain (``~inside``) by a copy of a survivor drawn uniformly, with replacement,
    from its own group; only the copies are then moved (Cerou and Guyader 2007; Brehier,
    Gazeau, Goudenege, Lelievre, Rousset 2016, who show the product of the levels' survival
    fractions is then an unbiased estimate of ``p`` when the copies are moved to exact draws).
    A group with no survivor copies from the pooled survivors (the caller guarantees >= 1).

    Returns
    -------
    dest, src : numpy.ndarray of int64, shape (n_killed,)
        Chain ``dest[i]`` becomes a copy of chain ``src[i]``.
    """
    N = inside.size
    nb = N // n_groups
    pooled = np.flatnonzero(inside)
    dest, src = [], []
    for g in range(n_groups):
        blk = inside[g * nb : (g + 1) * nb]
        kill = g * nb + np.flatnonzero(~blk)
        if kill.size == 0:
            continue
        surv = g * nb + np.flatnonzero(blk)
        dest.append(kill)
        src.append(rng.choice(surv if surv.size else pooled, size=kill.size, replace=True))
    if not dest:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(dest), np.concatenate(src)


def _level(m: np.ndarray, counted: np.ndarray, n_rank: int):
    """The next level of adaptive multilevel splitting on the level values ``m``.

    As in Brehier et al. (2016), the level is the largest value among the chains it kills (the
    ``(n_rank + 1)``-th largest counted ``m``, ``-gamma``), and the next domain is the open
    ``{m > -gamma}``: every chain at or below the level is killed (ties included: generalized
    AMS), so about ``n_rank`` survive. Then the product of the recorded fractions is unbiased
    for ``p`` under exact moves. Placing the level at the smallest survivor instead (the
    closed ``{m >= n_rank-th largest}``) shrinks every domain by one order statistic while the
    recorded fraction stays ``n_rank / N``: an exact simulation (20 levels, 128 chains) puts
    that product ``e^0.22`` too high (docs/theory.md, section 5.1). ``gamma`` never goes below
    0; at 0 the domain is the closed cone ``{m >= 0}``, the last level.

    Returns ``(gamma, inside, strict)``: ``inside`` the counted survivors (bool), ``strict``
    whether the domain is open (False at ``gamma == 0``, and when every counted chain ties at
    the top, which would kill them all: then the closed domain keeps the ties).
    """
    q = np.partition(-m[counted], n_rank)[n_rank]  # (n_rank + 1)-th largest counted m is -q
    gamma = max(0.0, float(q))
    if gamma == 0.0:
        return gamma, (m >= 0.0) & counted, False
    inside = (m > -gamma) & counted
    if not inside.any():
        return gamma, (m >= -gamma) & counted, False
    return gamma, inside, True


class _Splitter:
    """Multilevel splitting for one cone: the state of one run of :func:`_split_token`.

    ``X`` holds the ``n_chains`` chains (``n_groups`` groups of consecutive chains), ``cs`` the
    working set, ``counts``/``sizes`` per recorded level the survivors and trials per group,
    ``n_checked`` the points checked against every row of ``W`` and ``log_check`` the log of
    the accepted full-check fraction (0 without a working set). Every draw comes from ``rng``,
    in a fixed order: the start, then per level the resampling of the killed chains and their
    moves, so a seed reruns the same run bit for bit.

    ``initial``: the working set to start from, chosen before this run (a token's earlier runs,
    :func:`_token_runs`: a :class:`_Constraints` with every shift ``inf``); the run then probes
    nothing, and every chain counts. ``known``: sorted token ids of rows that cut off earlier
    chains, which screen the full check (:meth:`_Cone.check`; the screen changes no verdict).
    ``seen`` (bool (V,)) marks every row among a probed or checked point's :data:`CHECK_K`
    smallest margins: this run's later checks and a later run's ``known`` are screened by them.
    """

    def __init__(self, cone: _Cone, rng: np.random.Generator, *, n_chains: int, n_groups: int,
                 level_prob: float, n_moves: int, move: str, working: bool, full_check: bool,
                 max_constraints: int, probe_k: int, n_probes: int, min_full_fraction: float,
                 max_levels: int, initial: _Constraints | None = None,
                 known: np.ndarray | None = None, gram_buffer: _GramBuffer | None = None):
        self.cone, self.rng = cone, rng
        self.n_moves, self.move, self.working, self.full_check = n_moves, move, working, full_check
        self.max_constraints, self.probe_k = max_constraints, probe_k
        self.check_k = max(probe_k, CHECK_K)
        self.min_full_fraction, self.max_levels = min_full_fraction, max_levels
        self.k = cone.WG32.shape[1]
        self.N, self.B = n_chains, n_groups
        nb = n_chains // n_groups
        self.group = np.repeat(np.arange(n_groups), nb)
        self.X = rng.standard_normal((n_chains, self.k))
        self.counts, self.sizes = [], []  # per recorded level: survivors and trials, per group
        self.n_checked = 0
        self.log_check = 0.0  # log of the accepted full-check fraction (0 without a working set)

        if working and initial is not None:
            self.cs = initial
        else:
            # without a working set every constraint is in from the start, whatever the cap:
            # capped at max_constraints, the rows past it were dropped (a cone too wide, and
            # "two-sided" all the same: -4.9 instead of -6.93 nats for 4,511 rows at the cap)
            self.cs = _Constraints(cone, max_constraints if working else cone.n_constraints,
                                   gram=(move == "hmc"), gram_buffer=gram_buffer)
            if not working:
                self.cs.add(cone.all_constraints())
        self.known = np.zeros(0, dtype=np.int64) if known is None else known
        # rows seen by this run, as a mask over the vocabulary: a union of sorted id arrays
        # grew with every check (CHECK_K ids per chain) and cost a tenth of a run in sorting
        self.seen = np.zeros(cone.WG32.shape[0], dtype=bool)

        # one chain in each of the first n_probes groups; none with a working set given up front
        self.probing = working and initial is None
        self.probe_idx = np.arange(n_probes if self.probing else 0) * nb
        self.counted = np.ones(n_chains, dtype=bool)
        if self.probing:
            # a probe's position chose constraints that cut it: counting it would bias the level's
            # fraction down, so probes sit out the count (and the resampling) of their level
            self.counted[self.probe_idx] = False
        n_counted = self.counted.sum()
        self.n_rank = min(int(n_counted) - 1, max(1, int(math.ceil(level_prob * n_counted))))
        self.gammas = []  # levels since the last emptiness LP
        self.next_lp = EMPTY_CHECK_LEVELS
        self.t_max = 0.5 * math.pi  # HMC time; halved while trajectories hit MAX_BOUNCES
        self.warned = False  # the too-thin-cone warning (moves), once per run

    def probe(self):
        """Check one chain in each of the first ``n_probes`` groups against every row of ``W``;
        the constraints that cut a probe off from the cone join the working set."""
        X, cs, idx = self.X, self.cs, self.probe_idx
        val, ids = self.cone.scan(X[idx], self.probe_k)
        self.n_checked += idx.size
        self._see(ids)
        # constraints that bind harder at the probe than every one in the working set
        m_S = (X[idx] @ cs.A.T).min(axis=1) if cs.M else np.full(idx.size, np.inf)
        cs.add(np.where(val < np.minimum(m_S, 0.0)[:, None], ids, -1).ravel())

    def sync(self, P: np.ndarray) -> np.ndarray:
        """Constraint values of the chains, extended to the constraints added since."""
        cs = self.cs
        if P.shape[1] < cs.M:
            P = np.hstack([P, self.X @ cs.A[P.shape[1]:].T])
        return np.ascontiguousarray(P)

    def moves(self, X, P, t_max=None):
        """``n_moves`` exact moves of every chain inside the working set's current domain
        (HMC with reflections for time ``min(t_max, self.t_max)``, or LIN-ESS); ``X`` and ``P``
        are updated in place and returned.

        A trajectory that needs more reflections than :func:`_bounce_cap` allows (at least
        :data:`MAX_BOUNCES`) is rejected (the chain stays:
        :func:`embgeom._rare_kernels.hmc_trajectories`). When more than
        :data:`MAX_REJECTED` of a move's trajectories are, the run's HMC time ``self.t_max``
        halves for every later move: a cone far thinner than wide (an origin ellipsoid with
        axis ratio 1e7) reflects a quarter-turn thousands of times, and the chains would never
        move. The time is chosen from the levels before, so each level's kernel stays exact.
        Below :data:`HMC_MIN_TIME` a RuntimeWarning says the estimate may be biased low.
        """
        cs, rng = self.cs, self.rng
        n = X.shape[0]
        t = self.t_max if t_max is None else min(t_max, self.t_max)
        cap = _bounce_cap(cs.M, self.k)
        for _ in range(self.n_moves):
            nu = rng.standard_normal((n, self.k))
            # the velocities' constraint values in float32 (half the time of float64): their
            # relative error, ~1e-7, is the decoder's own float32 precision, and it only moves
            # the trajectory's reflection times by as much (the chains' positions and
            # constraint values stay float64)
            Q = np.matmul(nu.astype(np.float32), cs.A32.T).astype(np.float64)
            if self.move == "hmc":
                b = _rare_kernels.hmc_trajectories(X, nu, P, Q, cs.A, cs.gram, cs.shift, t, cap)
                if n and np.count_nonzero(b >= cap) > MAX_REJECTED * n:
                    self.t_max *= 0.5
                    if self.t_max < HMC_MIN_TIME and not self.warned:
                        import warnings

                        self.warned = True
                        warnings.warn(
                            f"rare-event: the cone of token {self.cone.t} is too thin for the "
                            f"HMC moves (over {MAX_REJECTED:.0%} of trajectories need "
                            f"{cap} reflections at time {self.t_max:.1e}): its chains "
                            "hardly mix and its estimate may be low by more than its interval "
                            "(a wedge 2^16 times thinner than wide: 0.2-0.6 nats)", RuntimeWarning,
                            stacklevel=2)
            else:
                theta = _rare_kernels.ess_angles(P, Q, cs.shift, rng.random(n))
                c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]
                X = X * c + nu * s
                P = P * c + Q * s
        return X, P

    def _record(self, kept, tried):
        """Record a level: its survivors ``kept`` among the trials ``tried``, counted per group."""
        self.counts.append(np.bincount(self.group[kept], minlength=self.B))
        self.sizes.append(np.bincount(self.group[tried], minlength=self.B))

    def proven_empty(self) -> bool:
        """The emptiness LP on the working-set cone, after :data:`EMPTY_CHECK_LEVELS` levels, at
        every doubling after, and whenever the levels stall (:func:`_stalled`)."""
        L = len(self.counts)
        if L >= self.next_lp or (L >= 8 and _stalled(self.gammas)):
            if cone_is_empty(self.cs.A):
                return True
            self.next_lp = 2 * max(L, self.next_lp // 2)
            self.gammas.clear()
        return False

    def step(self, P: np.ndarray):
        """Record the next level on the working set's margins: lower the shifts to its
        ``gamma``. Returns ``(P, gamma, inside)`` (``inside``: the counted survivors)."""
        P = self.sync(P)
        m = P.min(axis=1) if self.cs.M else np.full(self.N, np.inf)
        gamma, inside, _ = _level(m, self.counted, self.n_rank)
        self.cs.lower_shifts(gamma)
        self.gammas.append(gamma)
        self._record(inside, self.counted)
        return P, gamma, inside

    def resample(self, P: np.ndarray, inside: np.ndarray):
        """Replace the killed chains by copies of survivors of their group and move the copies
        (``X`` and ``P`` in place)."""
        dest, src = _replace_killed(inside, self.B, self.rng)
        self.X[dest], P[dest] = self.moves(self.X[src], P[src])

    def _see(self, ids: np.ndarray) -> None:
        ids = ids.ravel()
        self.seen[ids[ids >= 0]] = True

    def check_known(self) -> np.ndarray:
        """The rows that screen this run's next full check (:meth:`_Cone.check`): ``known``
        (earlier runs) and the rows this run has seen, less the working set; sorted ids."""
        mask = self.seen.copy()
        mask[self.known] = True
        mask &= ~self.cs.in_S
        return np.flatnonzero(mask)

    def at_cone(self, P: np.ndarray, inside: np.ndarray, side: str, sel: np.ndarray, checked):
        """The chains are in the working-set cone (``gamma == 0``): the full check of the chains
        ``sel`` (the counted survivors), whose :meth:`_Cone.check` is ``checked`` (``val, ids,
        n_scanned``; :data:`CHECK_K` margins per chain).

        Returns the run's side when the run ends here, ``None`` when the levels go on (the
        constraints the checked chains break have joined the working set).
        """
        cs = self.cs
        val, ids, n_scanned = checked
        self.n_checked += n_scanned
        self._see(ids)
        val, ids = val[:, : self.probe_k], ids[:, : self.probe_k]  # the ones that may join
        ok = val[:, 0] >= 0
        self.log_check = math.log(ok.mean()) if ok.any() else -np.inf
        if cs.M >= self.max_constraints or (not self.probing and ok.mean() < self.min_full_fraction):
            # A run that did not choose its working set (a token's counted run, from the
            # pilot's set) never adds constraints picked from its own chains: those would cut
            # exactly the chains then counted, and the next levels would place their domains
            # too wide for the recorded fractions (on SmolLM2 the pilot's own estimate of its
            # final cone, -9.0 nats, was 0.7 below the plain estimate of that cone, -8.3); a
            # too small last step is split on the margin over all of W instead, as when the
            # working set is full.
            # The working set is full: the cell's share of its cone can be anything, and one
            # check of chains that descend from a few ancestors is no estimate of it (a small
            # step left to a couple of hits errs high, and a token with none is unresolved).
            # Go on splitting inside the working-set cone with levels on the margin over all
            # of W.
            return self.full_levels(self.sync(P), inside)
        if ok.mean() >= self.min_full_fraction:
            self._record(sel[ok], sel)
            return side
        cs.add(np.where(val[~ok] < 0, ids[~ok], -1).ravel())
        return None

    def full_levels(self, P: np.ndarray, inside: np.ndarray) -> str:
        """Splitting levels on the margin over all of ``W``, inside the working-set cone.

        The domains ``cone(S) & {min_s a_s.x / |a_s| >= -gamma}`` shrink to the cell as ``gamma``
        falls to 0 (each level keeps ``n_rank`` chains); moves are the working-set moves (exact
        inside ``cone(S)``) with a move that leaves the level's domain rejected (a Metropolis
        step, so each level's law stays invariant). Appends to ``counts``/``sizes``, adds the
        points it checks to ``n_checked`` and sets ``log_check``, the log of the cell's
        estimated share of ``cone(S)``. Returns the run's side.
        """
        cone, rng, X, B, counted = self.cone, self.rng, self.X, self.B, self.counted
        dest, src = _replace_killed(inside, B, rng)
        X[dest], P[dest] = self.moves(X[src], P[src])  # the chains outside cone(S) replaced
        first = len(self.counts)
        v, _ = cone.scan(X, 1)
        mf, n_checked, side = v[:, 0], X.shape[0], "two-sided"
        t_max = 0.5 * math.pi  # HMC time: shortened while most moves leave the level's domain
        while True:
            if len(self.counts) >= self.max_levels:
                side = "unresolved"
                break
            gamma, ins, strict = _level(mf, counted, self.n_rank)
            self._record(ins, counted)
            if gamma == 0.0:
                break
            dest, src = _replace_killed(ins, B, rng)
            Xn, Pn = self.moves(X[src], P[src], t_max)  # the copies only
            v, _ = cone.scan(Xn, 1)
            n_checked += Xn.shape[0]
            # left the level's domain: stay at the copied point
            back = (v[:, 0] <= -gamma) if strict else (v[:, 0] < -gamma)
            Xn[back], Pn[back] = X[src[back]], P[src[back]]
            X[dest], P[dest] = Xn, Pn
            mf[dest] = np.where(back, mf[src], v[:, 0])
            # a small working-set cone around a much smaller cell rejects long trajectories, and
            # chains that never move leave the levels stalled on ties: adapt the time between
            # levels (each level's kernel is still exact and reversible)
            accepted = 1.0 - float(back.mean())
            if accepted < 0.25:
                t_max *= 0.5
            elif accepted > 0.6:
                t_max = min(2.0 * t_max, 0.5 * math.pi)
        self.n_checked += n_checked
        if len(self.counts) == first:  # max_levels reached before a level of its own
            self.log_check = -np.inf
            return "unresolved"
        c = np.array(self.counts[first:], float).sum(1) / np.array(self.sizes[first:], float).sum(1)
        self.log_check = float(np.log(c).sum()) if np.all(c > 0) else -np.inf
        return side

    def run(self) -> tuple:
        """The levels until the cone (checked against every row of ``W`` with a working set),
        the level cap or an emptiness proof; returns :meth:`result`."""
        steps = self.steps()
        try:
            X = next(steps)
            while True:
                val, ids, scanned = self.cone.check(X, self.check_k, self.check_known())
                X = steps.send((val, ids, int(scanned.sum())))
        except StopIteration as stop:
            return stop.value

    def steps(self):
        """:meth:`run` as a generator: it yields the chains of each full check (float64 (n, k))
        and takes back their :meth:`_Cone.check` (:data:`CHECK_K` margins, screened by
        :meth:`check_known`), so that :func:`_token_runs` can check the chains of several runs
        in one pass over ``W``; it returns :meth:`result`."""
        if self.probing:
            self.probe()
        elif (not self.working and self.cs.M * self.k <= EARLY_LP_WORK
              and cone_is_empty(self.cs.A)):
            # every constraint is in and the LP is small: an empty cone is proved before any
            # level (its levels shrink towards the apex without stalling, with trajectories of
            # up to MAX_BOUNCES_CHEAP reflections: 40 s per empty 3-d cell at 256 chains)
            return -np.inf, 0.0, "empty", 0, self.cs.M, self.n_checked, 0.0
        side = "two-sided" if (not self.working or self.full_check) else "upper"
        P = np.zeros((self.N, 0))
        while True:
            if len(self.counts) >= self.max_levels:
                side = "unresolved"
                break
            if self.proven_empty():
                return -np.inf, 0.0, "empty", len(self.counts), self.cs.M, self.n_checked, 0.0
            P, gamma, inside = self.step(P)
            if gamma == 0.0:
                if not self.working or not self.full_check:
                    break
                sel = np.flatnonzero(inside)
                checked = yield self.X[sel]
                end = self.at_cone(P, inside, side, sel, checked)
                if end is not None:
                    side = end
                    break
            P = self.sync(P)  # constraints added by a failed full check: their values at these X
            self.resample(P, inside)
            if self.probing and len(self.counts) % PROBE_EVERY == 0:
                self.probe()
        return self.result(side)

    def result(self, side: str) -> tuple:
        """``(log_p, std_err, side, n_levels, |S|, n_checked, log_check)`` from the recorded
        levels: ``log p`` the sum of the logs of the pooled fractions, its error from the
        spread of the groups' linearised contributions."""
        B, M, n_checked, log_check = self.B, self.cs.M, self.n_checked, self.log_check
        counts = np.array(self.counts, dtype=np.float64)  # (L, B)
        sizes = np.array(self.sizes, dtype=np.float64)
        r = counts.sum(1) / sizes.sum(1)  # pooled fraction per level
        n_levels = int(r.size)
        if not np.all(r > 0):  # no chain survived the last level: only the levels before bound p
            return float(np.log(r[r > 0]).sum()), np.inf, "unresolved", n_levels, M, n_checked, log_check
        # linearised influence of each group: log p_hat - log p ~ (1/B) sum_b sum_k e_bk
        nbar = sizes.mean(1, keepdims=True)
        e = ((counts - r[:, None] * sizes) / (r[:, None] * nbar)).sum(0)
        se = SE_INFLATION * float(np.std(e, ddof=1) / math.sqrt(B))
        # No bias correction here: with survivors kept, only the copies moved and the level at the
        # largest killed value, the product of the fractions is unbiased for p (Brehier et al.
        # 2016), so its log is low by about var / 2 (tests/test_rare_event.py pins both); a mean of
        # logs removes that first-order bias itself (CellVolumes.cell_volume_rate).
        log_p = float(np.log(r).sum())
        return log_p, se, side, n_levels, M, n_checked, log_check


def _split_token(cone: _Cone, rng: np.random.Generator, *, n_chains: int, n_groups: int,
                 level_prob: float, n_moves: int, move: str, working: bool, full_check: bool,
                 max_constraints: int, probe_k: int, n_probes: int, min_full_fraction: float,
                 max_levels: int):
    """Multilevel splitting for one cone (:class:`_Splitter`). Returns ``(log_p, std_err, side,
    n_levels, |S|, n_checked, log_check)``."""
    return _Splitter(
        cone, rng, n_chains=n_chains, n_groups=n_groups, level_prob=level_prob,
        n_moves=n_moves, move=move, working=working, full_check=full_check,
        max_constraints=max_constraints, probe_k=probe_k, n_probes=n_probes,
        min_full_fraction=min_full_fraction, max_levels=max_levels).run()


def _check_tokens(token_ids, V: int) -> np.ndarray:
    if token_ids is None:
        return np.arange(V, dtype=np.int64)
    t = np.asarray(token_ids)
    if t.ndim == 0:
        t = t[None]
    if t.ndim != 1 or t.size == 0:
        raise ValueError(f"token_ids: expected a non-empty 1-D array of token ids, got shape {t.shape}")
    if t.dtype.kind not in "iu":
        raise TypeError(f"token_ids: expected integers, got dtype {t.dtype}")
    if t.min() < 0 or t.max() >= V:
        raise ValueError(f"token_ids: expected ids in [0, {V}), got values in [{t.min()}, {t.max()}]")
    return t.astype(np.int64)


def _token_seed(root: np.random.SeedSequence, t: int) -> np.random.SeedSequence:
    """The stream of token ``t``: the child of key ``t`` of ``root``, spawn key included."""
    return np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, t),
                                  pool_size=root.pool_size)


def _seed_record(root: np.random.SeedSequence) -> dict:
    """JSON-able ``seed_entropy`` (an int or a list of ints) and ``seed_spawn_key`` of ``root``:
    ``SeedSequence(seed_entropy, spawn_key=seed_spawn_key)`` is the same root again."""
    e = root.entropy
    entropy = int(e) if isinstance(e, (int, np.integer)) else [int(x) for x in e]
    return {"seed_entropy": entropy, "seed_spawn_key": [int(k) for k in root.spawn_key]}


def _check_settings(*, n_chains, n_groups, level_prob, n_moves, max_constraints, probe_k,
                    n_probes, min_full_fraction, max_levels, confidence, move, working_set,
                    seed, target_se=None, max_runs=32) -> tuple:
    """The tuning settings of :func:`log_cone_gaussian_measure`, checked (ValueError/TypeError
    naming the argument); also called by :func:`embgeom.cell_volumes` before its uniform pass."""
    n_chains = check_positive_int(n_chains, "n_chains")
    if n_chains > MAX_CHAINS:
        raise ValueError(f"n_chains: expected at most 2**20 ({MAX_CHAINS}) chains per run (the "
                         f"default is 128; for a tighter interval lower target_se or raise "
                         f"max_runs), got {n_chains:.3g}")
    n_groups = check_positive_int(n_groups, "n_groups", minimum=2)
    if n_chains % n_groups or n_chains // n_groups < 2:
        raise ValueError(f"n_chains: expected a multiple of n_groups={n_groups} with >= 2 chains per group (so {2 * n_groups}, {3 * n_groups}, ...), got {n_chains}")
    level_prob = check_probability(level_prob, "level_prob", open_right=True)
    n_moves = check_positive_int(n_moves, "n_moves")
    max_constraints = check_positive_int(max_constraints, "max_constraints")
    probe_k = check_positive_int(probe_k, "probe_k")
    n_probes = min(check_positive_int(n_probes, "n_probes", minimum=0), n_groups)
    min_full_fraction = check_probability(min_full_fraction, "min_full_fraction")
    max_levels = check_positive_int(max_levels, "max_levels")
    confidence = check_probability(confidence, "confidence", open_right=True)
    if target_se is not None:
        target_se = check_positive(target_se, "target_se")
    max_runs = check_positive_int(max_runs, "max_runs")
    if move not in ("hmc", "ess"):
        raise ValueError(f"move: expected 'hmc' or 'ess', got {move!r}")
    if working_set not in ("auto", True, False):
        raise ValueError(f"working_set: expected 'auto', True or False, got {working_set!r}")
    if seed is not None and not isinstance(seed, np.random.SeedSequence) and (
            isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise TypeError(f"seed: expected None, an int or a numpy SeedSequence, got {type(seed).__name__}")
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed < 0:
        raise ValueError(f"seed: expected an int >= 0 (a SeedSequence's entropy), got {seed}")
    return (n_chains, n_groups, level_prob, n_moves, max_constraints, probe_k, n_probes,
            min_full_fraction, max_levels, confidence, target_se, max_runs)


def log_cone_gaussian_measure(
    W,
    token_ids=None,
    G=None,
    *,
    n_chains: int = 1024,
    n_groups: int = 16,
    level_prob: float = 0.5,
    n_moves: int = 1,
    move: str = "hmc",
    working_set: str | bool = "auto",
    full_check: bool = True,
    max_constraints: int = 4096,
    probe_k: int = 8,
    n_probes: int = 4,
    min_full_fraction: float = 0.05,
    max_levels: int = 400,
    confidence: float = 0.95,
    seed=0,
    target_se: float | None = None,
    max_runs: int = 32,
    progress: bool = False,
) -> ConeMeasure:
    """Log Gaussian measure of decoder cones: each cell's share of an origin-centred ellipsoid.

    For every requested token ``t`` estimates ``log P(x in C_t)``, ``x ~ N(0, I_k)``,
    ``C_t = {x : (w_t - w_s)^T G x >= 0 for all s != t}``: the share of ``S = G B`` held by the
    decoder cell of ``t`` when the decoder has no bias (module docstring: multilevel splitting
    with exact elliptical slice sampling for linear constraints). A cone of ``k <= 2``
    dimensions (``d <= 2``, or a ``G`` of rank 1 or 2) is not sampled: its share is its angle,
    exactly (``side == "exact"``, an interval of width 0; the sampler's moves stop mixing in
    wedges ``2^16`` times thinner than wide, where the exact angle keeps its digits).

    Parameters
    ----------
    W : array_like of float32 or float64, shape (n_tokens, d)
        The unembedding (stored and multiplied in float32, as :class:`embgeom.cells.Decoder`).
    token_ids : array_like of int, shape (T,), optional
        Tokens to estimate; default every token.
    G : array_like of float, shape (d, k), optional
        The support's linear map (``S = G B``); default the identity (the origin ball: the radius
        does not change a cone's share). A rank-deficient ``G`` is reduced to its range
        (``G = U S V^T`` -> ``U_r S_r``: the same law of ``G x``).
    n_chains : int, default 1024
        Chains per token; the budget. The standard error of ``log p`` falls like
        ``1 / sqrt(n_chains)``. At most ``MAX_CHAINS`` (2**20).
    n_groups : int, default 16
        Independent groups of chains (>= 2; must divide ``n_chains``); their spread gives the
        interval.
    level_prob : float, default 0.5
        Conditional probability per level, in (0, 1).
    n_moves : int, default 1
        Moves per copied chain per level (>= 1).
    move : {"hmc", "ess"}, default "hmc"
        The exact move: reflected Hamiltonian trajectories of time ``pi / 2`` or LIN-ESS. Both
        leave the level's law invariant, but one LIN-ESS move per level barely decorrelates a
        copy from its survivor: on an orthant of share ``2^-10`` (128 chains, 40 seeds,
        ``target_se=0.2``) it erred -0.86 nats with coverage 0/40, -0.19 at ``n_moves=4``
        (HMC: -0.03, coverage 0.95). Kept for comparison, with a RuntimeWarning.
    working_set : {"auto", True, False}, default "auto"
        ``True``: constraints join a working set from probes and full checks (cheap for large
        vocabularies; the full check keeps the estimate exact). ``False``: every constraint
        from the start. ``"auto"``: a working set when the cone has more than
        ``min(max_constraints, 2048)`` constraints (:data:`AUTO_WORKING_SET`).
    full_check : bool, default True
        With a working set, check the final chains against every row of ``W`` (required for an
        unbiased estimate). ``False`` returns the working-set cone's measure, an upper bound on
        the share up to Monte Carlo error (``side == "upper"``).
    max_constraints : int, default 4096
        Cap on the working set (its Gram matrix, float64, grows with it: 128 MiB at 4,096). At
        2,048, 3 and 5 of two seeded samples of 16 SmolLM2 tokens (origin ball) reached the
        cap, and a counted run that meets a full working set splits on the margin over all of
        ``W``, a product with ``W`` per level; uncapped, their sets held 2,102-2,766 rows. On
        16 such tokens (128 chains, one thread) 4,096 cost 0.90 instead of 1.07 s per token at
        ``target_se=None`` and 1.81 instead of 2.33 at ``target_se=0.24``, with the same
        interval widths and mean log-share; 8,192 changed nothing.
    probe_k : int, default 8
        Smallest margins kept per checked point; the violated ones join the working set.
    n_probes : int, default 4
        Chains checked against every row of ``W`` after every :data:`PROBE_EVERY` levels of a
        token's first run (one per group; at most ``n_groups`` are used). A few points cost
        about as much as one: the scan reads all of ``W``.
    min_full_fraction : float, default 0.05
        The full check is accepted as the last level when at least this fraction of the
        working-set cone's chains is in the real cone. Otherwise, in the pilot (which accepts
        only from :data:`PILOT_MIN_FULL` up) the violated constraints join and the levels go
        on; in a counted run the levels go on with the margin over all of ``W``.
    max_levels : int, default 400
        Give up after this many levels (``level_prob ** max_levels``: about ``e^-277`` at 0.5).
    confidence : float, default 0.95
        Two-sided coverage of ``[log_lower, log_upper]``.
    seed : int, numpy.random.SeedSequence or None, default 0
        The root seed. Token ``t`` draws from the root's child of key ``t``:
        ``SeedSequence(root.entropy, spawn_key=(*root.spawn_key, t))`` (for an int ``s``,
        ``SeedSequence(s, spawn_key=(t,))``), so results do not depend on which other tokens are
        estimated, nor their order, and two spawned SeedSequences give independent runs.
        ``None``: fresh OS entropy (recorded in ``params``). A token's extra runs (``target_se``)
        draw from that stream's children: run ``j >= 1`` from ``SeedSequence(root.entropy,
        spawn_key=(*root.spawn_key, t, j - 1))``, what ``spawn`` on the token's stream gives.
    target_se : float or None, default None
        Target standard error of each ``log_share``, in nats (> 0). ``None``: one run of
        ``n_chains`` chains per token. Otherwise a token gets the chains its error needs, in
        blocks of ``n_chains`` chains and ``n_groups`` groups (planned from the error so far:
        it falls like ``1 / sqrt(blocks)``), up to ``max_runs`` blocks: one run sized from the
        pilot's error, and while the error still exceeds ``target_se`` a run of the blocks
        missing; the runs' estimates of ``p`` (each unbiased) are averaged, weighted by
        blocks, so small shares, whose error grows like ``sqrt(-log p / n_chains)``, get the
        chains they need and big ones no more than one block. ``n_runs`` records each token's
        blocks. With a working set a pilot run chooses it
        (its probes are most of a run's passes over ``W``) and every counted run starts from
        it without probes: unbiased, and uncorrelated with each other (:func:`_token_runs`).
    max_runs : int, default 32
        Cap on the counted blocks of ``n_chains`` chains per token (>= 1) when ``target_se``
        is set: no token costs
        more than ``max_runs * n_chains`` chains, plus a pilot of at most
        :data:`PILOT_CHAINS` with a working set; a token that reaches the cap keeps its larger
        error.
    progress : bool, default False
        tqdm bar over tokens.

    Returns
    -------
    ConeMeasure
        Per-token ``log_share``, ``log_lower``, ``log_upper`` (nats), standard errors, the side
        each figure errs on, levels, working-set size, points fully checked, seconds.

    Raises
    ------
    TypeError
        ``W``/``G`` not real float arrays, ``token_ids`` not integers, bad seed.
    ValueError
        NaN/inf, wrong shapes, ids out of range, budgets below 1, ``n_groups`` not dividing
        ``n_chains``, ``level_prob`` or ``confidence`` outside (0, 1), unknown ``working_set``,
        a negative int seed.

    Warns
    -----
    RuntimeWarning
        ``move="ess"``: its moves mix too slowly for the levels (below). ``target_se`` not
        reached by some token within ``max_runs`` (``std_err`` says which).

    Notes
    -----
    - Ties between a point and a facet have measure zero and are ignored; an exact duplicate
      row with a lower token id takes every tie, so such a cell is reported empty (``-inf``).
    - Cost per level: two ``(n_chains, k) x (k, |S|)`` products per move; each checked point
      costs one row of the full ``(k) x (k, |V|)`` product.
    - The interval is a t-interval over ``n_groups`` independent groups: honest about MCMC
      correlation, but with few groups its width itself is noisy. With ``R`` runs the estimate
      is ``log`` of the mean of the runs' ``p``; its variance pools the groups' estimate
      (``sum_j w_j^2 se_j^2``, ``w_j`` the runs' shares of the sum of ``p``; ``R (n_groups - 1)``
      degrees of freedom) with the runs' own spread (delta method, ``R - 1`` degrees of
      freedom), weighted by degrees of freedom, and the t-quantile has ``R n_groups - 1``.

    Examples
    --------
    >>> import numpy as np
    >>> W = np.vstack([np.zeros(3), -np.eye(3)])  # cell of token 0: the positive orthant
    >>> r = log_cone_gaussian_measure(W, [0], n_chains=512, seed=1)
    >>> bool(abs(r.log_share[0] - 3 * np.log(0.5)) < 0.3)
    True
    """
    cones = prepare_cones(W, G)
    tokens = _check_tokens(token_ids, cones.n_tokens)
    settings = _check_settings(
        n_chains=n_chains, n_groups=n_groups, level_prob=level_prob, n_moves=n_moves,
        max_constraints=max_constraints, probe_k=probe_k, n_probes=n_probes,
        min_full_fraction=min_full_fraction, max_levels=max_levels, confidence=confidence,
        move=move, working_set=working_set, seed=seed, target_se=target_se, max_runs=max_runs)
    if move == "ess":
        import warnings

        warnings.warn(
            "move='ess': LIN-ESS moves mix too slowly for the splitting levels, and the shares "
            "come out low (-0.86 nats at n_moves=1, -0.19 at 4, on an orthant of share 2^-10 "
            "at 128 chains); use move='hmc' (the default)", RuntimeWarning, stacklevel=2)
    root = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    r = measure_cones(cones, tokens, root, settings, move=move, working_set=working_set,
                      full_check=full_check, progress=progress)
    if target_se is not None:
        missed = int(np.count_nonzero(np.isfinite(r.log_share) & (r.std_err > target_se)))
        if missed:
            import warnings

            warnings.warn(
                f"target_se: {missed} of {tokens.size} tokens stopped at max_runs={max_runs} "
                f"blocks of {n_chains} chains with a standard error above target_se="
                f"{target_se} nats (their intervals are wider; raise n_chains or max_runs)",
                RuntimeWarning, stacklevel=2)
    return r


@dataclass(frozen=True)
class ConeSetup:
    """What every token's cone reads, computed once per call (:func:`prepare_cones`).

    Attributes
    ----------
    W32 : numpy.ndarray of float32, shape (V, d)
        ``W`` scaled by a power of two so that ``max|W|`` lies in [0.5, 1) (exact; a bias-free
        decoder's cones do not change with the scale of ``W``); a float32 ``W`` with
        ``max|W|`` within ``2^+-UNSCALED_RANGE`` of that is ``W`` itself, not a copy.
    WG32 : numpy.ndarray of float32, shape (V, k)
        ``W32 G_r``, ``G_r = U_r diag(s_r)`` the range of ``G`` scaled by a power of two
        (``W32`` itself when ``G`` is None).
    row_sq : numpy.ndarray of float64, shape (V,)
        Squared row norms of ``WG32``.
    """

    W32: np.ndarray
    WG32: np.ndarray
    row_sq: np.ndarray

    @property
    def n_tokens(self) -> int:
        return int(self.W32.shape[0])


def prepare_cones(W, G=None) -> ConeSetup:
    """Validate ``W`` and ``G`` and build the cone set-up of :func:`log_cone_gaussian_measure`.

    Parameters
    ----------
    W : array_like of float, shape (V, d)
    G : array_like of float, shape (d, k), optional
        A rank-deficient ``G`` is reduced to its range (``G = U S V^T`` -> ``U_r S_r``: the same
        law of ``G x``).

    Returns
    -------
    ConeSetup

    Raises
    ------
    TypeError
        ``W`` or ``G`` not a real float array.
    ValueError
        NaN/inf, wrong shapes, ``G`` zero.
    """
    Wc = check_array(W, "W", ndim=2, dtype=None)
    # a cone of a bias-free decoder does not change when W is scaled: bring max|W| to [0.5, 1)
    # by a power of two (exact), so float32 and its products neither overflow nor underflow at
    # any scale of the data (W * 1e30 used to give every share 0). A float32 W is scaled in
    # float32 (ldexp rounds a subnormal result as the cast of the exact float64 product does:
    # the same array, without two float64 copies of it, 0.7 s for SmolLM2). Within
    # UNSCALED_RANGE of unit scale a float32 W is used as it is: a power of two changes no
    # float32 product or sum there (none overflows or becomes subnormal), so the cones are the
    # same draw for draw, and no copy of W is made (SmolLM2's 113 MB: 0.6 s of page faults here)
    w_max = max(float(Wc.max()), -float(Wc.min())) if Wc.size else 0.0  # no |W| temporary
    shift = -math.frexp(w_max)[1] if w_max > 0.0 else 0
    if Wc.dtype == np.float32:
        W32 = Wc if abs(shift) <= UNSCALED_RANGE else np.ascontiguousarray(np.ldexp(Wc, shift))
    else:
        W32 = np.ascontiguousarray(np.ldexp(np.asarray(Wc, dtype=np.float64), shift), dtype=np.float32)
    V, d = W32.shape
    G64 = None if G is None else check_array(G, "G", ndim=2, dtype=None).astype(np.float64)
    if G64 is not None and G64.shape[0] != d:
        raise ValueError(f"G: expected shape ({d}, k) (S = G B in the hidden space), got {G64.shape}")
    if G64 is not None and G64.shape[1] == d and G64[0, 0] != 0.0 and np.array_equal(
            G64, G64[0, 0] * np.eye(d)):
        G64 = None  # r I (the origin ball): the cones of W itself, without a second rounding
    if G64 is None:
        WG32 = W32
    else:
        # only G's range matters (y = G x): drop its null directions exactly, or float32 round-off
        # of W G leaves them as spurious thin cones (LayerNorm's shell has rank d - 1)
        U, sv, _ = np.linalg.svd(G64, full_matrices=False)
        r = int(np.sum(sv > sv[0] * 1e-12)) if sv.size and sv[0] > 0 else 0
        if r == 0:
            raise ValueError("G: expected a non-zero linear map")
        # G's scale is irrelevant too: divide it out (sv[0] -> 1), so that G and s G give the same
        # float32 rows (up to a float64 ulp, which float32 rounding almost never keeps); a power
        # of two alone left s = 1e3 and s = 1 different rows and different draws (-10.19 vs -10.35
        # nats for one Ellipsoid cell)
        WG = W32.astype(np.float64) @ (U[:, :r] * (sv[:r] / sv[0]))
        WG32 = np.ascontiguousarray(WG, dtype=np.float32)
    row_sq = np.einsum("ij,ij->i", WG32, WG32, dtype=np.float64)
    return ConeSetup(W32=W32, WG32=WG32, row_sq=row_sq)


def measure_cones(cones: ConeSetup, tokens: np.ndarray, root: np.random.SeedSequence,
                  settings: tuple, *, move: str, working_set, full_check: bool,
                  progress: bool = False, gram_buffer: _GramBuffer | None = None) -> ConeMeasure:
    """The per-token loop of :func:`log_cone_gaussian_measure` on a prepared set-up.

    ``tokens`` are checked ids (int64, :func:`_check_tokens`), ``settings`` the tuple of
    :func:`_check_settings`; token ``t`` draws from child ``t`` of ``root`` (its extra runs from
    that child's children). ``gram_buffer``: a :class:`_GramBuffer` to reuse (a pool worker's,
    kept between its tasks); a new one by default. It changes no result.
    """
    from tqdm.auto import tqdm

    (n_chains, n_groups, level_prob, n_moves, max_constraints, probe_k, n_probes,
     min_full_fraction, max_levels, confidence, target_se, max_runs) = settings
    W32, WG32, row_sq = cones.W32, cones.WG32, cones.row_sq
    T = tokens.size
    out = {name: np.full(T, np.nan) for name in ("log_share", "log_lower", "log_upper", "std_err", "log_check_fraction", "seconds")}
    tallies = {name: np.zeros(T, dtype=np.int64) for name in ("n_levels", "n_constraints_used", "n_full_checks", "n_runs")}
    side = np.empty(T, dtype=object)
    if gram_buffer is None:
        gram_buffer = _GramBuffer()  # reused by every token's working set
    for i, t in enumerate(tqdm(tokens, desc="cone measures", unit="tok", **tqdm_kwargs(progress))):
        t0 = time.perf_counter()
        cone = _Cone(WG32, row_sq, W32, int(t))
        if cone.empty:
            out["log_share"][i] = out["log_lower"][i] = out["log_upper"][i] = -np.inf
            out["std_err"][i] = 0.0
            side[i] = "empty"
        elif WG32.shape[1] <= EXACT_MAX_DIM:  # a planar cone: its angle, exactly
            lp = _planar_log_measure(cone)
            out["log_share"][i] = out["log_lower"][i] = out["log_upper"][i] = lp
            out["std_err"][i] = 0.0
            out["log_check_fraction"][i] = 0.0
            tallies["n_constraints_used"][i] = cone.n_constraints
            side[i] = "exact" if lp > -np.inf else "empty"
        else:
            estimate = _token_runs(cone, _token_seed(root, int(t)), settings, move=move,
                                   working_set=working_set, full_check=full_check,
                                   gram_buffer=gram_buffer)
            side[i] = _store_token(i, *estimate, out=out, tallies=tallies, confidence=confidence)
        out["seconds"][i] = time.perf_counter() - t0
    return ConeMeasure(
        token_ids=tokens, side=side.astype(str), confidence=confidence,
        params={"n_chains": n_chains, "n_groups": n_groups, "level_prob": level_prob,
                "n_moves": n_moves, "move": move, "working_set": str(working_set), "full_check": bool(full_check),
                "target_se": target_se, "max_runs": max_runs if target_se is not None else 1,
                **_seed_record(root)},
        **tallies, **out,
    )


def _token_runs(cone: _Cone, seed_t: np.random.SeedSequence, settings: tuple, *, move: str,
                working_set, full_check: bool, gram_buffer: _GramBuffer | None = None) -> tuple:
    """The splitting runs of one non-empty cone (:func:`measure_cones`): one run, and with
    ``target_se`` more until the error is reached, the cap is, or a run ends empty or unresolved.

    Run 0 draws from ``seed_t``, run ``j >= 1`` from its child ``j - 1``. Returns ``(runs,
    log p, std_err, degrees of freedom, pilot, blocks)``: ``runs`` the counted runs' results
    (:meth:`_Splitter.result`), ``pilot`` the pilot's (None without a working set),
    ``blocks`` each counted run's size in blocks of ``n_chains`` chains and ``n_groups``
    groups (the groups keep their size).

    With a working set, run 0 is a *pilot* (:data:`PILOT_CHAINS` chains, or ``n_chains`` if
    fewer): it chooses the working set (probes, and the rows
    that cut off the chains of a rejected full check), and its own estimate is not used. Every
    counted run (``j >= 1``, at least one, at most ``max_runs``) starts from the pilot's working
    set, probes nothing and adds no constraint; a full check that finds too few chains in the
    cell goes on with levels on the margin over all of ``W`` (:meth:`_Splitter.full_levels`).
    Why: a constraint chosen from a run's chains cuts exactly those chains, which the run then
    counts. Probes sitting out their own level does not prevent it (their group's chains are
    copies of the same survivors), and the rows a rejected check adds are the checked chains'
    own. The next level's quantile then sits too low and the recorded fractions err low: on
    SmolLM2 (token 2013, 16 seeds at 128 chains) the one-run estimates were 0.65 nats below runs
    from a fixed working set, and a pilot's estimate of its final working-set cone (-9.0 nats)
    was 0.7 below the plain no-working-set estimate of that cone (-8.35 +- 0.05), which the
    fixed-set runs matched (-8.28).

    A counted run is sized, not repeated: the first holds the blocks planned from the pilot's
    error, a top-up the blocks still missing by the error so far (:meth:`_TokenRuns.
    _planned_total`), at most ``max_runs`` blocks in all. One run of ``c`` blocks shares its
    levels across its ``c n_groups`` groups, moves ``c`` times as many chains per product with
    the working set and checks them in one pass over ``W`` (screened by the rows seen before,
    :meth:`_Cone.check`). Against ``c`` runs of one block (the rule before): on an orthant of
    share ``2^-16`` behind 2,500 redundant rows, 30 seeds at ``target_se=0.2``, the spread of
    the estimates fell from 0.171 to 0.124 nats at the same 5.2 blocks per token (coverage
    0.90 -> 0.97); on 3 x 16 seeded SmolLM2 tokens at ``target_se=0.24`` the CPU time per
    token was 0.75-1.0 times the old one. The pilot's probes are most of its passes over ``W``
    (one every :data:`PROBE_EVERY` levels), and the counted runs need none.

    Why the average is unbiased and its error honest (a run of ``c`` blocks is one run ``j``,
    weighted by ``c`` in the mean, :func:`_combine_runs`). Let ``F_b`` be everything the pilot
    and the runs before run ``b`` drew. A counted run starts from the pilot's set ``S``, fixed
    by ``F_1``, and draws afresh from its own stream; given ``S`` it is adaptive multilevel
    splitting on the nested domains ``cone(S) & {m_S >= -gamma}`` down to ``cone(S)`` (no
    constraint chosen from its own chains), then the fraction of its chains in the cell (or
    levels on the margin over all of ``W``, a fixed function): so ``E[p_j | F_b] = p``. Hence
    any weighted mean of the ``p_j`` is unbiased. For runs ``i < j``
    ``E[(p_i - p)(p_j - p)] = E[(p_i - p) E[p_j - p | F_j]] = 0``: the ``p_j`` are
    uncorrelated, and the variance of their weighted mean is ``sum_j w_j^2 var(p_j)`` (the
    screening rows grow from run to run; they change no verdict, only the cost). Each run's
    group error stays valid (its groups are independent given ``S``), so :func:`_combine_runs`
    adds them; the runs' spread joins only when all runs have one size. What this does not
    cover: the number of runs is chosen from the error so far (stopping when it is small), a
    second-order effect at these run counts.
    """
    return _TokenRuns(cone, seed_t, settings, move=move, working_set=working_set,
                      full_check=full_check, gram_buffer=gram_buffer).run()


#: Sides of a run that measured the cell (its estimate counts), and of one that stopped the
#: token: it proved the cell empty or gave up.
_MEASURED = ("two-sided", "upper")
_STOPPED = ("empty", "unresolved")


class _TokenRuns:
    """The state of :func:`_token_runs` for one cone: its settings, the runs so far, and the
    working set and known rows that the next runs start from (set by the pilot)."""

    def __init__(self, cone: _Cone, seed_t: np.random.SeedSequence, settings: tuple, *,
                 move: str, working_set, full_check: bool,
                 gram_buffer: _GramBuffer | None = None):
        self.gram_buffer = gram_buffer
        (self.n_chains, self.n_groups, self.level_prob, self.n_moves, self.max_constraints,
         self.probe_k, self.n_probes, self.min_full_fraction, self.max_levels, _,
         self.target_se, self.max_runs) = settings
        self.working = (cone.n_constraints > min(self.max_constraints, AUTO_WORKING_SET)
                        if working_set == "auto" else bool(working_set))
        if not self.working and move == "hmc" and cone.n_constraints > MAX_GRAM:
            raise ValueError(
                f"working_set: False with move='hmc' needs the Gram matrix of all "
                f"{cone.n_constraints} constraints (over {MAX_GRAM}); use a working set"
            )
        self.cone, self.seed_t, self.move, self.full_check = cone, seed_t, move, full_check
        self.runs = []  # (log p, se, side, levels, |S|, checked, log check) per run
        self.blocks = []  # per run: its blocks of n_chains chains and n_groups groups
        # the pilot: PILOT_CHAINS chains (n_chains if fewer; >= 2 per group)
        self.pilot_chains = min(self.n_chains,
                                max(2, PILOT_CHAINS // self.n_groups) * self.n_groups)
        self.initial = None  # the counted runs' starting working set (the pilot's)
        self.known = np.zeros(0, dtype=np.int64)  # rows seen by the runs so far

    def _splitter(self, j: int, blocks: int) -> _Splitter:
        """Run ``j``'s splitter, of ``blocks`` blocks of ``n_chains`` chains in ``n_groups``
        groups each (the groups keep their size); run 0 draws from ``seed_t``, run ``j >= 1``
        from its child ``j - 1``; with a working set, run 0 is the pilot."""
        s = self.seed_t
        ss = s if j == 0 else np.random.SeedSequence(
            s.entropy, spawn_key=(*s.spawn_key, j - 1), pool_size=s.pool_size)
        pilot = j == 0 and self.working
        return _Splitter(
            self.cone, np.random.default_rng(ss), n_groups=self.n_groups * blocks,
            n_chains=self.pilot_chains if pilot else self.n_chains * blocks,
            level_prob=self.level_prob, n_moves=self.n_moves, move=self.move,
            working=self.working, full_check=self.full_check,
            max_constraints=self.max_constraints, probe_k=self.probe_k, n_probes=self.n_probes,
            max_levels=self.max_levels,
            min_full_fraction=(max(self.min_full_fraction, PILOT_MIN_FULL) if pilot
                               else self.min_full_fraction),
            initial=None if self.initial is None else self.initial.copy(), known=self.known,
            gram_buffer=self.gram_buffer)

    def batch(self, j: int, blocks: int = 1) -> None:
        """Run ``j`` of ``blocks`` blocks (:func:`_drive_batch`); then, with a working set, the
        pilot's set for the counted runs and the rows seen, for screening."""
        sps = [self._splitter(j, blocks)]
        self.runs.extend(_drive_batch(self.cone, sps))
        self.blocks.append(blocks)
        if self.working:
            if self.initial is None:  # after the pilot: its working set, for every counted run
                self.initial = sps[0].cs
            seen = np.logical_or.reduce([sp.seen for sp in sps])
            seen[self.known] = True
            self.known = np.flatnonzero(seen)

    def _first_batch(self, pilot: tuple) -> int:
        """Blocks of the first counted run, planned from the pilot's error (scaled to blocks of
        ``n_chains`` chains); one without ``target_se``."""
        if self.target_se is None:
            return 1
        x = (pilot[1] / self.target_se) ** 2 * self.pilot_chains / self.n_chains
        return min(self.max_runs, max(1, round(x)))

    def _planned_total(self, se: float) -> int:
        """Counted blocks wanted in all after this run, planned from the error so far.

        The error falls like 1 / sqrt(blocks); re-plan after. One block's error, from 16
        groups, is itself uncertain by ~20% (its square by ~40%): a plan from one block rounds
        instead of rounding up and lets the re-plan (on more groups) top up, as overshooting
        costs whole blocks and another run only one more pass over W.
        """
        n = sum(self.blocks)
        # a tiny target_se (1e-160) wants as many as allowed; (se / target_se)^2 would overflow
        if not se < self.target_se * math.sqrt(self.max_runs / n):
            return self.max_runs
        x = n * (se / self.target_se) ** 2
        want = max(2, round(x)) if n == 1 else math.ceil(x)
        return min(self.max_runs, max(want, n + 1))

    def _combined(self) -> tuple:
        """``(log p, std_err, degrees of freedom)`` of the counted runs so far."""
        if len(self.runs) > 1:
            return _combine_runs(self.runs, self.n_groups, self.blocks)
        r = self.runs[0]
        return r[0], r[1], self.blocks[0] * self.n_groups - 1

    def run(self) -> tuple:
        """The pilot (with a working set), the counted runs, and their combined estimate: the
        tuple :func:`_token_runs` returns."""
        runs, blocks, n_groups = self.runs, self.blocks, self.n_groups
        pilot, j0 = None, 0
        self.batch(0)
        if self.working:
            pilot, j0 = runs.pop(), 1
            blocks.pop()
            if pilot[2] in _STOPPED:  # proved the cell empty, or gave up
                return [pilot], pilot[0], pilot[1], n_groups - 1, None, [1]
            self.batch(1, self._first_batch(pilot))
        lp, se, df = self._combined()
        while (self.target_se is not None and all(r[2] in _MEASURED for r in runs)
               and se > self.target_se and sum(blocks) < self.max_runs):
            self.batch(j0 + len(runs), self._planned_total(se) - sum(blocks))
            if runs[-1][2] not in _MEASURED:
                break
            lp, se, df = self._combined()
        if any(r[2] in _STOPPED for r in runs):  # a run proved the cell empty or gave up
            k = len(runs) - 1  # only the last run can be one: the loop stops at it
            runs[:], blocks[:] = runs[k:], blocks[k:]
            lp, se, df = runs[0][0], runs[0][1], blocks[0] * n_groups - 1
        return runs, lp, se, df, pilot, blocks


def _drive_batch(cone: _Cone, sps: list) -> list:
    """Run the splitters ``sps`` to the end; their results (:meth:`_Splitter.result`), in order.

    Their first full checks share one pass over ``W`` (the same screening rows: none of them
    has added or seen any before); a run that goes on (a rejected check) is checked on its own
    after.
    """
    with single_blas_thread():
        gens = [sp.steps() for sp in sps]
        results = [None] * len(sps)
        pending = {}  # run -> the chains of its first full check
        for i, g in enumerate(gens):
            try:
                pending[i] = next(g)
            except StopIteration as stop:
                results[i] = stop.value
        if pending:
            order = list(pending)
            X = np.concatenate([pending[i] for i in order])
            val, ids, scanned = cone.check(X, sps[order[0]].check_k, sps[order[0]].check_known())
            row = 0
            for i in order:
                n = pending[i].shape[0]
                part = (val[row:row + n], ids[row:row + n],
                        int(np.count_nonzero(scanned[row:row + n])))
                row += n
                try:
                    Xi = gens[i].send(part)
                    while True:
                        v, d, m = cone.check(Xi, sps[i].check_k, sps[i].check_known())
                        Xi = gens[i].send((v, d, int(m.sum())))
                except StopIteration as stop:
                    results[i] = stop.value
    return results


def _store_token(i: int, runs: list, lp: float, se: float, df, pilot, blocks: list, *,
                 out: dict, tallies: dict, confidence: float) -> str:
    """Write token ``i``'s estimate from :func:`_token_runs` into :func:`measure_cones`'s
    arrays (``confidence`` t-interval on ``df`` degrees of freedom; the pilot, if any, counts
    in the runs and the points checked only; ``n_runs`` counts blocks of ``n_chains``
    chains); returns its side."""
    from scipy import stats

    sd = runs[-1][2]
    tq = stats.t.ppf(0.5 + confidence / 2, df)
    spent = runs if pilot is None else [pilot, *runs]
    tallies["n_runs"][i] = sum(blocks) + (pilot is not None)
    tallies["n_levels"][i], lc = runs[0][3], runs[0][6]
    tallies["n_constraints_used"][i] = max(r[4] for r in spent)
    tallies["n_full_checks"][i] = sum(r[5] for r in spent)
    if sd == "empty":
        out["log_share"][i] = out["log_lower"][i] = out["log_upper"][i] = -np.inf
    out["log_check_fraction"][i] = lc
    out["std_err"][i] = se
    if sd == "empty":
        pass
    elif sd == "unresolved":
        out["log_upper"][i] = min(lp + tq * se, 0.0) if np.isfinite(se) else lp
        out["log_lower"][i] = -np.inf
    else:
        out["log_share"][i] = lp
        out["log_lower"][i] = lp - tq * se
        out["log_upper"][i] = min(lp + tq * se, 0.0)
    return sd


def _combine_runs(runs: list, n_groups: int, blocks=None) -> tuple:
    """One estimate from independent runs: ``(log p, std_err, degrees of freedom)``.

    Run ``j`` holds ``c_j`` blocks (``blocks``, default one each) of ``n_groups`` groups. Each
    run's ``p_j`` is unbiased for ``p``, so their block-weighted mean ``sum_j c_j p_j /
    sum_j c_j`` is too; its log is returned. Its variance (delta method, nats^2) is
    estimated from the runs' group errors, ``sum_j w_j^2 se_j^2`` with ``w_j = c_j p_j /
    sum_k c_k p_k``, on ``sum_j (c_j n_groups - 1)`` degrees of freedom; when every run has
    the same size, also from the runs' spread, ``var(p_j) / (R mean(p)^2)``, on ``R - 1``,
    the two pooled by their degrees of freedom (runs of different sizes have different
    variances, which one spread does not estimate).
    """
    lps = np.array([r[0] for r in runs])
    ses = np.array([r[1] for r in runs])
    c = np.ones(lps.size) if blocks is None else np.asarray(blocks, dtype=np.float64)
    R = lps.size
    p = np.exp(lps - lps.max())
    w = c * p / np.sum(c * p)
    log_p = float(lps.max() + math.log(np.sum(c * p) / c.sum()))
    v_groups = float(np.sum(w**2 * ses**2))
    df_groups = int(np.sum(c * n_groups - 1))
    if R < 2 or np.any(c != c[0]):
        return log_p, math.sqrt(v_groups), df_groups
    v_spread = float(np.var(p, ddof=1) / (R * p.mean() ** 2))
    df = df_groups + R - 1
    var = (df_groups * v_groups + (R - 1) * v_spread) / df
    return log_p, math.sqrt(var), df
