"""Accuracy and bias of the rare-event cell shares at the DEFAULT budget of ``cell_volumes``.

Three parts (issue 22, items 3 and 4), each written to ``benchmarks/results/rare_event/``:

``truth``  Cells whose share is known exactly, randomly rotated, run through
    ``cell_volumes(decoder, Ball(0, 1), N_SAMPLES, seed=s, tokens=[t])`` with every other
    argument at its default (``method="auto"``, runs of 128 chains until the standard error
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
    multinomial resampling of every chain, LIN-ESS moves (the default uses adaptive multilevel
    splitting with kill-and-copy, resampling within groups, reflected Hamiltonian moves and a
    working set). Fixed levels make the product of fractions unbiased for ``p`` with any
    invariant move (Del Moral, *Feynman-Kac formulae*, 2004, Sec. 3.5), whatever the pilot's
    levels. Tokens of random Gaussian decoders (|V| = 4,000 > the 2,048-constraint cap, so the
    default takes its working-set path; d = 16, 32), shares about ``e^-2`` to ``e^-20``; the
    mean of (default - reference) over tokens is the systematic bias.

``cost``  Seconds per token (one thread) of the default at 128 chains and of 1,024 chains, on
    SmolLM2-135M's unembedding (origin ball) when ``--w-npy`` gives it (float32 ``(V, d)``),
    with the median 95% interval width: run once with this tree and once with the tree to
    compare (``PYTHONPATH``) to get "before" and "after".

Usage (single-threaded: ``OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1``):
    .venv/bin/python benchmarks/bench_rare_event_accuracy.py truth [--quick] [--seeds 50]
    .venv/bin/python benchmarks/bench_rare_event_accuracy.py bias [--quick]
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

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if not any(os.path.isdir(os.path.join(p, "embgeom")) for p in sys.path if p):
    sys.path.insert(0, os.path.join(HERE, ".."))

from embgeom import _rare_kernels  # noqa: E402
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


def truth_cases(quick: bool):
    """(name, builder(seed) -> (W, token, exact log-share))."""
    cases = [
        ("sector 2-D share 1e-1", lambda s: sector(0.1, s)),
        ("sector 2-D share 1e-3", lambda s: sector(1e-3, s)),
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
    if quick:
        keep = {"sector 2-D share 1e-3", "cross-polytope d=8", "simplex d=32", "orthant k=10 d=16",
                "orthant k=30 d=48", "orthant k=50 d=64", "orthant k=15 d=24 +3000 rows"}
        cases = [c for c in cases if c[0] in keep]
    return cases


def run_truth(args) -> dict:
    rows = []
    for name, build in truth_cases(args.quick):
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
               "coverage": float(np.mean(cover)), "median_width": float(np.median(width)),
               "estimator": ",".join(sorted(set(methods))), "seconds_per_call": float(np.mean(secs)),
               "mean_runs": float(np.mean(runs)), "max_runs": int(np.max(runs)),
               "mean_chains": float(np.mean(runs)) * cv.extra["rare_event"].get("n_chains", 128)}
        rows.append(row)
        print(f"{name:32s} {lt:8.2f} bias {row['mean_error']:+.3f} +- {row['se_of_mean']:.3f} "
              f"rms {row['rms_error']:.3f} max {row['max_abs_error']:.3f} cover {row['coverage']:.2f} "
              f"width {row['median_width']:.2f} [{row['estimator']}] runs {row['mean_runs']:.1f} "
              f"(max {row['max_runs']}) {row['seconds_per_call']:.2f} s",
              flush=True)
    return {"part": "truth", "n_samples": N_SAMPLES, "seeds": args.seeds, "rows": rows}


# ------------------------------------------------------------------------- the reference
def _unit_constraints(W, t):
    """Unit rows ``(w_t - w_s) / |w_t - w_s|``, s != t (float64 (V - 1, d))."""
    A = np.asarray(W, np.float64)[t] - np.delete(np.asarray(W, np.float64), t, axis=0)
    return A / np.linalg.norm(A, axis=1, keepdims=True)


def _ess_moves(X, A, shift, n_moves, rng):
    """``n_moves`` exact LIN-ESS steps of every chain inside ``{A x + shift >= 0}``."""
    P = np.ascontiguousarray(X @ A.T)
    sh = np.full(A.shape[0], float(shift))
    for _ in range(n_moves):
        nu = rng.standard_normal(X.shape)
        Q = np.ascontiguousarray(nu @ A.T)
        th = _rare_kernels.ess_angles(P, Q, sh, rng.random(X.shape[0]))
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


def reference_log_share(W, t, seed, *, n_chains=1024, n_reps=4, n_moves=10, pilot_chains=256):
    """Independent estimate of token ``t``'s log Gaussian share (origin ball, no bias).

    A pilot run (adaptive levels, ``pilot_chains``) fixes the levels; ``n_reps`` independent
    fixed-level runs of ``n_chains`` chains each give unbiased estimates ``p_i`` of the share;
    returns ``(log mean p_i, standard error of log mean)`` in nats (delta method over the reps).
    """
    rng = np.random.default_rng(seed)
    A = _unit_constraints(W, t)
    _, levels = _splitting(A, pilot_chains, rng, n_moves)
    if levels[-1] != 0.0:
        levels = levels + [0.0]
    reps = np.array([_splitting(A, n_chains, rng, n_moves, levels=levels)[0] for _ in range(n_reps)])
    p = np.exp(reps - reps.max())
    log_mean = float(np.log(p.mean()) + reps.max())
    se = float(p.std(ddof=1) / math.sqrt(n_reps) / p.mean())
    return log_mean, se


def run_bias(args) -> dict:
    rows = []
    configs = [(16, 1), (32, 2)] if not args.quick else [(16, 1)]
    per = 6 if args.quick else 12
    for d, wseed in configs:
        rng = np.random.default_rng(100 + wseed)
        V = 4000
        # row norms spread out, as in real unembeddings: cell shares from e^-2 to e^-20
        W = (rng.standard_normal((V, d)) * rng.uniform(0.6, 1.4, (V, 1))).astype(np.float32)
        toks = np.sort(rng.choice(V, per, replace=False))
        t0 = time.perf_counter()
        cv = cell_volumes(Decoder(W), Ball.from_params(np.zeros(d), 1.0), N_SAMPLES, seed=wseed,
                          tokens=toks, progress=False)
        t_def = (time.perf_counter() - t0) / per
        for t in toks:
            t1 = time.perf_counter()
            ref, ref_se = reference_log_share(W, int(t), seed=int(t))
            t_ref = time.perf_counter() - t1
            lf, lo, hi = cv.log_fractions[t], cv.log_lower[t], cv.log_upper[t]
            row = {"d": d, "V": V, "token": int(t), "default": float(lf), "default_lower": float(lo),
                   "default_upper": float(hi), "method": str(cv.token_method[t]), "reference": ref,
                   "reference_se": ref_se, "diff": float(lf - ref),
                   "covered": bool(lo <= ref <= hi), "seconds_reference": t_ref,
                   "seconds_default_per_token": t_def}
            rows.append(row)
            print(f"d={d} t={t:5d} default {lf:8.3f} [{lo:7.2f}, {hi:7.2f}] ({row['method']}) "
                  f"reference {ref:8.3f} +- {ref_se:.3f} diff {row['diff']:+.3f} ({t_ref:.1f} s)",
                  flush=True)
    diff = np.array([r["diff"] for r in rows if np.isfinite(r["diff"])])
    split = np.array([r["diff"] for r in rows if np.isfinite(r["diff"]) and r["method"] == "rare-event"])
    summary = {"n_tokens": int(diff.size), "mean_diff": float(diff.mean()),
               "se_mean_diff": float(diff.std(ddof=1) / math.sqrt(diff.size)),
               "n_higher": int((diff > 0).sum()),
               "mean_diff_split_tokens": float(split.mean()) if split.size else float("nan"),
               "n_split_tokens": int(split.size),
               "coverage_of_reference": float(np.mean([r["covered"] for r in rows]))}
    print(json.dumps(summary))
    return {"part": "bias", "n_samples": N_SAMPLES, "rows": rows, "summary": summary}


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
        lines = [f"Truth cases at the default budget of `cell_volumes` (method='auto', runs of 128 "
                 f"chains until the standard error is target_se = 0.12 nats, at most 32; "
                 f"{res['n_samples']:,} uniform samples), {res['seeds']} seeds each. Runs: splitting "
                 "runs per token (0: the count was kept); s: seconds per call, one thread, loaded machine.", "",
                 "| case | log share | bias (nats) | RMS error | max error | 95% coverage | median width | estimator | mean runs (max) | mean chains | s per call |",
                 "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["rows"]:
            lines.append(f"| {r['case']} | {r['log_truth']:.2f} | {r['mean_error']:+.3f} +- {r['se_of_mean']:.3f} | "
                         f"{r['rms_error']:.3f} | {r['max_abs_error']:.3f} | {r['coverage']:.2f} | "
                         f"{r['median_width']:.2f} | {r['estimator']} | {r.get('mean_runs', 1):.1f} "
                         f"({r.get('max_runs', 1)}) | {r.get('mean_chains', 128):.0f} | "
                         f"{r['seconds_per_call']:.2f} |")
        return "\n".join(lines) + "\n"
    if res["part"] == "bias":
        s = res["summary"]
        lines = ["Default (`cell_volumes`, method='auto', 128 chains) against the fixed-level "
                 "LIN-ESS reference (1,024 chains x 4 reps, levels from a 256-chain pilot).", "",
                 "| d | token | default | 95% interval | method | reference | diff |", "|---|---|---|---|---|---|---|"]
        for r in res["rows"]:
            lines.append(f"| {r['d']} | {r['token']} | {r['default']:.3f} | [{r['default_lower']:.2f}, "
                         f"{r['default_upper']:.2f}] | {r['method']} | {r['reference']:.3f} +- "
                         f"{r['reference_se']:.3f} | {r['diff']:+.3f} |")
        lines += ["", f"Mean difference over {s['n_tokens']} tokens: {s['mean_diff']:+.3f} +- "
                  f"{s['se_mean_diff']:.3f} nats ({s['n_higher']} higher); split tokens only "
                  f"({s['n_split_tokens']}): {s['mean_diff_split_tokens']:+.3f}; the default's interval "
                  f"covers the reference for {s['coverage_of_reference']:.0%}."]
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
    ap.add_argument("--seeds", type=int, default=None, help="truth: seeds per case (50; 10 quick)")
    ap.add_argument("--w-npy", default=None, help="cost: float32 (V, d) unembedding")
    ap.add_argument("--tokens", type=int, default=8, help="cost: tokens")
    ap.add_argument("--label", default="after", help="cost: name of this tree in the output")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    if args.seeds is None:
        args.seeds = 10 if args.quick else 50
    if args.part == "cost" and not args.w_npy:
        ap.error("cost needs --w-npy")
    res = {"truth": run_truth, "bias": run_bias, "cost": run_cost}[args.part](args)
    os.makedirs(args.out, exist_ok=True)
    stem = args.part + ("_quick" if args.quick else "") + (f"_{args.label}" if args.part == "cost" else "")
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(_markdown(res))
    print(f"wrote {os.path.join(args.out, stem)}.json/.md")


if __name__ == "__main__":
    main()
