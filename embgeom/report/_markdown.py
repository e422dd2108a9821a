"""Plain-text formatting of the report (and of ``cram_summary.md``): numbers and markdown tables."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["fmt", "md_table"]


def fmt(x, nd: int = 4) -> str:
    """A number for a table: ints with thousands separators, floats to ``nd`` significant digits
    (scientific outside [1e-3, 1e5)), ``None`` as an em dash."""
    if x is None:
        return "—"
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    if isinstance(x, (float, np.floating)):
        x = float(x)
        if not math.isfinite(x):
            return str(x)
        if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
            return f"{x:.{nd - 1}e}"
        return f"{x:.{nd}g}"
    return str(x)


def md_cell(text: str) -> str:
    """A markdown table cell: ``|`` escaped (token strings and |V| contain it)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list], *, drop_empty: bool = False) -> str:
    """A markdown table, one line per row; every cell through :func:`fmt` and :func:`md_cell`.

    With ``drop_empty`` a column whose cells are all ``None`` (or ``"-"``) is left out.
    """
    keep = list(range(len(header)))
    if drop_empty and rows:
        keep = [j for j in keep if any(r[j] is not None and r[j] != "-" for r in rows)]
    lines = ["| " + " | ".join(md_cell(header[j]) for j in keep) + " |", "|" + "---|" * len(keep)]
    for r in rows:
        lines.append("| " + " | ".join(md_cell(fmt(r[j])) for j in keep) + " |")
    return "\n".join(lines)
