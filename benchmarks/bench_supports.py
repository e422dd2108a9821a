"""Benchmark of the support fits on real SmolLM2-135M hidden states.

Prints (and writes as JSON) the fit time and log-volume of every shape with the fast solvers on
N hidden states (default 10,000, d = 576), and fast-vs-cvxpy ratios (time, log-volume
agreement) at sizes cvxpy finishes. Timings on a shared 2-core machine are noisy: compare the
ratios measured in one run, not absolute seconds across runs.

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_supports.py            # full (minutes)
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_supports.py --n 2000   # quicker

Hidden states are sampled with ``embgeom.adapters.sample_hidden_states`` (random token
sequences, the last position's final hidden state) and cached under ``.cache/bench_supports``
(gitignored), so a second run skips the model's forward passes.

Measured here (2 shared cores, N = 10,000, d = 576, lengths 4..64; one run, load ~4):
ball 3.0 s (342 steps), origin ball 0.03 s, cone 11.7 s (most of it the paper's all-pairs
cosine), box 0.3 s, PCA box 18.5 s (before the thin-SVD fix), ellipsoid 133 s at the default
tol 1e-7 (10,480 steps, certified gap 2.9e-5 nats; 11 s at tol 1e-4 on a quiet machine).
Log-volumes (nats): ellipsoid 666.2, PCA box 1050.5, final-norm solid 1153.4, ball 1199.7,
box 1221.7, cone 1335.2, origin ball 1367.6. cvxpy/fast time ratios: ball x460 (N=200) and
x4100 (N=500) at d=576; cone x50; ellipsoid x6 (d=8), x26 (d=16), x48 (d=24); log-volume
relative differences 1e-8 or less.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from embgeom import supports  # noqa: E402


def load_hidden(n: int, lengths, cache_dir: Path, seed: int = 0):
    """``n`` SmolLM2 hidden states (float32 (n, 576)) and the Unembedding, cached on disk."""
    from embgeom.adapters import load_model, sample_hidden_states, unembedding

    model = load_model("smollm2-135m", progress=False)
    per = -(-n // len(lengths))
    H, _ = sample_hidden_states(model, lengths, per, batch_size=32, seed=seed, cache_dir=cache_dir,
                                progress=True)
    return H[:n], unembedding(model)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000, help="number of hidden states (default 10000)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    ap.add_argument("--cache-dir", type=Path, default=ROOT / ".cache" / "bench_supports")
    ap.add_argument("--ellipsoid-tol", type=float, default=1e-7, help="fast MVEE tolerance (the library default)")
    ap.add_argument("--skip-ellipsoid", action="store_true")
    ap.add_argument("--skip-cvxpy", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="JSON output (default: <cache-dir>/results.json)")
    args = ap.parse_args(argv)

    H, unemb = load_hidden(args.n, args.lengths, args.cache_dir)
    N, d = H.shape
    print(f"hidden states: N={N}, d={d}, dtype={H.dtype}")
    results: dict = {"N": N, "d": d, "fits": {}, "cvxpy_vs_fast": []}

    shell = supports.support_from_final_norm(unemb)
    results["fits"]["final_norm"] = {"log_volume": shell.log_volume, "seconds": 0.0,
                                     "on_shell_fraction(tol=1e-4)": float(shell.contains(H, tol=1e-4).mean())}
    plan = [
        ("ball", dict(shape="ball")),
        ("ball_origin", dict(shape="ball", center="origin")),
        ("cone", dict(shape="cone")),
        ("box", dict(shape="box")),
        ("box_pca", dict(shape="box", rotation="pca")),
    ]
    if not args.skip_ellipsoid:
        plan.append(("ellipsoid", dict(shape="ellipsoid", tol=args.ellipsoid_tol, progress=True)))
    for name, kw in plan:
        kw = dict(kw)
        shape = kw.pop("shape")
        S, sec = timed(lambda: supports.fit_support(H, shape, **kw))
        row = {"log_volume": S.log_volume, "seconds": sec, "solver": S.solver_,
               "contains_all": bool(S.contains(H, tol=1e-9).all())}
        for attr in ("radius_", "rinf_", "half_angle_", "paper_half_angle_", "n_iter_", "eps_", "gap_nats_"):
            if hasattr(S, attr):
                row[attr.rstrip("_")] = float(getattr(S, attr))
        results["fits"][name] = row
        print(f"{name:12s} {sec:8.2f} s  log_volume {S.log_volume:12.3f}  " +
              " ".join(f"{k}={v:.4g}" for k, v in row.items() if k not in ("log_volume", "seconds", "solver", "contains_all")),
              flush=True)

    if not args.skip_cvxpy:
        rng = np.random.default_rng(0)
        H64 = H.astype(np.float64)
        # cvxpy sizes: ball and cone SOCPs at full d; the ellipsoid's log_det has d^2 variables,
        # so it runs on the leading principal coordinates
        Vt = np.linalg.svd(H64 - H64.mean(axis=0), full_matrices=False)[2]
        tight = {"tol": 1e-9}  # the ellipsoid's fast solver at the cvxpy reference's accuracy
        cases = [("ball", 200, d, {}), ("ball", 500, d, {}), ("cone", 200, d, {}), ("cone", 500, d, {}),
                 ("ellipsoid", 200, 8, tight), ("ellipsoid", 400, 16, tight), ("ellipsoid", 600, 24, tight)]
        for shape, n_sub, k, kw in cases:
            idx = rng.choice(N, size=min(n_sub, N), replace=False)
            X = H64[idx] if k == d else (H64[idx] - H64.mean(axis=0)) @ Vt[:k].T
            fast, tf = timed(lambda: supports.fit_support(X, shape, solver="fast", **kw))
            ref, tc = timed(lambda: supports.fit_support(X, shape, solver="cvxpy"))
            row = {"shape": shape, "N": len(idx), "d": k, "fast_s": tf, "cvxpy_s": tc,
                   "time_ratio_cvxpy_over_fast": tc / tf,
                   "log_volume_fast": fast.log_volume, "log_volume_cvxpy": ref.log_volume,
                   "rel_diff": abs(fast.log_volume - ref.log_volume) / abs(ref.log_volume)}
            results["cvxpy_vs_fast"].append(row)
            print(f"cvxpy vs fast {shape:9s} N={len(idx):5d} d={k:3d}: fast {tf:7.2f} s, cvxpy {tc:7.2f} s "
                  f"(x{tc / tf:6.1f}), log-volume rel diff {row['rel_diff']:.2e}", flush=True)

    out = args.out or (args.cache_dir / "results.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return results


if __name__ == "__main__":
    main()
