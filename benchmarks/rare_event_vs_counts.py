"""Rare-event cell shares at the default budget against plain Monte Carlo counts (issue 22).

The counts (``benchmarks/uniform_counts.py``: 5,005,312 Gaussian directions over all 49,152
SmolLM2 rows, no Markov chain, no levels) are the estimator with no bias: a token with ``k``
hits of ``n`` has log-share ``log(k / n)`` with standard error ``1 / sqrt(k)`` nats. This script
draws ``--n-tokens`` tokens with at least ``--min-hits`` hits (stratified by hits, seeded), runs
:func:`embgeom.cell_volumes` with ``method="rare-event"`` (splitting forced, the default budget:
128 chains per run, ``target_se`` 0.12) on them, and reports per token and in all: the mean
difference (default - counts) with its standard error, the RMS difference, and how often the
default's 95% interval, widened by the count's own 2 standard errors, holds the count.

Writes ``benchmarks/results/rare_event/vs_counts_<support>.{json,md}``.

Usage: ``OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/rare_event_vs_counts.py``
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main(argv=None) -> int:
    from all_cells import MODELS, model_parts
    from uniform_counts import counts_path, load_counts

    from embgeom import volumes

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", choices=sorted(MODELS))
    ap.add_argument("--support", default="ball", choices=["ball", "shell"])
    ap.add_argument("--n-tokens", type=int, default=48)
    ap.add_argument("--min-hits", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--extra-tokens", type=int, nargs="*", default=[812, 2013, 31304],
                    help="tokens always included (those of bench_rare_event_cost.py with hits)")
    args = ap.parse_args(argv)

    short = MODELS[args.model]
    dec, sup, tok = model_parts(args.model, args.support)
    G = sup.origin_ellipsoid_map()
    state = load_counts(counts_path(short, args.support), volumes._fingerprint(dec, G))
    if state is None:
        raise SystemExit("no counts: run benchmarks/uniform_counts.py first")
    counts, n = state["counts"], state["n_samples"]
    rng = np.random.default_rng(args.seed)
    pool = np.flatnonzero(counts >= args.min_hits)
    # stratified by hits: equal numbers from each third of log(hits)
    edges = np.quantile(np.log(counts[pool]), [0, 1 / 3, 2 / 3, 1])
    strata = np.digitize(np.log(counts[pool]), edges[1:-1])
    per = args.n_tokens // 3
    ids = np.concatenate([rng.choice(pool[strata == s], per, replace=False) for s in range(3)])
    extra = [t for t in args.extra_tokens if counts[t] >= args.min_hits and t not in ids]
    ids = np.sort(np.concatenate([ids, np.asarray(extra, dtype=np.int64)]))
    t0 = time.process_time()
    cv = volumes.cell_volumes(dec, sup, volumes.SAMPLE_BLOCK, seed=args.seed,
                              method="rare-event", tokens=ids, progress=True)
    cpu = time.process_time() - t0
    rows = []
    for t in ids:
        k = int(counts[t])
        lc, sc = math.log(k / n), 1 / math.sqrt(k)
        ls, lo, hi = (float(cv.log_fractions[t]), float(cv.log_lower[t]), float(cv.log_upper[t]))
        rows.append({"token_id": int(t), "hits": k, "log_share_counts": lc, "se_counts": sc,
                     "log_share_default": ls, "lower": lo, "upper": hi,
                     "method": str(cv.token_method[t]), "diff": ls - lc,
                     "holds": bool(lo - 2 * sc <= lc <= hi + 2 * sc)})
    d = np.array([r["diff"] for r in rows])
    summary = {"model": args.model, "support": args.support, "n_samples_counts": n,
               "n_tokens": len(rows), "mean_diff": float(d.mean()),
               "se_mean_diff": float(d.std(ddof=1) / math.sqrt(d.size)),
               "rms_diff": float(math.sqrt(np.mean(d**2))),
               "share_higher": float(np.mean(d > 0)),
               "coverage": float(np.mean([r["holds"] for r in rows])),
               "cpu_seconds_per_token": cpu / len(rows),
               "embgeom_commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                                capture_output=True, text=True).stdout.strip()}
    out = ROOT / "benchmarks" / "results" / "rare_event" / f"vs_counts_{args.support}"
    out.with_suffix(".json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    s = summary
    lines = [f"# Rare-event shares (default budget, splitting forced) vs plain Monte Carlo counts",
             "",
             f"{args.model}, {args.support} support, counts from {n:,} Gaussian directions over "
             f"all rows (`benchmarks/uniform_counts.py`); {s['n_tokens']} tokens with >= "
             f"{args.min_hits} hits, stratified by hits (seed {args.seed}). embgeom at "
             f"{s['embgeom_commit']}. Command: `benchmarks/rare_event_vs_counts.py --support "
             f"{args.support}`.", "",
             f"- mean difference (default - counts): **{s['mean_diff']:+.3f} +- "
             f"{s['se_mean_diff']:.3f} nats**; RMS {s['rms_diff']:.3f}; higher in "
             f"{100 * s['share_higher']:.0f}% of tokens",
             f"- the default's 95% interval (widened by the count's 2 se) holds the count for "
             f"{100 * s['coverage']:.0f}% of tokens",
             f"- {s['cpu_seconds_per_token']:.2f} CPU-s per token (loaded machine)", "",
             "| token | hits | counts log-share | default | 95% interval | diff |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['token_id']} | {r['hits']:,} | {r['log_share_counts']:.3f} +- "
                     f"{r['se_counts']:.3f} | {r['log_share_default']:.3f} | [{r['lower']:.2f}, "
                     f"{r['upper']:.2f}] | {r['diff']:+.3f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:9]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
