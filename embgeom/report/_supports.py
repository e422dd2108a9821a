"""The report's supports section: fits, held-out validity with a guarantee, conformal shapes."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np

from .._validation import check_probability
from ..supports import (
    Box,
    calibrate_support,
    containment_check,
    fit_support,
    min_points_for,
    support_from_final_norm,
)
from ..supports._base import check_hidden
from . import figures
from ._markdown import fmt, md_table

__all__ = ["supports_report_section", "REPORT_FITS", "CONFORMAL_SUFFIX", "CUBE"]

#: Report name -> (fit_support shape, options).
REPORT_FITS = {
    "ball": ("ball", {"center": "free"}),
    "ball_origin": ("ball", {"center": "origin"}),
    "ellipsoid": ("ellipsoid", {}),
    "cone": ("cone", {}),
    "box": ("box", {}),
    "box_pca": ("box", {"rotation": "pca"}),
}
#: A calibrated support is reported under ``<name> + CONFORMAL_SUFFIX``.
CONFORMAL_SUFFIX = "_conformal"
#: The report's name (and ``kind``) of the L-infinity cube ``[-r_inf, r_inf]^d`` row: a report
#: entry, not a support shape (the support behind it is a :class:`~embgeom.supports.Box`).
CUBE = "cube"
_BIG = ("center", "axis", "lower", "upper", "semi_axes", "gain")


def _entry(S) -> dict:
    entry = S.to_dict()
    entry["log_volume_per_dim"] = entry["log_volume"] / S.dim
    entry["summary_keys"] = list(S.summary_keys)
    for big in _BIG:
        if big in entry and isinstance(entry[big], list) and len(entry[big]) > 16:
            arr = np.asarray(entry.pop(big), dtype=np.float64)
            entry[f"{big}_summary"] = {"min": float(arr.min()), "max": float(arr.max()),
                                       "mean": float(arr.mean())}
    return entry


def supports_report_section(H, out_dir, shapes=tuple(REPORT_FITS), unembedding=None, *,
                            quantile=1.0, solver="auto", heldout=None, heldout_min=0.99,
                            confidence=0.95, calibration=None, alpha=0.01, rinf=None,
                            return_supports=False):
    """The report's supports section: every shape's fit, its held-out validity, its figure.

    Parameters
    ----------
    H : array_like of float32/float64, shape (N, d)
        Hidden states the shapes are fitted to.
    out_dir : str or path-like
        Folder for ``supports_log_volume.png`` (created if missing).
    shapes : sequence of str
        Among the keys of :data:`REPORT_FITS` (``"ball"``, ``"ball_origin"``, ``"ellipsoid"``,
        ``"cone"``, ``"box"``, ``"box_pca"``).
    unembedding : embgeom.adapters.Unembedding, optional
        Adds ``"final_norm"``: the shell the final norm certifies (no data; valid by
        construction, its log-volume is the enclosing solid's).
    quantile, solver
        Passed to :func:`embgeom.supports.fit_support`.
    heldout : array_like of float, shape (M, d), optional
        Fresh hidden states none of the fits has seen (other seeds and prompt lengths). Every
        support gets ``heldout`` (:class:`embgeom.supports.ContainmentCheck` as a dict: the
        share inside and its one-sided Clopper-Pearson lower bound), ``heldout_contained`` (the
        share) and ``heldout_valid`` (lower bound ``>= heldout_min``). Without it no fitted
        support is called valid.
    heldout_min : float in (0, 1), default 0.99
        Threshold on the lower bound.
    confidence : float in (0, 1), default 0.95
        Level of the lower bound.
    calibration : array_like of float, shape (K, d), optional
        A calibration sample drawn like ``H`` (same prompt lengths, another seed). Each fitted
        shape is then also calibrated (:func:`embgeom.supports.calibrate_support` at level
        ``alpha``) and reported as ``<name>_conformal`` with its ``calibration`` record.
    alpha : float in (0, 1), default 0.01
        Miscoverage of the conformal calibration.
    rinf : float, optional
        The L-infinity radius of the cube ``[-rinf, rinf]^d`` that the bounds use; adds a
        ``"cube"`` entry (log-volume ``d log(2 rinf)``, held-out check) and puts the cube in the
        figure.
    return_supports : bool, default False
        Also return ``{name: Support}`` of every fitted, calibrated and certified support (the
        cube included when ``rinf`` is given).

    Returns
    -------
    dict
        ``{<name>: entry, ..., "cube": entry, "heldout": {...}, "calibration": {...},
        "figures": {"log_volume": file name}}``. Each entry is ``support.to_dict()`` plus
        ``log_volume_per_dim``, ``summary_keys``, ``kind`` (``fit``, ``conformal``, ``cube``,
        ``certified``) and the held-out keys above; a shape that cannot be fitted gets
        ``{"shape", "error"}``; a calibration that cannot be made gets ``calibration_error``
        in the raw entry. JSON-able. With ``return_supports``: ``(section, supports)``.

    Raises
    ------
    ValueError, TypeError
        Unknown shape name, bad ``H``, ``heldout`` or ``calibration`` (checked before anything
        is fitted or written).
    """
    unknown = [s for s in shapes if s not in REPORT_FITS]
    if unknown:
        raise ValueError(f"shapes: unknown {unknown}; expected names among {tuple(REPORT_FITS)}")
    H = check_hidden(H, "H")
    d = H.shape[1]
    Ht = _check_extra(heldout, "heldout", d)
    Hc = _check_extra(calibration, "calibration", d)
    # both in (0, 1) as documented: min_points_for and the Clopper-Pearson bound refuse 1, so a
    # closed check here would let 1 through to a later error naming another argument
    heldout_min = check_probability(heldout_min, "heldout_min", open_right=True)
    confidence = check_probability(confidence, "confidence", open_right=True)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    section: dict = {}
    fitted: dict = {}
    for name in shapes:
        shape, kw = REPORT_FITS[name]
        kw = dict(kw)
        center = kw.pop("center", "free")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                S = fit_support(H, shape, center=center, quantile=quantile, solver=solver, **kw)
            except ValueError as exc:
                section[name] = {"shape": shape, "kind": "fit", "error": str(exc)}
                continue
        fitted[name] = S
        section[name] = _entry(S)
        section[name]["kind"] = "fit"
        if caught:
            section[name]["warnings"] = [str(w.message) for w in caught]
        if Hc is not None:
            try:
                C = calibrate_support(S, Hc, alpha)
            except ValueError as exc:
                section[name]["calibration_error"] = str(exc)
            else:
                cname = name + CONFORMAL_SUFFIX
                fitted[cname] = C
                section[cname] = _entry(C)
                section[cname].update(kind="conformal", of=name, calibration=C.calibration_)
    if unembedding is not None:
        shell = support_from_final_norm(unembedding)
        entry = _entry(shell)
        entry["kind"] = "certified"
        if shell.dim == d:
            entry["contains_fraction"] = float(shell.contains(H, tol=1e-4).mean())
        section["final_norm"] = entry
        fitted["final_norm"] = shell
    if rinf is not None:
        cube = Box.from_params(-np.full(d, float(rinf)), np.full(d, float(rinf)))
        fitted[CUBE] = cube
        section[CUBE] = {"shape": cube.shape, "kind": CUBE, "dim": d, "rinf": float(rinf),
                           "log_volume": float(cube.log_volume),
                           "log_volume_per_dim": float(cube.log_volume) / d}
    if Ht is not None:
        for name, S in fitted.items():
            chk = containment_check(S, Ht, confidence=confidence, min_share=heldout_min)
            section[name]["heldout"] = chk.to_dict()
            section[name]["heldout_contained"] = chk.share
            section[name]["heldout_lower"] = chk.lower_bound
            # the final-norm shell holds every hidden state by construction, not by a sample
            section[name]["heldout_valid"] = (True if section[name]["kind"] == "certified"
                                              else chk.valid)
    section["heldout"] = None if Ht is None else {
        "n": int(Ht.shape[0]), "confidence": float(confidence), "min_share": heldout_min,
        "min_points": min_points_for(heldout_min, confidence),
        "not_valid": sorted(k for k, e in section.items()
                            if isinstance(e, dict) and e.get("heldout_valid") is False),
    }
    section["calibration"] = None if Hc is None else {"n": int(Hc.shape[0]), "alpha": float(alpha)}
    rows = [{"name": k, "log_volume": e["log_volume"], "kind": e["kind"],
             "valid": bool(e.get("heldout_valid", False))}
            for k, e in section.items() if isinstance(e, dict) and "log_volume" in e]
    section["figures"] = {"log_volume": Path(figures.plot_support_volumes(
        rows, out_dir / "supports_log_volume.png")).name}
    return (section, fitted) if return_supports else section


def _check_extra(X, name: str, d: int):
    if X is None:
        return None
    X = check_hidden(X, name)
    if X.shape[1] != d:
        raise ValueError(f"{name}: expected {d} columns (the hidden size of H), got {X.shape[1]}")
    return X


def support_names(section: dict) -> list[str]:
    """The support entries of a section (not its bookkeeping keys), in order."""
    return [k for k, e in section.items() if isinstance(e, dict) and "kind" in e]


def supports_markdown(section: dict, shape, *, heldout_desc: str = "") -> str:
    """The supports section of report.md: one row per support, the validity rule, the figure."""
    rows = []
    for name in support_names(section):
        e = section[name]
        if "error" in e:
            rows.append([name, "not fitted: " + e["error"][:90], None, None, None, None, None])
            continue
        params = []
        for key in e.get("summary_keys", []):
            if e.get(key) is not None and not isinstance(e.get(key), (list, dict)):
                params.append(f"{key} {fmt(e[key])}")
        if e["kind"] == "conformal":
            params = [f"scale {fmt(e['calibration']['scale'])} of {e['of']}"]
        if e["kind"] == CUBE:
            params = [f"rinf {fmt(e['rinf'])}"]
        ho = e.get("heldout") or {}
        held = (f"{ho['n_inside']:,}/{ho['n']:,}" if ho else None)
        valid = ("certified" if e["kind"] == "certified" else
                 ("yes" if e.get("heldout_valid") else "NO") if ho else None)
        rows.append([name, ", ".join(params) or "—", e["log_volume"], held,
                     ho.get("lower_bound"), valid, e.get("fit_seconds")])
    lines = ["## Supports", "",
             f"Smallest sets of each shape holding the {shape[0]:,} hidden states (d = {shape[1]}); "
             "`ball` is a Ball about a fitted centre and `ball_origin` a Ball about the origin "
             "(the apex of a bias-free decoder's cells, where the cells section measures its "
             "shares); `box` has the coordinate axes and `box_pca` the principal axes; "
             "`final_norm` is the shell certified by the final norm (no data; its log-volume is "
             "the enclosing solid's); `cube` is [-r_inf, r_inf]^d; `*_conformal` are the fits "
             "scaled by split-conformal calibration. Log-volumes in nats.", "",
             md_table(["support", "parameters", "log-volume", "held-out inside",
                       "95% lower bound", "valid", "fit (s)"], rows, drop_empty=True)]
    ho = section.get("heldout")
    if ho:
        lines += ["", f"Validity rule: a fitted support is valid when the one-sided "
                  f"{100 * ho['confidence']:g}% Clopper-Pearson lower bound on the share of fresh "
                  f"hidden states it contains is at least {fmt(ho['min_share'])} (then, with "
                  f"{100 * ho['confidence']:g}% confidence, it holds at least "
                  f"{100 * ho['min_share']:g}% of hidden states drawn like the fresh ones). "
                  f"Fresh sample: {ho['n']:,} hidden states{heldout_desc}; at least "
                  f"{ho['min_points']:,} are needed even when all are inside. "
                  f"Not valid: {', '.join(ho['not_valid']) or 'none'}."]
    cal = section.get("calibration")
    if cal:
        lines += ["", f"Conformal calibration: each fit scaled about its centre by the "
                  f"ceil((n+1)(1-alpha))-th smallest gauge of n = {cal['n']:,} calibration hidden "
                  f"states (same lengths as the fit, another seed), alpha = {fmt(cal['alpha'])}: a "
                  f"fresh hidden state drawn like them is inside with probability >= "
                  f"{fmt(1 - cal['alpha'])} (split conformal; Vovk et al. 2005, Angelopoulos and "
                  "Bates 2021)."]
        ho_ = section.get("heldout") or {}
        rejected = [k for k in ho_.get("not_valid") or [] if k.endswith(CONFORMAL_SUFFIX)]
        if rejected and ho_.get("min_share") is not None:
            lines += ["", f"Why {len(rejected)} conformal set{'s are' if len(rejected) != 1 else ' is'} "
                      f"marked not valid ({', '.join(rejected)}): calibration gives coverage >= "
                      f"{fmt(1 - cal['alpha'])} on average over calibration samples, while the "
                      f"validity rule asks the {100 * ho_['confidence']:g}% lower bound on the fresh "
                      f"share to reach {fmt(ho_['min_share'])}. A set whose true coverage is near "
                      f"{fmt(1 - cal['alpha'])} passes that rule only part of the time, so this is "
                      "the expected outcome at this alpha, not a failed calibration; a smaller "
                      "alpha (e.g. `fit_support(..., calibrate=0.001)`) makes sets that pass it."]
        errs = [f"{k}: {section[k]['calibration_error']}" for k in support_names(section)
                if section[k].get("calibration_error")]
        if errs:
            lines += ["", "Not calibrated: " + "; ".join(errs[:3]) + "."]
    fn = section.get("final_norm")
    if fn and "contains_fraction" in fn:
        lines += ["", "Share of the sampled hidden states on the final-norm shell (relative tol "
                  f"1e-4): {fmt(fn['contains_fraction'])}."]
    lines += ["", f"![support log-volumes]({section['figures']['log_volume']})"]
    return "\n".join(lines)


def certified_radius(shell) -> float:
    """The L2 radius the final norm certifies: ``sqrt(d) max|g_i|`` (+ ``|b|`` with a bias).

    After an RMSNorm (or a LayerNorm) the normalised vector has L2 norm at most ``sqrt(d)``,
    so the output ``g * x + b`` has norm at most ``sqrt(d) max|g_i| + |b|``.
    """
    r = math.sqrt(shell.dim) * float(np.abs(shell.gain_).max())
    if shell.bias_ is not None:
        r += float(np.linalg.norm(shell.bias_))
    return r
