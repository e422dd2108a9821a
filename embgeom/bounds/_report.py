"""The report's bounds section and the accessible-fraction figure.

Kept apart from the maths: this is the only module of :mod:`embgeom.bounds` that writes files (it
moves to ``embgeom/report/`` with the other report sections).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .._markdown import md_table as _md_table
from .._validation import check_positive, check_positive_int
from ._checks import _check_vocab
from ._linear_law import accessible_fraction_bound, n_star
from ._packing import log_packing_number, theorem45_log_count
from ._precision import precision_eps
from ._rate import cell_volume_rate
from ._unbounded import threshold_length_unbounded

__all__ = ["plot_accessible_fraction", "bounds_report_section"]


def plot_accessible_fraction(curves: dict, vocab_size, path, *, m_values=(1, 2, 4, 8),
                             n_max=None) -> str:
    """Plot the accessible-fraction bound ``log10 fraction`` against ``n`` and save a PNG.

    Parameters
    ----------
    curves : dict[str, tuple[float, float | None]]
        Label -> ``(log_packing, rate)`` (nats; ``rate=None`` means ``log|V|``).
    vocab_size : int
        >= 2.
    path : str or Path
        PNG file to write.
    m_values : sequence of int
        Prompt-vector counts drawn for each curve.
    n_max : int, optional
        Largest length on the x axis (default: 1.3 times the largest ``n*``).

    Returns
    -------
    str
        The path written.

    Raises
    ------
    ValueError
        Empty ``curves``.
    """
    from matplotlib.figure import Figure

    if not curves:
        raise ValueError("curves: expected at least one curve")
    V = _check_vocab(vocab_size)
    ms = [check_positive_int(m, "m_values") for m in m_values]
    if n_max is None:
        n_max = int(1.3 * max(float(n_star(max(ms), lp, V, rate)) for lp, rate in curves.values())) + 2
    n = np.unique(np.linspace(1, n_max, 600).astype(np.int64))
    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.subplots()
    styles = ["-", "--", ":", "-."]
    for ci, (label, (lp, rate)) in enumerate(curves.items()):
        for mi, m in enumerate(ms):
            y = accessible_fraction_bound(n, m, lp, V, rate, log=True) / math.log(10)
            ax.plot(n, y, styles[mi % len(styles)], color=f"C{ci % 10}",
                    label=f"{label}, m={m}" if len(ms) > 1 else label, lw=1.3)
    ax.set_xlabel("sequence length n (tokens)")
    ax.set_ylabel("log10 accessible fraction (upper bound)")
    ax.set_ylim(bottom=max(ax.get_ylim()[0], -60), top=2)
    ax.set_title("Accessible fraction bound (Thm 4.5 / Cor 4.6)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return str(path)


def bounds_report_section(unembedding_facts: dict, supports: dict, rinf, fractions=None,
                          lower=None, upper=None, published_c_emp=None, out_dir=".", *,
                          dtype="float32", k_max: int = 32, n_samples=None,
                          m_values=tuple(range(1, 9)), valid=None) -> dict:
    """The bounds section of a model report: slopes per support, lambda, n*, the figure.

    Parameters
    ----------
    unembedding_facts : dict
        Needs ``hidden_size`` (or ``d``) and ``vocab_size``; ``name`` is used if present.
    supports : dict[str, Support]
        Fitted supports by name; every entry is bounded (a failure is recorded, not raised).
    valid : collection of str, optional
        Names (``"cube"`` included) of the supports that passed a held-out containment check
        (see :func:`embgeom.report.build_report`). Only these compete for ``tightest``; the others
        are still bounded and tabulated, marked not valid. ``None``: all are taken as valid.
    rinf : float
        The L-infinity radius of the hidden states, > 0: the cube ``[-rinf, rinf]^d`` is the
        ``"cube"`` column and ``eps`` is derived from it.
    fractions, lower, upper : array_like of float, shape (|V|,), optional
        Cell-volume fractions and their Monte Carlo interval ends; with them the refined slopes
        ``C log|V| / lambda`` are computed. ``fractions`` may also be an
        :class:`embgeom.volumes.CellVolumes`: with rare-event log-shares lambda comes from them
        (:func:`cell_volume_rate_from_logs`, with its bootstrap interval), else from its
        uniform fractions and intervals (``lower``/``upper``/``n_samples`` then unused).
    published_c_emp : float, optional
        Empirical slope (tokens per prompt vector) to compare against.
    out_dir : str or Path
        Folder for ``accessible_fraction.png``.
    dtype : str, default "float32"
        The model's compute dtype, for the second precision.
    k_max : int, default 32
        Passed to :func:`cell_volume_rate`.
    n_samples : int, optional
        Passed to :func:`cell_volume_rate`.
    m_values : sequence of int
        The ``m`` for the ``n_star`` table.

    Returns
    -------
    dict
        JSON-able: ``eps`` ({"paper": r_inf 2^-11, "dtype": r_inf 2^-bits, "dtype_name"}),
        ``log_packing`` / ``slope`` / ``slope_dtype`` / ``slope_paper_formula`` /
        ``slope_refined`` / ``ratio`` / ``n_star`` (dicts by shape), ``rate_lambda``, ``rate``
        (the :class:`CellVolumeRate` dict), ``threshold_unbounded`` (Cor. 4.10 for the tightest
        shape), ``c_emp``, ``tightest``, ``errors``, ``figure``, ``markdown``.

    Raises
    ------
    TypeError, ValueError
        Missing facts, ``rinf <= 0``, bad fractions.
    """
    d = unembedding_facts.get("hidden_size", unembedding_facts.get("d"))
    d = check_positive_int(d, "unembedding_facts['hidden_size']")
    V = _check_vocab(unembedding_facts.get("vocab_size"))
    rinf = check_positive(rinf, "rinf")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    logV = math.log(V)
    eps_paper = precision_eps(rinf, 11)
    eps_dtype = precision_eps(rinf, dtype)
    shapes: dict[str, object] = {}
    errors: dict[str, str] = {}
    lp_paper, lp_dtype, lp_formula = {}, {}, {}
    lp_paper["cube"] = theorem45_log_count(d, 1, rinf, eps_paper)
    lp_dtype["cube"] = theorem45_log_count(d, 1, rinf, eps_dtype)
    lp_formula["cube"] = lp_paper["cube"]
    for name, sup in (supports or {}).items():
        try:
            lp_paper[name] = log_packing_number(sup, eps_paper)
            lp_dtype[name] = log_packing_number(sup, eps_dtype)
            lp_formula[name] = log_packing_number(sup, eps_paper, variant="paper")
            shapes[name] = type(sup).__name__
        except (TypeError, ValueError, AttributeError) as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    rate = None
    lam = None
    if fractions is not None:
        rate = cell_volume_rate(fractions, k_max, lower=lower, upper=upper, n_samples=n_samples)
        lam = rate.rate if np.isfinite(rate.rate) else None
    c_emp = None if published_c_emp is None else check_positive(published_c_emp, "published_c_emp")
    slope = {k: v / logV for k, v in lp_paper.items()}
    slope_dtype = {k: v / logV for k, v in lp_dtype.items()}
    slope_formula = {k: v / logV for k, v in lp_formula.items()}
    slope_ref = {k: (v / lam if lam else None) for k, v in lp_paper.items()}
    slope_ref_cons = {}
    if rate is not None and np.isfinite(rate.rate_conservative):
        slope_ref_cons = {k: v / rate.rate_conservative for k, v in lp_paper.items()}
    ratio = {k: (v / c_emp if c_emp else None) for k, v in slope.items()}
    ratio_ref = {k: (v / c_emp if (c_emp and v) else None) for k, v in slope_ref.items()}
    nstar = {k: n_star(np.asarray(m_values), v, V).tolist() for k, v in lp_paper.items()}
    is_valid = {k: (valid is None or k in valid) for k in lp_paper}
    candidates = [k for k in lp_paper if is_valid[k]] or list(lp_paper)
    tight = min(candidates, key=lp_paper.get)
    thr = threshold_length_unbounded(lp_paper[tight], V, weight_bits=11)
    curves = {f"{tight} (log|V|)": (lp_paper[tight], None), f"cube (log|V|)": (lp_paper["cube"], None)}
    if lam:
        curves[f"{tight} (lambda)"] = (lp_paper[tight], lam)
    fig = plot_accessible_fraction(curves, V, out / "accessible_fraction.png", m_values=(1, 4))

    rows = []
    for k in lp_paper:
        rows.append([k, shapes.get(k, "box (cube)"), "yes" if is_valid[k] else "NO",
                     lp_paper[k], slope_formula[k], slope[k],
                     slope_dtype[k], slope_ref[k] if slope_ref[k] else "-",
                     ratio[k] if ratio[k] else "-",
                     ("BROKEN " if ratio[k] and ratio[k] < 1 else "") + (f"{ratio_ref[k]:.3g}" if ratio_ref[k] else "-")])
    md = ["## Packing bounds", "",
          f"Precision eps = r_inf 2^-11 = {eps_paper:.4g} (paper's convention; r_inf = {rinf:.4g}); "
          f"{dtype} gives eps = {eps_dtype:.4g}. |V| = {V:,}, log|V| = {logV:.4f}, d = {d}.",
          "C = log P / log|V| in tokens per prompt vector (rigorous bound on log P unless the "
          "column says 'paper formula'); refined: log P / lambda (heuristic, typical sequences). "
          "A support marked not held-out valid missed fresh hidden states: its C is no bound. "
          + ("C_emp: the published empirical slope (THEORY.md)." if c_emp else
             "C / C_emp: no published empirical slope for this model (run `embgeom cram` for "
             "ours)."), "",
          _md_table(["support", "shape", "held-out valid", "log P (nats)", "C paper formula", "C rigorous",
                     f"C ({dtype} eps)", "C refined", "C / C_emp", "C refined / C_emp"], rows), ""]
    if rate is not None:
        if rate.rate_ci is not None:
            how = (f"{int(round(100 * rate.ci_level))}% interval [{rate.rate_ci[0]:.4g}, "
                   f"{rate.rate_ci[1]:.4g}] ({'; '.join(rate.ci_includes)}); from "
                   + (f"a uniform sample of {rate.n_tokens_used:,} tokens" if rate.token_sample
                      else "every token") + f"'s log-shares, {rate.n_unresolved} unresolved, "
                   f"{rate.n_empty} proven empty")
        else:
            how = (f"{rate.n_zero} zero fractions filled by {rate.zero_fill}"
                   + (f", then renormalised (the filled sum was {math.exp(rate.log_total):.3g})"
                      if rate.normalized and rate.n_zero else ""))
        md.append(f"lambda = {rate.rate:.4g} nats/token (R^2 {rate.r2:.4f}; conservative "
                  f"{rate.rate_conservative:.4g}; asymptotic -mean log f = {rate.rate_asymptotic:.4g}; "
                  f"{how}) vs log|V| = {logV:.4g}.")
    md.append(f"Cor. 4.10 (mean-field, weights at 2^-11): N = {thr['n_threshold']:.4g} tokens "
              f"for the {tight} support.")
    md += ["", "n*(m) for m = " + ", ".join(map(str, m_values)) + ":", "",
           _md_table(["support"] + [f"m={m}" for m in m_values],
                     [[k] + [float(x) for x in v] for k, v in nstar.items()]),
           "", "![accessible fraction](accessible_fraction.png)"]
    return {
        "eps": {"paper": eps_paper, "dtype": eps_dtype, "dtype_name": str(dtype), "rinf": rinf},
        "log_packing": lp_paper,
        "slope": slope,
        "slope_dtype": slope_dtype,
        "slope_paper_formula": slope_formula,
        "slope_refined": slope_ref,
        "slope_refined_conservative": slope_ref_cons,
        "rate_lambda": lam,
        "rate": None if rate is None else rate.to_dict(),
        "log_vocab": logV,
        "c_emp": c_emp,
        "ratio": ratio,
        "ratio_refined": ratio_ref,
        "n_star": {"m": list(m_values), **nstar},
        "threshold_unbounded": {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in thr.items()},
        "tightest": tight,
        "heldout_valid": is_valid,
        "errors": errors,
        "figure": Path(fig).name,
        "markdown": "\n".join(md),
    }
