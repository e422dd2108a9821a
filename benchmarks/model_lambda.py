"""A real model's cell rate lambda from rare-event log-shares of a seeded uniform token sample.

``--model`` picks the model (``smollm2-135m``, the default, or ``gemma-3-270m``, which needs the
``gemma`` extra); file names start with its short name (``smollm2``, ``gemma3``).

A resumable run. Phase 1 estimates each sampled token's log-share (the standard Gaussian
measure of its decoder cone, :func:`embgeom._rare_event.log_cone_gaussian_measure`) for the
origin ball (``G = I``) or, with ``--shell``, the final-norm shell (``G`` from the final norm's
gain), in chunks of ``--chunk`` tokens; each finished chunk is appended to
``runs/<short>_lambda_<support>_c<chains>_s<seed>.jsonl`` (one line per token; ``runs/`` is
git-ignored), so a rerun skips the tokens already there and resumes. Every token draws from
its own seed (``SeedSequence(seed, spawn_key=(token,))``): a resumed run gives the same figures
as an uninterrupted one.

The token sample is the first ``--tokens`` entries of ``default_rng(--token-seed).permutation(|V|)``:
a longer run extends a shorter one (same first tokens).

Phase 2 (when every requested token is done, or with ``--summarize``): lambda with its
interval from :func:`embgeom.bounds.cell_volume_rate_from_logs` (bootstrap over the sampled
tokens plus each token's Monte Carlo error), ``log|V|``, and the refined slopes
``C_refined = C_shape log|V| / lambda = log P / lambda`` for the origin ball (``ball_origin``,
fitted to hidden states) and the final-norm shell, with the report's precision
``eps = precision_eps(r_inf, 11)`` (``r_inf`` = the largest |h_i| over the hidden states of
the report's default sizes, sampled once and cached under ``runs/hidden_cache``). Each support's slope uses
that support's lambda when its run is complete; otherwise the result says which lambda stands in.
Writes ``benchmarks/results/<short>_lambda.json`` and ``benchmarks/results/<short>_lambda.png``
(histogram and rank plot of the log-shares).

Usage (from the repository root):
    nohup nice -n 5 env HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/model_lambda.py \
        --tokens 1000 > runs/smollm2_lambda_ball.log 2>&1 &
    ... --shell                   # the final-norm shell
    ... --summarize               # phase 2 only, from whatever the JSONL files hold
    ... --out-dir benchmarks/results/smollm2_lambda   # the committed JSONL files (resume there)
    ... --model gemma-3-270m --tokens 200 --out-dir benchmarks/results/gemma3_lambda
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIELDS = ("log_share", "log_lower", "log_upper", "std_err", "n_levels", "n_constraints_used",
          "n_full_checks", "log_check_fraction", "seconds")


#: registry name -> short name used in file names and titles
MODELS = {"smollm2-135m": ("smollm2", "SmolLM2-135M"), "gemma-3-270m": ("gemma3", "Gemma-3-270m")}


def run_path(out_dir: Path, shell: bool, chains: int, seed: int, model: str = "smollm2-135m") -> Path:
    short = MODELS[model][0]
    return out_dir / f"{short}_lambda_{'shell' if shell else 'ball'}_c{chains}_s{seed}.jsonl"


def load_unembedding(model: str = "smollm2-135m"):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from embgeom.adapters import load_model, unembedding

    lm = load_model(model, progress=False)
    return lm, unembedding(lm)


def w_and_g(u, shell: bool):
    from embgeom.cells import Decoder

    W = Decoder.from_unembedding(u).W_
    G = None
    if shell:
        from embgeom.supports import support_from_final_norm

        G = support_from_final_norm(u).origin_ellipsoid_map()
        if G is None:
            raise SystemExit("the final-norm shell has a bias: its cells are not cones")
    return W, G


def token_sample(V: int, n: int, token_seed: int) -> np.ndarray:
    return np.random.default_rng(token_seed).permutation(V)[:n].astype(np.int64)


def read_run(path: Path) -> tuple[dict | None, dict]:
    """(header, {token: record}) of a JSONL run file (a torn last line is ignored)."""
    header, rows = None, {}
    if not path.exists():
        return header, rows
    with open(path) as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a chunk interrupted while being written
            if rec.get("kind") == "header":
                header = rec
            else:
                rows[int(rec["token"])] = rec
    return header, rows


def run_phase1(args, u) -> Path:
    from embgeom._rare_event import log_cone_gaussian_measure

    W, G = w_and_g(u, args.shell)
    V = W.shape[0]
    path = run_path(Path(args.out_dir), args.shell, args.chains, args.seed, args.model)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"kind": "header", "support": "final-norm shell" if args.shell else "origin ball",
              "vocab_size": V, "chains": args.chains, "seed": args.seed, "token_seed": args.token_seed,
              "token_sample": "default_rng(token_seed).permutation(vocab_size)[:n]"}
    old, done = read_run(path)
    if old is not None:
        for k in ("support", "vocab_size", "chains", "seed", "token_seed"):
            if old[k] != header[k]:
                raise SystemExit(f"{path}: written with {k}={old[k]!r}, this run has {header[k]!r}")
    else:
        with open(path, "a") as fh:
            fh.write(json.dumps(header) + "\n")
    toks = token_sample(V, args.tokens, args.token_seed)
    todo = [int(t) for t in toks if int(t) not in done]
    print(f"{header['support']}: {len(done)} of {toks.size} tokens done, {len(todo)} to go -> {path}",
          flush=True)
    t_start = time.perf_counter()
    for c in range(0, len(todo), args.chunk):
        chunk = np.asarray(todo[c:c + args.chunk], dtype=np.int64)
        r = log_cone_gaussian_measure(W, chunk, G, n_chains=args.chains, seed=args.seed)
        with open(path, "a") as fh:
            for i, t in enumerate(chunk):
                rec = {"token": int(t), "side": str(r.side[i])}
                for f in FIELDS:
                    v = getattr(r, f)[i]
                    rec[f] = int(v) if f.startswith("n_") else float(v)
                fh.write(json.dumps(rec) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        n_done = len(done) + c + chunk.size
        el = time.perf_counter() - t_start
        rate = (c + chunk.size) / el
        print(f"{time.strftime('%H:%M:%S')} {n_done}/{toks.size} tokens, {el / 60:.1f} min, "
              f"{1 / rate:.2f} s/token, ~{(len(todo) - c - chunk.size) / rate / 60:.0f} min left; "
              f"chunk median log-share {np.nanmedian(r.log_share):.2f}", flush=True)
    return path


def hidden_geometry(lm, u, cache: Path, sizes: str) -> dict:
    """r_inf, eps and log P of the origin ball and the final-norm shell (report conventions)."""
    from embgeom import bounds
    from embgeom.adapters import sample_hidden_states
    from embgeom.report import REPORT_SIZES
    from embgeom.supports import fit_support, support_from_final_norm

    size = REPORT_SIZES[sizes]
    H, _ = sample_hidden_states(lm, size["lengths"], size["n_per_length"], seed=0,
                                cache_dir=str(cache), progress=False)
    r_inf = float(np.abs(H).max())
    eps = bounds.precision_eps(r_inf, 11)
    V = int(u.to_dict()["vocab_size"])
    ball = fit_support(H, "ball", center="origin")
    shell = support_from_final_norm(u)
    logP = {"ball_origin": float(bounds.log_packing_number(ball, eps)),
            "final_norm": float(bounds.log_packing_number(shell, eps))}
    c_shape = {k: float(bounds.slope_bound(s, eps, V)) for k, s in
               (("ball_origin", ball), ("final_norm", shell))}
    return {"sizes": sizes, "n_hidden": int(H.shape[0]), "r_inf": r_inf, "eps": float(eps),
            "ball_origin_radius": float(ball.radius_), "log_packing": logP, "C_shape": c_shape}


def summarize(args, lm, u) -> dict:
    from embgeom.bounds import cell_volume_rate_from_logs

    V = int(u.to_dict()["vocab_size"])
    logV = math.log(V)
    res = {"model": args.model, "vocab_size": V, "log_vocab": logV, "supports": {}}
    logs_for_plot = {}
    for shell in (False, True):
        path = run_path(Path(args.out_dir), shell, args.chains, args.seed, args.model)
        header, rows = read_run(path)
        if not rows:
            continue
        toks = token_sample(V, max(args.tokens, len(rows)), args.token_seed)
        toks = [int(t) for t in toks if int(t) in rows]  # the sampled prefix that is done
        recs = [rows[t] for t in toks]
        ls = np.array([r["log_share"] for r in recs])
        lo = np.array([r["log_lower"] for r in recs])
        hi = np.array([r["log_upper"] for r in recs])
        rate = cell_volume_rate_from_logs(ls, log_lower=lo, log_upper=hi, vocab_size=V,
                                          k_max=args.k_max, n_boot=args.n_boot, seed=0)
        secs = np.array([r["seconds"] for r in recs])
        fin = np.isfinite(ls)
        name = "final_norm" if shell else "ball_origin"
        logs_for_plot[name] = ls[fin]
        res["supports"][name] = {
            "support": header["support"] if header else name, "run_file": os.path.relpath(path, ROOT),
            "tokens_done": len(toks), "tokens_requested": args.tokens,
            "complete": len(toks) >= args.tokens, "chains": args.chains, "seed": args.seed,
            "token_seed": args.token_seed,
            "sides": {s: int(sum(r["side"] == s for r in recs)) for s in sorted({r["side"] for r in recs})},
            "median_log_share": float(np.median(ls[fin])),
            "log_share_quantiles": {q: float(np.quantile(ls[fin], float(q))) for q in ("0.01", "0.1", "0.5", "0.9", "0.99")},
            "median_interval_width": float(np.median((hi - lo)[fin])),
            "resolved_1nat": float(np.mean((hi - lo)[fin] <= 1.0)),
            "wall_seconds_per_token": float(np.mean(secs)), "wall_seconds_total": float(secs.sum()),
            "lambda": rate.rate, "lambda_interval": list(rate.rate_ci) if rate.rate_ci else None,
            "lambda_interval_includes": rate.ci_includes, "lambda_conservative": rate.rate_conservative,
            "lambda_asymptotic": rate.rate_asymptotic, "log_total": rate.log_total,
            "log_total_interval": list(rate.log_total_ci) if rate.log_total_ci else None,
            "rate": rate.to_dict(),
        }
    if not res["supports"]:
        raise SystemExit("no run file with tokens yet: run phase 1 first")
    geo = hidden_geometry(lm, u, ROOT / "runs" / "hidden_cache", args.sizes)  # git-ignored
    res["geometry"] = geo
    res["C"] = {}
    for name in ("ball_origin", "final_norm"):
        own = res["supports"].get(name)
        src = name if own else next(iter(res["supports"]))
        s = res["supports"][src]
        lam, ci = s["lambda"], s["lambda_interval"]
        logP = geo["log_packing"][name]
        res["C"][name] = {
            "C_shape": geo["C_shape"][name], "lambda_from": src,
            "lambda_note": None if src == name else f"no {name} run yet: {src}'s lambda stands in",
            "C_refined": logP / lam,
            # a larger lambda gives a smaller C: the interval's upper end of C uses lambda's lower end
            "C_refined_interval": [logP / ci[1], logP / ci[0]] if ci else None,
            "C_refined_conservative": logP / s["lambda_conservative"],
        }
    return res, logs_for_plot


def plot(logs: dict, path: Path, logV: float, title: str = "SmolLM2-135M") -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    a1, a2 = fig.subplots(1, 2)
    for name, x in logs.items():
        a1.hist(x, bins=40, histtype="step", lw=1.5, label=f"{name} ({x.size} tokens)")
        xs = np.sort(x)[::-1]
        a2.plot(np.arange(1, xs.size + 1), xs, lw=1.5, label=name)
    a1.axvline(-logV, color="k", ls="--", lw=1, label="-log|V| (equal cells)")
    a1.set_xlabel("log share (nats)")
    a1.set_ylabel("sampled tokens")
    a1.legend(fontsize=8)
    a2.axhline(-logV, color="k", ls="--", lw=1)
    a2.set_xlabel("rank among sampled tokens")
    a2.set_ylabel("log share (nats)")
    a2.legend(fontsize=8)
    fig.suptitle(f"{title}: rare-event log-shares of a uniform token sample")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", choices=sorted(MODELS))
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=20)
    ap.add_argument("--chains", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--token-seed", type=int, default=0)
    ap.add_argument("--shell", action="store_true", help="final-norm shell instead of the origin ball")
    ap.add_argument("--summarize", action="store_true", help="phase 2 only")
    ap.add_argument("--no-summary", action="store_true", help="phase 1 only")
    ap.add_argument("--k-max", type=int, default=32)
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--sizes", default="default", choices=("default", "quick"),
                    help="REPORT_SIZES preset of the hidden states behind r_inf and the origin ball")
    ap.add_argument("--out-dir", default=str(ROOT / "runs"))
    ap.add_argument("--results", default=None,
                    help="result JSON (default: benchmarks/results/<short>_lambda.json)")
    args = ap.parse_args(argv)
    if args.results is None:
        args.results = str(ROOT / "benchmarks" / "results" / f"{MODELS[args.model][0]}_lambda.json")
    lm, u = load_unembedding(args.model)
    if not args.summarize:
        path = run_phase1(args, u)
        _, rows = read_run(path)
        if args.no_summary or len(rows) < args.tokens:
            return
    res, logs = summarize(args, lm, u)
    out = Path(args.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    plot(logs, png, res["log_vocab"], MODELS[args.model][1])
    res["figure"] = png.name
    with open(out, "w") as fh:
        json.dump(res, fh, indent=2, default=float)
    print(f"log|V| = {res['log_vocab']:.4f}")
    for name, s in res["supports"].items():
        ci = s["lambda_interval"]
        print(f"{name}: {s['tokens_done']} tokens, lambda = {s['lambda']:.3f} nats/token, "
              f"{int(100 * s['rate']['ci_level'])}% interval [{ci[0]:.3f}, {ci[1]:.3f}] "
              f"({'; '.join(s['lambda_interval_includes'])}), asymptotic {s['lambda_asymptotic']:.3f}, "
              f"median log-share {s['median_log_share']:.2f}; log of the estimated sum of shares "
              f"{s['log_total']:.2f} {s['log_total_interval']}")
    g = res["geometry"]
    print(f"eps = precision_eps(r_inf={g['r_inf']:.4g}, 11) = {g['eps']:.4g}")
    for name, c in res["C"].items():
        ci = c["C_refined_interval"]
        print(f"{name}: C_shape = {c['C_shape']:.2f}, C_refined = {c['C_refined']:.2f} "
              f"[{ci[0]:.2f}, {ci[1]:.2f}] (lambda from {c['lambda_from']})")
    print(f"wrote {out} and {png}")


if __name__ == "__main__":
    main()
