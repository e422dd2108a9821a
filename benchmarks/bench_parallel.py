"""The unargmaxable scan and the cell volumes on SmolLM2's W: serial vs Ray with 2 workers, in one run.

Prints, on SmolLM2-135M's unembedding (49,152 x 576 float32, 113 MB):

  Ray start-up    import ray + ray.init of a local 2-CPU cluster, then the first tasks (worker
                  processes start and import embgeom), each shown on its own line
  unargmaxable    Decoder.unargmaxable on a seeded random subset of tokens (default 2,048): the
                  local executor (one process, BLAS on every core: the strongest simple
                  baseline) vs executor=Ray with 2 workers (chunks of --chunk tokens, default
                  512: 4 witness tasks); its phases (set-up once on the driver, ray.put of the
                  set-up, witness tasks, LP tasks) timed apart from the result's phase_seconds
  cell volumes    cell_volumes (default 32,768 Gaussian directions, 4 blocks of 8,192):
                  local vs Ray with 2 workers (bit-identical counts, checked)

and a paper calculation of the wall time of Gemma-3-270m's full vocabulary (262,144 tokens,
d = 640) on N machines like this one, from the measured per-token worker cost scaled by |V| d
(each witness check and each LP row is a product with every row of W), the set-up scaled by
|V| d^2 (the whitening covariance) and the put scaled by |V| d.

The workers run one BLAS thread each (Ray sets OMP_NUM_THREADS to a task's num_cpus); the
serial runs use every core. This machine has 2 cores shared with other jobs: the numbers are
noisy (2x between runs is common), and 2 workers on 2 cores can at best match a serial run
whose BLAS already uses both cores; the point of Ray is the N-machine column. Figures of the
last run: docs/parallel.md.

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_parallel.py [--tokens 2048] [--chunk 512]
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
    ap.add_argument("--chunk", type=int, default=512, help="tokens per unargmaxable witness task")
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
    ser, t_ser = timed(lambda: dec.unargmaxable(tokens=subset, chunk_size=args.chunk, progress=False))
    cv_ser, t_cv_ser = timed(lambda: cell_volumes(dec, ball, args.n_samples, seed=args.seed,
                                                  batch_size=args.batch, progress=False))

    # ---------------------------------------------------------------- Ray, 2 workers
    workers = 2
    ex = RayExecutor(num_cpus=1, init_kwargs={"num_cpus": workers, "include_dashboard": False,
                                              "log_to_driver": False})
    try:
        ex.start()
        t_init = ex.startup_seconds_
        tiny = Decoder(np.eye(4, dtype=np.float32))
        _, t_warm = timed(lambda: [cell_volumes(tiny, Ball.from_params(None, 1.0, dim=4), 2 * 8192, seed=0,
                                                batch_size=8192, executor=ex, progress=False)
                                   for _ in range(2)])  # 2 tasks, twice: both workers started
        ray_un, t_ray_un = timed(lambda: dec.unargmaxable(tokens=subset, chunk_size=args.chunk,
                                                          executor=ex, progress=False))
        cv_ray, t_cv_ray = timed(lambda: cell_volumes(dec, ball, args.n_samples, seed=args.seed,
                                                      batch_size=args.batch, executor=ex, progress=False))
    finally:
        ex.close()
    # exact verdicts, and chunks aligned with the serial batches: identical status codes
    same_un = bool(np.array_equal(ray_un.status, ser.status) and ray_un.n_undecided == ser.n_undecided == 0)
    same_cv = bool(np.array_equal(cv_ray.counts, cv_ser.counts))
    ph_ser, ph_ray = ser.extra["phase_seconds"], ray_un.extra["phase_seconds"]

    n_wit = -(-args.tokens // args.chunk)
    rows += [
        ("Ray start-up (import ray + ray.init, 2-CPU local cluster)", t_init, ""),
        ("Ray worker warm-up (first tasks: processes + imports)", t_warm, ""),
        (f"unargmaxable {args.tokens} tok: local, one process", t_ser, f"{1e3 * t_ser / args.tokens:.2f} ms/tok"),
        ("  of which set-up (prepare, once) / witnesses / LPs", ph_ser["prepare"],
         f"{ph_ser['witness']:.2f} / {ph_ser['lp']:.2f} s; {ser.n_lp} LPs"),
        (f"unargmaxable {args.tokens} tok: Ray 2 workers ({n_wit} witness tasks)", t_ray_un,
         f"x{t_ser / t_ray_un:.2f} vs local, identical: {same_un}"),
        ("  of which set-up / ray.put of it / witnesses / LPs", ph_ray["prepare"],
         f"{ph_ray['put']:.2f} / {ph_ray['witness']:.2f} / {ph_ray['lp']:.2f} s"),
        (f"cell volumes {args.n_samples} pts: local", t_cv_ser, f"{args.n_samples / t_cv_ser:.0f} pt/s"),
        (f"cell volumes {args.n_samples} pts: {-(-args.n_samples // max(args.batch, 8192))} tasks, Ray 2 workers",
         t_cv_ray, f"x{t_cv_ser / t_cv_ray:.2f} vs local, identical: {same_cv}"),
    ]
    width = max(len(r[0]) for r in rows)
    print()
    print(f"{'step':<{width}}  {'seconds':>8}  note")
    for name, sec, note in rows:
        print(f"{name:<{width}}  {sec:8.2f}  {note}")

    # ---------------------------------------------------------------- Gemma on N machines (paper)
    # per-token work scales with |V| d; the set-up (covariance of W) with |V| d^2; the put with
    # the set-up's size (|V| d). Per machine: the measured Ray throughput of 2 workers on 2 cores.
    scale_tok = (GEMMA_V * GEMMA_D) / (V * d)
    scale_setup = (GEMMA_V * GEMMA_D**2) / (V * d * d)
    # worker-seconds per token: the witness and LP phases kept both workers busy
    per_tok_ray = (ph_ray["witness"] + ph_ray["lp"]) * workers / args.tokens
    per_tok_serial = (ph_ser["witness"] + ph_ser["lp"]) / args.tokens
    print()
    print(f"Gemma-3-270m full vocabulary ({GEMMA_V} tokens, d = {GEMMA_D}): per-token cost x{scale_tok:.2f} "
          f"(|V| d), set-up x{scale_setup:.2f} (|V| d^2), put x{scale_tok:.2f}")
    print(f"  measured here: local {1e3 * per_tok_serial:.2f} ms/token (2 BLAS threads); Ray "
          f"{1e3 * per_tok_ray:.2f} worker-ms/token (1 BLAS thread per worker); set-up {ph_ray['prepare']:.2f} s "
          f"once on the driver, put {ph_ray['put']:.2f} s")
    gemma = {"per_token_worker_ms_smollm2": 1e3 * per_tok_ray, "setup_s_smollm2": ph_ray["prepare"],
             "put_s_smollm2": ph_ray["put"], "scale_token": scale_tok, "scale_setup": scale_setup,
             "n_machines": {}}
    gemma["serial_hours"] = (GEMMA_V * per_tok_serial * scale_tok + ph_ser["prepare"] * scale_setup) / 3600
    print(f"  one process here, local executor: {gemma['serial_hours']:.2f} h")
    print(f"  {'machines':>8}  {'workers':>7}  {'wall (h)':>9}   (2 workers per machine, chunks of 2,048 tokens, "
          "incl. start-up, set-up and put)")
    chunk = 2048
    chunks = -(-GEMMA_V // chunk)
    for n in (1, 2, 4, 8, 16, 32, 64, 128):
        w = workers * n
        rounds = -(-chunks // w)  # chunks are the unit: the last round may idle
        wall = (t_init + t_warm + ph_ray["prepare"] * scale_setup + ph_ray["put"] * scale_tok
                + rounds * chunk * per_tok_ray * scale_tok)
        gemma["n_machines"][n] = {"hours": wall / 3600}
        print(f"  {n:>8}  {w:>7}  {wall / 3600:9.2f}")
    print("  assumptions: machines like this one (2 cores, 1 BLAS thread per worker), the same share of "
          "tokens needing an LP as in SmolLM2's subset, the set-up (3 x |V| d floats) reaching each node "
          "once, no other load.")

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
