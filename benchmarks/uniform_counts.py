"""Plain Monte Carlo counts of every SmolLM2 cell, resumable (issue 22: the independent check).

Each random block ``i`` of :data:`embgeom.volumes.SAMPLE_BLOCK` points is drawn from
``task_seed(root, i)``, exactly as :func:`embgeom.cell_volumes` (``method="uniform"``) draws it,
so after ``k`` blocks the counts equal ``cell_volumes(decoder, support, k * SAMPLE_BLOCK, seed,
method="uniform").counts`` bit for bit; this script only makes that call resumable, because
5,000,000 points over the 49,152 SmolLM2 rows take about 80 CPU-minutes.

The counts are the estimator with no Markov chain and no levels: a token with ``k`` hits of
``n`` has share ``k / n`` with relative standard error ``1 / sqrt(k)``. They are what the
rare-event shares are checked against (``benchmarks/rare_event_vs_counts.py``) and what
``benchmarks/all_cells.py --uniform-file`` reads for the whole-vocabulary uniform check.

Writes ``benchmarks/results/all_cells/<short>_<support>_uniform.npz`` (int64 counts per token,
the number of blocks done, the seed, and the SHA-256 fingerprint of W and G; about 100 kB
compressed), atomically after every ``--save-every`` blocks.

Usage (from the repository root):
    nohup nice -n 5 env OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python \
        benchmarks/uniform_counts.py --support ball --n-samples 5000000 > runs/uniform_ball.log 2>&1 &
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def counts_path(short: str, support: str) -> Path:
    """Where the counts of ``short`` (e.g. ``smollm2``) on ``support`` are kept."""
    return ROOT / "benchmarks" / "results" / "all_cells" / f"{short}_{support}_uniform.npz"


def load_counts(path: Path, fingerprint: str | None = None) -> dict | None:
    """The saved counts as a dict, or None when there is no file; refuses another W or G."""
    if not path.is_file():
        return None
    with np.load(path) as z:
        out = {k: z[k] for k in z.files}
    if fingerprint is not None and str(out["fingerprint"]) != fingerprint:
        raise SystemExit(f"{path}: counts of another model or support (fingerprint differs)")
    out["n_samples"] = int(out["blocks_done"]) * int(out["block"])
    return out


def _save(path: Path, **arrays) -> None:
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)


def main(argv=None) -> int:
    from all_cells import MODELS, model_parts
    from threadpoolctl import threadpool_limits

    from embgeom import volumes
    from tqdm.auto import tqdm
    from embgeom.parallel import task_seed
    from embgeom._validation import seed_sequence

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", choices=sorted(MODELS))
    ap.add_argument("--support", default="ball", choices=["ball", "shell"])
    ap.add_argument("--n-samples", type=int, default=5_000_000,
                    help="total points (rounded up to whole blocks of 8192)")
    ap.add_argument("--seed", type=int, default=1, help="root seed (all_cells uses seed 0)")
    ap.add_argument("--save-every", type=int, default=10, help="blocks between saves")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads")
    args = ap.parse_args(argv)

    short = MODELS[args.model]
    dec, sup, _ = model_parts(args.model, args.support)
    G = sup.origin_ellipsoid_map()
    directions, G32 = volumes._direction_map(dec, G)
    fp = volumes._fingerprint(dec, G)
    path = counts_path(short, args.support)
    path.parent.mkdir(parents=True, exist_ok=True)
    block = volumes.SAMPLE_BLOCK
    n_blocks = math.ceil(args.n_samples / block)
    state = load_counts(path, fp)
    if state is not None and int(state["seed"]) != args.seed:
        raise SystemExit(f"{path}: counts of seed {int(state['seed'])}, not --seed {args.seed}")
    counts = state["counts"].astype(np.int64) if state else np.zeros(dec.n_tokens, np.int64)
    done = int(state["blocks_done"]) if state else 0
    cpu = float(state["cpu_seconds"]) if state else 0.0
    root = seed_sequence(args.seed)
    print(f"{args.model} {args.support}: {done} of {n_blocks} blocks of {block} done", flush=True)
    bar = tqdm(total=n_blocks, initial=done, desc="uniform blocks", unit="block", mininterval=30)
    with threadpool_limits(args.threads):
        while done < n_blocks:
            stop = min(done + args.save_every, n_blocks)
            t0 = time.process_time()
            for i in range(done, stop):
                counts += volumes._count_chunk(block, decoder=dec, support=sup,
                                               directions=directions, seed=task_seed(root, i),
                                               G32=G32)
                bar.update(1)
            cpu += time.process_time() - t0
            done = stop
            _save(path, counts=counts, blocks_done=np.int64(done), block=np.int64(block),
                  seed=np.int64(args.seed), fingerprint=np.str_(fp), cpu_seconds=np.float64(cpu))
    bar.close()
    n = done * block
    print(f"done: {n:,} points, {int((counts >= 100).sum())} tokens with >= 100 hits, "
          f"{cpu:.0f} CPU-s ({1e3 * cpu / n:.3f} ms per point)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
