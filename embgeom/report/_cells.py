"""The report's cells section: cell shares, unresolved cells, duplicates, unargmaxable tokens."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ..cells import Decoder, distinct_rows
from ..volumes import cell_volumes
from . import figures
from ._markdown import fmt, md_table

__all__ = ["cells_report_section", "duplicate_rows", "cell_log_shares"]


def duplicate_rows(decoder: Decoder, tokenizer=None, limit: int = 50) -> dict:
    """The tokens whose unembedding row (and bias) exactly repeats a row of a lower id.

    Such a token is never the strict argmax: ties go to the lowest id (the decoder's rule), so
    every duplicate is unargmaxable whatever the hidden state.

    Parameters
    ----------
    decoder : Decoder
    tokenizer : optional
        ``convert_ids_to_tokens`` names the tokens.
    limit : int, default 50
        At most this many pairs are listed.

    Returns
    -------
    dict
        ``n_duplicates`` (int), ``pairs`` (list of ``{"token_id", "same_row_as"[, "token",
        "same_row_as_token"]}``, the first ``limit``).
    """
    W = np.asarray(decoder.W_, dtype=np.float32)
    b = None if decoder.bias_ is None else np.asarray(decoder.bias_, dtype=np.float32)
    _, rep = distinct_rows(W, b)
    dup = np.flatnonzero(rep != np.arange(rep.size))
    pairs = [{"token_id": int(t), "same_row_as": int(rep[t])} for t in dup[:limit]]
    if pairs and tokenizer is not None and hasattr(tokenizer, "convert_ids_to_tokens"):
        a = tokenizer.convert_ids_to_tokens([p["token_id"] for p in pairs])
        z = tokenizer.convert_ids_to_tokens([p["same_row_as"] for p in pairs])
        for p, ta, tz in zip(pairs, a, z):
            p["token"], p["same_row_as_token"] = str(ta), str(tz)
    return {"n_duplicates": int(dup.size), "pairs": pairs}


def cell_log_shares(cv) -> dict:
    """Per-token log-shares (nats), their interval ends, and which tokens are unresolved.

    Uses the rare-event fields of :class:`embgeom.volumes.CellVolumes` when it has them
    (``log_fractions``, ``log_lower``, ``log_upper``: NaN for a token not estimated), else the
    counts of the uniform estimator (a token with no hit is unresolved).

    Returns
    -------
    dict
        ``log_shares``, ``log_lower``, ``log_upper`` (float64 (|V|,)), ``estimated`` (bool
        (|V|,): the tokens given an estimate, all of them for the uniform estimator, the token
        sample for the rare-event one), ``unresolved`` (bool (|V|,): estimated tokens without a
        finite share), ``estimator`` (str).
    """
    lf = getattr(cv, "log_fractions", None)
    if lf is not None:
        lf = np.asarray(lf, dtype=np.float64)
        lo = np.asarray(getattr(cv, "log_lower", np.full_like(lf, np.nan)), dtype=np.float64)
        hi = np.asarray(getattr(cv, "log_upper", np.full_like(lf, np.nan)), dtype=np.float64)
        tm = getattr(cv, "token_method", None)
        estimated = (np.ones(lf.size, bool) if tm is None
                     else np.asarray(tm) != "not estimated")
        k = int(estimated.sum())
        est = ("rare-event estimator" if k == lf.size else
               f"rare-event estimator on a seeded uniform sample of {k:,} of {lf.size:,} tokens")
        return {"log_shares": lf, "log_lower": lo, "log_upper": hi, "estimated": estimated,
                "unresolved": estimated & ~np.isfinite(lf), "estimator": est}
    with np.errstate(divide="ignore"):
        return {"log_shares": np.log(cv.fractions), "log_lower": np.log(cv.lower),
                "log_upper": np.log(cv.upper), "estimated": np.ones(cv.counts.size, bool),
                "unresolved": cv.counts == 0,
                "estimator": f"uniform Monte Carlo ({cv.sampling})"}


def cells_report_section(decoder: Decoder, support, n_samples: int, seed, out_dir,
                         tokenizer=None, *, unargmaxable: str = "full", max_lp: int | None = 200,
                         lp_time_limit: float = 60.0, top_k: int = 20, progress: bool = True,
                         return_volumes: bool = False, method: str = "auto", tokens="auto",
                         executor="local", vocabulary=None):
    """The cells section of the report: cell shares, the largest cells, unargmaxable tokens.

    Writes ``cell_fractions.npy`` (float64 (|V|,): the uniform pass's hit fractions ``k / n``,
    which sum to 1; zero for tokens with no hit, whatever their rare-event share),
    ``cell_log_shares.npz`` (the estimated tokens' ids, log-shares with their interval ends in
    nats, and the estimator of each), ``cell_histogram.png`` (the
    per-token histogram) and ``cell_volumes.png`` (the rank plot of
    the log-shares, :func:`embgeom.report.figures.plot_cell_shares`) into ``out_dir``.

    Parameters
    ----------
    decoder : Decoder
    support : Support
        Where the hidden states live; passed to :func:`embgeom.volumes.cell_volumes`.
    n_samples : int
        Monte Carlo points.
    seed : int or None
    out_dir : str or path-like
    tokenizer : optional
        ``convert_ids_to_tokens`` names the largest cells, the duplicates and the unargmaxable.
    unargmaxable : {"full", "off"}, default "full"
        ``"full"``: the exact scan of every token over the whole space
        (:meth:`Decoder.unargmaxable`, at most ``max_lp`` LPs, the rest undecided). ``"off"``:
        skipped (exact duplicate rows are still found: they are unargmaxable by the tie rule).
    max_lp : int or None, default 200
    lp_time_limit : float, default 60
        Seconds per LP token before it is reported undecided.
    top_k : int, default 20
    progress : bool, default True
    return_volumes : bool, default False
        Also return the :class:`~embgeom.volumes.CellVolumes`.
    method, tokens : passed to :func:`~embgeom.volumes.cell_volumes`
        ``"auto"``: rare-event log-shares (on a seeded token sample for a large vocabulary)
        where the cells are cones through the support's centre, uniform counts elsewhere.
    executor : {"local", "ray"} or embgeom.parallel.Executor, default "local"
        Where the cell-volume chunks and the unargmaxable scan run (same results on each).
    vocabulary : path-like, sequence of path-likes, or None
        ``.npz`` files of :func:`embgeom.volumes.vocabulary_cell_volumes` (every token's share).
        The first one made for this decoder and support (its fingerprint of ``W``, bias and
        ``G`` matches) and complete adds ``section["vocabulary"]``: lambda from all tokens
        beside lambda from the sample, the 20 smallest and 20 largest cells with their token
        strings, and ``cell_histogram_all.png`` over every token. Files of other models or
        supports are passed over; an unfinished one is named with its progress.

    Returns
    -------
    dict
        JSON-able: ``unargmaxable`` (the scan's dict, or None when off), ``duplicates``
        (:func:`duplicate_rows`), ``n_unresolved``, ``unresolved_share``, ``estimator``,
        ``fractions_path``, ``figure`` (file names), ``top``, ``top1pct_share``, ``volumes``
        (:meth:`CellVolumes.to_dict`).

    Raises
    ------
    TypeError, ValueError
        As :func:`~embgeom.volumes.cell_volumes`; ``unargmaxable`` not one of the choices.
    """
    if unargmaxable not in ("full", "off"):
        raise ValueError(f"unargmaxable: expected 'full' or 'off', got {unargmaxable!r}")
    os.makedirs(out_dir, exist_ok=True)
    out = Path(out_dir)
    # one splitting run per token (target_se=None): lambda over a token sample is limited by the
    # spread across tokens (about 2 nats / sqrt(1000) = 0.06), not by each token's precision,
    # and the rate removes the per-token log bias (CellVolumes.cell_volume_rate); the adaptive
    # default would take about 25 runs per SmolLM2 token (docs/theory.md, section 5.1)
    cv = cell_volumes(decoder, support, n_samples, seed=seed, progress=progress, method=method,
                      tokens=tokens, executor=executor, target_se=None)
    np.save(out / "cell_fractions.npy", cv.fractions)
    shares = cell_log_shares(cv)
    V = int(shares["log_shares"].size)
    est = shares["estimated"]
    n_est = int(est.sum())
    n_unres = int(shares["unresolved"].sum())
    fig = figures.plot_cell_shares(shares["log_shares"][est], out / "cell_volumes.png",
                                   log_lower=shares["log_lower"][est],
                                   log_upper=shares["log_upper"][est],
                                   unresolved=shares["unresolved"][est],
                                   n_samples=None if n_est < V else cv.n_samples,
                                   estimator=shares["estimator"], vocab_size=V)
    hist = out / "cell_histogram.png"
    cv.histogram(path=hist)  # per-token histogram of the estimated log-shares (no zero-hit bar)
    np.savez(out / "cell_log_shares.npz", token_ids=np.flatnonzero(est),
             log_shares=shares["log_shares"][est], log_lower=shares["log_lower"][est],
             log_upper=shares["log_upper"][est],
             token_method=np.asarray(cv.token_method)[est].astype(str))
    un = None
    if unargmaxable == "full":
        res = decoder.unargmaxable(max_lp=max_lp, lp_time_limit=lp_time_limit, progress=progress,
                                   executor=executor)
        un = res.to_dict()
        if tokenizer is not None and hasattr(tokenizer, "convert_ids_to_tokens") and res.tokens.size:
            un["tokens"] = [str(s) for s in
                            tokenizer.convert_ids_to_tokens([int(i) for i in res.tokens[:200]])]
    section = {
        "unargmaxable": un,
        "duplicates": duplicate_rows(decoder, tokenizer),
        "estimator": shares["estimator"],
        "n_estimated": n_est,
        "n_unresolved": n_unres,
        "unresolved_share": n_unres / max(n_est, 1),
        "fractions_path": "cell_fractions.npy",
        "figure": Path(fig).name,
        "histogram": hist.name,
        "log_shares_path": "cell_log_shares.npz",
        "top": cv.top(top_k, tokenizer=tokenizer),
        "top1pct_share": cv.top_share(0.01),
        "top1pct_share_equal_cells": cv.top_share_if_equal(0.01),
        "volumes": cv.to_dict(),
        "vocabulary": vocabulary_section(vocabulary, decoder, support, cv, out, tokenizer),
    }
    return (section, cv) if return_volumes else section


def vocabulary_section(paths, decoder: Decoder, support, cv, out: Path, tokenizer=None,
                       k: int = 20) -> dict | None:
    """The whole-vocabulary part of the cells section, from the first matching complete file.

    Returns None when no file is given or none was made for this decoder and support; else a
    dict: ``path``, ``complete``, ``n_done``, and for a complete file ``lambda_all`` and
    ``lambda_sample`` (nats per token, :meth:`CellVolumes.cell_volume_rate`), ``smallest`` and
    ``largest`` (``k`` each: token id, string, log-share and interval, nats), ``methods``
    (tokens per estimator), ``histogram`` (file name) and ``settings`` (budget and seed).
    """
    from ..volumes import load_vocabulary_cell_volumes

    if paths is None:
        return None
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    partial = None
    for p in paths:
        try:
            full = load_vocabulary_cell_volumes(p, decoder, support)
        except (ValueError, OSError, KeyError):  # another model or support, or not such a file
            continue
        info = full.extra["vocabulary"]
        if not info.get("complete"):
            partial = partial or {"path": str(p), "complete": False, "n_done": int(info["n_done"])}
            continue
        fin = np.flatnonzero(np.isfinite(full.log_fractions))
        # proven empty (-inf) and unresolved (nan) cells have no log-share to rank: counted
        empty = int(np.isneginf(full.log_fractions).sum())
        unresolved = int(np.isnan(full.log_fractions).sum())
        order = fin[np.argsort(full.log_fractions[fin], kind="stable")]
        n_small = min(k, order.size)
        picks = np.concatenate([order[:k], order[::-1][:k]])
        names = (tokenizer.convert_ids_to_tokens([int(t) for t in picks])
                 if tokenizer is not None and hasattr(tokenizer, "convert_ids_to_tokens")
                 else [None] * picks.size)
        rows = [{"token_id": int(t), "token": None if n is None else str(n),
                 "log_share": float(full.log_fractions[t]), "log_lower": float(full.log_lower[t]),
                 "log_upper": float(full.log_upper[t])} for t, n in zip(picks, names)]
        hist = out / "cell_histogram_all.png"
        full.histogram(path=hist)
        counted = full.token_method == "uniform"
        k_min = int(full.counts[counted].min()) if counted.any() else None
        return {"path": str(p), "complete": True, "n_done": int(info["n_done"]),
                "lambda_all": float(full.cell_volume_rate().rate),
                "lambda_sample": float(cv.cell_volume_rate().rate),
                "smallest": rows[:n_small], "largest": rows[n_small:],
                "n_empty": empty, "n_unresolved": unresolved,
                "methods": {str(m): int((full.token_method == m).sum())
                            for m in np.unique(full.token_method)},
                "histogram": hist.name,
                "n_counted": int(counted.sum()), "min_count": k_min,
                "n_samples": int(full.n_samples),
                "settings": {key: info.get(key) for key in
                             ("n_chains", "target_se", "n_samples", "seed_entropy", "seconds")}}
    return partial


def vocabulary_markdown(v: dict | None) -> list[str]:
    """Lines of report.md on the whole-vocabulary file (none without one)."""
    if not v:
        return []
    if not v["complete"]:
        return ["", f"Every cell: `{v['path']}` is unfinished ({v['n_done']:,} tokens done); "
                "rerun benchmarks/all_cells.py to complete it."]
    s = v["settings"]
    budget = (f"{s['n_chains']} chains per run, "
              + ("one counted run per token, after a pilot run that picks its working set"
                 if s["target_se"] is None else f"target_se {s['target_se']}"))
    lines = ["", f"Every cell ({v['n_done']:,} tokens, `{v['path']}`, {budget}): lambda from all "
             f"tokens {fmt(v['lambda_all'])} nats/token, from the sample "
             f"{fmt(v['lambda_sample'])}.", "",
             "Smallest and largest cells (log-share, nats)" + _left_out(v) + ":", ""]
    lines.append(md_table(["smallest", "log-share", "largest", "log-share"],
                          [[f"{a['token']!r} ({a['token_id']})", fmt(a["log_share"]),
                            f"{b['token']!r} ({b['token_id']})", fmt(b["log_share"])]
                           for a, b in zip(v["smallest"], v["largest"])]))
    lines += ["", f"![every cell, per-token histogram]({v['histogram']})"]
    if v.get("n_counted") and v.get("min_count") and v.get("n_samples"):
        k, N = v["min_count"], v["n_samples"]
        lines += ["", f"{v['n_counted']:,} of these shares are uniform counts k / {N:,} (k >= {k} "
                  "hits, where a count's interval is tighter than one splitting run's). A count "
                  f"takes only the values log(k / N): log({k} / N) = {math.log(k / N):.2f}, "
                  f"log({k + 1} / N) = {math.log((k + 1) / N):.2f}, ..., each shared by hundreds "
                  "of tokens, so the histogram has spikes there where splitting estimates would "
                  "spread; below them every share is a splitting estimate."]
    return lines


def _left_out(v: dict) -> str:
    """What the smallest-cells table leaves out: the empty cells (no share to rank) and the
    unresolved ones."""
    parts = []
    if v.get("n_empty"):
        parts.append(f"{v['n_empty']:,} empty cell{'s' if v['n_empty'] != 1 else ''} "
                     "(unargmaxable, share 0)")
    if v.get("n_unresolved"):
        parts.append(f"{v['n_unresolved']:,} unresolved")
    return f", the finite ones only; left out: {', '.join(parts)}" if parts else ""


def _equal_cells(section: dict) -> str:
    """The top-1% share's baseline: the same count from equal cells (not 0.01: by chance the
    largest counts of equal cells hold more than their 1%)."""
    eq = section.get("top1pct_share_equal_cells")
    if eq is None:
        return "equal cells would hold 0.01"
    return f"the same count from equal cells would read {fmt(eq)}, their true share being 0.01"


def unargmaxable_sentence(section: dict) -> str:
    """The unargmaxable count with its cause, in one sentence."""
    dup = section.get("duplicates") or {"n_duplicates": 0, "pairs": []}
    nd = dup["n_duplicates"]
    ex = ", ".join(f"{p['token_id']} = {p['same_row_as']}" for p in dup["pairs"][:4])
    ex += ", ..." if nd > 4 else ""
    un = section.get("unargmaxable")
    if un is None:
        if not nd:
            return ("Unargmaxable tokens: exact scan not run (--quick); no token repeats the "
                    "unembedding row of another.")
        return (f"Unargmaxable tokens: exact scan not run (--quick); at least {nd}: they are "
                f"exact duplicate rows of lower ids ({ex}) and ties go to the lower id.")
    n = un["n_unargmaxable"]
    counts = un.get("status_counts", {})
    n_dup, n_lp = counts.get("duplicate", 0), counts.get("lp_empty", 0)
    und = un.get("n_undecided", 0)
    tail = f"; {und} token{'s' if und != 1 else ''} undecided (LP time limit)" if und else ""
    if n == 0:
        return f"Unargmaxable tokens (exact scan): none{tail}."
    if n == n_dup:
        return (f"Unargmaxable tokens (exact scan): {n}, all of them exact duplicate rows of "
                f"lower ids ({ex}); ties go to the lower id, so these tokens never win{tail}.")
    parts = []
    if n_dup:
        parts.append(f"{n_dup} exact duplicate rows of lower ids ({ex}; ties go to the lower id)")
    if n_lp:
        parts.append(f"{n_lp} with an empty cell certified by an LP (the row lies inside the "
                     "convex hull of the others or on one of its faces)")
    return f"Unargmaxable tokens (exact scan): {n}: " + "; ".join(parts) + tail + "."


def splitting_budget(vol: dict) -> str | None:
    """The rare-event budget of a :meth:`CellVolumes.to_dict` as a phrase (None without one):
    the token sample, how many tokens were split and how many counted, chains and runs."""
    re_ = vol.get("rare_event") if isinstance(vol, dict) else None
    if not re_:
        return None
    n_split, counted = int(re_.get("n_tokens", 0)), int(re_.get("n_by_counts") or 0)
    ts = re_.get("token_sample")
    if re_.get("sample_is_all"):
        head = f"all {n_split + counted:,} tokens"
    elif isinstance(ts, int):
        head = f"a seeded sample of {ts:,} tokens"
    else:
        head = f"{n_split + counted:,} given tokens"
    runs = ("one counted run per token, after a pilot run that picks its working set (its "
            "estimate is not used; runs recorded per token count both)"
            if re_.get("target_se") is None else
            f"runs until a standard error of {re_['target_se']:g} nats, at most "
            f"{re_.get('max_runs')}")
    return (f"{head}: {n_split:,} by rare-event splitting ({re_.get('n_chains')} chains per "
            f"run, {runs}, median 95% width {re_.get('median_interval_width', float('nan')):.2f}"
            f" nats)" + (f", {counted:,} by their uniform count" if counted else ""))


def cells_markdown(section: dict, support_name: str) -> str:
    """The cells section of report.md."""
    vol = section["volumes"]
    V = vol["n_tokens"]
    n_est = section.get("n_estimated", V)
    budget = splitting_budget(vol)
    if n_est < V:
        shares = (f"Shares of the {V:,} decoder cells E_t (argmax of W h + b) in the "
                  f"`{support_name}` support: {section['estimator']} (each share checked "
                  f"against the full W, 95% intervals"
                  + (f"; {budget}" if budget else "")
                  + f"), {section['n_unresolved']:,} of them "
                  "unresolved. The largest-cells table and the top-1% share below come from "
                  f"{vol.get('n_samples', 0):,} uniform samples (95% {vol.get('interval', '')} "
                  f"intervals): the largest 1% of cells hold {fmt(section['top1pct_share'])} of "
                  f"the volume ({_equal_cells(section)}).")
    else:
        shares = (f"Shares of the {V:,} decoder cells E_t (argmax of W h + b) in the "
                  f"`{support_name}` support: {section['estimator']}, "
                  f"{vol.get('n_samples', 0):,} samples, 95% {vol.get('interval', '')} intervals. "
                  f"The largest 1% of cells hold {fmt(section['top1pct_share'])} of the volume "
                  f"({_equal_cells(section)}); {section['n_unresolved']:,} cells "
                  f"({100 * section['unresolved_share']:.1f}%) are unresolved (no sample fell in "
                  "them: only an upper bound on their share is known).")
    lines = ["## Decoder cells", "", shares, "", unargmaxable_sentence(section)]
    un = section.get("unargmaxable")
    if un and un.get("undecided"):
        lines.append("Undecided token ids (LP time limit reached): "
                     + ", ".join(str(i) for i in un["undecided"][:30]) + ".")
    dup = section.get("duplicates") or {}
    if dup.get("pairs") and dup["pairs"][0].get("token") is not None:
        lines += ["", "Duplicate rows:", "",
                  md_table(["token id", "token", "same row as", "token"],
                           [[p["token_id"], p["token"], p["same_row_as"], p["same_row_as_token"]]
                            for p in dup["pairs"][:20]])]
    top = section.get("top") or []
    if top:
        lines += ["", "Largest cells:", ""]
        keys = [k for k in ("token_id", "token", "fraction", "lower", "upper") if k in top[0]]
        lines.append(md_table(keys, [[t.get(k) for k in keys] for t in top[:10]]))
    lines += ["", f"![cell shares, rank plot]({section['figure']})"]
    if section.get("histogram"):
        lines += ["", f"![cell shares, per-token histogram]({section['histogram']})"]
    lines += vocabulary_markdown(section.get("vocabulary"))
    return "\n".join(lines)

