"""The report's figures, drawn with matplotlib's object API.

Every function builds a :class:`matplotlib.figure.Figure` directly (no pyplot state, no backend
switch, nothing left open), saves it as a PNG and returns the path as a string; matplotlib is
imported inside the functions, so importing this module is free.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .._validation import check_positive_int

__all__ = [
    "plot_hidden_norms",
    "plot_support_volumes",
    "plot_cell_shares",
    "plot_cell_histogram",
    "plot_accessible_fraction",
    "plot_linear_law",
]

_DPI = 120


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h))


def _save(fig, path) -> str:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    return str(path)


def plot_hidden_norms(summary: dict, path, *, certified_radius: float | None = None) -> str | None:
    """Max/mean L2 and max L-infinity norm of the hidden states against prompt length.

    Parameters
    ----------
    summary : dict
        :func:`embgeom.report.hidden_state_summary`'s output (needs ``per_length``).
    path : str or Path
        PNG to write.
    certified_radius : float, optional
        The L2 radius the final norm certifies (``sqrt(d) max|g_i|``, plus ``|b|`` with a bias),
        drawn as a horizontal line.

    Returns
    -------
    str or None
        The path written, or None when there is no per-length breakdown (nothing drawn).
    """
    rows = summary.get("per_length") or []
    if not rows:
        return None
    L = [r["length"] for r in rows]
    fig = _figure(7.5, 3.8)
    ax = fig.subplots()
    ax.plot(L, [r["r2_max"] for r in rows], "o-", label="max L2 norm")
    ax.plot(L, [r["r2_mean"] for r in rows], "s--", label="mean L2 norm")
    ax.plot(L, [r["rinf_max"] for r in rows], "^-", label="max L-inf norm")
    if certified_radius is not None and math.isfinite(certified_radius):
        ax.axhline(certified_radius, color="k", lw=1.2, ls=":",
                   label=f"final norm certifies L2 <= {certified_radius:.4g}")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("norm of the final hidden state")
    ax.set_title("Hidden-state norms vs prompt length")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_support_volumes(rows: list[dict], path) -> str:
    """Bar chart of log-volumes of every support the bounds table uses.

    Parameters
    ----------
    rows : list of dict
        ``{"name", "log_volume" (nats), "valid" (bool), "kind"}`` with ``kind`` one of
        ``"fit"``, ``"conformal"``, ``"cube"``, ``"certified"``.
    path : str or Path

    Returns
    -------
    str

    Raises
    ------
    ValueError
        No rows.
    """
    if not rows:
        raise ValueError("rows: expected at least one support")
    names = [r["name"] for r in rows]
    vals = [float(r["log_volume"]) for r in rows]
    valid = [bool(r["valid"]) for r in rows]
    hatch = {"conformal": "//", "cube": "..", "certified": "", "fit": ""}
    fig = _figure(7.8, 0.42 * len(rows) + 1.5)
    ax = fig.subplots()
    bars = ax.barh(names, vals, color=["tab:blue" if ok else "lightgrey" for ok in valid],
                   edgecolor="k", linewidth=0.4)
    for bar, r in zip(bars, rows):
        bar.set_hatch(hatch.get(r.get("kind", "fit"), ""))
    for i, (v, ok) in enumerate(zip(vals, valid)):
        ax.text(v, i, f" {v:.0f}" + ("" if ok else "  not valid"), va="center", fontsize=8)
    lo, hi = min(vals), max(vals)
    span = max(hi - lo, 1.0)
    ax.set_xlim(lo - 0.15 * span, hi + 0.3 * span)
    ax.set_xlabel("log-volume (nats); smaller = tighter bound")
    ax.set_title("Supports in the bounds table (blue: valid; grey: rejected;\n"
                 "hatched //: conformal-calibrated, ..: the L-inf cube)", fontsize=10)
    ax.invert_yaxis()
    return _save(fig, path)


def _cell_shares_title(estimator: str, n_samples, n_unres: int, k: int, V: int) -> str:
    """Title of :func:`plot_cell_shares`: the unresolved share is of the ``k`` cells drawn (the
    vocabulary, or a token sample of it), never of ``|V|`` for a sample."""
    title = f"Decoder cell shares, {estimator}"
    if n_samples:
        title += f", {n_samples:,} samples"
    if n_unres:
        what = "cells" if k == V else "the sampled cells"
        title += f"\n{100 * n_unres / k:.1f}% of {what} unresolved"
    return title


def plot_cell_shares(log_shares, path, *, log_lower=None, log_upper=None, unresolved=None,
                     n_samples: int | None = None, estimator: str = "uniform Monte Carlo",
                     vocab_size: int | None = None) -> str:
    """Rank plot of the decoder cells' log-shares with their intervals and the ``1/|V|`` line.

    Parameters
    ----------
    log_shares : array_like of float, shape (|V|,)
        Natural log of each cell's share of the support (nats); ``-inf`` or NaN for a token
        whose share is not resolved (no Monte Carlo hit, or not estimated).
    path : str or Path
    log_lower, log_upper : array_like of float, shape (|V|,), optional
        Interval ends (nats), drawn as a band.
    unresolved : array_like of bool, shape (|V|,), optional
        Tokens without a resolved share (default: non-finite ``log_shares``); their count and
        share of the vocabulary go into the legend, and the largest upper bound among them is
        drawn as a dotted line.
    n_samples : int, optional
        Monte Carlo sample count, for the title.
    estimator : str
        Named in the title.
    vocab_size : int, optional
        ``|V|`` when ``log_shares`` are those of a uniform token sample of ``k < |V|`` tokens:
        the sample's rank ``i`` is drawn at ``i |V| / k`` (its estimated rank in the
        vocabulary, an empirical CCDF), and the ``1/|V|`` line uses ``|V|``.

    Returns
    -------
    str
    """
    ls = np.asarray(log_shares, dtype=np.float64)
    k = ls.size
    V = k if vocab_size is None else int(vocab_size)
    scale = V / k
    unres = ~np.isfinite(ls) if unresolved is None else np.asarray(unresolved, bool)
    order = np.argsort(-np.where(unres, -np.inf, ls), kind="stable")
    res_order = order[~unres[order]]
    ln10 = math.log(10.0)
    fig = _figure(7.5, 4.4)
    ax = fig.subplots()
    ranks = np.arange(1, res_order.size + 1) * scale
    if res_order.size:
        if log_lower is not None and log_upper is not None:
            lo = np.asarray(log_lower, np.float64)[res_order] / ln10
            hi = np.asarray(log_upper, np.float64)[res_order] / ln10
            lo = np.where(np.isfinite(lo), lo, np.nan)
            ax.fill_between(ranks, lo, hi, color="C0", alpha=0.25, lw=0,
                            label="95% interval per cell")
        what = (f"{res_order.size:,} resolved cells" if k == V else
                f"{res_order.size:,} resolved cells of a {k:,}-token sample")
        ax.plot(ranks, ls[res_order] / ln10, color="C0", lw=1.4, label=what)
    ax.axhline(-math.log10(V), color="k", ls="--", lw=1.0, label=f"1/|V| = {1 / V:.2e} (uniform)")
    n_unres = int(unres.sum())
    if n_unres:
        label = (f"{n_unres:,} unresolved cells ({100 * n_unres / V:.1f}% of |V|)" if k == V else
                 f"{n_unres:,} of {k:,} sampled cells unresolved")
        if log_upper is not None:
            ub = np.asarray(log_upper, np.float64)[unres]
            ub = ub[np.isfinite(ub)]
            if ub.size:
                ax.axhline(float(ub.max()) / ln10, color="0.5", ls=":", lw=1.0)
                label += f": each below {math.exp(float(ub.max())):.1e}"
        ax.axvspan(max(res_order.size * scale, 1), V, color="0.85", alpha=0.6, lw=0, label=label)
    ax.set_xscale("log")
    ax.set_xlim(1, V)
    ax.set_xlabel("rank of the cell (largest first)" if k == V else
                  f"estimated rank in the vocabulary (rank in the sample x |V|/{k:,})")
    ax.set_ylabel("log10 share of the support")
    ax.set_title(_cell_shares_title(estimator, n_samples, n_unres, k, V), fontsize=10)
    ax.legend(fontsize=7.5, loc="lower left")
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def plot_cell_histogram(cv, ax=None, path=None, bins: int = 50, title: str | None = None):
    """Histogram of per-token cell volumes (log10 fraction on x, number of tokens on y).

    The body of :meth:`embgeom.volumes.CellVolumes.histogram`. With rare-event log-shares
    (``cv.token_method == "rare-event"``) every estimated token is drawn from its log-share.
    Otherwise (uniform counts) tokens with no hit have no finite log fraction: they are drawn
    as a separate grey bar to the left of the others, labelled with their count and the upper
    bound every one of them shares.

    Parameters
    ----------
    cv : embgeom.volumes.CellVolumes
    ax : matplotlib Axes, optional
        Draw into it; default a new :class:`~matplotlib.figure.Figure`.
    path : str or path-like, optional
        Save the figure as PNG there.
    bins : int, default 50
    title : str, optional

    Returns
    -------
    matplotlib Axes
    """
    bins = check_positive_int(bins, "bins")
    if ax is None:
        ax = _figure(7, 4).subplots()
    method = getattr(cv, "token_method", None)
    rare = np.zeros(cv.counts.size, bool) if method is None else (np.asarray(method) == "rare-event")
    if rare.any():  # rare-event log-shares: every estimated token, no zero-hit bar
        hit = rare
        n_empty = int((np.asarray(method) == "empty").sum())
        n_est = int(rare.sum()) + n_empty  # the tokens the estimator was given
        label = (f"{int(rare.sum()):,} tokens, rare-event" if n_est == rare.size else
                 f"{int(rare.sum()):,} of a {n_est:,}-token sample of {rare.size:,}, rare-event"
                 ) + (f"; {n_empty} proven empty, not drawn" if n_empty else "")
        x = cv.log_fractions[rare] / math.log(10)
    else:
        hit = cv.counts > 0
        label = f"{int(hit.sum())} tokens with hits"
        x = np.log10(cv.fractions[hit])
    if x.size:
        lo, hi = float(x.min()), float(x.max())
        if hi - lo < 1e-9:
            lo, hi = lo - 0.5, hi + 0.5
        edges = np.linspace(lo, hi, bins + 1)
        ax.hist(x, bins=edges, color="C0", label=label)
        width = (hi - lo) / bins
    else:
        lo, width = math.log10(1.0 / cv.n_samples), 0.1
    if cv.n_zero and not rare.any():
        ub = float(cv.upper[~hit].max())
        xz = lo - 3 * width
        ax.bar([xz], [cv.n_zero], width=2 * width, color="0.6",
               label=f"{cv.n_zero} tokens with 0 hits (fraction < {ub:.1e})")
        ax.annotate("0 hits", (xz, cv.n_zero), ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("log10 cell-volume fraction")
    ax.set_ylabel("number of tokens (log scale)")
    ax.set_yscale("log")
    ax.set_title(title or f"decoder cell volumes ({cv.n_samples} samples, {cv.sampling})")
    ax.legend(fontsize=8)
    if path is not None:
        ax.figure.savefig(path, dpi=_DPI, bbox_inches="tight")
    return ax


def plot_accessible_fraction(curves: dict, vocab_size, path, *, m_values=(1, 2, 4, 8),
                             decades: float = 10.0, n_max=None) -> str:
    """The accessible-fraction bound around its cliff, one panel per number of prompt vectors.

    The bound ``min(1, P^m / |V|^n)`` (Thm 4.5 / Cor. 4.6; with a rate ``lambda``:
    ``min(1, P^m e^{-lambda n})``) is 1 up to ``n*(m)`` and then falls by ``log10|V|`` decades
    per token: over the whole length axis it is a vertical step. Each panel therefore shows
    only the lengths where some curve changes, and the y axis only the first ``decades``
    decades below 1.

    Parameters
    ----------
    curves : dict[str, tuple[float, float | None]]
        Label -> ``(log_packing, rate)`` (nats; ``rate=None`` means ``log|V|``).
    vocab_size : int
        ``|V|`` >= 2.
    path : str or Path
    m_values : sequence of int, default (1, 2, 4, 8)
        One panel per ``m``.
    decades : float, default 10
        Depth of the y axis below 0 (log10 units).
    n_max : int, optional
        Ignored (kept for the signature of earlier versions; each panel picks its own range).

    Returns
    -------
    str

    Raises
    ------
    ValueError
        Empty ``curves``, ``vocab_size < 2``.
    """
    from ..bounds import accessible_fraction_bound, n_star

    if not curves:
        raise ValueError("curves: expected at least one curve")
    V = check_positive_int(vocab_size, "vocab_size", minimum=2)
    ms = [check_positive_int(m, "m_values") for m in m_values]
    ncol = 2 if len(ms) > 1 else 1
    nrow = -(-len(ms) // ncol)
    fig = _figure(8.0, 2.9 * nrow + 0.6)
    axes = np.atleast_1d(fig.subplots(nrow, ncol, squeeze=False)).ravel()
    ln10 = math.log(10.0)
    for ax, m in zip(axes, ms):
        starts, ends = [], []
        for lp, rate in curves.values():
            ns = float(n_star(m, lp, V, rate))
            per_token = (rate if rate else math.log(V)) / ln10  # decades per token past n*
            starts.append(ns)
            ends.append(ns + decades / per_token)
        lo = min(starts)
        hi = max(ends)
        pad = 0.04 * (hi - lo) + 1.0
        n = np.arange(max(int(math.floor(lo - pad)), 1), int(math.ceil(hi + pad)) + 1)
        for ci, (label, (lp, rate)) in enumerate(curves.items()):
            y = accessible_fraction_bound(n, m, lp, V, rate, log=True) / ln10
            ax.plot(n, y, color=f"C{ci % 10}", lw=1.4, label=label,
                    marker="." if n.size <= 60 else None, ms=3)
        ax.set_ylim(-decades, 0.4)
        ax.set_title(f"m = {m} prompt vector" + ("s" if m > 1 else ""), fontsize=9)
        ax.set_xlabel("sequence length n (tokens)", fontsize=8)
        ax.set_ylabel("log10 fraction (bound)", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in axes[len(ms):]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Accessible-fraction bound near its cliff (falls log10|V| = {math.log10(V):.2f} "
                 "decades per token past n*)", fontsize=10)
    return _save(fig, path)


def plot_linear_law(slopes: dict, path, *, m_max: int = 8, reference: dict | None = None,
                    c_emp: dict | None = None) -> str:
    """The linear law ``n*(m) = C m``: one line per valid support, and C_emp where measured.

    Parameters
    ----------
    slopes : dict[str, float]
        Label -> slope ``C`` (tokens per prompt vector) of the valid supports.
    path : str or Path
    m_max : int, default 8
        Largest number of prompt vectors ``m`` on the x axis.
    reference : dict[str, float], optional
        Further slopes drawn grey and dashed (e.g. the cube, rejected supports).
    c_emp : dict, optional
        A cramming measurement: ``c_emp`` (tokens per vector), ``c_emp_lower``,
        ``c_emp_upper`` and ``n50`` ``{m: {"n50", "lower", "upper"}}``; the n50 points with their
        intervals and the fitted line are drawn. None: the figure says "not measured".

    Returns
    -------
    str

    Raises
    ------
    ValueError
        No slopes at all.
    """
    if not slopes and not reference:
        raise ValueError("slopes: expected at least one slope")
    m_max = check_positive_int(m_max, "m_max")
    m = np.arange(0, m_max + 1)
    fig = _figure(7.5, 4.6)
    ax = fig.subplots()
    for i, (label, C) in enumerate(sorted(slopes.items(), key=lambda kv: kv[1])):
        ax.plot(m, C * m, "-", color=f"C{i % 10}", lw=1.6, label=f"{label}: C = {C:.4g}")
    for label, C in (reference or {}).items():
        ax.plot(m, C * m, "--", color="0.55", lw=1.0, label=f"{label}: C = {C:.4g} (not the bound)")
    if c_emp and c_emp.get("c_emp") is not None:
        pts = c_emp.get("n50") or {}
        xs, ys, los, his = [], [], [], []
        for k, v in pts.items():
            if v.get("n50") is None:
                continue
            xs.append(int(k))
            ys.append(float(v["n50"]))
            los.append(float(v["n50"]) - float(v["lower"] if v.get("lower") is not None else v["n50"]))
            his.append(float(v["upper"] if v.get("upper") is not None else v["n50"]) - float(v["n50"]))
        if xs:
            ax.errorbar(xs, ys, yerr=[np.clip(los, 0, None), np.clip(his, 0, None)], fmt="ko",
                        capsize=3, label="n50(m), cramming (95% bootstrap)")
        ce = float(c_emp["c_emp"])
        lo, hi = c_emp.get("c_emp_lower"), c_emp.get("c_emp_upper")
        ax.plot(m, ce * m, "k-", lw=1.0, label=f"C_emp = {ce:.3g}"
                + (f" [{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None else ""))
    else:
        ax.text(0.98, 0.03, "C_emp not measured (no cramming run)", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=8, color="0.3")
    ax.set_xlim(0, m_max)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("prompt vectors m")
    ax.set_ylabel("longest fully accessible length n*(m) (tokens)")
    ax.set_title("Linear law n*(m) <= C m (Cor. 4.6): valid supports")
    ax.legend(fontsize=7.5, loc="upper left")
    ax.grid(alpha=0.3)
    return _save(fig, path)
