"""Cell-assignment throughput on SmolLM2's real unembedding (49152 x 576), in one run.

Prints points per second for
  ours            Decoder.assign (blocked float32 product + numba running argmax)
  ours (volumes)  cell_volumes with an origin ball (Gaussian directions + assign + count)
  numpy argmax    X @ W.T then argmax(axis=1): the obvious code
  product alone   numpy X @ W.T into a preallocated output (the roofline), and with a fresh output
  torch product   torch.matmul into a preallocated output (MKL), for reference only
and the ratios ours / product alone, all measured in this run (best of ``--reps``, interleaved).

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_cell_volumes.py [--n 2048] [--reps 3]
        [--sweep] [--unargmaxable] [--w-npy W.npy]

``--sweep`` times assign for several (point_block, vocab_block); ``--unargmaxable`` runs the exact
scan of the whole vocabulary once and prints its time and how many tokens needed an LP.
"""

from __future__ import annotations

import argparse
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2048, help="points per timed call")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--unargmaxable", action="store_true")
    ap.add_argument("--w-npy", default=None, help="load W from a .npy instead of the model")
    args = ap.parse_args(argv)

    try:
        from threadpoolctl import threadpool_info

        for info in threadpool_info():
            print(f"BLAS: {info.get('internal_api')} {info.get('version')} kernel={info.get('architecture')} "
                  f"threads={info.get('num_threads')}")
    except ImportError:
        pass
    print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')!r} cpus={os.cpu_count()}")

    W = np.ascontiguousarray(load_w(args.w_npy), dtype=np.float32)
    V, d = W.shape
    print(f"W: {V} x {d} float32")
    dec = Decoder(W)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.n, d)).astype(np.float32)
    out = np.empty((args.n, V), dtype=np.float32)
    dec.assign(X[:8])  # compile / warm

    try:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
        tX, tW = torch.from_numpy(X), torch.from_numpy(W)
        tout = torch.empty((args.n, V))

        def torch_prod():
            torch.matmul(tX, tW.T, out=tout)
    except ImportError:
        torch_prod = None

    from embgeom.supports import Ball

    blk = np.empty((min(dec.point_block, args.n), min(dec.vocab_block, V)), dtype=np.float32)

    def blocked_product():
        """The same blocked GEMMs as ``assign`` (same block sizes), without the argmax kernel."""
        nb, vb = blk.shape
        for p0 in range(0, args.n, nb):
            xb = X[p0 : p0 + nb]
            for v0 in range(0, V, vb):
                wb = W[v0 : v0 + vb]
                o = blk if (xb.shape[0], wb.shape[0]) == blk.shape else np.empty(
                    (xb.shape[0], wb.shape[0]), dtype=np.float32)
                np.matmul(xb, wb.T, out=o)

    ball = Ball.from_params(None, 1.0, dim=d)
    timers = {
        "ours (assign)": lambda: dec.assign(X),
        "ours (cell_volumes)": lambda: cell_volumes(dec, ball, args.n, seed=0, batch_size=args.n, progress=False),
        "numpy X@W.T + argmax": lambda: (X @ W.T).argmax(axis=1),
        "product alone (out=)": lambda: np.matmul(X, W.T, out=out),
        "product alone (fresh)": lambda: X @ W.T,
        "blocked product alone": blocked_product,
    }
    if torch_prod is not None:
        timers["torch product (out=)"] = torch_prod
    for fn in timers.values():
        fn()
    times = {k: float("inf") for k in timers}
    for _ in range(args.reps):  # interleaved, best of reps
        for k, fn in timers.items():
            times[k] = min(times[k], best_time(fn, 1))
    print(f"\n{'method':28s} {'points/s':>10s}")
    for k, t in times.items():
        print(f"{k:28s} {args.n / t:10.0f}")
    roof = times["product alone (out=)"]
    print("\nratios (points/s over product alone with out=):")
    for k in ("ours (assign)", "ours (cell_volumes)", "numpy X@W.T + argmax", "product alone (fresh)"):
        print(f"  {k:26s} {roof / times[k]:.2f}x")
    print(f"  ours (assign) / blocked product alone (same blocks, no kernel): "
          f"{times['blocked product alone'] / times['ours (assign)']:.2f}x")
    if torch_prod is not None:
        print(f"  ours (assign) / torch product: {times['torch product (out=)'] / times['ours (assign)']:.2f}x")
    check = np.array_equal(dec.assign(X[:256]), (X[:256] @ W.T).argmax(axis=1))
    print(f"assign equals numpy argmax on 256 points: {check}")

    if args.sweep:
        print("\nblock sweep (points/s of assign):")
        for nb in (256, 512, 1024):
            for vb in (1024, 2048, 4096, 8192):
                dd = Decoder(W, point_block=nb, vocab_block=vb)
                t = best_time(lambda: dd.assign(X), args.reps)
                print(f"  point_block={nb:5d} vocab_block={vb:5d}: {args.n / t:8.0f}   ({roof / t:.2f}x product)")

    if args.unargmaxable:
        t0 = time.perf_counter()
        res = dec.unargmaxable(progress=True)
        info = res.to_dict()
        print(f"\nunargmaxable scan: {time.perf_counter() - t0:.0f} s, {info['n_unargmaxable']} unargmaxable, "
              f"{info['n_lp']} needed an LP, {info['n_undecided']} undecided; status {info['status_counts']}")
        print(f"unargmaxable ids: {info['unargmaxable'][:50]}")


if __name__ == "__main__":
    main()
