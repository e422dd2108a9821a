"""The report's figures, drawn with matplotlib's object API.

Every function builds a :class:`matplotlib.figure.Figure` directly (no pyplot state, no backend
switch, nothing left open), saves it as a PNG and returns the path as a string; matplotlib is
imported inside the functions, so importing this module is free.

Every plot helper of the package (here, :mod:`embgeom.cramming.plots`,
:mod:`embgeom.copying.plots`, :meth:`embgeom.volumes.CellVolumes.histogram`) turns its ``path``
into the file it writes by one rule, :func:`_figure_path`: a path without a suffix gets
``.png`` appended (and the path returned says so), a suffix matplotlib knows (``.png``,
``.pdf``, ``.svg``, ...) is written in that format, any other suffix, an existing directory or a
path ending in a separator is a ValueError naming ``path``, and anything but a str or
path-like object is a TypeError naming ``path``.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .._validation import check_bool as _check_bool
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


def _figure_path(path, name: str = "path") -> Path:
    """The file a plot helper writes for the caller's ``path`` (the rule of every plot helper).

    A str or path-like ``path`` without a suffix gets ``.png`` appended; one whose suffix is a
    format matplotlib writes (``.png``, ``.pdf``, ``.svg``, ...; any case) is kept as it is.
    The file is then written in the format its suffix names (:func:`_write`), so the path
    returned is the path written, whatever ``savefig.format`` says.

    Raises
    ------
    TypeError
        ``path`` is not a str or path-like object (bytes, a number, a file object).
    ValueError
        ``path`` is empty, ends in a path separator or names an existing directory (matplotlib
        would write ``<dir>.png`` beside it), has a suffix matplotlib cannot write, or lies in
        a folder that does not exist (a typo in it would otherwise create folders nobody asked
        for; ``savefig`` would raise ``FileNotFoundError`` after the plot was drawn).
    """
    from matplotlib.backend_bases import FigureCanvasBase

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a str or path-like file name, got "
                        f"{type(path).__name__} {path!r}")
    raw = os.fspath(path)
    if not isinstance(raw, str):  # a path-like object returning bytes
        raise TypeError(f"{name}: expected a str or path-like file name, got {type(raw).__name__} "
                        f"{raw!r}")
    if not raw:
        raise ValueError(f"{name}: expected a file name, got the empty string")
    if raw.endswith((os.sep, os.altsep or os.sep)):
        raise ValueError(f"{name}: expected a file name, got {raw!r} (a directory)")
    out = Path(raw)
    if out.is_dir():
        raise ValueError(f"{name}: expected a file name, got the existing directory {raw!r}")
    if not out.parent.is_dir():
        raise ValueError(f"{name}: the folder {str(out.parent)!r} does not exist (create it "
                         f"first), got {raw!r}")
    if not out.suffix:
        return out.with_name(out.name + ".png")
    formats = FigureCanvasBase.get_supported_filetypes()
    if out.suffix[1:].lower() not in formats:
        raise ValueError(f"{name}: expected a file name ending in one of "
                         f"{', '.join('.' + f for f in sorted(formats))} (or no suffix, for "
                         f".png), got {raw!r}")
    return out


def _write(fig, target: Path, **kwargs) -> Path:
    """Save ``fig`` at ``target`` (a :func:`_figure_path` result, whose folder exists), in the
    format its suffix names; returns ``target``."""
    fig.savefig(target, format=target.suffix[1:].lower(), **kwargs)
    return target


def _save(fig, path) -> str:
    """Lay ``fig`` out and write it at ``path`` (a :func:`_figure_path` result); returns the
    path written, as a string."""
    fig.tight_layout()
    return str(_write(fig, path, dpi=_DPI))


# ---------------------------------------------------------------- the helpers' input checks
#
# One rule for every figure helper: a wrong type is a TypeError, a wrong value a ValueError,
# and both name the argument (down to the key or index: ``rows[1]['valid']``) and what was
# expected, before anything is drawn.

#: Largest ``m_max`` :func:`plot_linear_law` draws (a million prompt vectors, far beyond any
#: context window); ``10**9`` used to build ``m_max``-point lines and ran out of memory.
_MAX_M = 10**6

#: Points of each line of :func:`plot_linear_law` beyond which ``m`` is an even grid from 1 to
#: ``m_max`` rather than every integer (the lines are smooth; the picture is the same).
_LAW_POINTS = 1000

#: Largest ``vocab_size`` :func:`plot_cell_shares` takes: no tokenizer has a billion tokens, and
#: a vocabulary beyond float64's exact integers would draw wrong ranks (``10**30`` failed inside
#: matplotlib, ``10**400`` overflowed).
_MAX_VOCAB = 10**9

#: Largest number of lower panels (``m_values``) :func:`plot_accessible_fraction` draws.
_MAX_PANELS = 64

#: Most bins of a cell histogram (``bins``): more draws bars narrower than a pixel, slowly.
MAX_BINS = 10_000

#: Largest magnitude (nats) :func:`plot_support_volumes` puts on its axis as it is; beyond it
#: (up to float64's ``1.8e308``) matplotlib's transforms overflow, and the log-volumes are
#: drawn in units of a power of ten nats instead (the axis label says which).
_MAX_AXIS_NATS = 1e100


def _is_bool(x) -> bool:
    return isinstance(x, (bool, np.bool_))


def _check_real(x, name: str, *, finite: bool = True, error=TypeError) -> float:
    """``x`` as a float: a real number (Python or numpy int or float), never a bool or a
    string (``"1.0"`` is refused, not parsed); with ``finite``, NaN and +-inf are a
    ValueError. ``error`` is the class raised for a wrong type. Every message names ``name``."""
    if _is_bool(x) or not isinstance(x, (numbers.Real, np.integer, np.floating)):
        raise error(f"{name}: expected a real number, got {type(x).__name__} {x!r}")
    try:
        v = float(x)
    except OverflowError:  # an int beyond float64 (10**400)
        raise ValueError(f"{name}: expected a finite number, got an integer of "
                         f"{len(str(abs(int(x))))} digits (beyond float64)") from None
    if finite and not math.isfinite(v):
        raise ValueError(f"{name}: expected a finite number, got {v!r}")
    return v


def _check_mapping(x, name: str, what: str) -> Mapping:
    """``x`` if it is a mapping (a dict), else a TypeError naming ``name`` and ``what``."""
    if not isinstance(x, Mapping):
        raise TypeError(f"{name}: expected {what}, got {type(x).__name__} {x!r}"[:300])
    return x


def _check_keys(row: Mapping, keys, name: str) -> None:
    """ValueError naming ``name`` and the keys of ``keys`` missing from ``row``."""
    missing = [k for k in keys if k not in row]
    if missing:
        raise ValueError(f"{name}: expected keys {', '.join(keys[:-1])} and {keys[-1]}, "
                         f"missing {', '.join(missing)} (got {dict(row)!r})"[:400])


def _int_text(v: int) -> str:
    """An integer for a message: ``1e+30``, or its digit count past float64 (``10**400``)."""
    return f"{v:.3g}" if abs(v) < 10**300 else f"an integer of {len(str(abs(v)))} digits"


def _check_int_sequence(x, name: str, *, maximum_length: int | None = None) -> list[int]:
    """``x`` as a list of ints >= 1: a sequence (list, tuple, range, array), never a scalar, a
    string or a dict; TypeError/ValueError naming ``name`` (or ``name[i]`` for an element)."""
    if (isinstance(x, (str, bytes, Mapping)) or not hasattr(x, "__iter__")
            or getattr(x, "ndim", 1) != 1):
        raise TypeError(f"{name}: expected a sequence of integers >= 1 (a list or tuple), got "
                        f"{type(x).__name__} {x!r}"[:300])
    out = [check_positive_int(v, f"{name}[{i}]") for i, v in enumerate(x)]
    if maximum_length is not None and len(out) > maximum_length:
        raise ValueError(f"{name}: expected at most {maximum_length} values (one panel each), "
                         f"got {len(out)}")
    return out


def plot_hidden_norms(summary: dict, path, *, certified_radius: float | None = None) -> str | None:
    """Max/mean L2 and max L-infinity norm of the hidden states against prompt length.

    Parameters
    ----------
    summary : dict
        :func:`embgeom.report.hidden_state_summary`'s output (needs ``per_length``).
    path : str or Path
        PNG to write (``.png`` is appended to a name without a suffix, :func:`_figure_path`).
    certified_radius : float, optional
        The L2 radius the final norm certifies (``sqrt(d) max|g_i|``, plus ``|b|`` with a bias),
        drawn as a horizontal line; a finite number > 0 (``None``: no line).

    Returns
    -------
    str or None
        The path written, or None when there is no per-length breakdown (nothing drawn).

    Raises
    ------
    TypeError
        ``summary`` not a dict; its ``per_length`` not a list of dicts; a length or norm that
        is not a real number (a string, a bool); ``certified_radius`` not a real number.
    ValueError
        A ``per_length`` row without ``length``, ``r2_max``, ``r2_mean`` or ``rinf_max``; a
        length that is not finite and > 0 (the x axis is logarithmic) or a norm that is not
        finite and >= 0; a ``certified_radius`` that is not finite and > 0. Each names the
        argument (``summary['per_length'][2]['r2_max']``). TypeError and ValueError: a ``path``
        the plot helpers refuse (:func:`_figure_path`), even when nothing is drawn.
    """
    target = _figure_path(path)
    rows = _norm_rows(summary)
    if certified_radius is not None:
        certified_radius = check_positive(certified_radius, "certified_radius")
    if not rows:
        return None
    L = [r["length"] for r in rows]
    fig = _figure(7.5, 3.8)
    ax = fig.subplots()
    ax.plot(L, [r["r2_max"] for r in rows], "o-", label="max L2 norm")
    ax.plot(L, [r["r2_mean"] for r in rows], "s--", label="mean L2 norm")
    ax.plot(L, [r["rinf_max"] for r in rows], "^-", label="max L-inf norm")
    if certified_radius is not None:
        ax.axhline(certified_radius, color="k", lw=1.2, ls=":",
                   label=f"final norm certifies L2 <= {certified_radius:.4g}")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("norm of the final hidden state")
    ax.set_title("Hidden-state norms vs prompt length")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, target)


_NORM_KEYS = ("length", "r2_max", "r2_mean", "rinf_max")


def _norm_rows(summary) -> list[dict]:
    """``summary["per_length"]`` as a list of ``{length, r2_max, r2_mean, rinf_max}`` floats
    (an empty list when there is none); errors name ``summary`` and the row and key."""
    _check_mapping(summary, "summary", "the dict of embgeom.report.hidden_state_summary "
                                       "(with per_length)")
    rows = summary.get("per_length")
    if rows is None:
        return []
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, (list, tuple)):
        raise TypeError(f"summary['per_length']: expected a list of dicts with "
                        f"{', '.join(_NORM_KEYS)}, got {type(rows).__name__}")
    out = []
    for i, r in enumerate(rows):
        name = f"summary['per_length'][{i}]"
        _check_mapping(r, name, f"a dict with {', '.join(_NORM_KEYS)}")
        _check_keys(r, _NORM_KEYS, name)
        out.append({k: check_positive(r[k], f"{name}[{k!r}]", allow_zero=k != "length")
                    for k in _NORM_KEYS})
    return out


def plot_support_volumes(rows: list[dict], path) -> str:
    """Bar chart of log-volumes of every support the bounds table uses.

    A support whose log-volume is not finite (``-inf`` for a degenerate support, ``inf`` or
    NaN) has no bar: its value is written at the axis' left edge with "not finite", and it is
    left out of the axis limits, which the finite log-volumes set. Every finite log-volume is
    drawn, up to float64's largest (``+-1.8e308``): when one exceeds ``1e100`` nats in
    magnitude (beyond it matplotlib's transforms overflow) the axis is in units of ``10**k``
    nats, which its label names, and the values written beside the bars stay in nats.

    Parameters
    ----------
    rows : list of dict
        ``{"name", "log_volume" (nats), "valid" (bool), "kind"}`` with ``kind`` (optional,
        default ``"fit"``) one of ``"fit"``, ``"conformal"``, ``"cube"``, ``"certified"``.
    path : str or Path
        PNG to write (``.png`` is appended to a name without a suffix, :func:`_figure_path`).

    Returns
    -------
    str
        The path written.

    Raises
    ------
    ValueError
        No rows; a row without ``name``, ``log_volume`` or ``valid``, or whose ``log_volume``
        is not a real number (a string such as ``"1.0"`` and a bool included; both name
        ``rows`` and the row).
    TypeError
        ``rows`` not a list of rows; a row that is not a mapping; a ``valid`` that is not a
        bool (``"no"`` would be truthy; a numpy bool is fine, named ``rows[i]['valid']``); a
        ``path`` the plot helpers refuse (:func:`_figure_path`, which also raises ValueError).
    """
    target = _figure_path(path)
    if isinstance(rows, (str, bytes, Mapping)) or not hasattr(rows, "__iter__"):
        raise TypeError(f"rows: expected a list of dicts with name, log_volume and valid, got "
                        f"{type(rows).__name__}")
    rows = list(rows)
    if not rows:
        raise ValueError("rows: expected at least one support")
    names, vals, valid = [], [], []
    for i, r in enumerate(rows):
        _check_mapping(r, f"rows[{i}]", "a dict with name, log_volume and valid")
        _check_keys(r, ("name", "log_volume", "valid"), f"rows[{i}]")
        try:
            v = _check_real(r["log_volume"], f"rows[{i}]['log_volume']", finite=False,
                            error=ValueError)
        except ValueError:
            raise ValueError(f"rows[{i}]: expected a real log_volume (nats), got "
                             f"{type(r['log_volume']).__name__} {r['log_volume']!r} (row "
                             f"{r.get('name')!r})") from None
        names.append(str(r["name"]))
        vals.append(v)
        valid.append(_check_bool(r["valid"], f"rows[{i}]['valid']"))
    finite = [math.isfinite(v) for v in vals]
    shown = [v for v, fin in zip(vals, finite) if fin] or [0.0]
    # near float64's largest the axis' own arithmetic overflows: draw in units of 10**k nats
    big = max(abs(v) for v in shown)
    exp10 = math.floor(math.log10(big)) if big > _MAX_AXIS_NATS else 0
    unit = 10.0 ** exp10
    x = [v / unit if fin else 0.0 for v, fin in zip(vals, finite)]
    hatch = {"conformal": "//", "cube": "..", "certified": "xx", "fit": ""}
    fig = _figure(7.8, 0.42 * len(rows) + 1.5)
    ax = fig.subplots()
    bars = ax.barh(names, x, color=["tab:blue" if ok else "lightgrey" for ok in valid],
                   edgecolor="k", linewidth=0.4)
    for bar, r in zip(bars, rows):
        bar.set_hatch(hatch.get(r.get("kind", "fit"), ""))
    lo, hi = min(shown) / unit, max(shown) / unit
    # a span of 1 nat is lost in rounding beside values past 1e9 nats: then a relative one
    span = max(hi - lo, 1.0 / unit, 1e-9 * max(abs(lo), abs(hi)))
    left = lo - 0.15 * span
    ax.set_xlim(left, hi + 0.3 * span)
    for i, (v, xi, ok, fin) in enumerate(zip(vals, x, valid, finite)):
        text = ((f" {v:.0f}" if abs(v) < 1e15 else f" {v:.4g}") if fin else
                f" log-volume {v} (not finite, no bar)")
        ax.text(xi if fin else left, i, text + ("" if ok else "  not valid"), va="center",
                fontsize=8)
    ax.set_xlabel("log-volume (nats); smaller = tighter bound" if not exp10 else
                  f"log-volume (units of 1e{exp10} nats); smaller = tighter bound")
    ax.set_title("Supports in the bounds table (blue: valid; grey: rejected;\n"
                 "hatched //: conformal-calibrated, ..: the L-inf cube, xx: certified by the "
                 "final norm)", fontsize=10)
    ax.invert_yaxis()
    return _save(fig, target)


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
        Natural log of each cell's share of the support (nats, <= 0); ``-inf`` or NaN for a
        token whose share is not resolved (no Monte Carlo hit, or not estimated). At least one
        resolved (finite).
    path : str or Path
        PNG to write (``.png`` is appended to a name without a suffix, :func:`_figure_path`).
    log_lower, log_upper : array_like of float, shape (|V|,), optional
        Interval ends (nats), drawn as a band.
    unresolved : array_like of bool, shape (|V|,), optional
        Tokens without a resolved share (default: non-finite ``log_shares``); their count and
        share of the vocabulary go into the legend, and the largest upper bound among them is
        drawn as a dotted line.
    n_samples : int, optional
        Monte Carlo sample count (an integer >= 1), for the title.
    estimator : str
        Named in the title.
    vocab_size : int, optional
        ``|V|`` when ``log_shares`` are those of a uniform token sample of ``k < |V|`` tokens:
        the sample's rank ``i`` is drawn at ``i |V| / k`` (its estimated rank in the
        vocabulary, an empirical CCDF), and the ``1/|V|`` line uses ``|V|``. An integer
        ``>= k`` and at most ``10**9`` (:data:`_MAX_VOCAB`; no tokenizer is larger).

    Returns
    -------
    str
        The path written.

    Raises
    ------
    ValueError
        ``log_shares`` empty or not 1-D (or not numbers); a value above 0 (``+inf`` included:
        a share above 1) in ``log_shares``, ``log_lower`` or ``log_upper``; a ``log_lower``
        above its ``log_upper`` (an interval upside down); no resolved cell (every log-share
        NaN or ``-inf``, or flagged in ``unresolved``); a token not flagged in ``unresolved``
        without a finite log-share; ``log_lower``, ``log_upper`` or ``unresolved`` not of
        shape ``(k,)``; ``vocab_size`` smaller than ``k``, the number of shares, or above
        ``10**9``; ``n_samples < 1`` (each names the argument).
    TypeError
        ``vocab_size`` or ``n_samples`` not an integer (a string, a float, a bool);
        ``unresolved`` not booleans (``["no", "yes"]`` would all be True; numpy bools are
        fine); ``estimator`` not a str; a ``path`` the plot helpers refuse
        (:func:`_figure_path`, which also raises ValueError).
    """
    target = _figure_path(path)
    if n_samples is not None:
        n_samples = check_positive_int(n_samples, "n_samples")
    if not isinstance(estimator, str):
        raise TypeError(f"estimator: expected a str (named in the title), got "
                        f"{type(estimator).__name__} {estimator!r}")
    ls = _shares_array(log_shares, "log_shares")
    if ls.ndim != 1 or ls.size == 0:
        raise ValueError(f"log_shares: expected a non-empty 1-D array of log-shares (nats), got "
                         f"shape {ls.shape}")
    k = ls.size
    lower = None if log_lower is None else _shares_array(log_lower, "log_lower", k)
    upper = None if log_upper is None else _shares_array(log_upper, "log_upper", k)
    for name, arr in (("log_shares", ls), ("log_lower", lower), ("log_upper", upper)):
        if arr is not None and np.any(arr > 1e-9):  # NaN compares False; +inf is caught
            raise ValueError(f"{name}: expected log-shares <= 0 (nats; a share is at most 1), "
                             f"got max {float(np.nanmax(arr))!r} ({int(np.sum(arr > 1e-9))} above 0)")
    if lower is not None and upper is not None:
        # NaN compares False (an end not computed is no conflict); 1e-9 nats of rounding, as
        # for the ends above 0
        flipped = lower > upper + 1e-9
        if flipped.any():
            i = int(np.flatnonzero(flipped)[0])
            raise ValueError(f"log_lower: expected log_lower <= log_upper for every cell, got "
                             f"{int(flipped.sum())} interval(s) upside down, the first at "
                             f"index {i}: log_lower {float(lower[i])!r} > log_upper "
                             f"{float(upper[i])!r}")
    if vocab_size is None:
        V = k
    else:
        try:
            V = check_positive_int(vocab_size, "vocab_size", minimum=k)
        except ValueError as e:  # |V| is at least the k tokens sampled from it
            raise ValueError(f"{e} (the number of log_shares, a sample of the vocabulary)"
                             ) from None
        if V > _MAX_VOCAB:
            raise ValueError(f"vocab_size: expected at most 10**9 tokens (no tokenizer is "
                             f"larger), got {_int_text(V)}")
    scale = V / k
    if unresolved is None:
        unres = ~np.isfinite(ls)
    else:
        unres = np.asarray(unresolved)
        if unres.dtype != bool:  # np.asarray(["no"], bool) is True: flags must be booleans
            raise TypeError(f"unresolved: expected booleans (one flag per log-share; numpy "
                            f"bools are fine), got dtype {unres.dtype}")
        if unres.shape != (k,):
            raise ValueError(f"unresolved: expected shape ({k},), one flag per log-share, got "
                             f"{unres.shape}")
        drawn = ~unres & ~np.isfinite(ls)
        if drawn.any():
            raise ValueError(f"log_shares: expected a finite log-share for every token not "
                             f"flagged in unresolved, got {float(ls[drawn][0])!r} for "
                             f"{int(drawn.sum())} of them")
    if unres.all():
        raise ValueError(f"log_shares: expected at least one resolved cell (a finite log-share "
                         f"not flagged in unresolved), got none of {k} "
                         f"({int(np.isnan(ls).sum())} NaN, {int(np.isneginf(ls).sum())} -inf): "
                         f"nothing to draw")
    order = np.argsort(-np.where(unres, -np.inf, ls), kind="stable")
    res_order = order[~unres[order]]
    fig = _figure(7.5, 4.4)
    ax = fig.subplots()
    ranks = np.arange(1, res_order.size + 1) * scale
    if res_order.size:
        if lower is not None and upper is not None:
            lo = lower[res_order]
            hi = upper[res_order]
            lo = np.where(np.isfinite(lo), lo, np.nan)
            ax.fill_between(ranks, lo, hi, color="C0", alpha=0.25, lw=0,
                            label="95% interval per cell")
        what = (f"{res_order.size:,} resolved cells" if k == V else
                f"a {k:,}-token sample, all resolved" if res_order.size == k else
                f"{res_order.size:,} resolved cells of a {k:,}-token sample")
        ax.plot(ranks, ls[res_order], color="C0", lw=1.4, label=what)
    ax.axhline(-math.log(V), color="k", ls="--", lw=1.0, label=f"1/|V| = {1 / V:.2e} (uniform)")
    n_unres = int(unres.sum())
    if n_unres:
        label = (f"{n_unres:,} unresolved cells ({100 * n_unres / V:.1f}% of |V|)" if k == V else
                 f"{n_unres:,} of {k:,} sampled cells unresolved")
        if upper is not None:
            ub = upper[unres]
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
    return _save(fig, target)


def _shares_array(x, name: str, k: int | None = None, what: str = "log-shares (nats)"
                  ) -> np.ndarray:
    """``x`` as float64; with ``k``, of shape ``(k,)``. ValueError naming ``name`` otherwise.

    Numbers only: strings (``["-1.0"]``, which numpy would parse) and bools are refused; a
    ``None`` among numbers (JSON's null) is NaN."""
    try:
        raw = np.asarray(x)
    except (TypeError, ValueError):  # ragged nested lists
        raise ValueError(f"{name}: expected an array of {what}, got {type(x).__name__} (ragged)"
                         ) from None
    arr = None
    if not (raw.dtype.kind in "USb" or (raw.dtype.kind == "O" and any(
            isinstance(v, (str, bytes, bool, np.bool_)) for v in raw.ravel()))):
        try:
            arr = np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            pass
    if arr is None:
        raise ValueError(f"{name}: expected an array of {what}, got {type(x).__name__} of "
                         f"dtype {raw.dtype}")
    if k is not None and arr.shape != (k,):
        raise ValueError(f"{name}: expected shape ({k},), one value per log-share, got "
                         f"{arr.shape}")
    return arr


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
        Save the figure as PNG there (its folder must exist). The rule of every plot helper
        (:func:`_figure_path`): a name without a suffix gets ``.png`` appended, so
        ``path="h"`` writes ``h.png``.
    bins : int, optional
        Number of bins; default ``clip(sqrt(k), 5, 50)`` for k drawn tokens (a 32-token
        sample gets 6 bins, not 50 mostly empty ones).
    title : str, optional

    Returns
    -------
    matplotlib Axes

    Raises
    ------
    TypeError
        ``cv`` not a :class:`~embgeom.volumes.CellVolumes` (an array or list of log-shares
        included: :func:`plot_cell_shares` draws those); ``ax`` not a matplotlib Axes; ``path``
        not a str or path-like object; ``bins`` not an integer.
    ValueError
        ``path`` an existing directory, ending in a separator, or with a suffix matplotlib
        cannot write; ``bins < 1`` or above ``MAX_BINS`` (10,000). All before anything is drawn.
    """
    from matplotlib.axes import Axes

    from ..volumes import CellVolumes  # the caller holds one: the module is loaded already

    if not isinstance(cv, CellVolumes):
        raise TypeError(f"cv: expected an embgeom.volumes.CellVolumes (the result of "
                        f"cell_volumes, whose counts, intervals and estimator the histogram "
                        f"reads), got {type(cv).__name__}; for bare log-shares use "
                        f"plot_cell_shares")
    if ax is not None and not isinstance(ax, Axes):
        raise TypeError(f"ax: expected a matplotlib Axes (or None, for a new figure), got "
                        f"{type(ax).__name__} {ax!r}")
    target = None if path is None else _figure_path(path)
    if bins is not None:
        bins = check_positive_int(bins, "bins")
        if bins > MAX_BINS:
            raise ValueError(f"bins: expected at most {MAX_BINS} (a histogram of a 49,152-token "
                             f"vocabulary needs far fewer), got {bins:.3g}")
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
        n_drawn = int(rare.sum())
        label = (f"{n_drawn:,} tokens" if n_est == rare.size else
                 f"a {n_est:,}-token sample of {rare.size:,}" if n_drawn == n_est else
                 f"{n_drawn:,} of a {n_est:,}-token sample of {rare.size:,}"
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
    nbins = int(np.clip(round(math.sqrt(max(x.size, 1))), 5, 50)) if bins is None else bins
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
    if target is not None:
        _write(ax.figure, target, dpi=_DPI, bbox_inches="tight")
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
        entry is the bound drawn in the top panel. Every cliff ``n*(m)`` (and the
        ``depth_nats`` past it) must lie below ``2**52`` tokens, so that the lengths drawn are
        exact integers.
    vocab_size : int
        ``|V|`` >= 2.
    path : str or Path
        PNG to write (``.png`` is appended to a name without a suffix, :func:`_figure_path`).
    m_values : sequence of int, default (1, 2, 4, 8)
        One lower panel per ``m`` (a list or tuple of integers >= 1, at most 64 of them; a
        bare integer is refused).
    depth_nats : float, default 23
        Depth of the lower panels' y axis below 0, in nats (23 nats is about 10 decades).
    measured : dict, optional
        ``{m: {"lengths", "accessibility", "lower", "upper"}}`` (lists of equal length; e.g.
        :func:`embgeom.report.read_cram_summary`'s ``curves``): lengths finite and > 0, the
        fractions finite and in ``[0, 1]``. An entry that is ``None`` or has no lengths is
        not drawn.

    Returns
    -------
    str
        The path written.

    Raises
    ------
    ValueError
        Empty ``curves`` or ``m_values``, ``vocab_size < 2``, a ``depth_nats`` that is not
        finite and > 0; a curve whose ``log_packing`` or ``rate`` :func:`embgeom.bounds.n_star`
        refuses, or whose cliff lies past ``2**52`` tokens (these name ``curves`` and the
        label); more than 64 ``m_values``; a ``measured`` key that is not an integer >= 1, an
        entry without ``accessibility``, ``lower`` or ``upper``, of lists of different
        lengths or with values out of range (named ``measured['2']['lower']``).
    TypeError
        A ``depth_nats`` that is not a real number; ``curves`` not a dict of pairs;
        ``m_values`` not a sequence (a bare integer, a string) or with an element that is not
        an integer (named ``m_values[1]``); ``measured`` not a dict of dicts; a ``path`` the
        plot helpers refuse (:func:`_figure_path`, which also raises ValueError).
    """
    from ..bounds import accessible_fraction_bound, n_star

    target = _figure_path(path)
    if not isinstance(curves, Mapping):
        raise TypeError(f"curves: expected a dict label -> (log_packing, rate), got "
                        f"{type(curves).__name__}")
    if not curves:
        raise ValueError("curves: expected at least one curve")
    V = check_positive_int(vocab_size, "vocab_size", minimum=2)
    ms = _check_int_sequence(m_values, "m_values", maximum_length=_MAX_PANELS)
    if not ms:
        raise ValueError("m_values: expected at least one number of prompt vectors (integers "
                         ">= 1), got none")
    measured = _measured_curves(measured)
    depth = check_positive(depth_nats, "depth_nats")
    _check_curves(curves, sorted(set(ms) | set(measured)), V, depth)
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
        n = _lengths_around(starts, ends)
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
    return _save(fig, target)


#: Longest cliff (plus the depth drawn past it) :func:`plot_accessible_fraction` draws, in
#: tokens: every length its axes are built from, up to 1.6 times this, is then an exact
#: integer in float64 and int64.
_MAX_CLIFF = 2.0 ** 52

#: Points of a lower panel of :func:`plot_accessible_fraction` beyond which its lengths are a
#: grid (plus every cliff and end) rather than every integer.
_MAX_PANEL_POINTS = 4000


def _measured_m(k, name: str = "measured") -> int:
    """A key of ``name`` (an int, or its string from JSON) as the integer ``m >= 1``."""
    try:
        m = 0 if _is_bool(k) else int(k)
    except (TypeError, ValueError, OverflowError):
        m = 0
    if m < 1 or (not isinstance(k, str) and m != k):
        raise ValueError(f"{name}: expected keys m, integers >= 1 (or their strings), got "
                         f"{k!r}")
    return m


_CURVE_KEYS = ("lengths", "accessibility", "lower", "upper")


def _measured_curves(measured) -> dict:
    """``measured`` as ``{m: {lengths, accessibility, lower, upper}}`` of float arrays of one
    length, the entries without lengths left out; errors name ``measured`` and the entry."""
    if measured is None:
        return {}
    _check_mapping(measured, "measured", "a dict m -> {lengths, accessibility, lower, upper}")
    out = {}
    for k, c in measured.items():
        m = _measured_m(k)
        name = f"measured[{k!r}]"
        if c is None:
            continue
        _check_mapping(c, name, "a dict with lengths, accessibility, lower and upper")
        if c.get("lengths") is None or len(c["lengths"]) == 0:
            continue  # nothing measured for this m
        _check_keys(c, _CURVE_KEYS, name)
        arrs = {key: _shares_array(c[key], f"{name}[{key!r}]",
                                   what="lengths" if key == "lengths" else "fractions")
                for key in _CURVE_KEYS}
        n = arrs["lengths"].shape
        for key, a in arrs.items():
            if a.ndim != 1 or a.shape != n:
                raise ValueError(f"{name}[{key!r}]: expected a list of {n[0]} values (one per "
                                 f"length), got shape {a.shape}")
            ok = (a > 0) if key == "lengths" else (a >= 0) & (a <= 1)
            if not (np.isfinite(a) & ok).all():
                want = "finite lengths > 0" if key == "lengths" else "fractions in [0, 1]"
                raise ValueError(f"{name}[{key!r}]: expected {want}, got "
                                 f"{float(a[~(np.isfinite(a) & ok)][0])!r}")
        out[m] = arrs
    return out


def _check_curves(curves, ms, V: int, depth: float) -> None:
    """Refuse, naming ``curves`` and the label, a curve :func:`embgeom.bounds.n_star` refuses
    or whose cliff ``n*(m)`` or end ``n* + depth / rate`` lies past :data:`_MAX_CLIFF`."""
    from ..bounds import n_star

    for label, c in curves.items():
        try:
            lp, rate = c
        except (TypeError, ValueError):
            raise TypeError(f"curves[{label!r}]: expected a pair (log_packing, rate), got "
                            f"{c!r}") from None
        try:
            ns = float(np.max(n_star(ms, lp, V, rate)))
        except (TypeError, ValueError) as e:
            raise type(e)(f"curves[{label!r}]: {e}") from None
        end = ns + depth / (rate if rate else math.log(V))
        if not end <= _MAX_CLIFF:
            raise ValueError(f"curves[{label!r}]: expected a cliff n*(m) below 2**52 tokens for "
                             f"m up to {max(ms)}, got n* = {ns:.3g} (log_packing {float(lp):.3g} "
                             f"nats, rate {rate!r}); the figure draws exact integer lengths")


def _lengths_around(starts: list, ends: list) -> np.ndarray:
    """Integer lengths (int64, >= 1, sorted) spanning the cliffs ``starts`` to the ends
    ``ends`` of a lower panel, padded by 4 per cent and a token: every integer when there are
    at most :data:`_MAX_PANEL_POINTS`, otherwise an even grid plus the lengths on either side
    of every cliff and end (the bound is linear in between, so nothing is lost)."""
    lo, hi = min(starts), max(ends)
    pad = 0.04 * (hi - lo) + 1.0
    a, b = max(int(math.floor(lo - pad)), 1), int(math.ceil(hi + pad))
    if b - a < _MAX_PANEL_POINTS:
        return np.arange(a, b + 1, dtype=np.int64)
    kinks = [f(x) for x in (*starts, *ends) for f in (math.floor, math.ceil)]
    grid = np.round(np.linspace(a, b, _MAX_PANEL_POINTS)).astype(np.int64)
    return np.unique(np.clip(np.concatenate([grid, np.asarray(kinks, np.int64)]), a, b))


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
        PNG to write (``.png`` is appended to a name without a suffix, :func:`_figure_path`).
    m_max : int, default 8
        Largest number of prompt vectors ``m`` on the x axis: an integer from 1 to ``10**6``
        (:data:`_MAX_M`). Up to 1000 every integer ``m`` is a point of the lines, beyond it an
        even grid of 1000.
    reference : dict[str, float], optional
        Further slopes drawn grey and dashed (e.g. the cube, rejected supports).
    c_emp : dict, optional
        A cramming measurement: ``c_emp`` (tokens per vector), ``c_emp_lower``,
        ``c_emp_upper``, ``converged`` (a bool, or None: not known), ``source`` and ``n50``
        ``{m: {"n50", "lower", "upper"}}`` (``m`` an integer >= 1 or its string, the values
        real numbers or None). None, or a ``c_emp`` of None: the figure says "not measured".

    Returns
    -------
    str
        The path written.

    Raises
    ------
    ValueError
        No slopes at all; a slope of ``slopes`` or ``reference`` that is NaN, infinite or
        negative (named as ``slopes['ball']``; a slope of 0, a support of one point at this
        precision, is listed, and in the legend, but has no line: it lies below the log y
        axis); ``m_max < 1`` or above ``10**6``; a ``c_emp`` value (``c_emp``,
        ``c_emp_lower``, ``c_emp_upper``) that is not finite and > 0; an ``n50`` key that is
        not an integer >= 1, or an n50 that is not finite and > 0 (bounds: >= 0).
    TypeError
        ``slopes`` or ``reference`` not a dict; a slope that is not a real number (a string, a
        bool); ``m_max`` not an integer (``2.0`` and ``True`` included); ``c_emp`` not a dict,
        its ``converged`` not a bool or None (``"no"`` would be truthy), its ``n50`` not a dict
        of dicts, or an n50 value not a real number; a ``path`` the plot helpers refuse
        (:func:`_figure_path`, which also raises ValueError).
    """
    target = _figure_path(path)
    slopes = _slope_dict(slopes, "slopes")
    reference = _slope_dict(reference, "reference")
    if not slopes and not reference:
        raise ValueError("slopes: expected at least one slope")
    m_max = check_positive_int(m_max, "m_max")
    if m_max > _MAX_M:
        raise ValueError(f"m_max: expected at most 10**6 prompt vectors (the x axis of the "
                         f"law), got {_int_text(m_max)}")
    m = (np.arange(1, m_max + 1) if m_max <= _LAW_POINTS else
         np.linspace(1.0, float(m_max), _LAW_POINTS))
    if c_emp is not None:
        _check_mapping(c_emp, "c_emp", "a dict with c_emp, c_emp_lower, c_emp_upper and n50 "
                                       "(a cramming measurement), or None")
    measured = bool(c_emp and c_emp.get("c_emp") is not None)
    pts = None
    if measured:
        c_emp = dict(c_emp)
        for key in ("c_emp", "c_emp_lower", "c_emp_upper"):
            if c_emp.get(key) is not None:
                c_emp[key] = check_positive(c_emp[key], f"c_emp[{key!r}]")
        c_emp["converged"] = _check_bool(c_emp.get("converged"), "c_emp['converged']",
                                         optional=True)
        pts = _n50_points(c_emp)
    fig = _figure(11.0 if measured else 7.5, 4.6)
    axes = fig.subplots(1, 2 if measured else 1, squeeze=False).ravel()
    ax = axes[0]
    ordered = sorted(slopes.items(), key=lambda kv: kv[1])
    if ordered:
        # valid supports' slopes often lie within a few per cent of each other: on a log axis
        # their lines coincide, so the tightest is drawn, the rest as the band they span, and
        # every C is written out
        # a slope of 0 has no point on the log y axis: its line is empty (no "no positive
        # values" warning), its legend entry and listing stay
        (label0, C0), C1 = ordered[0], ordered[-1][1]
        ax.plot(*_law_line(m, C0), "-", color="C0", lw=1.8,
                label=f"the bound, {label0}: C = {C0:.4g} (tightest valid support)")
        if len(ordered) > 1 and C1 > 0:
            ax.fill_between(m, C0 * m, C1 * m, color="C0", alpha=0.18, lw=0,
                            label=f"{len(ordered)} valid supports: C = {C0:.4g} to {C1:.4g}")
            ax.plot(m, C1 * m, "-", color="C0", lw=0.8, alpha=0.6)
        ax.text(0.02, 0.98, "valid supports, C (tokens per vector):\n" + "\n".join(
            f"  {k}: {C:.4g}" for k, C in ordered), transform=ax.transAxes, ha="left",
            va="top", fontsize=6.5, color="0.25", family="monospace")
    for label, C in (reference or {}).items():
        ax.plot(*_law_line(m, C), "--", color="0.55", lw=1.0,
                label=f"{label}: C = {C:.4g} (not the bound)")
    if measured:
        ce = float(c_emp["c_emp"])
        lo, hi = c_emp.get("c_emp_lower"), c_emp.get("c_emp_upper")
        # n50 not shown to converge in the step budget: C_emp is a lower bound on the capacity
        # and C / C_emp an upper bound on the bound's looseness (as the answer block says)
        exact = bool(c_emp["converged"]) or str(c_emp.get("source", "")).startswith("published")
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
    return _save(fig, target)


def _slope_dict(slopes, name: str) -> dict:
    """``slopes`` (label -> C, tokens per vector) as a dict of finite floats >= 0; ``None`` is an
    empty dict. TypeError/ValueError naming ``name[label]``."""
    if slopes is None:
        return {}
    if not isinstance(slopes, Mapping):
        raise TypeError(f"{name}: expected a dict of label -> slope C (tokens per prompt vector), "
                        f"got {type(slopes).__name__}")
    return {label: check_positive(C, f"{name}[{label!r}]", allow_zero=True)
            for label, C in slopes.items()}


def _law_line(m: np.ndarray, C: float):
    """``(m, C m)``, the points of a slope's line; none for ``C = 0`` (below the log axis)."""
    return (m, C * m) if C > 0 else ([], [])


def _n50_points(c_emp: dict):
    """``(m list, n50 list, yerr 2 x k)`` of a measurement's n50 points (those not None);
    errors name ``c_emp['n50']`` and the entry."""
    xs, ys, los, his = [], [], [], []
    n50 = c_emp.get("n50")
    if n50 is None:
        n50 = {}
    _check_mapping(n50, "c_emp['n50']", "a dict m -> {n50, lower, upper}")
    for k, v in n50.items():
        m = _measured_m(k, "c_emp['n50']")
        name = f"c_emp['n50'][{k!r}]"
        _check_mapping(v, name, "a dict with n50, lower and upper")
        if v.get("n50") is None:
            continue
        y = check_positive(v["n50"], f"{name}['n50']")
        lo, hi = (y if v.get(e) is None else check_positive(v[e], f"{name}[{e!r}]",
                                                              allow_zero=True)
                  for e in ("lower", "upper"))
        xs.append(m)
        ys.append(y)
        los.append(y - lo)
        his.append(hi - y)
    return xs, ys, [np.clip(los, 0, None), np.clip(his, 0, None)]
