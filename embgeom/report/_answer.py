"""The answer block that opens report.md: the bound, why it holds, what was rejected, and why."""

from __future__ import annotations

from ._cells import unargmaxable_sentence
from ._markdown import fmt
from ._supports import CUBE

__all__ = ["build_answer", "answer_markdown", "answer_lines"]


def _why_valid(name: str, entry: dict, heldout_desc: str) -> str:
    ho = entry.get("heldout")
    evidence = ""
    if ho:
        evidence = (f"it holds {ho['n_inside']:,} of {ho['n']:,} fresh hidden states"
                    f"{heldout_desc}, one-sided {100 * ho['confidence']:g}% lower bound on the "
                    f"contained share q >= {ho['lower_bound']:.4f}")
    if entry.get("kind") == "certified":
        return ("valid by construction: the final norm maps every hidden state onto this shell"
                + (f" (and {evidence})" if evidence else ""))
    text = f"valid because {evidence}" if evidence else "taken as valid (no held-out check)"
    if entry.get("kind") == "conformal":
        cal = entry["calibration"]
        text += (f"; it is the {entry['of']} fit scaled by {cal['scale']:.4g} by split-conformal "
                 f"calibration on {cal['n_calibration']:,} hidden states (alpha = {cal['alpha']:g}: "
                 f"a fresh hidden state drawn like them is inside with probability >= "
                 f"{1 - cal['alpha']:g})")
    return text


def _rejection(name: str, entry: dict) -> str:
    if "error" in entry:
        return f"{name}: not fitted ({entry['error'].split(';')[0][:120]})"
    ho = entry.get("heldout")
    if not ho:
        return f"{name}: no held-out check"
    return (f"{name}: holds {ho['n_inside']:,} of {ho['n']:,} fresh hidden states (share "
            f"{ho['share']:.4f}, lower bound {ho['lower_bound']:.4f} < {ho['min_share']:g})")


def build_answer(model: dict, supports: dict, cells: dict, bounds: dict, *,
                 heldout_desc: str = "") -> dict:
    """The report's answer: the tightest valid bound as a sentence and the facts around it.

    Parameters
    ----------
    model : dict
        The report's ``model`` facts (``name``, ``hidden_size``, ``vocab_size``, ...).
    supports, cells, bounds : dict
        The report's sections.
    heldout_desc : str
        How the fresh hidden states were drawn, e.g. ``" (prompt lengths 8, 32; seed 1)"``.

    Returns
    -------
    dict
        ``model`` (str), ``bound`` (``support``, ``kind``, ``slope`` (tokens per prompt vector),
        ``log_packing`` (nats), ``eps``, ``sentence``; None when no support is valid),
        ``rejected`` (list of ``{"support", "reason"}``), ``lambda`` (``value``, ``usable``,
        ``note``, ``refined_slope``, ``support``: the support whose cell shares it comes from,
        ``budget``: their estimator and budget, :func:`splitting_budget`), ``c_emp`` (``measured``, ``value``, ``lower``, ``upper``,
        ``source``, ``ratio``), ``unargmaxable`` (``count`` (None when not scanned),
        ``n_duplicates``, ``sentence``), ``paper_vs_rigorous`` (sentence or None) and ``lines``
        (the block as markdown bullet lines).
    """
    from ._bounds import paper_vs_rigorous_sentence

    d, V = model["hidden_size"], model["vocab_size"]
    name = model.get("name", "model")
    ans: dict = {"model": f"{name} (d = {d}, |V| = {V:,}, {model.get('source_dtype', '')})"}
    tight = bounds.get("tightest")
    eps = bounds["eps"]["paper"]
    if tight is not None:
        C = bounds["slope"][tight]
        entry = supports.get(tight, {"kind": CUBE} if tight == CUBE else {})
        sentence = (f"m prompt vectors at precision eps = r_inf 2^-11 = {eps:.4g} can make "
                    f"{name} emit every sequence of n tokens only if n <= C m with C = {C:.4g} "
                    f"tokens per prompt vector (log P = {bounds['log_packing'][tight]:,.0f} nats "
                    f"per vector); support `{tight}`, {_why_valid(tight, entry, heldout_desc)}.")
        ans["bound"] = {"support": tight, "kind": entry.get("kind"), "slope": C,
                        "log_packing": bounds["log_packing"][tight], "eps": eps,
                        "sentence": sentence}
    else:
        ans["bound"] = None
    rejected = []
    for k, e in supports.items():
        if not isinstance(e, dict) or "kind" not in e or e["kind"] == "certified":
            continue
        if "error" in e or e.get("heldout_valid") is False:
            rejected.append({"support": k, "reason": _rejection(k, e)})
    ans["rejected"] = rejected
    lam = bounds.get("rate_lambda")
    from ._cells import splitting_budget

    ans["lambda"] = {"value": lam, "usable": bool(bounds.get("lambda_usable")),
                     "note": bounds.get("lambda_note"),
                     "support": cells.get("support"),
                     "budget": splitting_budget(cells.get("volumes") or {}),
                     "refined_slope": (bounds["slope_refined"].get(tight)
                                       if tight and bounds.get("lambda_usable") else None)}
    ce = bounds.get("c_emp")
    ans["c_emp"] = {"measured": ce is not None, "value": ce, "lower": bounds.get("c_emp_lower"),
                    "upper": bounds.get("c_emp_upper"), "source": bounds.get("c_emp_source"),
                    "ratio": bounds["ratio"].get(tight) if (ce and tight) else None,
                    **_measurement(bounds.get("c_emp_measurement") or {}, bounds)}
    un = cells.get("unargmaxable")
    ans["unargmaxable"] = {"count": None if un is None else un["n_unargmaxable"],
                           "n_duplicates": (cells.get("duplicates") or {}).get("n_duplicates"),
                           "sentence": unargmaxable_sentence(cells)}
    ans["paper_vs_rigorous"] = (paper_vs_rigorous_sentence(bounds, d)
                                if bounds.get("paper_exceeds_rigorous") else None)
    ans["lines"] = answer_lines(ans, bounds)
    return ans


def _measurement(meas: dict, bounds: dict) -> dict:
    """How C_emp was measured, as fields and one phrase: protocol, budget, source, converged."""
    kind = meas.get("kind") or "per-length"
    proto = meas.get("protocol") or ("adam (per-length default)" if kind == "per-length"
                                     else "custom")
    budget = meas.get("steps_per_length")
    parts = [f"{kind} cramming, protocol {proto}"]
    if budget is not None:
        parts.append(f"at most {budget} steps per length"
                     + (f", {meas['max_steps']} per target" if meas.get("max_steps") else ""))
    if meas.get("target_source"):
        nt = meas.get("n_targets")
        if nt is not None:
            count = (", ".join(f"{v} (m = {k})" for k, v in nt.items()) if isinstance(nt, dict)
                     else str(nt))
            parts.append(f"{count} targets of {meas['target_source']}")
        else:
            parts.append(f"targets {meas['target_source']}")
    if meas.get("interim"):
        parts.append("interim (summarised while the run was unfinished; later targets or m may change it)")
    conv = meas.get("converged")
    parts.append("n50 converged in the budget" if conv else
                 "n50 not converged" if conv is False else "no budget sweep")
    src = bounds.get("c_emp_source")
    if src:
        parts.append(str(src))
    return {"kind": kind, "protocol": proto, "steps_per_length": budget,
            "target_source": meas.get("target_source"), "converged": conv,
            "interim": bool(meas.get("interim")), "how": "; ".join(parts)}


def answer_lines(ans: dict, bounds: dict) -> list[str]:
    """The answer as markdown bullet lines (report.md; the terminal prints them without ``**``)."""
    lines = [f"- **Model**: {ans['model']}."]
    b = ans["bound"]
    lines.append(f"- **Bound**: {b['sentence']}" if b else
                 "- **Bound**: no support passed the validity rule: no bound is stated.")
    if ans["rejected"]:
        lines.append("- **Rejected**: " + "; ".join(r["reason"] for r in ans["rejected"]) + ".")
    else:
        lines.append("- **Rejected**: none.")
    lam = ans["lambda"]
    if lam["value"] is None:
        lines.append(f"- **lambda**: not computed ({lam['note']}).")
    elif lam["usable"]:
        lines.append(f"- **lambda** = {lam['value']:.4g} nats/token (log|V| = "
                     f"{bounds['log_vocab']:.4g}){_lambda_source(lam, ans['bound'])}; refined "
                     f"slope C log|V| / lambda = {fmt(lam['refined_slope'])} tokens per prompt "
                     "vector for typical sequences (a heuristic, not a counting bound).")
    else:
        lines.append(f"- **lambda**: not usable ({lam['note']}; the value would be "
                     f"{lam['value']:.4g} nats/token). The bound above uses log|V|.")
    c = ans["c_emp"]
    if c["measured"]:
        iv = (f" [{fmt(c['lower'])}, {fmt(c['upper'])}]" if c.get("lower") is not None else "")
        if not c.get("converged") and iv:  # an interval of the fit, beside a lower bound
            iv = f" (fit 95%{iv})"
        ratio = c["ratio"]
        verdict = ("" if ratio is None else
                   " (>= 1: the bound holds)" if ratio >= 1 else " (< 1: the bound is broken)")
        if c.get("converged"):
            lines.append(f"- **C_emp** = {c['value']:.4g}{iv} tokens per prompt vector "
                         f"({c['how']}); C / C_emp = {fmt(ratio)}{verdict}.")
        else:
            lines.append(f"- **C_emp** >= {c['value']:.4g}{iv} tokens per prompt vector "
                         f"({c['how']}): its n50 has not been shown to converge in the step "
                         "budget, so C_emp is a lower bound on the model's capacity and "
                         f"C / C_emp = {fmt(ratio)} an upper bound on the bound's looseness"
                         f"{verdict}.")
    else:
        lines.append("- **C_emp**: not measured (no cramming summary for this model: run "
                     "`embgeom cram` and pass `--cram-summary`).")
    un = ans["unargmaxable"]["sentence"]
    for prefix in ("Unargmaxable tokens (exact scan): ", "Unargmaxable tokens: "):
        un = un[len(prefix):] if un.startswith(prefix) else un
    lines.append(f"- **Unargmaxable tokens**: {un[:1].upper() + un[1:]}")
    if ans["paper_vs_rigorous"]:
        lines.append(f"- **Paper formula vs rigorous**: {ans['paper_vs_rigorous']}")
    return lines


def _lambda_source(lam: dict, bound: dict | None) -> str:
    """Where lambda comes from: the cells' support (named apart from the bound's when they
    differ) and the shares' estimator and budget."""
    sup = lam.get("support")
    if not sup:
        return ""
    text = f", from the cell shares in support `{sup}`"
    if lam.get("budget"):
        text += f" ({lam['budget']})"
    if bound and bound.get("support") and bound["support"] != sup:
        text += (f"; the bound's support is `{bound['support']}`, whose shares may differ, which is "
                 "one more reason the refined slope is a heuristic")
    return text


def answer_markdown(ans: dict) -> str:
    """The ``## Answer`` block of report.md."""
    return "\n".join(["## Answer", "", *ans["lines"]])

