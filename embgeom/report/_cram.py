"""Reading a cramming measurement (``cram_summary.json``) for the report's C_emp."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["read_cram_summary", "find_cram_summary", "CRAM_SEARCH_DIRS"]

#: Folders (relative to the working directory) searched by ``cram_summary="auto"``.
CRAM_SEARCH_DIRS = ("benchmarks/results", "runs")


def read_cram_summary(path, model_name: str | None = None) -> dict:
    """C_emp and the n50 points of a :func:`embgeom.cramming.run_cram` summary.

    Parameters
    ----------
    path : str or Path
        ``cram_summary.json``, or a folder holding one.
    model_name : str, optional
        When given, a summary of another model is refused.

    Returns
    -------
    dict
        ``c_emp``, ``c_emp_lower``, ``c_emp_upper`` (tokens per prompt vector; None when the
        run had fewer than two finite n50), ``r2`` (the fit's uncentred R^2), ``n50`` ``{m:
        {"n50", "lower", "upper"}}``, ``model``, ``source`` (the file), ``fit_error``, and how
        C_emp was measured: ``kind`` (``"horizons"`` or ``"per-length"``), ``protocol`` (the
        preset's name, or None for the per-length default), ``steps_per_length`` (the step
        budget per length), ``max_steps``, ``target_source``, ``converged`` (True/False from a
        budget sweep, None when none was run), ``interim`` (True for a summary of a run still
        going, :func:`embgeom.cramming.summarise_horizons`), ``n_targets`` (an int, or ``{m:
        count}``) and ``curves`` ``{m: {"lengths", "accessibility", "lower", "upper"}}`` (the
        measured accessibility).

    Raises
    ------
    FileNotFoundError
        No such file (or no ``cram_summary.json`` in the folder).
    ValueError
        Not a cram summary, or a summary of another model.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "cram_summary.json"
    if not p.is_file():
        raise FileNotFoundError(f"cram_summary: no file {str(p)!r}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"cram_summary: {str(p)!r} is not JSON ({exc})") from None
    if not isinstance(data, dict) or "n50" not in data or "model" not in data:
        raise ValueError(f"cram_summary: {str(p)!r} is not an `embgeom cram` summary (no n50/model)")
    if model_name is not None and Path(str(data["model"])).name != Path(str(model_name)).name:
        raise ValueError(f"cram_summary: {str(p)!r} measures {data['model']!r}, not {model_name!r}")
    fit = data.get("fit") or {}
    n50 = {str(m): {k: v.get(k) for k in ("n50", "lower", "upper")}
           for m, v in (data.get("n50") or {}).items() if isinstance(v, dict)}
    st = data.get("settings") or {}
    proto = st.get("protocol")
    conv = st.get("converged")
    curves = {str(m): {k: c.get(k) for k in ("lengths", "accessibility", "lower", "upper")}
              for m, c in (data.get("curves") or {}).items() if isinstance(c, dict)}
    return {"c_emp": fit.get("c_emp"), "c_emp_lower": fit.get("c_emp_lower"),
            "c_emp_upper": fit.get("c_emp_upper"), "r2": fit.get("r2_uncentred"),
            "n50": n50, "model": data["model"], "source": str(p),
            "fit_error": data.get("fit_error"), "kind": data.get("kind", "per-length"),
            "protocol": proto.get("name") if isinstance(proto, dict) else proto,
            "steps_per_length": st.get("steps_per_length", st.get("steps")),
            "max_steps": st.get("max_steps"), "target_source": st.get("target_source"),
            "converged": conv.get("converged") if isinstance(conv, dict) else None,
            "interim": bool(st.get("interim", False)),
            "n_targets": st.get("n_targets"),
            "curves": curves}


def _preference(s: dict, mtime: float) -> tuple:
    """Sort key of :func:`find_cram_summary`: horizons before per-length runs, random tokens
    (the theorem's own count) before other targets, more values of m, more targets, newer."""
    nt = s.get("n_targets")
    total = sum(int(v) for v in nt.values()) if isinstance(nt, dict) else int(nt or 0) * len(s["n50"])
    return (s.get("kind") == "horizons", s.get("target_source") in ("random-tokens", None),
            len(s["n50"]), total, mtime)


def find_cram_summary(model_name: str, search_dirs=CRAM_SEARCH_DIRS, root=".") -> dict | None:
    """The best cram summary of ``model_name`` with a fitted C_emp under ``search_dirs``.

    Best, in this order (:func:`_preference`): a horizons run (the per-target horizons of
    issue 23) over a per-length run; random-token targets (the bound's own count) over words
    or text; more values of m; more targets; the newer file. The file's time decides only ties:
    a fresh clone gives every file the same time.

    Parameters
    ----------
    model_name : str
    search_dirs : sequence of str
        Folders under ``root`` searched recursively for ``*cram_summary*.json``.
    root : str or Path, default "."

    Returns
    -------
    dict or None
        :func:`read_cram_summary`'s result, or None when there is none.
    """
    found = []
    for sub in search_dirs:
        base = Path(root) / sub
        if not base.is_dir():
            continue
        for p in base.rglob("*cram_summary*.json"):
            try:
                s = read_cram_summary(p, model_name)
            except (ValueError, OSError):
                continue
            if s["c_emp"] is not None:
                found.append((_preference(s, p.stat().st_mtime), s))
    return max(found, key=lambda t: t[0])[1] if found else None
