"""Every decoder cell of a real model: all 49,152 SmolLM2 cells, resumable (issue 22, item 5).

Runs :func:`embgeom.volumes.vocabulary_cell_volumes` on the model's unembedding for the origin
ball (``--support ball``) or the final-norm shell (``--support shell``), in chunks of
``--chunk-size`` tokens, each saved to ``benchmarks/results/all_cells/<short>_<support>.npz``
as it finishes (float32 log-share and interval per token, the estimator, the runs, the uniform
count; about 1 MB). A rerun with the same arguments resumes from the file. ``--max-chunks``
bounds one step of a long run.

When the file is complete (or with ``--summarize``) it writes ``<short>_<support>.{json,md}``
with the checks only the whole vocabulary allows:

- **sum check** (:func:`sum_check`): ``sum_t exp(log-share_t)`` against 1. The file's own
  counts chose which tokens to split, so its plain sum sits above 1 by a selection term; with
  the counted tokens' shares from an independent run (``--uniform-file``) the sum has mean 1,
  and that is the check;
- **uniform check** (``--uniform-samples``, e.g. 5,000,000, about half an hour on 2 cores):
  every token with >= 100 hits in an independent uniform run agrees with its count;
- **split check** (with ``--uniform-file``): the split tokens' shares, summed, against the
  independent run's hits on them, in all and per bin of the file's own hits
  (:func:`split_check`): the splitting estimator's bias over thousands of small cells;
- lambda from all tokens beside lambda from the 1,000-token sample
  (``benchmarks/results/<short>_lambda.json``), and the 20 smallest and 20 largest cells with
  their token strings.

The budget defaults to one 128-chain run per split token (``--target-se none``), the cheapest
setting whose errors (0.3-0.6 nats per token) still average out across tokens.

Usage (from the repository root):
    nohup nice -n 5 env HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/all_cells.py \
        --support ball > runs/all_cells_ball.log 2>&1 &
    ... --support shell
    ... --summarize [--uniform-samples 5000000 | --uniform-file
        benchmarks/results/all_cells/smollm2_ball_uniform.npz]
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
sys.path.insert(0, str(ROOT / "benchmarks"))

MODELS = {"smollm2-135m": "smollm2", "gemma-3-270m": "gemma3"}


def model_parts(model: str, support: str):
    """(decoder, support, tokenizer) of the registry model."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from embgeom.adapters import load_model, unembedding
    from embgeom.cells import Decoder
    from embgeom.supports import Ball, support_from_final_norm

    loaded = load_model(model)
    u = unembedding(loaded)
    dec = Decoder.from_unembedding(u)
    # the shares of an origin ball do not depend on its radius
    builders = {"ball": lambda: Ball.from_params(np.zeros(dec.dim), 1.0),
                "shell": lambda: support_from_final_norm(u)}
    sup = builders[support]()
    if sup.origin_ellipsoid_map() is None:
        raise SystemExit(f"the {support} support is not an origin-centred ellipsoid (a bias?): "
                         "its cells are not cones")
    return dec, sup, getattr(loaded, "tokenizer", None)


def _split_se(cv, sel) -> float:
    """Standard error of ``sum_{t in sel} exp(log-share_t)`` from each token's 95% interval
    (delta method; splitting runs are independent across tokens)."""
    p = np.exp(cv.log_fractions[sel])
    with np.errstate(invalid="ignore"):  # a proven-empty cell's interval is [-inf, -inf]
        half = (cv.log_upper[sel] - cv.log_lower[sel]) / 2
    se_log = np.where(np.isfinite(half), half / 1.959964, 0.0)
    return float(np.sqrt(np.sum((p * se_log) ** 2)))


def sum_check(cv, counts=None) -> dict:
    """``sum_t exp(log-share_t)`` over the resolved tokens, and whether 1 is inside its interval.

    The file keeps a token's count where the count beats one splitting run, so the counted
    share is ``1 - K_S / N`` exactly (``K_S``: the file's own hits on the other tokens ``S``,
    ``N`` its points) and ``sum = 1 + sum_S p_t - K_S / N``: its variance is that of ``K_S``
    (multinomial) and of the split estimates, not a sum over tokens treated as independent.
    Its mean is not 1: the counts chose ``S`` (the tokens whose count is low), so ``K_S / N``
    sits below ``S``'s share (the *selection term*), and the plain sum sits above 1 by it
    however exact the splitting. With ``counts`` (an independent uniform run's hits, int64 per
    token) the counted tokens' shares are taken from that run instead, which chose nothing:
    ``sum_counted k'_t / N' + sum_S p_t`` has mean 1, and that is the check (``"independent"``);
    the selection term is estimated as ``K'_S / N' - K_S / N``. Empty cells are in ``S`` with
    share 0 (an independent hit on one would be a contradiction: ``hits_on_empty``). A file
    not yet complete gives the sums over its resolved tokens and no verdict.
    """
    resolved = np.isfinite(cv.log_fractions) | (cv.token_method == "empty")
    counted = (cv.token_method == "uniform") & resolved
    S = resolved & ~counted
    n = int(cv.n_samples)
    own = np.asarray(cv.counts, np.int64)
    complete = bool(resolved.all())
    with np.errstate(divide="ignore"):
        p = np.where(cv.token_method == "empty", 0.0, np.exp(cv.log_fractions))
    total = float(p[resolved].sum())
    k_s = int(own[S].sum())
    se_split = _split_se(cv, S & (cv.token_method != "empty"))
    se = math.sqrt(k_s * max(1.0 - k_s / n, 0.0) / n**2 + se_split**2)
    out = {"sum": total, "se": se, "interval": [total - 1.96 * se, total + 1.96 * se],
           "one_inside": bool(abs(total - 1) <= 1.96 * se) if complete else None,
           "n_unresolved": int((~resolved).sum()), "n_split": int(S.sum()),
           "own_hits_on_split": k_s}
    if counts is not None:
        counts = np.asarray(counts, np.int64)
        n2 = int(counts.sum())
        q = float(counts[counted].sum()) / n2
        tot2 = q + float(p[S].sum())
        se2 = math.sqrt(q * (1.0 - q) / n2 + se_split**2)
        k2 = int(counts[S].sum())
        sel = k2 / n2 - k_s / n
        out["independent"] = {
            "n_samples": n2, "sum": tot2, "se": se2, "interval": [tot2 - 1.96 * se2, tot2 + 1.96 * se2],
            "one_inside": bool(abs(tot2 - 1) <= 1.96 * se2) if complete else None,
            "selection_term": sel, "selection_term_se": math.sqrt(k2 / n2**2 + k_s / n**2),
            "hits_on_empty": int(counts[cv.token_method == "empty"].sum())}
    return out


def independent_counts(cv, dec, sup, args) -> dict | None:
    """The independent uniform run the checks compare with: ``--uniform-file`` (counts of
    ``benchmarks/uniform_counts.py``, resumable) or a fresh run of ``--uniform-samples`` points
    with seed ``--seed + 1``; None without either. Returns ``counts`` (int64 per token),
    ``n_samples``, ``seed``, ``seconds`` and ``file``."""
    if args.uniform_file:
        from uniform_counts import load_counts

        from embgeom.volumes import _fingerprint

        st = load_counts(Path(args.uniform_file), _fingerprint(dec, sup.origin_ellipsoid_map()))
        if st is None:
            raise SystemExit(f"--uniform-file: no file {args.uniform_file}")
        return {"counts": np.asarray(st["counts"], np.int64), "n_samples": int(st["n_samples"]),
                "seed": int(st["seed"]), "seconds": float("nan"), "file": str(args.uniform_file)}
    if args.uniform_samples:
        from embgeom.volumes import cell_volumes

        u = cell_volumes(dec, sup, args.uniform_samples, args.seed + 1, method="uniform",
                         n_jobs=args.n_jobs, progress=True)
        return {"counts": np.asarray(u.counts, np.int64), "n_samples": int(u.n_samples),
                "seed": args.seed + 1, "seconds": float(u.seconds), "file": None}
    return None


def uniform_check(cv, counts, n: int) -> dict:
    """Tokens with >= 100 hits in an independent uniform run of ``n`` points (``counts``, int64
    per token): the share of them whose count lies in the file's interval (widened by the
    count's 2 standard errors), and the mean log difference (nats)."""
    resolved = np.isfinite(cv.log_fractions)
    big = (counts >= 100) & resolved  # a partial file's unresolved tokens are left out
    lf = np.log(counts[big] / n)
    inside = (lf >= cv.log_lower[big] - 2 / np.sqrt(counts[big])) & \
             (lf <= cv.log_upper[big] + 2 / np.sqrt(counts[big]))
    diff = cv.log_fractions[big] - lf
    return {"n_samples": n, "n_tokens_100_hits": int(big.sum()),
            "n_unresolved_100_hits": int(((counts >= 100) & ~resolved).sum()),
            "share_agreeing": float(inside.mean()) if big.any() else float("nan"),
            "mean_diff_nats": float(np.nanmean(diff)) if big.any() else float("nan")}


#: Bins of the uniform pass's own hits for :func:`split_check` (lower edges; the last is open).
SPLIT_BINS = (0, 1, 2, 3, 5, 10)


def split_check(cv, counts) -> dict:
    """The split tokens' shares, summed, against an independent uniform run's hits on them.

    ``cv`` chooses which tokens to split from its *own* uniform pass (``cv.counts``: those
    whose count would not beat one splitting run), so its counts are biased low on them; an
    independent run's hits ``counts`` (int64 per token, ``n = counts.sum()`` points) are not,
    and ``K / n`` (``K``: their hits on the split tokens) is unbiased for the tokens' total
    share, as is ``sum_t exp(log-share_t)`` of one splitting run per token (an unbiased
    estimate of each share: Brehier et al. 2016). Their log-ratio (nats) tests the splitting
    estimator's bias where single tokens cannot: most split tokens have a handful of hits.
    Standard error: the split sum's (delta method, each token's se from its 95% interval)
    and the Poisson ``1 / sqrt(K)``, combined. Also per bin of ``cv``'s own hits
    (:data:`SPLIT_BINS`), a choice made before either estimate and independent of both.
    """
    n = int(counts.sum())
    split = (cv.token_method == "rare-event") & np.isfinite(cv.log_fractions)
    own = np.asarray(cv.counts, np.int64)
    edges = list(SPLIT_BINS) + [np.iinfo(np.int64).max]

    def compare(sel, label):
        total = float(np.exp(cv.log_fractions[sel]).sum())
        k = int(counts[sel].sum())
        rel_split = _split_se(cv, sel) / total if total > 0 else float("nan")
        ratio = math.log(total * n / k) if k > 0 and total > 0 else float("nan")
        se = math.sqrt(rel_split**2 + 1.0 / k) if k > 0 else float("nan")
        return {"bin": label, "n_tokens": int(sel.sum()), "split_sum": total, "hits": k,
                "hits_share": k / n, "log_ratio_nats": ratio, "se_nats": se,
                "z": ratio / se if se > 0 else float("nan")}

    bins = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = split & (own >= lo) & (own < hi)
        if sel.any():
            label = (f"{lo}" if hi == lo + 1 else f"{lo}-{hi - 1}") if hi != edges[-1] else f">= {lo}"
            bins.append(compare(sel, label))
    return {"n_samples": n, "all": compare(split, "all split tokens"), "bins_by_own_hits": bins}


def summarize(cv, dec, sup, tok, args, short) -> dict:
    rate = cv.cell_volume_rate()
    out = {"model": args.model, "support": args.support,
           "vocabulary": cv.extra["vocabulary"],
           "lambda_all_tokens": float(rate.rate), "log_vocab": float(math.log(dec.n_tokens)),
           "methods": {str(m): int((cv.token_method == m).sum()) for m in np.unique(cv.token_method)}}
    sample = ROOT / "benchmarks" / "results" / f"{short}_lambda.json"
    if sample.is_file():
        out["lambda_sample_file"] = str(sample.relative_to(ROOT))
        out["lambda_sample"] = json.loads(sample.read_text()).get(args.support)
    fin = np.flatnonzero(np.isfinite(cv.log_fractions))
    order = fin[np.argsort(cv.log_fractions[fin])]
    names = (tok.convert_ids_to_tokens([int(t) for t in order]) if tok is not None else
             [None] * order.size)
    row = lambda i: {"token_id": int(order[i]), "token": names[i],  # noqa: E731
                     "log_share": float(cv.log_fractions[order[i]])}
    out["smallest"] = [row(i) for i in range(min(20, order.size))]
    out["largest"] = [row(i) for i in range(order.size - 1, max(order.size - 21, -1), -1)]
    ind = independent_counts(cv, dec, sup, args)
    if ind is None:
        out["sum_check"] = sum_check(cv)
        return out
    meta = {k: ind[k] for k in ("n_samples", "seed", "seconds", "file")}
    out["uniform_check"] = {**uniform_check(cv, ind["counts"], ind["n_samples"]), **meta}
    out["split_check"] = {**split_check(cv, ind["counts"]), "file": ind["file"]}
    out["sum_check"] = sum_check(cv, ind["counts"])
    return out


def markdown(s: dict) -> str:
    v, sc = s["vocabulary"], s["sum_check"]
    lines = [f"# Every cell of {s['model']} ({s['support']})", "",
             f"{v['n_done']:,} of {v['n_tokens']:,} tokens; {v['n_chains']} chains per run, "
             f"target_se {v['target_se']}, {v['n_samples']:,} uniform samples, seed "
             f"{v['seed_entropy']}; {v.get('seconds', 0) / 3600:.2f} h.", "",
             f"- sum of the file's shares: {sc['sum']:.6f} [{sc['interval'][0]:.6f}, "
             f"{sc['interval'][1]:.6f}] (1 inside: {sc['one_inside']}; {sc['n_unresolved']:,} "
             "unresolved); it sits above 1 by the selection term (the counts chose which tokens "
             "to split), as the independent run shows:" if "independent" in sc else
             f"- sum of the file's shares: {sc['sum']:.6f} [{sc['interval'][0]:.6f}, "
             f"{sc['interval'][1]:.6f}] (1 inside: {sc['one_inside']}; {sc['n_unresolved']:,} "
             "unresolved; its mean sits above 1 by the selection term: give --uniform-file)",
             ("- lambda from all tokens: " if v["n_done"] == v["n_tokens"] else
              f"- lambda from the {v['n_done']:,} tokens done (not yet all): ")
             + f"{s['lambda_all_tokens']:.3f} nats/token "
             f"(log|V| = {s['log_vocab']:.3f})",
             f"- estimators: {s['methods']}"]
    if "independent" in sc:
        ind = sc["independent"]
        lines.insert(5, f"  - with the counted tokens' shares from the independent run "
                        f"({ind['n_samples']:,} points): {ind['sum']:.6f} [{ind['interval'][0]:.6f}, "
                        f"{ind['interval'][1]:.6f}] (1 inside: {ind['one_inside']}); selection "
                        f"term {ind['selection_term']:+.2e} +- {ind['selection_term_se']:.1e}; "
                        f"independent hits on proven-empty cells: {ind['hits_on_empty']}")
    if "uniform_check" in s:
        u = s["uniform_check"]
        lines.append(f"- uniform check ({u['n_samples']:,} samples): {u['n_tokens_100_hits']} tokens "
                     f">= 100 hits ({u.get('n_unresolved_100_hits', 0)} more not yet resolved), "
                     f"{u['share_agreeing']:.1%} agree, mean diff "
                     f"{u['mean_diff_nats']:+.3f} nats")
    if "split_check" in s:
        c = s["split_check"]
        a = c["all"]
        lines += [f"- split tokens against the independent run's hits ({c['n_samples']:,} points): "
                  f"{a['n_tokens']:,} tokens, sum of shares {a['split_sum']:.3e} vs hits "
                  f"{a['hits']:,} ({a['hits_share']:.3e}): log-ratio {a['log_ratio_nats']:+.3f} "
                  f"+- {a['se_nats']:.3f} nats", "",
                  "| own hits | split tokens | sum of shares x n | independent hits | log-ratio (nats) | z |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {b['bin']} | {b['n_tokens']:,} | {b['split_sum'] * c['n_samples']:.0f} | "
                  f"{b['hits']:,} | {b['log_ratio_nats']:+.3f} +- {b['se_nats']:.3f} | {b['z']:+.1f} |"
                  for b in c["bins_by_own_hits"]]
    lines += ["", "| smallest | log-share | largest | log-share |", "|---|---|---|---|"]
    for a, b in zip(s["smallest"], s["largest"]):
        lines.append(f"| {a['token']!r} ({a['token_id']}) | {a['log_share']:.2f} | "
                     f"{b['token']!r} ({b['token_id']}) | {b['log_share']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", choices=sorted(MODELS))
    ap.add_argument("--support", default="ball", choices=("ball", "shell"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-samples", type=int, default=20_000)
    ap.add_argument("--n-chains", type=int, default=128)
    ap.add_argument("--target-se", default="none", help="nats, or 'none': one run per token")
    ap.add_argument("--chunk-size", type=int, default=2048)
    ap.add_argument("--max-chunks", type=int, default=None)
    ap.add_argument("--n-jobs", type=int, default=-1)
    ap.add_argument("--summarize", action="store_true")
    ap.add_argument("--uniform-samples", type=int, default=0)
    ap.add_argument("--uniform-file", default=None,
                    help="counts from benchmarks/uniform_counts.py instead of a new uniform run")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results" / "all_cells"))
    args = ap.parse_args(argv)
    from embgeom.volumes import load_vocabulary_cell_volumes, vocabulary_cell_volumes

    short = MODELS[args.model]
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{short}_{args.support}.npz"
    dec, sup, tok = model_parts(args.model, args.support)
    t0 = time.perf_counter()
    if args.summarize:
        cv = load_vocabulary_cell_volumes(path, dec, sup)
    else:
        target = None if args.target_se == "none" else float(args.target_se)
        cv = vocabulary_cell_volumes(dec, sup, path, args.n_samples, args.seed,
                                     chunk_size=args.chunk_size, n_chains=args.n_chains,
                                     target_se=target, max_chunks=args.max_chunks,
                                     n_jobs=args.n_jobs, progress=sys.stderr.isatty())
    v = cv.extra["vocabulary"]
    print(f"{path}: {v['n_done']:,} of {v['n_tokens']:,} tokens done "
          f"({time.perf_counter() - t0:.0f} s this step)", flush=True)
    if v["complete"] or args.summarize:
        s = summarize(cv, dec, sup, tok, args, short)
        (out / f"{short}_{args.support}.json").write_text(json.dumps(s, indent=1, default=str))
        (out / f"{short}_{args.support}.md").write_text(markdown(s))
        print(markdown(s))


if __name__ == "__main__":
    main()
