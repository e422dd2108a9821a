"""The report's supports section and its figure.

Kept apart from the shapes: this is the only module of :mod:`embgeom.supports` that writes files
(it moves to ``embgeom/report/`` with the other report sections).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .._validation import check_probability
from ._base import check_hidden
from ._fit import fit_support
from ._shell import support_from_final_norm

__all__ = ["supports_report_section"]


_REPORT_FITS = {
    "ball": ("ball", {"center": "free"}),
    "ball_origin": ("ball", {"center": "origin"}),
    "ellipsoid": ("ellipsoid", {}),
    "cone": ("cone", {}),
    "box": ("box", {}),
    "box_pca": ("box", {"rotation": "pca"}),
}


def supports_report_section(H, out_dir, shapes=("ball", "ball_origin", "ellipsoid", "cone", "box", "box_pca"),
                            unembedding=None, *, quantile=1.0, solver="auto",
                            heldout=None, heldout_min=0.99, return_supports=False):
    """The report's supports section: every shape's parameters and log-volume, and a figure.

    Parameters
    ----------
    H : array_like of float32/float64, shape (N, d)
        Hidden states.
    out_dir : str or path-like
        Folder for the figure ``supports_log_volume.png`` (created if missing).
    shapes : sequence of str
        Among ``"ball"``, ``"ball_origin"``, ``"ellipsoid"``, ``"cone"``, ``"box"``,
        ``"box_pca"``.
    unembedding : embgeom.adapters.Unembedding, optional
        Adds ``"final_norm"`` (the data-free shell; its log-volume is the enclosing solid's).
    quantile, solver
        Passed to :func:`fit_support`.
    heldout : array_like of float, shape (M, d), optional
        Hidden states not used in the fits (e.g. another seed). Every support then gets
        ``heldout_contained`` (the share of them inside, ``contains(tol=1e-6)``) and
        ``heldout_valid`` (that share ``>= heldout_min``), and the figure greys out the invalid
        ones: a support fitted to a sample bounds the model's hidden states only if it also holds
        the ones it has not seen.
    heldout_min : float, default 0.99
    return_supports : bool, default False
        Also return the fitted support objects, ``{name: Support}`` (the shapes that could be
        fitted), for the bounds section.

    Returns
    -------
    dict
        ``{<name>: support.to_dict() (with "log_volume", "log_volume_per_dim", "fit_seconds",
        "summary_keys" (the keys a table shows as the shape's parameters), and for final_norm
        "contains_fraction": the fraction of H on the shell at tol 1e-4), ...,
        "figures": {"log_volume": path}}``. JSON-able. A shape that cannot be fitted to ``H``
        (e.g. an ellipsoid with N <= d) gets ``{"error": message}`` instead of raising. With
        ``return_supports=True``: ``(section, supports)``.

    Raises
    ------
    ValueError
        Unknown shape name, bad ``H``.
    """
    unknown = [s for s in shapes if s not in _REPORT_FITS]
    if unknown:
        raise ValueError(f"shapes: unknown {unknown}; expected names among {tuple(_REPORT_FITS)}")
    H = check_hidden(H, "H")
    out_dir = Path(out_dir)
    if heldout is not None:  # checked before anything is fitted or written
        Ht = check_hidden(heldout, "heldout")
        if Ht.shape[1] != H.shape[1]:
            raise ValueError(f"heldout: expected {H.shape[1]} columns, got {Ht.shape[1]}")
        heldout_min = check_probability(heldout_min, "heldout_min")
    out_dir.mkdir(parents=True, exist_ok=True)
    section: dict = {}
    fitted: dict = {}
    for name in shapes:
        shape, kw = _REPORT_FITS[name]
        kw = dict(kw)
        center = kw.pop("center", "free")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                S = fit_support(H, shape, center=center, quantile=quantile, solver=solver, **kw)
            except ValueError as exc:
                section[name] = {"shape": shape, "error": str(exc)}
                continue
        fitted[name] = S
        entry = S.to_dict()
        entry["log_volume_per_dim"] = entry["log_volume"] / S.dim
        entry["summary_keys"] = list(S.summary_keys)
        if caught:
            entry["warnings"] = [str(w.message) for w in caught]
        for big in ("center", "axis", "lower", "upper", "semi_axes"):
            if big in entry and isinstance(entry[big], list) and len(entry[big]) > 16:
                arr = np.asarray(entry.pop(big), dtype=np.float64)
                entry[f"{big}_summary"] = {"min": float(arr.min()), "max": float(arr.max()),
                                           "mean": float(arr.mean())}
        section[name] = entry
    if unembedding is not None:
        shell = support_from_final_norm(unembedding)
        entry = shell.to_dict()
        entry["log_volume_per_dim"] = entry["log_volume"] / shell.dim
        entry["summary_keys"] = list(shell.summary_keys)
        if shell.dim == H.shape[1]:
            entry["contains_fraction"] = float(shell.contains(H, tol=1e-4).mean())
        section["final_norm"] = entry
        fitted["final_norm"] = shell
    if heldout is not None:
        for name, S in fitted.items():
            frac = float(np.mean(S.contains(Ht, tol=1e-6)))
            section[name]["heldout_contained"] = frac
            section[name]["heldout_valid"] = frac >= heldout_min
    section["figures"] = {"log_volume": str(_plot_log_volumes(section, out_dir / "supports_log_volume.png"))}
    return (section, fitted) if return_supports else section


def _plot_log_volumes(section: dict, path):
    """Bar chart of the supports' log-volumes, saved to ``path`` (matplotlib object API: no
    backend switch, no pyplot state)."""
    from matplotlib.figure import Figure

    names = [k for k in section if k != "figures" and "log_volume" in section[k]]
    vals = [section[k]["log_volume"] for k in names]
    valid = [section[k].get("heldout_valid", True) for k in names]
    fig = Figure(figsize=(7.5, 0.45 * len(names) + 1.4))
    ax = fig.subplots()
    ax.barh(names, vals, color=["tab:blue" if ok else "lightgrey" for ok in valid])
    for i, (v, ok) in enumerate(zip(vals, valid)):
        ax.text(v, i, f" {v:.1f}" + ("" if ok else " (misses held-out states)"), va="center",
                fontsize=8)
    lo, hi = min(0.0, min(vals)), max(vals)
    ax.set_xlim(lo, hi + 0.35 * (hi - lo))
    ax.set_xlabel("log-volume (nats)")
    ax.set_title("Support log-volumes (smaller = tighter bound; grey: not a valid support)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
