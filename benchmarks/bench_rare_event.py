"""Rare-event cell shares: calibration on exact cases, and cost on SmolLM2's real unembedding.

Two parts, each optional:

``--truth``  coverage and log-error of :func:`embgeom._rare_event.log_cone_gaussian_measure`
    over ``--seeds`` seeds (default 50) at its default budget, on cones whose Gaussian measure
    is known exactly (randomly rotated): orthants ``2^-k`` (k = 10, 20, 40, 50 in d = 16..64),
    the cross-polytope ``1/(2d)``, the regular simplex ``1/(d+1)``. Prints per case: truth,
    mean error, RMS error, 95% coverage, mean interval width, seconds per run.

``--smollm2``  ``--tokens`` seeded random tokens of SmolLM2-135M (origin ball, ``G = I``; or the
    final-norm shell with ``--shell``), at the budget ``cell_volumes`` uses (``--chains``,
    default 128). Prints per token the log-share, its 95% interval, levels, working-set size,
    points checked against all of W, the working-set correction and seconds; then the median
    cost per token, the median interval width, the share of tokens resolved (interval <= 1
    nat), the projected wall time of 1,000 tokens, and what uniform sampling would resolve in
    the same wall time (Decoder.assign's throughput measured in this run; a token counts as
    resolved there with >= 16 hits, where the Clopper-Pearson log-interval is about 1 nat;
    expected from the rare-event shares with Poisson counts). ``--reference K`` reruns the
    first K tokens with 8x the chains and 4096 constraints and prints the difference.

Timings are wall clock on whatever machine runs it; on the shared 2-core development machine
they varied by 2x between runs (load average 8-10 during the figures in docs/theory.md).

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_rare_event.py --truth [--seeds 50]
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_rare_event.py --smollm2 [--tokens 20]
        [--chains 128] [--shell] [--reference 3] [--w-npy W.npy] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from embgeom._rare_event import log_cone_gaussian_measure  # noqa: E402
from embgeom.cells import Decoder  # noqa: E402


# ------------------------------------------------------------------------------- exact cases
def _rotate(W, seed):
    from scipy.stats import special_ortho_group

    return W @ special_ortho_group.rvs(W.shape[1], random_state=seed).T


def truth_cases():
    """(name, W, token, exact log-share) for cones of known Gaussian measure."""
    cases = []
    for k, d in [(10, 16), (20, 32), (40, 64), (50, 64)]:
        W = np.vstack([np.zeros(d), -np.eye(d)[:k]])
        cases.append((f"orthant k={k} d={d}", _rotate(W, k), 0, k * math.log(0.5)))
    d = 8
    cases.append((f"cross-polytope d={d}", _rotate(np.vstack([np.eye(d), -np.eye(d)]), 1), 0, -math.log(2 * d)))
    d = 5
    E = np.eye(d + 1) - 1.0 / (d + 1)
    U = np.linalg.svd(E.T)[0]
    cases.append((f"simplex d={d}", _rotate(E @ U[:, :d], 2), 0, -math.log(d + 1)))
    return cases


def run_truth(seeds: int) -> list[dict]:
    rows = []
    print(f"{'case':24s} {'log truth':>10s} {'mean err':>9s} {'RMS err':>8s} {'coverage':>9s} {'width':>6s} {'s/run':>6s}")
    for name, W, t, lt in truth_cases():
        err, cover, width, secs = [], [], [], []
        for s in range(seeds):
            r = log_cone_gaussian_measure(W, [t], seed=s)
            err.append(r.log_share[0] - lt)
            cover.append(r.log_lower[0] <= lt <= r.log_upper[0])
            width.append(r.log_upper[0] - r.log_lower[0])
            secs.append(r.seconds[0])
        err = np.array(err)
        row = {"case": name, "log_truth": lt, "mean_err": float(err.mean()),
               "rms_err": float(np.sqrt(np.mean(err**2))), "coverage": float(np.mean(cover)),
               "mean_width": float(np.mean(width)), "seconds": float(np.mean(secs)), "seeds": seeds}
        rows.append(row)
        print(f"{name:24s} {lt:10.3f} {row['mean_err']:9.3f} {row['rms_err']:8.3f} {row['coverage']:9.2f} "
              f"{row['mean_width']:6.2f} {row['seconds']:6.2f}", flush=True)
    return rows


# ------------------------------------------------------------------------------- SmolLM2
def load_w(path, shell: bool):
    if path and not shell:
        return np.load(path), None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from embgeom.adapters import load_model, unembedding

    from model_lambda import w_and_g  # benchmarks/ is on sys.path when this runs as a script

    return w_and_g(unembedding(load_model("smollm2-135m")), shell)


def uniform_throughput(W, n: int = 2048) -> float:
    """Decoder.assign points per second (best of 2), on Gaussian directions."""
    dec = Decoder(W)
    X = np.random.default_rng(0).standard_normal((n, W.shape[1]), dtype=np.float32)
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        dec.assign(X)
        best = min(best, time.perf_counter() - t0)
    return n / best


def run_smollm2(args) -> dict:
    W, G = load_w(args.w_npy, args.shell)
    V = W.shape[0]
    toks = np.sort(np.random.default_rng(args.token_seed).choice(V, args.tokens, replace=False))
    t0 = time.perf_counter()
    r = log_cone_gaussian_measure(W, toks, G, n_chains=args.chains, seed=0)
    wall = time.perf_counter() - t0
    print(f"SmolLM2 {'final-norm shell' if args.shell else 'origin ball'}: {toks.size} tokens, "
          f"{args.chains} chains each, wall {wall:.1f} s")
    print(f"{'token':>6s} {'log share':>9s} {'95% interval':>17s} {'width':>6s} {'lev':>4s} {'|S|':>5s} "
          f"{'checked':>7s} {'corr':>6s} {'s':>6s}")
    for i, t in enumerate(toks):
        print(f"{t:6d} {r.log_share[i]:9.2f} [{r.log_lower[i]:7.2f},{r.log_upper[i]:7.2f}] "
              f"{r.log_upper[i] - r.log_lower[i]:6.2f} {r.n_levels[i]:4d} {r.n_constraints_used[i]:5d} "
              f"{r.n_full_checks[i]:7d} {r.log_check_fraction[i]:6.2f} {r.seconds[i]:6.1f}  {r.side[i]}")
    fin = np.isfinite(r.log_share)
    width = r.log_upper - r.log_lower
    per_tok = float(np.median(r.seconds))
    mean_tok = float(np.mean(r.seconds))
    rate = uniform_throughput(W)
    n_uniform = rate * wall  # points assignable in the same wall time
    p = np.exp(r.log_share[fin])
    from scipy import stats

    resolved_uniform = float(np.mean(stats.poisson.sf(15, n_uniform * p)))  # P(hits >= 16)
    out = {
        "support": "final-norm shell" if args.shell else "origin ball",
        "tokens": int(toks.size), "chains": args.chains, "wall_s": wall,
        "median_s_per_token": per_tok, "mean_s_per_token": mean_tok,
        "projected_1000_tokens_min": 1000 * mean_tok / 60,
        "median_log_share": float(np.median(r.log_share[fin])),
        "log_share_range": [float(r.log_share[fin].min()), float(r.log_share[fin].max())],
        "median_width": float(np.median(width[fin])),
        "resolved_1nat": float(np.mean(width[fin] <= 1.0)),
        "median_levels": float(np.median(r.n_levels)),
        "median_working_set": float(np.median(r.n_constraints_used)),
        "median_points_checked": float(np.median(r.n_full_checks)),
        "median_correction": float(np.median(r.log_check_fraction[fin])),
        "uniform_points_per_s": rate, "uniform_points_same_wall": n_uniform,
        "uniform_resolved_same_wall": resolved_uniform,
    }
    print(f"median log-share {out['median_log_share']:.2f} (range {out['log_share_range'][0]:.1f} .. "
          f"{out['log_share_range'][1]:.1f}); median 95% width {out['median_width']:.2f} nats; "
          f"resolved (<= 1 nat) {100 * out['resolved_1nat']:.0f}%")
    print(f"cost per token: median {per_tok:.2f} s, mean {mean_tok:.2f} s -> 1,000 tokens ~ "
          f"{out['projected_1000_tokens_min']:.0f} min; levels {out['median_levels']:.0f}, working set "
          f"{out['median_working_set']:.0f}, points checked on all of W {out['median_points_checked']:.0f}, "
          f"working-set cone above the share by {-out['median_correction']:.2f} nats (median)")
    print(f"uniform sampling in the same {wall:.0f} s: {n_uniform:,.0f} points ({rate:,.0f} points/s); "
          f"expected share of these tokens with >= 16 hits: {100 * resolved_uniform:.2g}%")
    if args.reference:
        K = min(args.reference, toks.size)
        ref = log_cone_gaussian_measure(W, toks[:K], G, n_chains=8 * args.chains, max_constraints=4096, seed=1)
        d = r.log_share[:K] - ref.log_share
        z = d / np.hypot(r.std_err[:K], ref.std_err)
        print("reference (8x chains, 4096 constraints, other seed): " + ", ".join(
            f"{t}: {a:.2f} vs {b:.2f} (z {zz:+.1f})" for t, a, b, zz in zip(toks[:K], r.log_share[:K], ref.log_share, z)))
        out["reference"] = {"tokens": toks[:K].tolist(), "estimate": r.log_share[:K].tolist(),
                            "reference": ref.log_share.tolist(), "z": z.tolist()}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--truth", action="store_true")
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--smollm2", action="store_true")
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--token-seed", type=int, default=0)
    ap.add_argument("--chains", type=int, default=128)
    ap.add_argument("--shell", action="store_true", help="final-norm shell instead of the origin ball")
    ap.add_argument("--reference", type=int, default=0)
    ap.add_argument("--w-npy", default=None, help="load W from a .npy instead of the model")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not (args.truth or args.smollm2):
        ap.error("choose --truth and/or --smollm2")
    res = {}
    if args.truth:
        res["truth"] = run_truth(args.seeds)
    if args.smollm2:
        res["smollm2"] = run_smollm2(args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2)


if __name__ == "__main__":
    main()
