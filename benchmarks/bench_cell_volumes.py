"""Cell-assignment throughput on SmolLM2's real unembedding (49152 x 576), in one run.

Prints points per second (median of ``--reps`` interleaved rounds) for
  Decoder.assign            ours: blocked float32 product + running argmax folded with numpy's
                            SIMD argmax (default blocks; ``--assign-blocks`` adds other shapes)
  cell_volumes (uniform)    Gaussian directions + assign + count, origin ball
  blocked GEMM alone        np.matmul(X[p:p+nb], W.T, out=buf) with buf (nb, |V|) preallocated:
                            the full vocabulary per block, nb points per block chosen so that the
                            output block fits the caches (nb swept, the best is the roofline)
  blocked matmul + argmax   the same blocks, then buf.argmax(axis=1): the strongest simple code
  prange fold (--prange)    the same blocks, folded by a numba kernel parallel over rows: a
                            rejected candidate (0.8-0.95x; numba leaves the max loop scalar)
  one GEMM (n, |V|)         the whole product into one preallocated (n, |V|) output: memory
                            bound (n = 2048: 400 MB written), the old roofline, for reference
and every ratio to the roofline, all from the same run. Timings on a shared machine are noisy:
only ratios within one run mean anything.

The BLAS kernel matters: this machine sets OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE) for old
OpenBLAS builds, which slows a current numpy. Compare by running the benchmark twice, the second
time with both unset in that command only (the header prints the kernel threadpoolctl sees):
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_cell_volumes.py
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE HF_HUB_OFFLINE=1 .venv/bin/python \
        benchmarks/bench_cell_volumes.py

``--rare-vs-uniform T``: the rare-event estimator (``log_cone_gaussian_measure``, origin ball,
``--chains`` chains) on ``T`` seeded uniform tokens, then uniform sampling (``cell_volumes``,
method "uniform") for the same wall time; for each: share of the ``T`` tokens resolved (95%
interval <= 1 nat; Clopper-Pearson for uniform), median log-interval width over them, the share
of the whole vocabulary resolved, cost per token and per resolved token, wall time.

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_cell_volumes.py [--n 2048] [--reps 5]
        [--sweep] [--rare-vs-uniform 20] [--unargmaxable] [--w-npy W.npy] [--json out.json]

``--sweep`` times assign for several (point_block, vocab_block); ``--unargmaxable`` runs the exact
scan of the whole vocabulary once and prints its time and how many tokens needed an LP.
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

from embgeom.cells import Decoder  # noqa: E402
from embgeom.volumes import cell_volumes  # noqa: E402


def load_w(path: str | None) -> np.ndarray:
    if path:
        return np.load(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from embgeom.adapters import load_model, unembedding

    u = unembedding(load_model("smollm2-135m"))
    return Decoder.from_unembedding(u).W_


def best_time(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _prange_fold():
    """A numba running argmax parallel over rows, in column chunks (candidate for assign)."""
    from numba import njit, prange

    @njit("void(float32[:, ::1], int64, float32[::1], int64[::1])", parallel=True, nogil=True,
          fastmath={"nnan", "ninf", "nsz", "arcp", "contract", "afn", "reassoc"}, cache=False)
    def fold(logits, offset, best_val, best_idx):
        nb, vb = logits.shape
        chunk = 1024
        for i in prange(nb):
            row = logits[i]
            bv = best_val[i]
            bi = best_idx[i]
            for c0 in range(0, vb, chunk):
                c1 = min(c0 + chunk, vb)
                m = row[c0]
                for j in range(c0 + 1, c1):  # vectorised max over the chunk
                    m = max(m, row[j])
                if m > bv:  # rare after the first chunks: find the first index of m
                    for j in range(c0, c1):
                        if row[j] == m:
                            bi = offset + j
                            break
                    bv = m
            best_val[i] = bv
            best_idx[i] = bi

    return fold


def blas_info() -> list[str]:
    lines = []
    try:
        from threadpoolctl import threadpool_info

        for info in threadpool_info():
            lines.append(f"{info.get('internal_api')} {info.get('version')} kernel={info.get('architecture')} "
                         f"threads={info.get('num_threads')}")
    except ImportError:
        lines.append("threadpoolctl not installed")
    return lines


def throughput(args, W) -> dict:
    V, d = W.shape
    dec = Decoder(W)
    rng = np.random.default_rng(0)
    n = args.n
    X = rng.standard_normal((n, d)).astype(np.float32)
    dec.assign(X[:8])  # compile / warm
    fold = _prange_fold() if args.prange else None
    from embgeom.supports import Ball

    ball = Ball.from_params(None, 1.0, dim=d)
    bufs = {nb: np.empty((nb, V), dtype=np.float32) for nb in args.nb}

    def gemm_alone(nb):
        buf = bufs[nb]
        for p0 in range(0, n, nb):
            xb = X[p0 : p0 + nb]
            np.matmul(xb, W.T, out=buf[: xb.shape[0]])

    def gemm_argmax(nb):
        buf = bufs[nb]
        out = np.empty(n, dtype=np.int64)
        for p0 in range(0, n, nb):
            xb = X[p0 : p0 + nb]
            o = buf[: xb.shape[0]]
            np.matmul(xb, W.T, out=o)
            out[p0 : p0 + xb.shape[0]] = o.argmax(axis=1)
        return out

    def gemm_fold(nb):
        buf = bufs[nb]
        bv = np.full(n, -np.inf, dtype=np.float32)
        bi = np.zeros(n, dtype=np.int64)
        for p0 in range(0, n, nb):
            xb = X[p0 : p0 + nb]
            o = buf[: xb.shape[0]]
            np.matmul(xb, W.T, out=o)
            fold(o, 0, bv[p0 : p0 + xb.shape[0]], bi[p0 : p0 + xb.shape[0]])
        return bi

    full_out = np.empty((n, V), dtype=np.float32)
    timers = {"Decoder.assign": lambda: dec.assign(X)}
    for spec in args.assign_blocks:  # other block shapes of the same code (constructor arguments)
        pb, vb = (int(v) for v in spec.lower().split("x"))
        dd = Decoder(W, point_block=pb, vocab_block=min(vb, V))
        dd.assign(X[:8])
        timers[f"Decoder.assign {pb}x{min(vb, V)}"] = (lambda dd=dd: dd.assign(X))
    timers |= {
              "cell_volumes (uniform)": lambda: cell_volumes(dec, ball, n, seed=0, batch_size=n,
                                                             progress=False, method="uniform")}
    for nb in args.nb:
        timers[f"blocked GEMM alone nb={nb}"] = (lambda nb=nb: gemm_alone(nb))
        timers[f"blocked matmul + argmax nb={nb}"] = (lambda nb=nb: gemm_argmax(nb))
        if args.prange:
            timers[f"fused prange fold nb={nb}"] = (lambda nb=nb: gemm_fold(nb))
    timers["one GEMM (n, |V|)"] = lambda: np.matmul(X, W.T, out=full_out)
    ref = (X[:256] @ W.T).argmax(axis=1)
    checks = {"Decoder.assign": bool(np.array_equal(dec.assign(X[:256]), ref))}
    for fn in timers.values():
        fn()  # warm (compiles the fold)
    if args.prange:
        checks["fused prange fold"] = bool(np.array_equal(gemm_fold(args.nb[0])[:256], ref))
    times = {k: [] for k in timers}
    for _ in range(args.reps):  # interleaved rounds; medians
        for k, fn in timers.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    roof_key = min((k for k in med if k.startswith("blocked GEMM alone")), key=med.get)
    roof = med[roof_key]
    print(f"\n{'method':36s} {'points/s':>10s} {'x roofline':>11s}")
    for k, t in med.items():
        print(f"{k:36s} {n / t:10.0f} {roof / t:11.2f}" + ("   <- roofline" if k == roof_key else ""))
    best_np = min((k for k in med if k.startswith("blocked matmul + argmax")), key=med.get)
    folds = [k for k in med if k.startswith("fused prange fold")]
    best_fold = min(folds, key=med.get) if folds else None
    print(f"\nroofline: {roof_key} ({n / roof:.0f} points/s)")
    print(f"Decoder.assign / roofline           {roof / med['Decoder.assign']:.2f}x")
    print(f"Decoder.assign / {best_np:20s}   {med[best_np] / med['Decoder.assign']:.2f}x")
    if best_fold:
        print(f"{best_fold} / roofline   {roof / med[best_fold]:.2f}x")
    print(f"equal to numpy argmax on 256 points: {checks}")
    return {"n": n, "reps": args.reps, "points_per_s": {k: n / t for k, t in med.items()},
            "roofline": roof_key, "assign_over_roofline": roof / med["Decoder.assign"],
            "assign_over_numpy_argmax": med[best_np] / med["Decoder.assign"],
            "fold_over_roofline": roof / med[best_fold] if best_fold else None, "checks": checks}


def rare_vs_uniform(args, W) -> dict:
    """Rare-event on T tokens vs uniform sampling for the same wall time (origin ball)."""
    from scipy import stats

    from embgeom._rare_event import log_cone_gaussian_measure

    V, d = W.shape
    toks = np.sort(np.random.default_rng(args.token_seed).choice(V, args.rare_vs_uniform, replace=False))
    t0 = time.perf_counter()
    r = log_cone_gaussian_measure(W, toks, None, n_chains=args.chains, seed=0)
    wall_re = time.perf_counter() - t0
    width_re = r.log_upper - r.log_lower
    # uniform sampling for the same wall time: what cell_volumes does on the origin ball (Gaussian
    # directions, Decoder.assign, counts), in seeded chunks until the rare-event wall time is used
    dec = Decoder(W)
    counts = np.zeros(V, dtype=np.int64)
    n_pts, chunk, i = 0, 2048, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < wall_re:
        X = np.random.default_rng([args.token_seed, i]).standard_normal((chunk, d), dtype=np.float32)
        counts += np.bincount(dec.assign(X), minlength=V)
        n_pts += chunk
        i += 1
    wall_u = time.perf_counter() - t0
    lo = stats.beta.ppf(0.025, counts, n_pts - counts + 1)  # Clopper-Pearson 95%
    hi = stats.beta.ppf(0.975, counts + 1, n_pts - counts)
    with np.errstate(divide="ignore"):
        width_u = np.where(counts > 0, np.log(hi) - np.log(lo), np.inf)
    res_re = width_re <= 1.0
    res_u_t = width_u[toks] <= 1.0
    rows = {
        "rare-event": {"wall_s": wall_re, "tokens": int(toks.size), "resolved_share": float(res_re.mean()),
                       "median_width": float(np.median(width_re)),
                       "vocab_resolved_share": float(res_re.sum() / V),
                       "s_per_token": wall_re / toks.size,
                       "s_per_resolved_token": wall_re / max(int(res_re.sum()), 1) if res_re.any() else float("inf")},
        "uniform": {"wall_s": wall_u, "points": int(n_pts), "resolved_share": float(res_u_t.mean()),
                    "median_width": float(np.median(width_u[toks])),
                    "vocab_resolved_share": float(np.mean(width_u <= 1.0)),
                    "tokens_with_hits": int((counts > 0).sum()),
                    "s_per_token": wall_u / V,
                    "s_per_resolved_token": wall_u / int((width_u <= 1.0).sum()) if (width_u <= 1.0).any() else float("inf")},
    }
    print(f"\nrare-event vs uniform sampling, same wall time, SmolLM2 origin ball, {toks.size} seeded tokens "
          f"(rare-event {args.chains} chains):")
    print(f"{'method':12s} {'wall s':>7s} {'resolved (<=1 nat) of T':>24s} {'median width':>13s} "
          f"{'of |V| resolved':>16s} {'s/token':>9s} {'s/resolved token':>17s}")
    for k, v in rows.items():
        print(f"{k:12s} {v['wall_s']:7.1f} {100 * v['resolved_share']:23.0f}% {v['median_width']:13.2f} "
              f"{100 * v['vocab_resolved_share']:15.3f}% {v['s_per_token']:9.3g} {v['s_per_resolved_token']:17.3g}")
    print(f"uniform: {n_pts:,} points, {rows['uniform']['tokens_with_hits']:,} of {V:,} tokens hit at least once; "
          "s/token is wall / |V| (every token counted), s/resolved token wall / tokens resolved")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2048, help="points per timed call")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--assign-blocks", nargs="*", default=["256x49152"],
                    help="extra Decoder.assign block shapes, point_block x vocab_block")
    ap.add_argument("--nb", type=int, nargs="+", default=[128, 256, 1024],
                    help="points per block of the full-vocabulary blocked GEMM (output nb x |V| float32)")
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--prange", action="store_true", help="also time the prange-fold candidate")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--rare-vs-uniform", type=int, default=0, metavar="T")
    ap.add_argument("--chains", type=int, default=128)
    ap.add_argument("--token-seed", type=int, default=0)
    ap.add_argument("--unargmaxable", action="store_true")
    ap.add_argument("--w-npy", default=None, help="load W from a .npy instead of the model")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    blas = blas_info()
    for line in blas:
        print("BLAS:", line)
    env = {k: os.environ.get(k, "") for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    print(f"{env} cpus={os.cpu_count()}")
    W = np.ascontiguousarray(load_w(args.w_npy), dtype=np.float32)
    V, d = W.shape
    print(f"W: {V} x {d} float32")
    res = {"blas": blas, "env": env}
    if not args.no_throughput:
        res["throughput"] = throughput(args, W)
    if args.sweep:
        X = np.random.default_rng(0).standard_normal((args.n, d)).astype(np.float32)
        print("\nblock sweep (points/s of assign):")
        for nb in (256, 1024, 2048):
            for vb in (4096, 8192, 16384, V):
                if nb * vb > 2**26:  # buffers over 256 MiB
                    continue
                dd = Decoder(W, point_block=nb, vocab_block=vb)
                t = best_time(lambda: dd.assign(X), args.reps)
                print(f"  point_block={nb:5d} vocab_block={vb:5d}: {args.n / t:8.0f}")
    if args.rare_vs_uniform:
        res["rare_vs_uniform"] = rare_vs_uniform(args, W)
    if args.unargmaxable:
        dec = Decoder(W)
        t0 = time.perf_counter()
        info = dec.unargmaxable(progress=True).to_dict()
        print(f"\nunargmaxable scan: {time.perf_counter() - t0:.0f} s, {info['n_unargmaxable']} unargmaxable, "
              f"{info['n_lp']} needed an LP, {info['n_undecided']} undecided; status {info['status_counts']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2)


if __name__ == "__main__":
    main()
