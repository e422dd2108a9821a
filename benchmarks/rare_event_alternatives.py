"""Issue 22, item 4: two ways to a cheaper 1-nat cell share that were measured and not taken.

On the same seeded SmolLM2-135M tokens as ``bench_rare_event_cost.py`` (origin ball), in one run:

1. ``pilot``: the working set's richness. The counted runs multiply the working-set cone's
   measure by the fraction of their chains that are in the real cell (``log_check_fraction``);
   at the default that fraction is e^-1.3 .. e^-2.6, and a binomial fraction f of N chains adds
   about (1 - f) / (f N) to the variance of log p, as much as several levels. Two knobs could
   raise it: :data:`embgeom._rare_event.PILOT_MIN_FULL` (the pilot accepts its working set once
   this fraction of its chains is in the cell; more rows join otherwise) and
   ``min_full_fraction`` (below it a counted run goes on with levels on the margin over all of
   ``W`` instead of one binomial step). Each setting runs the default budget
   (``target_se``) on every token: seconds per token, runs, the first run's check fraction.
2. ``ghk``: importance sampling instead of splitting. The pilot's working set ``S`` (unit rows
   ``A``, ``|S|`` of 800-2,400 against ``k = 576``) is ordered greedily as Genz does (the most
   constraining row next, given the truncated means so far), its first ``k`` rows factor as
   ``A_1 = L Q^T``, and ``x = Q y`` with ``y`` drawn coordinate by coordinate from the
   truncated normals of the GHK simulator, weight the product of the truncation probabilities.
   The rows past rank ``k`` and the rest of ``W`` can only be checked, not sampled; the
   effective sample size of the weights inside the cell says whether the proposal is usable.

Results: ``benchmarks/results/rare_event/alternatives.{json,md}``. Usage::

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/rare_event_alternatives.py \\
        --w-npy /tmp/smollm2_W.npy [--tokens 8] [--target-se 0.24] [--ghk-samples 4000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if not any(os.path.isdir(os.path.join(p, "embgeom")) for p in sys.path if p):
    sys.path.insert(0, os.path.join(HERE, ".."))

import embgeom._rare_event as R  # noqa: E402
from embgeom import _json  # noqa: E402

OUT = os.path.join(HERE, "results", "rare_event")


def _tokens(V: int, n: int, seed: int) -> np.ndarray:
    """The cost benchmark's tokens: ``n`` distinct ids drawn with ``default_rng(seed)``."""
    return np.sort(np.random.default_rng(seed).choice(V, n, replace=False))


def pilot_study(W, toks, target_se: float, seed: int) -> list:
    rows = []
    default_pmf = R.PILOT_MIN_FULL
    try:
        for pmf, mff in [(default_pmf, 0.05), (0.5, 0.05), (0.8, 0.05), (default_pmf, 0.3),
                         (default_pmf, 0.5)]:
            R.PILOT_MIN_FULL = pmf
            t0 = time.perf_counter()
            r = R.log_cone_gaussian_measure(W, toks, n_chains=128, target_se=target_se,
                                            seed=seed, min_full_fraction=mff)
            dt = time.perf_counter() - t0
            rows.append({"pilot_min_full": pmf, "min_full_fraction": mff,
                         "seconds_per_token": dt / len(toks), "runs": r.n_runs.tolist(),
                         "mean_runs": float(r.n_runs.mean()),
                         "working_set": r.n_constraints_used.tolist(),
                         "log_check_fraction": r.log_check_fraction.tolist(),
                         "log_share": r.log_share.tolist(), "std_err": r.std_err.tolist(),
                         "load": os.getloadavg()[0]})
            print(f"PILOT_MIN_FULL {pmf}, min_full_fraction {mff}: {dt / len(toks):.2f} s/token, "
                  f"mean runs {r.n_runs.mean():.2f}", flush=True)
    finally:
        R.PILOT_MIN_FULL = default_pmf
    return rows


def _genz_order(A: np.ndarray, tol: float = 1e-9):
    """Greedy Genz ordering of unit rows ``A`` (M, k) for ``A x >= 0``: returns the pivots
    (the first rank-many rows), the coefficients ``L`` (M, r) of every row on the orthonormal
    directions ``Q`` (k, r) of the pivots (``A_piv = L_piv Q^T``, lower triangular)."""
    from scipy.special import log_ndtr

    M, k = A.shape
    res = A.copy()
    rn2 = np.ones(M)
    c = np.zeros(M)  # sum_p L_jp E[y_p]
    L = np.zeros((M, k))
    Q = np.zeros((k, k))
    piv, chosen = [], np.zeros(M, bool)
    for i in range(k):
        sd = np.sqrt(np.maximum(rn2, 0.0))
        ok = ~chosen & (sd > tol)
        if not ok.any():
            break
        b = np.where(ok, -c / np.where(ok, sd, 1.0), -np.inf)
        j = int(np.argmax(b))  # the hardest row: the largest truncation point
        piv.append(j)
        chosen[j] = True
        q = res[j] / sd[j]
        Q[:, i] = q
        coef = res @ q
        L[:, i] = coef
        res -= np.outer(coef, q)
        rn2 -= coef**2
        bj = b[j]
        ey = np.exp(-0.5 * bj * bj - 0.5 * np.log(2 * np.pi) - log_ndtr(-bj))  # E[y | y >= b]
        c += coef * ey
    r = len(piv)
    return np.array(piv), L[:, :r], Q[:, :r]


def ghk_study(W, toks, n_samples: int, seed: int) -> list:
    from scipy.special import log_ndtr, logsumexp, ndtri_exp

    cs = R.prepare_cones(W)
    settings = R._check_settings(n_chains=128, n_groups=16, level_prob=0.5, n_moves=1,
                                 max_constraints=4096, probe_k=8, n_probes=4,
                                 min_full_fraction=0.05, max_levels=400, confidence=0.95,
                                 move="hmc", working_set="auto", seed=seed, target_se=0.24,
                                 max_runs=32)
    rows = []
    for t in toks:
        cone = R._Cone(cs.WG32, cs.row_sq, cs.W32, int(t))
        tr = R._TokenRuns(cone, np.random.SeedSequence([seed, int(t)]), settings, move="hmc",
                          working_set="auto", full_check=True)
        tr.batch(0)  # the pilot: its working set
        S = tr.initial.ids.copy()
        A = cone.rows(S)
        t0 = time.perf_counter()
        piv, L, Q = _genz_order(A)
        Lp = L[piv]
        rng = np.random.default_rng([seed, int(t), 1])
        Y = np.zeros((n_samples, len(piv)))
        logw = np.zeros(n_samples)
        for i in range(len(piv)):
            b = -(Y[:, :i] @ Lp[i, :i]) / Lp[i, i]
            lp = log_ndtr(-b)
            Y[:, i] = np.maximum(-ndtri_exp(np.log(rng.random(n_samples)) + lp), b)
            logw += lp
        X = Y @ Q.T
        in_S = (X @ A.T).min(1) >= -1e-9
        in_C = cone.scan(X, 1)[0][:, 0] >= 0
        dt = time.perf_counter() - t0
        row = {"token": int(t), "working_set": int(S.size), "rank": int(len(piv)),
               "pilot_log_share": float(tr.runs[0][0]), "seconds": dt,
               "fraction_in_working_set_cone": float(in_S.mean()),
               "fraction_in_cell": float(in_C.mean())}
        for name, mask in (("working_set_cone", in_S), ("cell", in_C)):
            lw = np.where(mask, logw, -np.inf)
            if not mask.any():
                row[name] = {"log_p": None, "ess": 0.0}
                continue
            w = np.exp(lw - lw.max())
            row[name] = {"log_p": float(logsumexp(lw) - np.log(n_samples)),
                         "ess": float(w.sum() ** 2 / (w**2).sum())}
        rows.append(row)
        print(f"token {t}: |S| {S.size}, in S-cone {in_S.mean():.4f}, in cell {in_C.mean():.5f}, "
              f"cell ESS {row['cell']['ess']:.1f} of {n_samples}", flush=True)
    return rows


def markdown(out: dict) -> str:
    lines = [
        "# Rare-event cell shares: alternatives measured and not taken (issue 22, item 4)", "",
        f"SmolLM2-135M, origin ball, tokens {out['tokens']}, default budget "
        f"(128-chain runs to target_se {out['target_se']}), one run of "
        "`benchmarks/rare_event_alternatives.py`; wall seconds on a shared 2-core machine "
        "(two nice'd cramming jobs ran).", "",
        "## 1. A richer working set", "",
        "| PILOT_MIN_FULL | min_full_fraction | s per token | mean runs | first run's log check fraction (median) | load |",
        "|---|---|---|---|---|---|",
    ]
    for r in out["pilot"]:
        lines.append(f"| {r['pilot_min_full']} | {r['min_full_fraction']} | "
                     f"{r['seconds_per_token']:.2f} | {r['mean_runs']:.2f} | "
                     f"{np.median(r['log_check_fraction']):.2f} | {r['load']:.1f} |")
    lines += [
        "", "A pilot that keeps adding rows until 80% of its chains are in the cell still leaves "
        "the counted runs' chains at e^-1.1 .. e^-1.8 in the cell: each fresh chain is cut off by "
        "another row of a long tail, so the working set grows (and each move costs more) "
        "faster than the check fraction rises. Levels on the full margin below a check fraction "
        "of 0.3 or 0.5 cost more passes over W than the runs they save. The defaults stay.", "",
        "## 2. GHK importance sampling on the working set", "",
        f"{out['ghk_samples']} samples per token.", "",
        "| token | working set | in working-set cone | in cell | cell ESS | log p (cell) | pilot's log p |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in out["ghk"]:
        c = r["cell"]
        lp = "-" if c["log_p"] is None else f"{c['log_p']:.2f}"
        lines.append(f"| {r['token']} | {r['working_set']} | {r['fraction_in_working_set_cone']:.4f} | "
                     f"{r['fraction_in_cell']:.5f} | {c['ess']:.1f} | {lp} | {r['pilot_log_share']:.2f} |")
    lines += [
        "", "The sequential proposal respects only the first k = 576 ordered rows; the other rows "
        "of the working set and of W reject most samples, and the weights of the few that remain "
        "are dominated by one or two: an effective sample size of 1-10 in thousands. Minimax "
        "tilting (Botev 2017) would shift the first k coordinates but cannot see the rows past "
        "rank k, which are what reject. Not pursued.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--w-npy", required=True, help="SmolLM2's unembedding as .npy (V, d)")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-se", type=float, default=0.24)
    ap.add_argument("--ghk-samples", type=int, default=4000)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    W = np.load(args.w_npy)
    toks = _tokens(W.shape[0], args.tokens, args.seed)
    out = {"tokens": toks.tolist(), "target_se": args.target_se, "seed": args.seed,
           "ghk_samples": args.ghk_samples, "shape": list(W.shape)}
    out["pilot"] = pilot_study(W, toks, args.target_se, args.seed)
    out["ghk"] = ghk_study(W, toks, args.ghk_samples, args.seed)
    os.makedirs(args.out, exist_ok=True)
    _json.dump(out, os.path.join(args.out, "alternatives.json"))
    text = markdown(out)
    with open(os.path.join(args.out, "alternatives.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
