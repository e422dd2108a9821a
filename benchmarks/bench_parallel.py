"""The unargmaxable scan and the cell volumes on SmolLM2's W: serial vs Ray with 2 workers, in one run.

Prints, on SmolLM2-135M's unembedding (49,152 x 576 float32, 113 MB):

  Ray start-up    import ray + ray.init of a local 2-CPU cluster, then the first tasks (worker
                  processes start and import embgeom), each shown on its own line
  ray.put         storing the Decoder (its W) in the object store once
  unargmaxable    the exact scan of a seeded random subset of tokens (default 2,048): one
                  serial call (BLAS on every core: the strongest simple baseline) vs the token
                  chunks (default 2 of 1,024: one per worker) on Ray with 2 workers; the scan's per-chunk set-up
                  (distinct rows, whitening) is timed alone, serially and in a worker
  cell volumes    uniform cell-volume counts (default 32,768 Gaussian directions in 4 chunks):
                  serial cell_volumes vs the chunked counts on Ray with 2 workers (bit-identical,
                  checked)

and a paper calculation of the wall time of Gemma-3-270m's full vocabulary (262,144 tokens,
d = 640) on N machines like this one, from the measured per-token cost scaled by |V| d (each
witness check and each LP row is a product with every row of W) and the measured per-chunk
set-up scaled by |V| d^2 (the whitening covariance).

The workers run one BLAS thread each (Ray sets OMP_NUM_THREADS to a task's num_cpus); the
serial runs use every core. This machine has 2 cores shared with other jobs: the numbers are
noisy (2x between runs is common), and 2 workers on 2 cores can at best match a serial run
whose BLAS already uses both cores; the point of Ray is the N-machine column.

Measured here (Ray 2.60.0, load average 9-12, defaults): Ray start-up 13.2 s + worker warm-up
5.6 s, ray.put 0.11 s; unargmaxable 2,048 tokens 15.4 s serial vs 5.6 s on 2 workers; cell
volumes 32,768 points 73.7 s vs 40.1 s; identical results; Gemma's full vocabulary about 0.7 h
on one such machine, 0.05 h on 16 (table and caveats in docs/parallel.md).

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_parallel.py [--tokens 2048] [--chunk 1024]
        [--n-samples 32768] [--batch 8192] [--json out.json] [--w-npy W.npy]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from embgeom._parallel_workloads import cell_volume_counts, unargmaxable_chunked  # noqa: E402
from embgeom.cells import Decoder  # noqa: E402
from embgeom.parallel import RayExecutor  # noqa: E402
from embgeom.supports import Ball  # noqa: E402
from embgeom.volumes import cell_volumes  # noqa: E402

GEMMA_V, GEMMA_D = 262_144, 640  # Gemma-3-270m (docs/paper.md)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2048, help="tokens of the unargmaxable subset")
    ap.add_argument("--chunk", type=int, default=1024, help="tokens per unargmaxable task")
    ap.add_argument("--n-samples", type=int, default=32_768, help="cell-volume points")
    ap.add_argument("--batch", type=int, default=8192, help="cell-volume points per task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the figures as JSON here")
    ap.add_argument("--w-npy", default=None, help="SmolLM2's W saved as .npy (skips the model load)")
    args = ap.parse_args(argv)

    import ray

    print(f"ray {ray.__version__}, numpy {np.__version__}, cpus {os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.1f} (a shared machine: timings are noisy)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from embgeom.adapters import load_model, unembedding

    if args.w_npy:
        dec, t_load = timed(lambda: Decoder(np.load(args.w_npy)))
    else:
        dec, t_load = timed(lambda: Decoder.from_unembedding(unembedding(load_model("smollm2-135m"))))
    V, d = dec.n_tokens, dec.dim
    print(f"W: {V} x {d} float32 ({dec.W_.nbytes / 1e6:.0f} MB), model load {t_load:.1f} s")
    rng = np.random.default_rng(args.seed)
    subset = np.sort(rng.choice(V, size=args.tokens, replace=False))
    ball = Ball.from_params(None, 1.0, dim=d)  # origin ball, no bias: cells are cones, directions suffice
    rows = []

    # ---------------------------------------------------------------- serial baselines
    dec.unargmaxable(tokens=subset[:1], progress=False)  # numba kernels loaded, caches warm
    _, t_setup = timed(lambda: dec.unargmaxable(tokens=subset[:1], progress=False))
    ser, t_ser = timed(lambda: dec.unargmaxable(tokens=subset, progress=False))
    cv_ser, t_cv_ser = timed(lambda: cell_volumes(dec, ball, args.n_samples, seed=args.seed,
                                                  batch_size=args.batch, progress=False))

    # ---------------------------------------------------------------- Ray, 2 workers
    ex = RayExecutor(num_cpus=1, init_kwargs={"num_cpus": 2, "include_dashboard": False,
                                              "log_to_driver": False})
    try:
        ex.start()
        t_init = ex.startup_seconds_
        tiny = Decoder(np.eye(4, dtype=np.float32))
        _, t_warm = timed(lambda: cell_volume_counts(tiny, Ball.from_params(None, 1.0, dim=4), 2, 0, batch_size=1,
                                                     executor=ex, progress=False))
        _, t_put = timed(lambda: ex.put(dec))
        # a worker's per-chunk set-up (1 BLAS thread): 1-token chunks, the second round warm
        for _ in range(2):
            one = unargmaxable_chunked(dec, tokens=subset[:2], chunk_size=1, executor=ex, progress=False)
        setup_w = min(one.extra["chunk_seconds"])
        ray_un, t_ray_un = timed(lambda: unargmaxable_chunked(dec, tokens=subset, chunk_size=args.chunk,
                                                              executor=ex, progress=False))
        cv_ray, t_cv_ray = timed(lambda: cell_volume_counts(dec, ball, args.n_samples, args.seed,
                                                            batch_size=args.batch, executor=ex, progress=False))
    finally:
        ex.close()
    # the verdicts are exact: the chunked Ray scan must find the same unargmaxable tokens
    same_un = bool(np.array_equal(ray_un.tokens, ser.tokens) and ray_un.n_undecided == ser.n_undecided == 0)
    same_cv = bool(np.array_equal(cv_ray, cv_ser.counts))

    n_chunks = -(-args.tokens // args.chunk)
    rows += [
        ("Ray start-up (import ray + ray.init, 2-CPU local cluster)", t_init, ""),
        ("Ray worker warm-up (first 2 tasks: processes + imports)", t_warm, ""),
        (f"ray.put of the Decoder ({dec.W_.nbytes / 1e6:.0f} MB), once per map", t_put, ""),
        ("unargmaxable scan set-up alone (1 token), serial", t_setup, ""),
        ("unargmaxable scan set-up alone (1 token), in a Ray worker", setup_w, ""),
        (f"unargmaxable {args.tokens} tok: serial, one call", t_ser, f"{1e3 * t_ser / args.tokens:.2f} ms/tok"),
        (f"unargmaxable {args.tokens} tok: {n_chunks} chunks, Ray 2 workers", t_ray_un,
         f"x{t_ser / t_ray_un:.2f} vs serial, identical: {same_un}"),
        (f"cell volumes {args.n_samples} pts: serial", t_cv_ser, f"{args.n_samples / t_cv_ser:.0f} pt/s"),
        (f"cell volumes {args.n_samples} pts: {-(-args.n_samples // args.batch)} chunks, Ray 2 workers",
         t_cv_ray, f"x{t_cv_ser / t_cv_ray:.2f} vs serial, identical: {same_cv}"),
    ]
    width = max(len(r[0]) for r in rows)
    print()
    print(f"{'step':<{width}}  {'seconds':>8}  note")
    for name, sec, note in rows:
        print(f"{name:<{width}}  {sec:8.2f}  {note}")

    # ---------------------------------------------------------------- Gemma on N machines (paper)
    # per-token work scales with |V| d; the set-up (covariance of W) with |V| d^2; W's transfer
    # with its size. Per machine: the measured Ray throughput of 2 workers on 2 cores.
    scale_tok = (GEMMA_V * GEMMA_D) / (V * d)
    scale_setup = (GEMMA_V * GEMMA_D**2) / (V * d * d)
    per_tok_serial = (t_ser - t_setup) / args.tokens
    # worker-seconds per token: each chunk's time minus its set-up, over its tokens (median chunk)
    sizes = [min(args.chunk, args.tokens - s) for s in range(0, args.tokens, args.chunk)]
    per_tok_ray = float(np.median([max(sec - setup_w, 0.0) / k for sec, k in zip(ray_un.extra["chunk_seconds"], sizes)]))
    print()
    print(f"Gemma-3-270m full vocabulary ({GEMMA_V} tokens, d = {GEMMA_D}): per-token cost x{scale_tok:.2f} "
          f"(|V| d), set-up x{scale_setup:.2f} (|V| d^2), W put x{scale_tok:.2f}")
    ser_note = f"{1e3 * per_tok_serial:.2f} ms/token" if per_tok_serial > 0 else "n/a (set-up noise exceeded it)"
    print(f"  measured here: serial {ser_note} (2 BLAS threads); Ray {1e3 * per_tok_ray:.2f} worker-ms/token "
          f"(1 BLAS thread per worker), set-up {setup_w:.2f} s per chunk in a worker")
    gemma = {"per_token_worker_ms_smollm2": 1e3 * per_tok_ray, "setup_worker_s_smollm2": setup_w,
             "scale_token": scale_tok, "scale_setup": scale_setup, "n_machines": {}}
    if per_tok_serial > 0:
        gemma["serial_hours"] = (GEMMA_V * per_tok_serial * scale_tok + t_setup * scale_setup) / 3600
        print(f"  one process here, serial (one set-up): {gemma['serial_hours']:.2f} h")
    print(f"  {'machines':>8}  {'workers':>7}  {'chunk':>6}  {'wall (h)':>9}   (2 workers per machine, incl. start-up and put)")
    for n in (1, 2, 4, 8, 16, 32, 64, 128):
        workers = 2 * n
        chunk = min(8192, max(1024, -(-GEMMA_V // workers)))  # fewer tokens per chunk when workers abound
        chunks = -(-GEMMA_V // chunk)
        per_chunk = chunk * per_tok_ray * scale_tok + setup_w * scale_setup  # worker-seconds
        rounds = -(-chunks // workers)  # chunks are the unit: the last round may idle
        wall = t_init + t_warm + t_put * scale_tok + rounds * per_chunk
        gemma["n_machines"][n] = {"chunk": chunk, "hours": wall / 3600}
        print(f"  {n:>8}  {workers:>7}  {chunk:>6}  {wall / 3600:9.2f}")
    print("  assumptions: machines like this one (2 cores, 1 BLAS thread per worker), the same share of "
          "tokens needing an LP as in SmolLM2's subset, W reaching each node once (671 MB), no other load.")

    if args.json:
        out = {
            "ray_version": ray.__version__, "tokens": args.tokens, "chunk": args.chunk,
            "n_samples": args.n_samples, "batch": args.batch, "seed": args.seed,
            "rows": [{"step": r[0], "seconds": r[1], "note": r[2]} for r in rows],
            "identical": {"unargmaxable": same_un, "cell_volumes": same_cv},
            "gemma": gemma,
        }
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0 if (same_un and same_cv) else 1


if __name__ == "__main__":
    raise SystemExit(main())
