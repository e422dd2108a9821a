"""The report's bounds section: slopes per support, lambda, n*, and two figures."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .._validation import check_positive, check_positive_int, check_probability
from ..bounds import (
    cell_volume_rate,
    log_packing_number,
    n_star,
    packing_bound_terms,
    precision_eps,
    slope_from_log_packing,
    theorem45_log_count,
    threshold_length_unbounded,
)
from . import figures
from ._markdown import md_table
from ._supports import CONFORMAL_SUFFIX, CUBE

__all__ = ["bounds_report_section", "LAMBDA_MAX_UNRESOLVED", "TERM_MEANING"]

#: lambda is used in the answer only when at most this share of the cells is unresolved;
#: otherwise the median of a product of cell shares is set by the upper bounds that stand in
#: for the unresolved cells, not by the model.
LAMBDA_MAX_UNRESOLVED = 0.01

#: What each family of rigorous packing terms counts (the prefix of the term's name).
TERM_MEANING = {
    "vinf": "disjoint cubes of side eps (points eps apart in L-infinity, the precision's own "
            "cells)",
    "v2": "disjoint Euclidean balls of radius eps/2",
}

def _binding_term(terms: dict) -> str:
    rig = {k: v for k, v in terms.items() if k != "paper"}
    return min(rig, key=rig.get)


def _log_packings(supports: dict, d: int, rinf: float, eps_paper: float, eps_dtype: float):
    """Per support: log packing numbers at the paper's and the dtype's precision, the paper's
    closed form, the support kind, the binding term, and the errors of supports that cannot be
    bounded (recorded, not raised). Without a ``"cube"`` support, Theorem 4.5's cube
    ``[-rinf, rinf]^d`` stands in."""
    kinds, errors, binding = {}, {}, {}
    lp_paper, lp_dtype, lp_formula = {}, {}, {}
    if CUBE not in supports:
        lp_paper[CUBE] = theorem45_log_count(d, 1, rinf, eps_paper)
        lp_dtype[CUBE] = theorem45_log_count(d, 1, rinf, eps_dtype)
        lp_formula[CUBE] = lp_paper[CUBE]
        kinds[CUBE], binding[CUBE] = "box (cube)", "vinf_box"
    for name, sup in supports.items():
        try:
            terms = packing_bound_terms(sup, eps_paper)
            lp_paper[name] = log_packing_number(sup, eps_paper)
            lp_dtype[name] = log_packing_number(sup, eps_dtype)
            lp_formula[name] = float(terms["paper"])
            binding[name] = _binding_term(terms)
            kinds[name] = "box (cube)" if name == CUBE else type(sup).__name__
        except (TypeError, ValueError, AttributeError) as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    return lp_paper, lp_dtype, lp_formula, kinds, binding, errors


def _bounds_figures(out: Path, lp_paper: dict, slope: dict, candidates: list, tight, V: int,
                    lam, c_emp, is_valid: dict, m_max: int) -> dict:
    """``accessible_fraction.png`` (when a valid support exists) and ``linear_law.png`` in
    ``out``; returns their file names by figure. ``lam`` is the usable lambda or None,
    ``c_emp`` the cramming measurement or None."""
    figs = {}
    if tight is not None:
        # the valid supports (at most three, tightest first; the cube only when alone): each
        # panel then spans the few tokens where their bounds fall, not the cube's far cliff
        shown = sorted((k for k in candidates if k != CUBE), key=lp_paper.get)[:3] or [tight]
        curves = {f"{k} (log|V|)": (lp_paper[k], None) for k in shown}
        if lam is not None:
            curves[f"{tight}, lambda = {lam:.3g} in place of log|V| (heuristic)"] = (lp_paper[tight], lam)
        measured = c_emp.get("curves") if c_emp else None
        # the lower panels at the m that were measured (the top panel's curves), else 1, 2, 4, 8
        ms = tuple(sorted(int(m) for m, c in (measured or {}).items()
                          if c and c.get("lengths"))) or (1, 2, 4, 8)
        figs["accessible_fraction"] = Path(figures.plot_accessible_fraction(
            curves, V, out / "accessible_fraction.png", m_values=ms, measured=measured)).name
    law = {k: slope[k] for k in lp_paper if is_valid[k]}
    # the L-inf cube's C is far above the fitted supports': in the band it would stretch it over
    # the whole plot; it is drawn only when no other support is valid (its C is in the table)
    law = {k: v for k, v in law.items() if k != CUBE} or law
    ref = {} if law else {k: slope[k] for k in lp_paper}
    figs["linear_law"] = Path(figures.plot_linear_law(
        law, out / "linear_law.png", m_max=m_max, reference=ref, c_emp=c_emp)).name
    return figs


def bounds_report_section(unembedding_facts: dict, supports: dict, rinf, fractions=None,
                          lower=None, upper=None, published_c_emp=None, out_dir=".", *,
                          dtype="float32", k_max: int = 32, n_samples=None,
                          m_values=tuple(range(1, 9)), valid=None, c_emp=None,
                          unresolved_share=None, reasons=None) -> dict:
    """The bounds section of a model report: slopes per support, lambda, n*, the figures.

    Parameters
    ----------
    unembedding_facts : dict
        Needs ``hidden_size`` (or ``d``) and ``vocab_size``.
    supports : dict[str, Support]
        Supports by name; ``<name>_conformal`` entries are the calibrated versions of
        ``<name>`` (shown beside it); a ``"cube"`` entry replaces the closed form below. A
        support that cannot be bounded is recorded in ``errors``, not raised.
    rinf : float
        The L-infinity radius of the hidden states, > 0: ``eps = rinf 2^-11`` and, without a
        ``"cube"`` entry, the cube ``[-rinf, rinf]^d`` (Theorem 4.5's closed form).
    fractions, lower, upper : array_like of float, shape (|V|,), optional
        Cell shares and their interval ends; give lambda (:func:`embgeom.bounds.cell_volume_rate`)
        and the refined slopes ``C log|V| / lambda``
        (:func:`embgeom.bounds.slope_from_log_packing`). ``fractions`` may be an
        :class:`embgeom.volumes.CellVolumes` (then without ``lower``, ``upper``, ``n_samples``):
        it answers with its own estimator (:meth:`~embgeom.volumes.CellVolumes.cell_volume_rate`);
        with rare-event log-shares lambda has a bootstrap interval and ``unresolved_share`` is
        the share of the *sampled* tokens the estimator left unresolved.
    published_c_emp : float, optional
        A published empirical slope (tokens per prompt vector); ``c_emp`` wins when both given.
    out_dir : str or Path
        Folder for ``accessible_fraction.png`` and ``linear_law.png``.
    dtype : str, default "float32"
        The model's compute dtype, for the second precision.
    k_max : int, default 32
    n_samples : int, optional
        Passed to :func:`~embgeom.bounds.cell_volume_rate` with array ``fractions``.
    m_values : sequence of int
        The ``m`` of the ``n_star`` table.
    valid : collection of str, optional
        Names that passed the held-out validity rule (``"cube"`` and ``*_conformal`` included);
        only these compete for ``tightest``. ``None``: all are taken as valid.
    c_emp : dict, optional
        A cramming measurement (:func:`embgeom.report.read_cram_summary`): ``c_emp``,
        ``c_emp_lower``, ``c_emp_upper``, ``n50``, ``source``.
    unresolved_share : float in [0, 1], optional
        Share of cells without a resolved share (default: the rate's own,
        :attr:`embgeom.bounds.CellVolumeRate.unresolved_share`: the share of zero fractions for
        uniform counts); lambda is *usable* when it is at most :data:`LAMBDA_MAX_UNRESOLVED`.
    reasons : dict[str, str], optional
        Why a support is not valid (a footnote of the table).

    Returns
    -------
    dict
        JSON-able: ``eps``, ``log_packing``, ``slope``, ``slope_dtype``, ``slope_paper_formula``,
        ``binding_term``, ``paper_exceeds_rigorous``, ``slope_refined``,
        ``slope_refined_conservative``, ``rate_lambda``, ``rate``, ``lambda_usable``,
        ``lambda_note``, ``log_vocab``, ``c_emp``, ``c_emp_source``, ``ratio``,
        ``ratio_refined``, ``n_star``, ``threshold_unbounded``, ``tightest``, ``heldout_valid``,
        ``errors``, ``figure`` and ``figures`` (file names), ``markdown``.

    Raises
    ------
    TypeError, ValueError
        Missing facts, ``rinf <= 0``, bad fractions; inputs that do not describe one model:
        ``fractions`` (or the CellVolumes) of another number of tokens than ``vocab_size``, a
        support whose dimension is not ``hidden_size``, a support that holds at most one
        distinguishable vector at ``eps = rinf 2^-11`` (its rigorous ``log P < log 2``: the
        support fits inside one precision cell, so ``rinf`` is not the scale of the hidden
        states it was fitted to, and ``C`` would be about 0); ``valid`` naming no support (or a
        bare string); ``m_values`` empty or not integers >= 1.
    TypeError
        ``supports`` not a mapping of names to supports (a list, say).
    """
    d = check_positive_int(unembedding_facts.get("hidden_size", unembedding_facts.get("d")),
                           "unembedding_facts['hidden_size']")
    V = check_positive_int(unembedding_facts.get("vocab_size"), "unembedding_facts['vocab_size']",
                           minimum=2)
    rinf = check_positive(rinf, "rinf")
    m_values = _check_m_values(m_values)
    from collections.abc import Mapping

    if supports is not None and not isinstance(supports, Mapping):
        raise TypeError("supports: expected a dict of name -> fitted Support (e.g. "
                        f"{{'ball': ball}}), got {type(supports).__name__}")
    valid = _check_valid(valid, supports or {})
    _check_support_dims(supports or {}, d)
    _check_fraction_count(fractions, V)
    logV = math.log(V)
    eps_paper = precision_eps(rinf, 11)
    eps_dtype = precision_eps(rinf, dtype)
    lp_paper, lp_dtype, lp_formula, kinds, binding, errors = _log_packings(
        supports or {}, d, rinf, eps_paper, eps_dtype)
    _refuse_single_cell(lp_paper, rinf, eps_paper)
    rate, lam, unresolved_share = _report_rate(fractions, k_max, lower, upper, n_samples,
                                               unresolved_share)
    if rate is not None and rate.vocab_size != V:
        raise ValueError(f"fractions: the cell shares are of {rate.vocab_size} tokens, but "
                         f"unembedding_facts['vocab_size'] is {V}; expected one share per token "
                         "of this model's vocabulary")
    usable, note = _lambda_usable(lam, unresolved_share)
    c = _c_emp(c_emp, published_c_emp)
    slope, slope_dtype, slope_formula = (
        {k: slope_from_log_packing(v, V) for k, v in lp.items()}
        for lp in (lp_paper, lp_dtype, lp_formula))
    slope_ref, slope_ref_cons = _refined_slopes(lp_paper, V, rate, lam)
    ce = c["c_emp"]
    ratio = {k: (v / ce if ce else None) for k, v in slope.items()}
    ratio_ref = {k: (v / ce if (ce and v) else None) for k, v in slope_ref.items()}
    nstar = {k: n_star(np.asarray(m_values, dtype=np.int64), v, V).tolist()
             for k, v in lp_paper.items()}
    is_valid = {k: (valid is None or k in valid) for k in lp_paper}
    candidates = [k for k in lp_paper if is_valid[k]]
    tight = min(candidates, key=lp_paper.get) if candidates else None
    thr = threshold_length_unbounded(lp_paper[tight], V, weight_bits=11) if tight else {}
    exceeds = [k for k in lp_paper if slope_formula[k] > slope[k] * (1 + 1e-9)
               and not k.endswith(CONFORMAL_SUFFIX)]

    out = Path(out_dir)  # made only once every input is accepted
    out.mkdir(parents=True, exist_ok=True)
    figs = _bounds_figures(out, lp_paper, slope, candidates, tight, V, lam if usable else None,
                           c if ce else None, is_valid, max(m_values))

    section = {
        "eps": {"paper": eps_paper, "dtype": eps_dtype, "dtype_name": str(dtype), "rinf": rinf},
        "log_packing": lp_paper,
        "slope": slope,
        "slope_dtype": slope_dtype,
        "slope_paper_formula": slope_formula,
        "binding_term": binding,
        "paper_exceeds_rigorous": exceeds,
        "slope_refined": slope_ref,
        "slope_refined_conservative": slope_ref_cons,
        "rate_lambda": lam,
        "rate": None if rate is None else rate.to_dict(),
        "lambda_usable": usable,
        "lambda_note": note,
        "unresolved_share": unresolved_share,
        "log_vocab": logV,
        "c_emp": ce,
        "c_emp_lower": c.get("c_emp_lower"),
        "c_emp_upper": c.get("c_emp_upper"),
        "c_emp_source": c.get("source"),
        "c_emp_converged": c.get("converged"),
        "c_emp_measurement": {k: c.get(k) for k in (
            "kind", "protocol", "steps_per_length", "max_steps", "target_source", "converged",
            "interim", "n_targets")},
        "ratio": ratio,
        "ratio_refined": ratio_ref,
        "n_star": {"m": list(m_values), **nstar},
        "threshold_unbounded": {k: (v.tolist() if isinstance(v, np.ndarray) else v)
                                for k, v in thr.items()},
        "tightest": tight,
        "heldout_valid": is_valid,
        "errors": errors,
        "figure": figs.get("accessible_fraction"),
        "figures": figs,
    }
    section["markdown"] = bounds_markdown(section, d=d, V=V, kinds=kinds, reasons=reasons or {},
                                          rate=rate)
    return section


def _check_m_values(m_values) -> tuple:
    """``m_values`` as a tuple of ints >= 1 (at least one), errors naming ``m_values``."""
    if isinstance(m_values, (str, bytes)) or not hasattr(m_values, "__iter__"):
        raise TypeError("m_values: expected a sequence of integers >= 1 (numbers of prompt "
                        f"vectors), got {type(m_values).__name__}")
    ms = tuple(check_positive_int(m, "m_values") for m in m_values)
    if not ms:
        raise ValueError("m_values: expected at least one number of prompt vectors (integers "
                         f">= 1), got {list(m_values)!r}")
    if len(set(ms)) != len(ms):
        raise ValueError(f"m_values: expected distinct numbers of prompt vectors, got {list(ms)} "
                         "(a repeated m would repeat its row of the n* table)")
    return ms


def _check_valid(valid, supports: dict):
    """``valid`` as a set of support names, each one of ``supports`` or ``"cube"``."""
    if valid is None:
        return None
    if isinstance(valid, (str, bytes)) or not hasattr(valid, "__iter__"):
        raise TypeError("valid: expected a collection of support names (e.g. a set or list), "
                        f"got {type(valid).__name__} {valid!r}")
    names = set(valid)
    known = set(supports) | {CUBE}
    unknown = sorted(map(str, names - known))
    if unknown:
        raise ValueError(f"valid: {unknown} name no support; expected names among the supports "
                         f"given and {CUBE!r}: {sorted(known)}")
    return names


def _check_support_dims(supports: dict, d: int) -> None:
    """Refuse a support whose dimension is not the hidden size (its bounds would be of another
    space: the cube's slope is proportional to ``d``). A support without a readable ``dim`` is
    left to :func:`_log_packings`, which records it in ``errors``."""
    for name, sup in supports.items():
        try:
            dim = sup.dim
        except Exception:  # unfitted or not a support: recorded as an error later
            continue
        if isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) and int(dim) != d:
            raise ValueError(
                f"supports[{name!r}]: dimension {int(dim)} differs from "
                f"unembedding_facts['hidden_size'] = {d}; expected supports fitted to this "
                f"model's {d}-dimensional hidden states")


def _check_fraction_count(fractions, V: int) -> None:
    """Refuse cell shares of another number of tokens than ``V`` before any rate is computed
    (the rate's own ``vocab_size`` is checked again after)."""
    if fractions is None:
        return
    if callable(getattr(type(fractions), "cell_volume_rate", None)):
        f = getattr(fractions, "fractions", None)
        what = f"a {type(fractions).__name__} of"
    else:
        f, what = fractions, "cell shares of"
    if f is None or np.ndim(f) != 1:
        return  # cell_volume_rate names the problem
    n = int(np.size(f))
    if n != V:
        raise ValueError(f"fractions: {what} {n} tokens, but unembedding_facts['vocab_size'] is "
                         f"{V}; expected one share per token of this model's vocabulary")


def _refuse_single_cell(lp_paper: dict, rinf: float, eps: float) -> None:
    """Refuse a support whose rigorous ``log P < log 2`` at ``eps``.

    Such a bound proves that the support holds one distinguishable vector: its L-infinity
    diameter is below ``eps = rinf 2^-11`` (a connected set with two points ``D`` apart holds
    ``floor(D/eps) + 1`` points ``eps`` apart). Hidden states of L-infinity radius ``rinf``
    that differ at all do not fit in one such cell, so ``rinf`` and the supports are of
    different scales (e.g. ``rinf = 1e160`` with unit-scale supports), and ``C`` would be
    reported as about 0 tokens per vector.
    """
    small = {k: v for k, v in lp_paper.items() if v < math.log(2.0)}
    if small:
        k = min(small, key=small.get)
        raise ValueError(
            f"rinf: at eps = rinf 2^-11 = {eps:.4g} (rinf = {rinf:.4g}) the support(s) "
            f"{sorted(small)} hold at most one distinguishable vector ({k!r}: log P <= "
            f"{small[k]:.3g} nats < log 2), i.e. they fit inside one precision cell and the "
            "bound would be C = 0 tokens per vector; expected rinf to be the L-infinity radius of "
            "the hidden states the supports were fitted to (same units)")


def _report_rate(fractions, k_max: int, lower, upper, n_samples, unresolved_share) -> tuple:
    """``(rate, lambda, unresolved_share)`` of :func:`bounds_report_section`: the
    :class:`~embgeom.bounds.CellVolumeRate` of ``fractions`` (None without them), its lambda
    (nats per token; None when not finite), and the share of unresolved cells that decides
    whether lambda is usable."""
    if fractions is None:
        return None, None, unresolved_share
    rate = cell_volume_rate(fractions, k_max, lower=lower, upper=upper, n_samples=n_samples)
    lam = rate.rate if np.isfinite(rate.rate) else None
    if rate.estimator == "log-shares" or unresolved_share is None:
        # from log-shares (a token sample) what sets lambda is the share of the sampled
        # tokens without a figure, not of the tokens outside the sample
        unresolved_share = rate.unresolved_share
    return rate, lam, unresolved_share


def _refined_slopes(lp_paper: dict, V: int, rate, lam) -> tuple[dict, dict]:
    """The slopes ``C log|V| / lambda`` per support (tokens per vector; None without a
    lambda) and their conservative versions (from the rate's lower lambda; empty when that
    is not finite), through :func:`embgeom.bounds.slope_from_log_packing`."""
    ref = {k: (slope_from_log_packing(v, V, rate) if lam else None) for k, v in lp_paper.items()}
    cons = {}
    if rate is not None and np.isfinite(rate.rate_conservative):
        cons = {k: slope_from_log_packing(v, V, rate, conservative=True)
                for k, v in lp_paper.items()}
    return ref, cons


def _lambda_usable(lam, unresolved_share) -> tuple[bool, str]:
    if lam is None:
        return False, "lambda not computed (no finite rate from the cell shares)"
    if unresolved_share is None:
        return True, "no unresolved cells reported"
    u = check_probability(unresolved_share, "unresolved_share", open_left=False)
    if u > LAMBDA_MAX_UNRESOLVED:
        return False, (f"{100 * u:.1f}% of the cells are unresolved (more than "
                       f"{100 * LAMBDA_MAX_UNRESOLVED:g}%): lambda would be set by the upper bounds "
                       "standing in for them, not by the model")
    return True, f"{100 * u:.2f}% of the cells unresolved (at most {100 * LAMBDA_MAX_UNRESOLVED:g}%)"


def _c_emp(c_emp, published) -> dict:
    if c_emp and c_emp.get("c_emp") is not None:
        out = dict(c_emp)
        out["c_emp"] = check_positive(c_emp["c_emp"], "c_emp['c_emp']")  # finite > 0, not bool
        return out
    if published is not None:
        return {"c_emp": check_positive(published, "published_c_emp"), "source": "published (paper)"}
    return {"c_emp": None}


def _raw_names(section: dict) -> list[str]:
    return [k for k in section["log_packing"] if not k.endswith(CONFORMAL_SUFFIX)]


def bounds_markdown(section: dict, *, d: int, V: int, kinds: dict, reasons: dict, rate) -> str:
    """The bounds section of report.md: one row per support, its conformal slope beside it."""
    lp, slope, valid = section["log_packing"], section["slope"], section["heldout_valid"]
    usable = section["lambda_usable"]
    ce = section["c_emp"]
    # C_emp not shown to converge is a lower bound, so C / C_emp is an upper bound on looseness
    ce_exact = bool(section.get("c_emp_converged")) or str(section.get("c_emp_source")).startswith(
        "published")
    rows, notes = [], []
    for k in _raw_names(section):
        cn = k + CONFORMAL_SUFFIX
        rows.append([
            k, kinds.get(k, "—"), "yes" if valid[k] else "NO", lp[k],
            section["slope_paper_formula"][k], slope[k], section["slope_dtype"][k],
            section["slope_refined"][k] if usable else None,
            slope.get(cn), ("yes" if valid.get(cn) else "NO") if cn in slope else None,
            section["ratio"][k] if ce else None,
        ])
        if not valid[k]:
            notes.append(f"{k}: {reasons.get(k, 'missed fresh hidden states')}")
    eps = section["eps"]
    dt = eps["dtype_name"]
    md = ["## Packing bounds", "",
          f"Precision eps = r_inf 2^-11 = {eps['paper']:.4g} (the paper's convention; r_inf = "
          f"{eps['rinf']:.4g}); {dt} gives eps = {eps['dtype']:.4g}. |V| = {V:,}, log|V| = "
          f"{section['log_vocab']:.4f}, d = {d}. C = log P / log|V| in tokens per prompt vector "
          "(rigorous unless the column says 'paper formula'); a support not valid gives no bound.",
          "",
          md_table(["support", "shape", "valid", "log P (nats)", "C paper formula",
                    "C rigorous", f"C ({dt} eps)", "C refined (lambda)", "C conformal",
                    "conformal valid", "C / C_emp" if ce_exact else "C / C_emp (at most)"],
                   rows, drop_empty=True)]
    if notes:
        md += ["", "NO: " + "; ".join(notes) + "."]
    if section["paper_exceeds_rigorous"]:
        md += ["", paper_vs_rigorous_sentence(section, d)]
    if rate is not None:
        if rate.rate_ci is not None:
            how = (f"{round(100 * rate.ci_level)}% interval [{rate.rate_ci[0]:.4g}, "
                   f"{rate.rate_ci[1]:.4g}] ({'; '.join(rate.ci_includes)}); from "
                   + (f"a uniform sample of {rate.n_tokens_used:,} tokens'" if rate.token_sample
                      else "every token's") + f" log-shares, {rate.n_unresolved} unresolved, "
                   f"{rate.n_empty} proven empty")
        else:
            how = (f"{rate.n_zero:,} zero shares filled by {rate.zero_fill}"
                   + (f", then renormalised (the filled sum was {math.exp(rate.log_total):.3g})"
                      if rate.normalized and rate.n_zero else ""))
        md += ["", f"lambda = {rate.rate:.4g} nats/token (R^2 {rate.r2:.4f}; conservative "
               f"{rate.rate_conservative:.4g}; {how}) vs log|V| = {section['log_vocab']:.4g}: "
               + ("usable" if usable else "not usable") + f" ({section['lambda_note']})."]
    if ce:
        # a cramming measurement whose n50 was not shown to converge is a lower bound (as the
        # answer block says); a published figure is quoted as it is
        exact = section.get("c_emp_converged") or str(section["c_emp_source"]).startswith(
            "published")
        md += ["", f"C_emp {'=' if exact else '>='} {ce:.4g} tokens per prompt vector "
               f"({section['c_emp_source']}"
               + ("" if exact else "; n50 not shown to converge in the step budget") + "); "
               "C / C_emp >= 1 is required of a valid bound."]
    else:
        md += ["", "C_emp: not measured for this model (run `embgeom cram` and pass "
               "`--cram-summary`)."]
    thr = section["threshold_unbounded"]
    if thr:
        md += ["", f"Cor. 4.10 (mean field, weights at 2^-11): N = {thr['n_threshold']:.4g} "
               f"tokens for the {section['tightest']} support."]
    ns = section["n_star"]
    md += ["", "n*(m) = C m for m = " + ", ".join(map(str, ns["m"])) + " (valid supports):", "",
           md_table(["support"] + [f"m={m}" for m in ns["m"]],
                    [[k] + [float(x) for x in ns[k]] for k in lp if valid[k]]),
           "", f"![linear law]({section['figures']['linear_law']})"]
    if section["figure"]:
        md += ["", f"![accessible fraction]({section['figure']})"]
    return "\n".join(md)


def paper_vs_rigorous_sentence(section: dict, d: int) -> str:
    """Why "C paper formula" exceeds "C rigorous", in one sentence (from the binding terms)."""
    ex = section["paper_exceeds_rigorous"]
    bt = section["binding_term"]
    rest = [k for k in section.get("slope_paper_formula", {}) if k not in ex
            and not k.endswith(CONFORMAL_SUFFIX)]
    fams = sorted({bt[k].split("_")[0] for k in ex})
    from .._special import log_unit_ball_volume

    gap = d * math.log(2.0) - log_unit_ball_volume(d)  # log(vol cube(eps) / vol ball(eps/2))
    meaning = "; ".join(f"{TERM_MEANING.get(f, f)}" for f in fams)
    return (f"C paper formula exceeds C rigorous for {', '.join(ex)}: the paper's formula counts "
            f"disjoint Euclidean balls of radius eps/2 (d log(1 + 2r/eps) for a ball), while the "
            f"rigorous bound is the smallest of several volumetric bounds, here "
            f"{', '.join(sorted({bt[k] for k in ex}))} ({meaning}); in d = {d} a cube of side eps "
            f"has e^{gap:.0f} times the volume of the ball of radius eps/2, so far fewer of them "
            "fit." + (f" For {', '.join(rest)} the paper's formula is at or below the "
                      "rigorous bound, so they are not listed."
                      if rest else ""))
