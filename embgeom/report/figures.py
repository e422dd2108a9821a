"""The report's figures, drawn with matplotlib's object API.

Every function builds a :class:`matplotlib.figure.Figure` directly (no pyplot state, no backend
switch, nothing left open), saves it as a PNG and returns the path as a string; matplotlib is
imported inside the functions, so importing this module is free.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .._validation import check_positive, check_positive_int

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
    fig = _figure(7.5, 4.4)
    ax = fig.subplots()
    ranks = np.arange(1, res_order.size + 1) * scale
    if res_order.size:
        if log_lower is not None and log_upper is not None:
            lo = np.asarray(log_lower, np.float64)[res_order]
            hi = np.asarray(log_upper, np.float64)[res_order]
            lo = np.where(np.isfinite(lo), lo, np.nan)
            ax.fill_between(ranks, lo, hi, color="C0", alpha=0.25, lw=0,
                            label="95% interval per cell")
        what = (f"{res_order.size:,} resolved cells" if k == V else
                f"{res_order.size:,} resolved cells of a {k:,}-token sample")
        ax.plot(ranks, ls[res_order], color="C0", lw=1.4, label=what)
    ax.axhline(-math.log(V), color="k", ls="--", lw=1.0, label=f"1/|V| = {1 / V:.2e} (uniform)")
    n_unres = int(unres.sum())
    if n_unres:
        label = (f"{n_unres:,} unresolved cells ({100 * n_unres / V:.1f}% of |V|)" if k == V else
                 f"{n_unres:,} of {k:,} sampled cells unresolved")
        if log_upper is not None:
            ub = np.asarray(log_upper, np.float64)[unres]
            ub = ub[np.isfinite(ub)]
            if ub.size:
                ax.axhline(float(ub.max()), color="0.5", ls=":", lw=1.0)
                label += f": each below {math.exp(float(ub.max())):.1e}"
        ax.axvspan(max(res_order.size * scale, 1), V, color="0.85", alpha=0.6, lw=0, label=label)
    ax.set_xscale("log")
    ax.set_xlim(1, V)
    ax.set_xlabel("rank of the cell (largest first)" if k == V else
                  f"estimated rank in the vocabulary (rank in the sample x |V|/{k:,})")
    ax.set_ylabel("log share of the support (nats)")
    ax.set_title(_cell_shares_title(estimator, n_samples, n_unres, k, V), fontsize=10)
    ax.legend(fontsize=7.5, loc="lower left")
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def plot_cell_histogram(cv, ax=None, path=None, bins: int | None = None,
                        title: str | None = None):
    """Histogram of per-token cell volumes: log-share in nats on x, number of tokens on y.

    The body of :meth:`embgeom.volumes.CellVolumes.histogram`. The x axis is the natural log
    of each token's share ``vol(E_t ∩ S) / vol(S)`` (nats, the project's unit), the y axis a
    linear count of tokens. With rare-event log-shares (``cv.token_method == "rare-event"``)
    every estimated token is drawn from its log-share. Otherwise (uniform counts) tokens with
    no hit have no finite log-share: they are drawn as a separate grey bar to the left of the
    others, labelled with their count and the upper bound every one of them shares. The title
    names the estimator and its budget (chains for rare-event splitting, samples for uniform
    Monte Carlo). Tokens beyond Tukey's far-out fences (3 IQR past the quartiles, with 20 or
    more tokens) are not spread over the axis, which would squash the bulk into a bin or two:
    they are one hatched bar past each edge, labelled with their count and the extreme value.

    Parameters
    ----------
    cv : embgeom.volumes.CellVolumes
    ax : matplotlib Axes, optional
        Draw into it; default a new :class:`~matplotlib.figure.Figure`.
    path : str or path-like, optional
        Save the figure as PNG there.
    bins : int, optional
        Number of bins; default ``clip(sqrt(k), 5, 50)`` for k drawn tokens (a 32-token
        sample gets 6 bins, not 50 mostly empty ones).
    title : str, optional

    Returns
    -------
    matplotlib Axes
    """
    if ax is None:
        ax = _figure(7, 4).subplots()
    method = getattr(cv, "token_method", None)
    is_rare = getattr(cv, "estimator", None) == "rare-event"
    rare = (np.zeros(cv.counts.size, bool) if method is None or not is_rare else
            np.isin(np.asarray(method), ("rare-event", "uniform", "exact")))  # the sampled, estimated
    if rare.any():  # rare-event log-shares: every estimated token, no zero-hit bar
        hit = rare
        n_empty = int((np.asarray(method) == "empty").sum())
        n_est = int(rare.sum()) + n_empty  # the tokens the estimator was given
        label = (f"{int(rare.sum()):,} tokens" if n_est == rare.size else
                 f"{int(rare.sum()):,} of a {n_est:,}-token sample of {rare.size:,}"
                 ) + (f"; {n_empty} proven empty, not drawn" if n_empty else "")
        x = cv.log_fractions[rare]
        info = (cv.extra or {}).get("rare_event")
        chains = info.get("n_chains") if isinstance(info, dict) else None
        n_counts = int((np.asarray(method) == "uniform").sum())
        tse = info.get("target_se") if isinstance(info, dict) else None
        runs = (cv.extra or {}).get("rare_event_n_runs")
        if chains and tse is not None:  # a token's chains come in runs until its error is met
            r = np.asarray(runs)[np.asarray(method) == "rare-event"] if runs is not None else None
            budget = (f", runs of {chains} chains until se {tse:g} nats"
                      + (f" ({int(r.min())}-{int(r.max())} blocks per token, pilot included)"
                         if r is not None and r.size else ""))
        else:
            budget = f", one run of {chains} chains per token" if chains else ""
        estimator = ("rare-event splitting" + budget
                     + (f"; {n_counts:,} big cells by their uniform count of "
                        f"{cv.n_samples:,} samples" if n_counts else ""))
    else:
        hit = cv.counts > 0
        label = f"{int(hit.sum()):,} tokens with hits"
        x = np.log(cv.fractions[hit])
        estimator = f"uniform Monte Carlo, {cv.n_samples:,} samples ({cv.sampling})"
    nbins = (int(np.clip(round(math.sqrt(max(x.size, 1))), 5, 50)) if bins is None
             else check_positive_int(bins, "bins"))
    if x.size:
        f_lo, f_hi = _fences(x)
        inside = (x >= f_lo) & (x <= f_hi)
        lo, hi = float(x[inside].min()), float(x[inside].max())
        if hi - lo < 1e-9:
            lo, hi = lo - 0.5, hi + 0.5
        edges = np.linspace(lo, hi, nbins + 1)
        ax.hist(x[inside], bins=edges, color="C0", label=label)
        width = (hi - lo) / nbins
        # a few far tokens (one cell 30 nats below the rest) would squash the bulk into one
        # bin: they are drawn as a hatched bar beyond each edge, with their count and extreme
        for side, far in (("below", x < f_lo), ("above", x > f_hi)):
            if far.any():
                xo = lo - 2 * width if side == "below" else hi + 2 * width
                ext = float(x[far].min() if side == "below" else x[far].max())
                ax.bar([xo], [int(far.sum())], width=width, color="C0", alpha=0.45, hatch="//",
                       label=f"{int(far.sum()):,} token{'s' if far.sum() > 1 else ''} far "
                             f"{side} (the most extreme at {ext:.1f} nats), axis not to scale")
                ax.annotate(f"{ext:.1f}", (xo, int(far.sum())), ha="center", va="bottom",
                            fontsize=7)
    else:
        lo, width = math.log(1.0 / cv.n_samples), 0.25
    if cv.n_zero and not rare.any():
        ub = float(cv.upper[~hit].max())
        xz = lo - 3 * width
        ax.bar([xz], [cv.n_zero], width=2 * width, color="0.6",
               label=f"{cv.n_zero:,} tokens with 0 hits (share < {ub:.1e})")
        ax.annotate("0 hits", (xz, cv.n_zero), ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("log cell-volume share (nats)")
    ax.set_ylabel("number of tokens")
    ax.set_title(title or f"decoder cell volumes: {estimator}", fontsize=10)
    ax.legend(fontsize=8)
    if path is not None:
        ax.figure.savefig(path, dpi=_DPI, bbox_inches="tight")
    return ax


def _fences(x: np.ndarray, k: float = 3.0) -> tuple[float, float]:
    """Tukey's far-out fences ``(q1 - k IQR, q3 + k IQR)`` of the values ``x``; with fewer than
    20 values or an IQR of 0, no fence (``-inf, inf``): every value is drawn to scale."""
    if x.size < 20:
        return -math.inf, math.inf
    q1, q3 = np.percentile(x, [25, 75])
    iqr = float(q3 - q1)
    if iqr <= 0:
        return -math.inf, math.inf
    return float(q1 - k * iqr), float(q3 + k * iqr)


def plot_accessible_fraction(curves: dict, vocab_size, path, *, m_values=(1, 2, 4, 8),
                             depth_nats: float = 23.0, measured: dict | None = None) -> str:
    """The measured accessibility beside the bound (top), and the bound near its cliff (below).

    Top panel (the paper's central figure): the accessible fraction against the sequence length
    on a log axis. For every m with a measurement, the measured accessibility ``P(h >= n)``
    (cramming: the share of random targets whose horizon reaches n) with its Wilson 95% band,
    and in the same colour the bound ``min(1, P^m / |V|^n)`` (Thm 4.5 / Cor. 4.6) of the first
    curve (the tightest valid support), so the gap between theory and measurement is read off
    the x axis. Without a measurement the bound alone is drawn for ``m_values``.

    Lower panels: one per m, the natural log of the bound (nats, the project's unit) over the
    few tokens where it falls (``log|V|`` nats per token past ``n*``; with a rate ``lambda``,
    ``lambda`` nats per token), the first ``depth_nats`` nats below 0.

    Parameters
    ----------
    curves : dict[str, tuple[float, float | None]]
        Label -> ``(log_packing, rate)`` (nats; ``rate=None`` means ``log|V|``). The first
        entry is the bound drawn in the top panel.
    vocab_size : int
        ``|V|`` >= 2.
    path : str or Path
    m_values : sequence of int, default (1, 2, 4, 8)
        One lower panel per ``m``.
    depth_nats : float, default 23
        Depth of the lower panels' y axis below 0, in nats (23 nats is about 10 decades).
    measured : dict, optional
        ``{m: {"lengths", "accessibility", "lower", "upper"}}`` (lists; e.g.
        :func:`embgeom.report.read_cram_summary`'s ``curves``).

    Returns
    -------
    str

    Raises
    ------
    ValueError
        Empty ``curves`` or ``m_values``, ``vocab_size < 2``, a ``depth_nats`` that is not
        finite and > 0.
    TypeError
        A ``depth_nats`` that is not a real number.
    """
    from ..bounds import accessible_fraction_bound, n_star

    if not curves:
        raise ValueError("curves: expected at least one curve")
    V = check_positive_int(vocab_size, "vocab_size", minimum=2)
    ms = [check_positive_int(m, "m_values") for m in m_values]
    if not ms:
        raise ValueError("m_values: expected at least one number of prompt vectors (integers "
                         ">= 1), got none")
    measured = {int(k): v for k, v in (measured or {}).items()
                if v and v.get("lengths")}
    depth = check_positive(depth_nats, "depth_nats")
    ncol = 2 if len(ms) > 1 else 1
    nrow = -(-len(ms) // ncol)
    fig = _figure(8.0, 2.9 * nrow + 3.8)
    gs = fig.add_gridspec(nrow + 1, ncol, height_ratios=[1.35] + [1.0] * nrow)
    top = fig.add_subplot(gs[0, :])
    (label0, (lp0, rate0)) = next(iter(curves.items()))
    top_ms = sorted(measured) or ms
    n_hi = max(float(n_star(m, lp0, V, rate0)) for m in top_ms) * 1.6 + 2
    n_axis = np.unique(np.round(np.geomspace(1, n_hi, 600)).astype(np.int64))
    for i, m in enumerate(top_ms):
        col = f"C{i % 10}"
        y = accessible_fraction_bound(n_axis, m, lp0, V, rate0)
        top.plot(n_axis, y, "--", color=col, lw=1.3,
                 label=f"bound, m = {m} ({label0}): n* = {float(n_star(m, lp0, V, rate0)):.0f}")
        if m in measured:
            c = measured[m]
            x = np.asarray(c["lengths"], float)
            top.step(x, c["accessibility"], where="mid", color=col, lw=1.8,
                     label=f"measured accessibility, m = {m}")
            top.fill_between(x, c["lower"], c["upper"], step="mid", color=col, alpha=0.2)
    top.set_xscale("log")
    top.set_ylim(-0.02, 1.05)
    top.set_xlabel("sequence length n (tokens, log scale)", fontsize=8)
    top.set_ylabel("accessible fraction", fontsize=8)
    top.set_title("Measured accessibility (cramming, 95% Wilson) vs the bound"
                  if measured else "The bound (no cramming measurement for this model)",
                  fontsize=9)
    top.grid(alpha=0.3, which="both")
    top.legend(fontsize=6.5, loc="center left", ncol=1)
    axes = [fig.add_subplot(gs[1 + i // ncol, i % ncol]) for i in range(len(ms))]
    for ax, m in zip(axes, ms):
        starts, ends = [], []
        for lp, rate in curves.values():
            ns = float(n_star(m, lp, V, rate))
            per_token = rate if rate else math.log(V)  # nats per token past n*
            starts.append(ns)
            ends.append(ns + depth / per_token)
        lo = min(starts)
        hi = max(ends)
        pad = 0.04 * (hi - lo) + 1.0
        n = np.arange(max(int(math.floor(lo - pad)), 1), int(math.ceil(hi + pad)) + 1)
        for ci, (label, (lp, rate)) in enumerate(curves.items()):
            y = accessible_fraction_bound(n, m, lp, V, rate, log=True)
            ax.plot(n, y, color=f"C{ci % 10}", lw=1.4, label=label,
                    marker="." if n.size <= 60 else None, ms=3)
        ax.set_ylim(-depth, 0.04 * depth)
        ax.set_title(f"m = {m} prompt vector" + ("s" if m > 1 else ""), fontsize=9)
        ax.set_xlabel("sequence length n (tokens)", fontsize=8)
        ax.set_ylabel("log fraction, bound (nats)", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Accessible fraction: measurement and bound (the bound falls log|V| = "
                 f"{math.log(V):.2f} nats per token past n*)", fontsize=10)
    return _save(fig, path)


def plot_linear_law(slopes: dict, path, *, m_max: int = 8, reference: dict | None = None,
                    c_emp: dict | None = None) -> str:
    """The linear law ``n*(m) = C m`` and the measured n50(m), readable together.

    Left: the bound ``C m`` of the tightest valid support, the band the other valid supports'
    slopes span (they often differ by a few per cent, and separate lines would coincide), a
    list of every ``C``, and the measured n50 points, on a log y axis, so lines hundreds of
    tokens high and n50 points of tens of tokens are both visible. Right (when
    C_emp was measured): the n50 points with their intervals and the fit ``n50 = C_emp m`` on
    linear axes, with ``C / C_emp`` of each valid support written in.

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
        ``c_emp_upper`` and ``n50`` ``{m: {"n50", "lower", "upper"}}``. None: the figure says
        "not measured".

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
    m = np.arange(1, m_max + 1)
    measured = bool(c_emp and c_emp.get("c_emp") is not None)
    fig = _figure(11.0 if measured else 7.5, 4.6)
    axes = fig.subplots(1, 2 if measured else 1, squeeze=False).ravel()
    ax = axes[0]
    ordered = sorted(slopes.items(), key=lambda kv: kv[1])
    if ordered:
        # valid supports' slopes often lie within a few per cent of each other: on a log axis
        # their lines coincide, so the tightest is drawn, the rest as the band they span, and
        # every C is written out
        (label0, C0), C1 = ordered[0], ordered[-1][1]
        ax.plot(m, C0 * m, "-", color="C0", lw=1.8,
                label=f"the bound, {label0}: C = {C0:.4g} (tightest valid support)")
        if len(ordered) > 1:
            ax.fill_between(m, C0 * m, C1 * m, color="C0", alpha=0.18, lw=0,
                            label=f"{len(ordered)} valid supports: C = {C0:.4g} to {C1:.4g}")
            ax.plot(m, C1 * m, "-", color="C0", lw=0.8, alpha=0.6)
        ax.text(0.02, 0.98, "valid supports, C (tokens per vector):\n" + "\n".join(
            f"  {k}: {C:.4g}" for k, C in ordered), transform=ax.transAxes, ha="left",
            va="top", fontsize=6.5, color="0.25", family="monospace")
    for label, C in (reference or {}).items():
        ax.plot(m, C * m, "--", color="0.55", lw=1.0, label=f"{label}: C = {C:.4g} (not the bound)")
    pts = _n50_points(c_emp) if measured else None
    if measured:
        ce = float(c_emp["c_emp"])
        lo, hi = c_emp.get("c_emp_lower"), c_emp.get("c_emp_upper")
        # n50 not shown to converge in the step budget: C_emp is a lower bound on the capacity
        # and C / C_emp an upper bound on the bound's looseness (as the answer block says)
        exact = bool(c_emp.get("converged")) or str(c_emp.get("source", "")).startswith("published")
        rel, rel_ratio = ("=", "=") if exact else (">=", "<=")
        for a in axes:
            if pts[0]:
                a.errorbar(pts[0], pts[1], yerr=pts[2], fmt="ko", capsize=3,
                           label="n50(m), cramming (95% bootstrap)")
            a.plot(m, ce * m, "k-", lw=1.0, label=f"C_emp {rel} {ce:.3g}"
                   + (f" (fit 95% [{lo:.3g}, {hi:.3g}])" if lo is not None and hi is not None else "")
                   + ("" if exact else ", n50 not converged"))
        right = axes[1]
        right.set_xlim(0, m_max + 0.5)
        right.set_ylim(bottom=0)
        right.set_xlabel("prompt vectors m")
        right.set_ylabel("n50 (tokens)")
        right.set_title("Measured: n50 = C_emp m", fontsize=10)
        txt = "\n".join(f"{k}: C / C_emp {rel_ratio} {C / ce:.3g}"
                         for k, C in sorted(slopes.items(), key=lambda kv: kv[1]))
        if txt:
            right.text(0.02, 0.98, txt, transform=right.transAxes, ha="left", va="top",
                       fontsize=7.5, color="0.25")
        right.legend(fontsize=7.5, loc="lower right")
        right.grid(alpha=0.3)
    else:
        ax.text(0.98, 0.03, "C_emp not measured (no cramming run)", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=8, color="0.3")
    ax.set_yscale("log")
    ax.set_xlim(0.8, m_max + 0.2)
    ax.set_xlabel("prompt vectors m")
    ax.set_ylabel("n*(m) bound and n50(m) (tokens, log scale)")
    ax.set_title("Linear law n*(m) <= C m (Cor. 4.6): valid supports", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def _n50_points(c_emp: dict):
    """``(m list, n50 list, yerr 2 x k)`` of a measurement's finite n50 points."""
    xs, ys, los, his = [], [], [], []
    for k, v in (c_emp.get("n50") or {}).items():
        if v.get("n50") is None:
            continue
        y = float(v["n50"])
        xs.append(int(k))
        ys.append(y)
        los.append(y - float(v["lower"] if v.get("lower") is not None else y))
        his.append(float(v["upper"] if v.get("upper") is not None else y) - y)
    return xs, ys, [np.clip(los, 0, None), np.clip(his, 0, None)]
