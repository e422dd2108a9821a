"""Accuracy and bias of the rare-event cell shares at the DEFAULT budget of ``cell_volumes``.

Three parts (issue 22, items 3 and 4), each written to ``benchmarks/results/rare_event/``:

``truth``  Cells whose share is known exactly, randomly rotated, run through
    ``cell_volumes(decoder, Ball(0, 1), N_SAMPLES, seed=s, tokens=[t])`` with every other
    argument at its default (``method="auto"``, blocks of 128 chains until the standard error
    is ``target_se = 0.12`` nats, at most 32): orthants ``{x_i > 0, i < k}``
    (share ``2^-k``; with 3,000 redundant rows the working-set path is taken), the
    cross-polytope (``1 / (2 d)``), the regular simplex's simplicial cones (``1 / (d + 1)``) and
    2-D sectors (``width / (2 pi)``), d = 2..64, shares 0.25 down to ``2^-50`` (8.9e-16).
    (A union of orthants that is a cell is convex, so it is an orthant of fewer constraints:
    covered by the orthant rows.) Per case over the seeds: mean log-error (the bias), RMS and
    largest log-error (nats), coverage of the 95% interval, which estimator
    (``token_method``) produced the share, and the cost: splitting runs and chains per token
    (``extra["rare_event_n_runs"]``) and seconds per call.

``bias``  The default against a second, independent estimator written here for the check
    (:func:`reference_log_share`): fixed-level splitting with levels from a pilot run, pooled
    multinomial resampling of every chain, elliptical-slice moves on *every* constraint with
    this file's own kernel (:func:`_arc_angles`; the default uses adaptive multilevel
    splitting with kill-and-copy, resampling within groups, one reflected Hamiltonian move per
    level and a working set of at most 2,048 constraints with a full check). Fixed levels make
    the product of fractions unbiased for ``p`` with any invariant move (Del Moral,
    *Feynman-Kac formulae*, 2004, Sec. 3.5), whatever the pilot's levels; the reference is
    itself checked on orthants of known share with redundant rows (``reference_truth``). Three
    configurations, each of |V| = 4,000 rows (> the 2,048-constraint cap, so the default takes
    its working-set path): random Gaussian decoders (d = 16, 32; tokens with a non-empty cone,
    by an LP), and a seeded random sub-vocabulary of 4,000 rows of SmolLM2-135M's unembedding
    (d = 576, origin ball; one token from each of ``--smollm2-tokens`` equal strata of the row
    norm, for a spread of shares). The default runs ``--default-seeds`` times per token (their
    mean log-share is compared); the mean of (default - reference) over tokens, with its
    standard error over tokens, is the systematic bias. A third estimator, plain Monte Carlo
    (:func:`mc_counts`: ``--mc-samples`` Gaussian directions, 8M per Gaussian config and 2M for
    SmolLM2, counted by the argmax of ``W x``), checks both on the tokens with >= 100 hits.
    ``--reuse-reference`` reruns only the default (e.g. with ``--rare-event-options`` or
    ``--default-chains``) against the references (and counts) of an earlier run: the reference
    costs 35-450 s per token, the default 1-15. Results: ``bias_reference_run`` (the run that
    computed the references), ``bias`` (the default at the recorded commit against them),
    ``bias_<tag>`` (variants).

``cost``  Seconds per token (one thread) of the default at 128 chains and of 1,024 chains, on
    SmolLM2-135M's unembedding (origin ball) when ``--w-npy`` gives it (float32 ``(V, d)``),
    with the median 95% interval width: run once with this tree and once with the tree to
    compare (``PYTHONPATH``) to get "before" and "after".

Usage (single-threaded: ``OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1``):
    .venv/bin/python benchmarks/bench_rare_event_accuracy.py truth [--quick] [--seeds 50]
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_rare_event_accuracy.py bias [--quick]
        [--configs gauss16,gauss32,smollm2] [--tokens-per-config 12] [--default-seeds 3]
        [--ref-chains 512 --ref-reps 4 --ref-moves 10] [--ref-truth-seeds 4]
        [--ref-truth-highd-seeds 2] [--reuse-reference benchmarks/results/rare_event/bias.json]
        [--rare-event-options '{"n_moves": 2}' --tag moves2] [--w-npy W.npy]
    .venv/bin/python benchmarks/bench_rare_event_accuracy.py cost --w-npy W.npy [--tokens 8]
        [--label after]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numba
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if not any(os.path.isdir(os.path.join(p, "embgeom")) for p in sys.path if p):
    sys.path.insert(0, os.path.join(HERE, ".."))

from embgeom.cells import Decoder  # noqa: E402
from embgeom.supports import Ball  # noqa: E402
from embgeom.volumes import cell_volumes  # noqa: E402

OUT = os.path.join(HERE, "results", "rare_event")
#: Uniform points of each cell_volumes call (the auto rule keeps the count where it is tighter).
N_SAMPLES = 20_000


# ------------------------------------------------------------------------------ truth cases
def _rotate(W, seed):
    from scipy.stats import special_ortho_group

    d = W.shape[1]
    return W if d == 1 else W @ special_ortho_group.rvs(d, random_state=seed).T


def orthant(k, d, seed, n_redundant=0):
    """Row 0's cell is ``{x_i >= 0, i < k}`` (share ``2^-k``); ``n_redundant`` rows
    ``-sum_i lambda_i e_i`` (lambda >= 0) add tokens without changing it."""
    rows = np.vstack([np.zeros(d), -np.eye(d)[:k]])
    if n_redundant:
        lam = np.abs(np.random.default_rng(seed).standard_normal((n_redundant, k)))
        R = np.zeros((n_redundant, d))
        R[:, :k] = -lam
        rows = np.vstack([rows, R])
    return _rotate(rows, seed), 0, k * math.log(0.5)


def cross_polytope(d, seed):
    return _rotate(np.vstack([np.eye(d), -np.eye(d)]), seed), 0, -math.log(2 * d)


def simplex(d, seed):
    E = np.eye(d + 1) - 1.0 / (d + 1)
    U, _, _ = np.linalg.svd(E.T)
    return _rotate(E @ U[:, :d], seed), 0, -math.log(d + 1)


def sector(width, seed):
    """Unit rows at angles 0, a, 2a, pi (rotated by ``seed``): the cell of the row at ``a`` is
    the arc between the bisectors ``a/2`` and ``3a/2``, share ``a / (2 pi)``."""
    a = 2 * math.pi * width
    phi = np.array([0.0, a, 2 * a, math.pi]) + np.random.default_rng(seed).uniform(0, 2 * math.pi)
    return np.stack([np.cos(phi), np.sin(phi)], 1), 1, math.log(width)


def wedge(s_wide, d, seed):
    """Rows ``(1, 0), (0.5, +-s)`` padded to ``d`` (rotated by ``seed`` when ``d > 2``): the
    cell of row 0 is a wedge ``s / 0.5`` times longer than wide, share ``atan(0.5 / s) / pi``
    (the rows are float32-exact; a 2-D sector of unit rows cannot be thinner than float32's
    angle resolution, about 1e-7)."""
    W = np.zeros((3, d))
    W[:, :2] = [[1.0, 0.0], [0.5, s_wide], [0.5, -s_wide]]
    if d > 2:
        W = _rotate(W, seed)
    return W, 0, math.log(math.atan(0.5 / s_wide) / math.pi)


def truth_cases(quick: bool, cases_filter=None):
    """(name, builder(seed) -> (W, token, exact log-share))."""
    cases = [
        ("sector 2-D share 1e-1", lambda s: sector(0.1, s)),
        ("sector 2-D share 1e-3", lambda s: sector(1e-3, s)),
        ("wedge 2-D 2^20 (share 1.5e-7)", lambda s: wedge(2.0**20, 2, s)),
        ("wedge 2-D 2^50 (share 1.4e-16)", lambda s: wedge(2.0**50, 2, s)),
        ("wedge 2^13 in d=16, rotated", lambda s: wedge(2.0**13, 16, s)),
        ("orthant k=2 d=2", lambda s: orthant(2, 2, s)),
        ("simplex d=5", lambda s: simplex(5, s)),
        ("cross-polytope d=8", lambda s: cross_polytope(8, s)),
        ("simplex d=32", lambda s: simplex(32, s)),
        ("cross-polytope d=64", lambda s: cross_polytope(64, s)),
        ("orthant k=4 d=8", lambda s: orthant(4, 8, s)),
        ("orthant k=10 d=16", lambda s: orthant(10, 16, s)),
        ("orthant k=20 d=32", lambda s: orthant(20, 32, s)),
        ("orthant k=30 d=48", lambda s: orthant(30, 48, s)),
        ("orthant k=40 d=64", lambda s: orthant(40, 64, s)),
        ("orthant k=50 d=64", lambda s: orthant(50, 64, s)),
        ("orthant k=15 d=24 +3000 rows", lambda s: orthant(15, 24, s, 3000)),
        ("orthant k=30 d=48 +3000 rows", lambda s: orthant(30, 48, s, 3000)),
    ]
    if cases_filter:
        cases = [c for c in cases if any(f in c[0] for f in cases_filter)]
    if quick:
        keep = {"sector 2-D share 1e-3", "cross-polytope d=8", "simplex d=32", "orthant k=10 d=16",
                "orthant k=30 d=48", "orthant k=50 d=64", "orthant k=15 d=24 +3000 rows"}
        cases = [c for c in cases if c[0] in keep]
    return cases


def _cov(row) -> str:
    return "exact" if row["coverage"] is None else f"{row['coverage']:.2f}"


def run_truth(args) -> dict:
    rows = []
    for name, build in truth_cases(args.quick, args.cases):
        err, cover, width, methods, secs, runs = [], [], [], [], [], []
        for s in range(args.seeds):
            W, t, lt = build(s)
            dec = Decoder(np.asarray(W, np.float32))
            t0 = time.perf_counter()
            cv = cell_volumes(dec, Ball.from_params(np.zeros(W.shape[1]), 1.0), N_SAMPLES, seed=s,
                              tokens=[t], progress=False)
            secs.append(time.perf_counter() - t0)
            lf, lo, hi = cv.log_fractions[t], cv.log_lower[t], cv.log_upper[t]
            err.append(lf - lt)
            cover.append(bool(lo <= lt <= hi))
            width.append(hi - lo)
            methods.append(str(cv.token_method[t]))
            runs.append(int(cv.extra["rare_event_n_runs"][t]))
        err = np.array(err)
        row = {"case": name, "log_truth": lt, "share": math.exp(lt), "seeds": args.seeds,
               "mean_error": float(err.mean()), "se_of_mean": float(err.std(ddof=1) / math.sqrt(err.size)),
               "rms_error": float(np.sqrt(np.mean(err**2))), "max_abs_error": float(np.abs(err).max()),
               # an exact figure (a planar cone's angle) has no interval to cover: its error is
               # the float32 rounding of the rows the decoder stores
               "coverage": (None if set(methods) == {"exact"} else float(np.mean(cover))),
               "median_width": float(np.median(width)),
               "estimator": ",".join(sorted(set(methods))), "seconds_per_call": float(np.mean(secs)),
               "mean_runs": float(np.mean(runs)), "max_runs": int(np.max(runs)),
               "mean_chains": float(np.mean(runs)) * cv.extra["rare_event"].get("n_chains", 128)}
        rows.append(row)
        print(f"{name:32s} {lt:8.2f} bias {row['mean_error']:+.3f} +- {row['se_of_mean']:.3f} "
              f"rms {row['rms_error']:.3f} max {row['max_abs_error']:.3f} cover {_cov(row)} "
              f"width {row['median_width']:.2f} [{row['estimator']}] runs {row['mean_runs']:.1f} "
              f"(max {row['max_runs']}) {row['seconds_per_call']:.2f} s",
              flush=True)
    return {"part": "truth", "n_samples": N_SAMPLES, "seeds": args.seeds, "rows": rows}


# ------------------------------------------------------------------------- the reference
def _unit_constraints(W, t):
    """Unit rows ``(w_t - w_s) / |w_t - w_s|``, s != t (float64 (V - 1, d))."""
    A = np.asarray(W, np.float64)[t] - np.delete(np.asarray(W, np.float64), t, axis=0)
    return A / np.linalg.norm(A, axis=1, keepdims=True)


@numba.njit(nogil=True, cache=True)
def _arc_angles(P, Q, c, u):  # pragma: no cover - compiled
    """One elliptical-slice angle per chain, uniform on the feasible arc through the chain.

    Chain ``i``'s ellipse is ``x cos(theta) + nu sin(theta)``; constraint ``s`` holds where
    ``P[i, s] cos(theta) + Q[i, s] sin(theta) + c >= 0``. ``theta = 0`` (the chain) is feasible,
    so each constraint forbids one open arc inside ``(0, 2 pi)``, centred at
    ``atan2(Q, P) + pi`` with half-width ``acos(c / R)``, ``R = |(P, Q)|``. The feasible arc
    through 0 runs from the last forbidden end to the first forbidden start, ``[hi_max - 2 pi,
    lo_min]``; the angle is uniform on it (``u`` uniform in [0, 1)). Uniform on that arc is
    reversible for the Gaussian on the ellipse restricted to the domain (the arc seen from the
    new point is the same arc), so each move leaves ``N(0, I)`` restricted to the domain
    invariant; unlike :func:`embgeom._rare_kernels.ess_angles` (uniform on every feasible arc,
    sorted) no sort is needed: O(M) per chain.
    """
    N, M = P.shape
    two_pi = 2.0 * math.pi
    c2 = c * c
    theta = np.empty(N)
    for i in range(N):
        lo_min = two_pi
        hi_max = 0.0
        for s in range(M):
            p = P[i, s]
            q = Q[i, s]
            r2 = p * p + q * q
            if r2 <= c2:
                continue  # the whole ellipse satisfies this constraint
            half = math.acos(c / math.sqrt(r2))
            centre = math.atan2(q, p) + math.pi
            a = centre - half
            b = centre + half
            if a < lo_min:
                lo_min = a
            if b > hi_max:
                hi_max = b
        lo = max(lo_min, 0.0)
        hi = min(hi_max, two_pi)
        length = lo + two_pi - hi
        theta[i] = hi - two_pi + u[i] * length if length > 0.0 else 0.0
    return theta


def _ess_moves(X, A, shift, n_moves, rng):
    """``n_moves`` exact elliptical-slice steps (:func:`_arc_angles`) of every chain inside
    ``{A x + shift >= 0}``; ``P = X A^T`` is recomputed exactly first."""
    P = np.ascontiguousarray(X @ A.T)
    for _ in range(n_moves):
        nu = rng.standard_normal(X.shape)
        Q = np.ascontiguousarray(nu @ A.T)
        th = _arc_angles(P, Q, float(shift), rng.random(X.shape[0]))
        c, s = np.cos(th)[:, None], np.sin(th)[:, None]
        X = X * c + nu * s
        P = P * c + Q * s
    return X, P


def _splitting(A, N, rng, n_moves, levels=None, level_prob=0.5, max_levels=200):
    """Splitting on ``m(x) = min_s a_s . x`` toward ``m >= 0``, pooled multinomial resampling.

    ``levels`` None: adaptive (each level the ``level_prob`` quantile of ``m``); returns the
    levels. Else the given decreasing shifts (ending at 0) are used as they are. Returns
    ``(log p_hat, levels used)``.
    """
    X = rng.standard_normal((N, A.shape[1]))
    m = (X @ A.T).min(axis=1)
    log_p, used = 0.0, []
    for j in range(max_levels):
        if levels is None:
            g = max(0.0, -float(np.quantile(m, 1 - level_prob)))
        else:
            g = levels[j]
        ins = m >= -g
        used.append(g)
        if not ins.any():
            return -np.inf, used
        log_p += math.log(ins.mean())
        if g == 0.0:
            return log_p, used
        pick = rng.choice(np.flatnonzero(ins), size=N, replace=True)
        X, P = _ess_moves(X[pick], A, g, n_moves, rng)
        m = P.min(axis=1)
    return float("nan"), used


def reference_log_share(W, t, seed, *, n_chains=512, n_reps=4, n_moves=10,
                        pilot_chains=256) -> dict:
    """Independent estimate of token ``t``'s log Gaussian share (origin ball, no bias).

    A pilot run (adaptive levels, ``pilot_chains``) fixes the levels; ``n_reps`` independent
    fixed-level runs of ``n_chains`` chains each give unbiased estimates ``p_i`` of the share;
    returns ``log_share`` (log mean p_i), ``se`` (standard error of the log mean in nats, delta
    method over the reps), ``reps`` (each rep's log p_i), ``levels`` (their number) and
    ``seconds``. Every move uses all ``V - 1`` constraints (no working set).
    """
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    A = _unit_constraints(W, t)
    _, levels = _splitting(A, pilot_chains, rng, n_moves)
    if levels[-1] != 0.0:
        levels = levels + [0.0]
    reps = np.array([_splitting(A, n_chains, rng, n_moves, levels=levels)[0] for _ in range(n_reps)])
    p = np.exp(reps - reps.max())
    log_mean = float(np.log(p.mean()) + reps.max())
    se = float(p.std(ddof=1) / math.sqrt(n_reps) / p.mean())
    return {"log_share": log_mean, "se": se, "reps": reps.tolist(), "levels": len(levels),
            "seconds": time.perf_counter() - t0}


def _ref_kw(args) -> dict:
    return {"n_chains": args.ref_chains, "n_reps": args.ref_reps, "n_moves": args.ref_moves,
            "pilot_chains": args.ref_pilot}


def reference_truth_check(args) -> list[dict]:
    """The reference itself on orthants of known share (rotated, with redundant rows), as in
    the truth part: its log-error, against its own standard error."""
    cases = [("orthant k=10 d=16 +3000 rows", 10, 16, 3000, args.ref_truth_seeds),
             ("orthant k=15 d=24 +3000 rows", 15, 24, 3000, args.ref_truth_seeds),
             ("orthant k=14 d=576 +3999 rows", 14, 576, 3999, args.ref_truth_highd_seeds)]
    rows = []
    for name, k, d, n_red, n_seeds in cases:
        for s in range(n_seeds):
            W, t, lt = orthant(k, d, 1000 + s, n_red)
            r = reference_log_share(W, t, seed=5000 + s, **_ref_kw(args))
            err = r["log_share"] - lt
            rows.append({"case": name, "seed": s, "log_truth": lt, "reference": r["log_share"],
                         "reference_se": r["se"], "error": err, "z": err / r["se"] if r["se"] > 0 else float("nan"),
                         "levels": r["levels"], "seconds": r["seconds"]})
            print(f"reference truth check {name} seed {s}: truth {lt:.3f} reference "
                  f"{r['log_share']:.3f} +- {r['se']:.3f} error {err:+.3f} ({r['levels']} levels, "
                  f"{r['seconds']:.1f} s)", flush=True)
    return rows


def _smollm2_w(args) -> np.ndarray:
    if args.w_npy:
        return np.load(args.w_npy).astype(np.float32)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from embgeom.adapters import load_model, unembedding

    return np.asarray(Decoder.from_unembedding(unembedding(load_model("smollm2-135m"))).W_, np.float32)


def mc_counts(W, tokens, n, seed, block=8192) -> np.ndarray:
    """Plain Monte Carlo: how many of ``n`` standard Gaussian directions (float32, seeded) land
    in each token's cone (argmax of ``W x``, ties being of measure zero); a third estimator,
    exact in expectation, for the shares large enough to count."""
    rng = np.random.default_rng(seed)
    WT = np.ascontiguousarray(np.asarray(W, np.float32).T)
    counts = np.zeros(WT.shape[1], np.int64)
    for s in range(0, n, block):
        X = rng.standard_normal((min(block, n - s), WT.shape[0]), dtype=np.float32)
        counts += np.bincount(np.argmax(X @ WT, axis=1), minlength=WT.shape[1])
    return counts[np.asarray(tokens)]


def _has_cell(W, t) -> bool:
    """Whether token ``t``'s cone ``{x : (w_t - w_s) . x >= 0}`` has an interior: the LP
    ``max r  s.t.  a_s . x >= r, |x|_inf <= 1`` (scipy HiGHS) has ``r > 0``."""
    from scipy.optimize import linprog

    A = _unit_constraints(W, t)
    d = A.shape[1]
    res = linprog(np.r_[np.zeros(d), -1.0], A_ub=np.hstack([-A, np.ones((A.shape[0], 1))]),
                  b_ub=np.zeros(A.shape[0]), bounds=[(-1, 1)] * d + [(None, 1)], method="highs")
    return bool(res.status == 0 and -res.fun > 1e-9)


def bias_configs(args):
    """(name, d, V, W float32, tokens, default seed) of every configuration asked for."""
    out = []
    per = args.tokens_per_config
    for name in args.configs:
        if name in ("gauss16", "gauss32"):
            d, wseed = (16, 1) if name == "gauss16" else (32, 2)
            rng = np.random.default_rng(100 + wseed)
            V = 4000
            # row norms spread out, as in real unembeddings: cell shares from e^-2 to e^-20
            W = (rng.standard_normal((V, d)) * rng.uniform(0.6, 1.4, (V, 1))).astype(np.float32)
            # tokens with a cell (most rows of a 16-D cloud of 4,000 lie inside its hull: their
            # cones are empty, and the reference would run out its levels on them)
            toks = []
            for t in rng.permutation(V):
                if len(toks) == per:
                    break
                if _has_cell(W, int(t)):
                    toks.append(int(t))
            toks = np.sort(toks)
        elif name == "smollm2":
            W_full = _smollm2_w(args)
            rng = np.random.default_rng(args.smollm2_seed)
            rows = np.sort(rng.choice(W_full.shape[0], args.smollm2_rows, replace=False))
            W = np.ascontiguousarray(W_full[rows])
            V, d, wseed = W.shape[0], W.shape[1], 3
            # a spread of shares: one token from each of ``per`` equal strata of the row norm
            order = np.argsort(np.linalg.norm(W.astype(np.float64), axis=1))
            strata = np.array_split(order, args.smollm2_tokens or per)
            toks = np.sort([int(rng.choice(st)) for st in strata])
        else:
            raise SystemExit(f"unknown config {name!r}")
        out.append((name, d, V, W, toks, wseed))
    return out


#: Hits a token needs for its plain Monte Carlo share to enter the comparison (log-se <= 0.1).
MC_MIN_HITS = 100


def _mc_summary(rows) -> dict:
    """Default and reference against plain Monte Carlo, over the tokens with >= MC_MIN_HITS."""
    ok = [r for r in rows if r.get("mc_count", 0) >= MC_MIN_HITS]
    out = {"n_tokens": len(ok), "min_hits": MC_MIN_HITS}
    for key in ("default", "reference"):
        e = np.array([r[key] - r["mc_log"] for r in ok])
        out[f"mean_{key}_minus_mc"] = float(e.mean()) if e.size else float("nan")
        out[f"se_{key}_minus_mc"] = float(e.std(ddof=1) / math.sqrt(e.size)) if e.size > 1 else float("nan")
    out["mean_mc_se"] = float(np.mean([r["mc_se"] for r in ok])) if ok else float("nan")
    return out


def _summary(rows) -> dict:
    diff = np.array([r["diff"] for r in rows if np.isfinite(r["diff"])])
    split = np.array([r["diff"] for r in rows if np.isfinite(r["diff"]) and r["method"] == "rare-event"])
    n = diff.size
    return {"n_tokens": int(n), "mean_diff": float(diff.mean()) if n else float("nan"),
            "se_mean_diff": float(diff.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan"),
            "rms_diff": float(np.sqrt(np.mean(diff**2))) if n else float("nan"),
            "n_higher": int((diff > 0).sum()),
            "mean_diff_split_tokens": float(split.mean()) if split.size else float("nan"),
            "se_mean_diff_split_tokens": float(split.std(ddof=1) / math.sqrt(split.size)) if split.size > 1 else float("nan"),
            "n_split_tokens": int(split.size),
            "coverage_of_reference": float(np.mean([c for r in rows for c in r["covered"]])),
            "mean_reference_se": float(np.mean([r["reference_se"] for r in rows])),
            "seconds_reference_total": float(sum(r["seconds_reference"] for r in rows)),
            "seconds_default_total": float(sum(r["seconds_default_per_token"] for r in rows)),
            "mc": _mc_summary(rows)}


def _embgeom_version() -> str:
    """The commit of the estimator under test, ``+dirty`` when ``embgeom/`` has uncommitted
    changes (the repository is shared: record what the default was)."""
    import subprocess

    import embgeom

    root = os.path.dirname(os.path.dirname(os.path.abspath(embgeom.__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "embgeom"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def run_bias(args) -> dict:
    version = _embgeom_version()  # at the start: the default is imported now
    reuse, reused_from, truth_rows = {}, None, []
    if args.reuse_reference:  # the default with other options against the same reference
        with open(args.reuse_reference) as f:
            prev = json.load(f)
        if _ref_kw(args) != prev["reference"]:
            raise SystemExit(f"--reuse-reference: {args.reuse_reference} has reference settings "
                             f"{prev['reference']}, not {_ref_kw(args)}")
        reuse = {(r["config"], r["token"]): r for r in prev["rows"]}
        reused_from = os.path.relpath(args.reuse_reference, os.path.join(HERE, ".."))
        truth_rows = prev.get("reference_truth", [])  # the same seeds would give the same rows
    if not truth_rows and args.ref_truth_seeds + args.ref_truth_highd_seeds:
        truth_rows = reference_truth_check(args)
    rows, config_info = [], {}
    for name, d, V, W, toks, wseed in bias_configs(args):
        # the default, once per seed (seed j > 0: [wseed, j]); one call for all the tokens
        cvs, t_def = [], []
        for j in range(args.default_seeds):
            t0 = time.perf_counter()
            cvs.append(cell_volumes(Decoder(W), Ball.from_params(np.zeros(d), 1.0), N_SAMPLES,
                                    seed=wseed if j == 0 else [wseed, j], tokens=toks,
                                    progress=False, n_chains=args.default_chains,
                                    rare_event_options=args.rare_event_options))
            t_def.append((time.perf_counter() - t0) / toks.size)
        info = {"d": d, "V": V, "tokens": toks.tolist(), "default_seconds_per_token": t_def,
                "rare_event": cvs[0].extra["rare_event"]}
        n_mc = args.mc_samples_smollm2 if name == "smollm2" else args.mc_samples
        mc = {}
        if n_mc:
            prev_mc = {t: reuse[(name, t)] for t in map(int, toks) if (name, t) in reuse
                       and reuse[(name, t)].get("mc_n") == n_mc}
            if len(prev_mc) == toks.size:
                mc = {t: r["mc_count"] for t, r in prev_mc.items()}
            else:
                t0 = time.perf_counter()
                mc = dict(zip(map(int, toks), map(int, mc_counts(W, toks, n_mc, seed=900 + wseed))))
                info["mc_seconds"] = time.perf_counter() - t0
                print(f"{name}: plain Monte Carlo, {n_mc:,} directions, {info['mc_seconds']:.0f} s", flush=True)
        print(f"{name}: d={d} V={V} {toks.size} tokens; default {np.mean(t_def):.2f} s per token "
              f"({args.default_seeds} seed(s))", flush=True)
        for t in toks:
            t = int(t)
            if (name, t) in reuse:
                r0 = reuse[(name, t)]
                ref = {"log_share": r0["reference"], "se": r0["reference_se"], "reps": r0["reference_reps"],
                       "levels": r0["reference_levels"], "seconds": r0["seconds_reference"]}
            else:
                ref = reference_log_share(W, t, seed=t, **_ref_kw(args))
            lf = np.array([cv.log_fractions[t] for cv in cvs])
            lo = np.array([cv.log_lower[t] for cv in cvs])
            hi = np.array([cv.log_upper[t] for cv in cvs])
            row = {"config": name, "d": d, "V": V, "token": t, "default": float(lf.mean()),
                   "default_each_seed": lf.tolist(), "default_lower": float(lo[0]),
                   "default_upper": float(hi[0]), "method": str(cvs[0].token_method[t]),
                   "n_runs": int(cvs[0].extra["rare_event_n_runs"][t]),
                   "reference": ref["log_share"], "reference_se": ref["se"],
                   "reference_reps": ref["reps"], "reference_levels": ref["levels"],
                   "diff": float(lf.mean() - ref["log_share"]),
                   "covered": [bool(a <= ref["log_share"] <= b) for a, b in zip(lo, hi)],
                   "seconds_reference": ref["seconds"],
                   "seconds_default_per_token": float(np.mean(t_def))}
            if t in mc:
                k = mc[t]
                row.update(mc_n=n_mc, mc_count=k, mc_log=math.log(k / n_mc) if k else float("-inf"),
                           mc_se=math.sqrt((1 - k / n_mc) / k) if k else float("inf"))
            rows.append(row)
            print(f"{name} t={t:5d} default {lf.mean():8.3f} [{lo[0]:7.2f}, {hi[0]:7.2f}] "
                  f"({row['method']}, {row['n_runs']} runs) reference {ref['log_share']:8.3f} +- "
                  f"{ref['se']:.3f} ({ref['levels']} levels) diff {row['diff']:+.3f} "
                  f"(reference {ref['seconds']:.1f} s)", flush=True)
        config_info[name] = info
    by_config = {name: _summary([r for r in rows if r["config"] == name]) for name in config_info}
    summary = _summary(rows)
    for name, s in by_config.items():
        print(f"{name}: mean diff {s['mean_diff']:+.3f} +- {s['se_mean_diff']:.3f} over "
              f"{s['n_tokens']} ({s['n_higher']} higher), coverage {s['coverage_of_reference']:.2f}")
    print(json.dumps(summary))
    truth_summary = {}
    for case in dict.fromkeys(r["case"] for r in truth_rows):
        e = np.array([r["error"] for r in truth_rows if r["case"] == case])
        truth_summary[case] = {"n": int(e.size), "mean_error": float(e.mean()),
                               "se_of_mean": float(e.std(ddof=1) / math.sqrt(e.size)) if e.size > 1 else float("nan"),
                               "max_abs_error": float(np.abs(e).max()),
                               "mean_reference_se": float(np.mean([r["reference_se"] for r in truth_rows if r["case"] == case])),
                               "mean_seconds": float(np.mean([r["seconds"] for r in truth_rows if r["case"] == case]))}
    return {"part": "bias", "command": " ".join(sys.argv[1:]), "embgeom_commit": version,
            "reference_reused_from": reused_from,
            "n_samples": N_SAMPLES, "reference": _ref_kw(args),
            "default_seeds": args.default_seeds, "default_chains": args.default_chains,
            "rare_event_options": args.rare_event_options,
            "configs": config_info, "rows": rows, "summary": summary, "by_config": by_config,
            "reference_truth": truth_rows, "reference_truth_summary": truth_summary}


# ------------------------------------------------------------------------------------ cost
def run_cost(args) -> dict:
    import embgeom
    from embgeom._rare_event import log_cone_gaussian_measure

    W = np.load(args.w_npy)
    V = W.shape[0]
    toks = np.sort(np.random.default_rng(0).choice(V, args.tokens, replace=False))
    out = {"part": "cost", "label": args.label, "embgeom": os.path.dirname(embgeom.__file__),
           "tokens": toks.tolist(), "runs": []}
    log_cone_gaussian_measure(W, toks[:1], n_chains=32, seed=0)  # compile the kernels
    for chains in (128, 1024):
        t0 = time.perf_counter()
        r = log_cone_gaussian_measure(W, toks, n_chains=chains, seed=0)
        sec = (time.perf_counter() - t0) / toks.size
        width = r.log_upper - r.log_lower
        run = {"n_chains": chains, "seconds_per_token": sec, "median_width": float(np.median(width)),
               "share_within_1_nat": float(np.mean(width <= 1.0)),
               "log_share": r.log_share.tolist()}
        out["runs"].append(run)
        print(f"{args.label}: {chains} chains {sec:.2f} s/token, median 95% width "
              f"{run['median_width']:.2f} nats, {run['share_within_1_nat']:.0%} within 1 nat", flush=True)
    return out


def _markdown(res: dict) -> str:
    if res["part"] == "truth":
        lines = [f"Truth cases at the default budget of `cell_volumes` (method='auto', blocks of 128 "
                 f"chains until the standard error is target_se = 0.12 nats, at most 32; "
                 f"{res['n_samples']:,} uniform samples), {res['seeds']} seeds each. Runs: blocks of "
                 "128 chains per token, the pilot included (0: the count was kept); s: seconds per call, one thread, loaded machine.", "",
                 "| case | log share | bias (nats) | RMS error | max error | 95% coverage | median width | estimator | mean runs (max) | mean chains | s per call |",
                 "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["rows"]:
            lines.append(f"| {r['case']} | {r['log_truth']:.2f} | {r['mean_error']:+.3f} +- {r['se_of_mean']:.3f} | "
                         f"{r['rms_error']:.3f} | {r['max_abs_error']:.3f} | {_cov(r)} | "
                         f"{r['median_width']:.2f} | {r['estimator']} | {r.get('mean_runs', 1):.1f} "
                         f"({r.get('max_runs', 1)}) | {r.get('mean_chains', 128):.0f} | "
                         f"{r['seconds_per_call']:.2f} |")
        return "\n".join(lines) + "\n"
    if res["part"] == "bias":
        ref = res["reference"]
        opts = res.get("rare_event_options")
        lines = ["Default (`cell_volumes`, method='auto', runs of "
                 f"{res.get('default_chains', 128)} chains until target_se = 0.12 "
                 f"nats, at most 32; {res['n_samples']:,} uniform samples"
                 + (f"; rare_event_options={opts}" if opts else "")
                 + f"; {res['default_seeds']} seed(s) per token, 'default' is their mean log-share, "
                 "the interval the first seed's) against the independent reference: fixed-level "
                 f"splitting, exact elliptical-slice moves (this file's kernel) on all constraints ({ref['n_chains']:,} chains x "
                 f"{ref['n_reps']} reps, {ref['n_moves']} moves per level, levels from a "
                 f"{ref['pilot_chains']}-chain pilot). diff = default - reference (nats). "
                 "Seconds: one thread, loaded 2-core machine.", ""]
        if res.get("command"):
            lines += [f"Command: `bench_rare_event_accuracy.py {res['command']}`; embgeom at "
                      f"{res.get('embgeom_commit', 'unrecorded')}"
                      + (f" (reference values reused from `{res['reference_reused_from']}`)"
                         if res.get("reference_reused_from") else ""), ""]
        if res.get("reference_truth"):
            lines += ["Reference on cells of known share (orthants, rotated, redundant rows):", "",
                      "| case | seeds | log share | mean error | max error | mean reference se | s per estimate |",
                      "|---|---|---|---|---|---|---|"]
            for case, t in res["reference_truth_summary"].items():
                lt = next(r["log_truth"] for r in res["reference_truth"] if r["case"] == case)
                se = f" +- {t['se_of_mean']:.3f}" if t["n"] > 1 else ""
                lines.append(f"| {case} | {t['n']} | {lt:.3f} | {t['mean_error']:+.3f}{se} | "
                             f"{t['max_abs_error']:.3f} | {t['mean_reference_se']:.3f} | {t['mean_seconds']:.1f} |")
            lines.append("")
        lines += ["| config | d | token | default | 95% interval | method | runs | reference | levels | diff | s reference | s default |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["rows"]:
            lines.append(f"| {r.get('config', '')} | {r['d']} | {r['token']} | {r['default']:.3f} | "
                         f"[{r['default_lower']:.2f}, {r['default_upper']:.2f}] | {r['method']} | "
                         f"{r.get('n_runs', '')} | {r['reference']:.3f} +- {r['reference_se']:.3f} | "
                         f"{r.get('reference_levels', '')} | {r['diff']:+.3f} | "
                         f"{r['seconds_reference']:.1f} | {r['seconds_default_per_token']:.2f} |")
        mc_rows = [r for r in res["rows"] if "mc_count" in r]
        if mc_rows:
            lines += ["", f"Plain Monte Carlo (a third estimator: Gaussian directions counted by the "
                      f"argmax of W x), tokens with >= {MC_MIN_HITS} hits:", "",
                      "| config | token | hits | MC log-share | default - MC | reference - MC |",
                      "|---|---|---|---|---|---|"]
            for r in mc_rows:
                if r["mc_count"] >= MC_MIN_HITS:
                    lines.append(f"| {r['config']} | {r['token']} | {r['mc_count']:,} of {r['mc_n']:,} | "
                                 f"{r['mc_log']:.3f} +- {r['mc_se']:.3f} | {r['default'] - r['mc_log']:+.3f} | "
                                 f"{r['reference'] - r['mc_log']:+.3f} |")
        lines += ["", "| config | tokens | mean diff | RMS diff | higher | split tokens: mean diff | "
                  "coverage of the reference | mean reference se | s reference (total) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, s in list(res.get("by_config", {}).items()) + [("all", res["summary"])]:
            lines.append(f"| {name} | {s['n_tokens']} | {s['mean_diff']:+.3f} +- {s['se_mean_diff']:.3f} | "
                         f"{s['rms_diff']:.3f} | {s['n_higher']} | {s['mean_diff_split_tokens']:+.3f} +- "
                         f"{s['se_mean_diff_split_tokens']:.3f} ({s['n_split_tokens']}) | "
                         f"{s['coverage_of_reference']:.0%} | {s['mean_reference_se']:.3f} | "
                         f"{s['seconds_reference_total']:.0f} |")
        if mc_rows:
            lines += ["", "| config | MC tokens | default - MC | reference - MC | mean MC se |", "|---|---|---|---|---|"]
            for name, s in list(res.get("by_config", {}).items()) + [("all", res["summary"])]:
                m = s.get("mc")
                if m and m["n_tokens"]:
                    lines.append(f"| {name} | {m['n_tokens']} | {m['mean_default_minus_mc']:+.3f} +- "
                                 f"{m['se_default_minus_mc']:.3f} | {m['mean_reference_minus_mc']:+.3f} +- "
                                 f"{m['se_reference_minus_mc']:.3f} | {m['mean_mc_se']:.3f} |")
        return "\n".join(lines) + "\n"
    lines = [f"Cost ({res['label']}, {res['embgeom']}), {len(res['tokens'])} SmolLM2 tokens, origin ball, one thread.", "",
             "| chains | s per token | median 95% width | within 1 nat |", "|---|---|---|---|"]
    for r in res["runs"]:
        lines.append(f"| {r['n_chains']} | {r['seconds_per_token']:.2f} | {r['median_width']:.2f} | "
                     f"{r['share_within_1_nat']:.0%} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=["truth", "bias", "cost"])
    ap.add_argument("--quick", action="store_true", help="fewer cases, seeds and tokens")
    ap.add_argument("--cases", nargs="+", default=None,
                    help="truth: only the cases whose name contains one of these strings")
    ap.add_argument("--seeds", type=int, default=None, help="truth: seeds per case (50; 10 quick)")
    ap.add_argument("--w-npy", default=None,
                    help="cost (required), bias (SmolLM2, optional: else loaded offline): float32 (V, d) unembedding")
    ap.add_argument("--tokens", type=int, default=8, help="cost: tokens")
    ap.add_argument("--label", default="after", help="cost: name of this tree in the output")
    ap.add_argument("--configs", default=None,
                    help="bias: comma-separated of gauss16, gauss32, smollm2 (all; quick: gauss16,smollm2)")
    ap.add_argument("--tokens-per-config", type=int, default=None, help="bias: tokens per config (12; 6 quick)")
    ap.add_argument("--smollm2-rows", type=int, default=4000,
                    help="bias: random sub-vocabulary of SmolLM2's rows (> 2,048: the working-set path)")
    ap.add_argument("--smollm2-seed", type=int, default=0, help="bias: seed of the sub-vocabulary and tokens")
    ap.add_argument("--smollm2-tokens", type=int, default=None,
                    help="bias: SmolLM2 tokens (one per row-norm stratum; default --tokens-per-config)")
    ap.add_argument("--reuse-reference", default=None,
                    help="bias: a previous bias json whose reference values (same settings) are reused")
    ap.add_argument("--default-seeds", type=int, default=3, help="bias: runs of the default per token")
    ap.add_argument("--default-chains", type=int, default=128,
                    help="bias: cell_volumes(n_chains=...) of the default (128)")
    ap.add_argument("--ref-chains", type=int, default=512, help="bias: reference chains per rep")
    ap.add_argument("--ref-reps", type=int, default=4, help="bias: independent fixed-level reps")
    ap.add_argument("--ref-moves", type=int, default=10, help="bias: LIN-ESS moves per level")
    ap.add_argument("--ref-pilot", type=int, default=256, help="bias: pilot chains (the levels)")
    ap.add_argument("--ref-truth-seeds", type=int, default=None,
                    help="bias: seeds of the reference's own truth check (4; 2 quick; 0 skips it)")
    ap.add_argument("--ref-truth-highd-seeds", type=int, default=None,
                    help="bias: seeds of the reference on an orthant k=14 in d=576 with 3,999 rows "
                         "(SmolLM2's size; 2; 0 quick)")
    ap.add_argument("--rare-event-options", type=json.loads, default=None,
                    help="bias: JSON dict passed to cell_volumes(rare_event_options=...)")
    ap.add_argument("--mc-samples", type=int, default=8_000_000,
                    help="bias: plain Monte Carlo directions per Gaussian config (0: none)")
    ap.add_argument("--mc-samples-smollm2", type=int, default=2_000_000,
                    help="bias: plain Monte Carlo directions for SmolLM2 (0: none)")
    ap.add_argument("--tag", default="", help="suffix of the output file names")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    if args.seeds is None:
        args.seeds = 10 if args.quick else 50
    if args.configs is None:
        args.configs = "gauss16,smollm2" if args.quick else "gauss16,gauss32,smollm2"
    args.configs = [c for c in args.configs.split(",") if c]
    if args.tokens_per_config is None:
        args.tokens_per_config = 6 if args.quick else 12
    if args.ref_truth_seeds is None:
        args.ref_truth_seeds = 2 if args.quick else 4
    if args.ref_truth_highd_seeds is None:
        args.ref_truth_highd_seeds = 0 if args.quick else 2
    if args.part == "cost" and not args.w_npy:
        ap.error("cost needs --w-npy")
    res = {"truth": run_truth, "bias": run_bias, "cost": run_cost}[args.part](args)
    os.makedirs(args.out, exist_ok=True)
    stem = args.part + ("_quick" if args.quick else "") + (f"_{args.label}" if args.part == "cost" else "")
    stem += f"_{args.tag}" if args.tag else ""
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(_markdown(res))
    print(f"wrote {os.path.join(args.out, stem)}.json/.md")


if __name__ == "__main__":
    main()
