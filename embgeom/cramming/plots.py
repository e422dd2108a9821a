"""Figures of a cramming run (matplotlib's object API: no backend switch, no pyplot state)."""

from __future__ import annotations

import numpy as np

from .analysis import AccessibilityCurve

__all__ = ["plot_accessibility", "plot_n50"]


def _rows(mapping, name: str, keys: tuple) -> list:
    """``[(m, dict)]`` of a ``{m: record}`` mapping, sorted by ``m``; a ValueError naming
    ``name`` for an empty mapping or a record without one of ``keys``."""
    if not hasattr(mapping, "items"):
        raise TypeError(f"{name}: expected a mapping {{m: record}}, got {type(mapping).__name__}")
    if not mapping:
        raise ValueError(f"{name}: expected at least one m, got an empty mapping")
    out = []
    for m in sorted(mapping):
        c = mapping[m]
        d = c.to_dict() if isinstance(c, AccessibilityCurve) else c
        if not hasattr(d, "keys"):
            raise TypeError(f"{name}[{m!r}]: expected a dict, got {type(d).__name__}")
        missing = [k for k in keys if k not in d]
        if missing:
            raise ValueError(f"{name}[{m!r}]: missing key(s) {missing}")
        out.append((m, d))
    return out


def plot_accessibility(curves, path) -> str:
    """Accessibility vs length, one line per m, with Wilson 95% bands; saves a PNG.

    Parameters
    ----------
    curves : mapping {m: AccessibilityCurve or its dict}
    path : str or Path
        PNG file to write (its folder must exist; ``.png`` is appended to a name without a
        suffix, :func:`embgeom.report.figures._figure_path`).

    Returns
    -------
    str
        The path written.

    Raises
    ------
    TypeError, ValueError
        A ``path`` the plot helpers refuse (not a str or path-like; an existing directory; a
        suffix matplotlib cannot write), before anything is drawn; ``curves`` empty, not a
        mapping, or a curve without ``lengths``, ``accessibility``, ``lower``, ``upper``.
    """
    from matplotlib.figure import Figure

    from ..report.figures import _figure_path, _write

    target = _figure_path(path)
    rows = _rows(curves, "curves", ("lengths", "accessibility", "lower", "upper"))
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for m, d in rows:
        x = np.asarray(d["lengths"])
        ax.plot(x, d["accessibility"], "o-", label=f"m = {m}")
        ax.fill_between(x, d["lower"], d["upper"], alpha=0.2)
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("target length n (tokens)")
    ax.set_ylabel("accessibility")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    ax.set_title("Cramming accessibility vs length")
    fig.tight_layout()
    return str(_write(fig, target, dpi=120))


def plot_n50(n50_by_m, fit, path) -> str:
    """n50 vs m with bootstrap intervals and the fitted line n50 = C_emp m; saves a PNG.

    Parameters
    ----------
    n50_by_m : mapping {m: dict from :func:`n50`}
    fit : dict from :func:`fit_slope` or None
    path : str or Path
        PNG file to write (its folder must exist; ``.png`` is appended to a name without a
        suffix, :func:`embgeom.report.figures._figure_path`).

    Returns
    -------
    str
        The path written.

    Raises
    ------
    TypeError, ValueError
        A ``path`` the plot helpers refuse (not a str or path-like; an existing directory; a
        suffix matplotlib cannot write), before anything is drawn; ``n50_by_m`` empty, not a
        mapping, or a record without ``n50``.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from ..report.figures import _figure_path, _write

    target = _figure_path(path)
    _rows(n50_by_m, "n50_by_m", ("n50",))
    fig = Figure(figsize=(5, 4))
    ax = fig.subplots()
    ms = sorted(n50_by_m)
    y = np.array([n50_by_m[m]["n50"] for m in ms], float)
    lo = np.array([n50_by_m[m].get("lower", np.nan) for m in ms], float)
    hi = np.array([n50_by_m[m].get("upper", np.nan) for m in ms], float)
    yerr = np.vstack([np.clip(y - lo, 0, None), np.clip(hi - y, 0, None)])
    yerr[~np.isfinite(yerr)] = 0
    ax.errorbar(ms, y, yerr=yerr, fmt="o", capsize=3, label="n50 (95% bootstrap)")
    if fit is not None:
        xx = np.linspace(0, max(ms) * 1.05, 50)
        ax.plot(xx, fit["c_emp"] * xx, "-",
                label=f"n50 = {fit['c_emp']:.2f} m  (R² {fit['r2_uncentred']:.3f}, through 0)")
    ax.set_xlabel("memory vectors m")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("n50 (tokens)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    return str(_write(fig, target, dpi=120))
