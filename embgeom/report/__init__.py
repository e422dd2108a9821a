"""The accessibility report: sections, markdown and figures (the only part of embgeom that
writes report files and draws).

:func:`build_report` runs the data flow once on one model and writes ``report.json`` (strict
JSON), ``report.md`` (opening with the answer block) and PNG figures. One module per job:

- ``_build.py``: :func:`build_report` in named phases, :data:`REPORT_SIZES`.
- ``_hidden.py``: :func:`hidden_state_summary` and its markdown.
- ``_supports.py``: :func:`supports_report_section` (fits, held-out validity with its one-sided
  Clopper-Pearson bound, split-conformal shapes, the cube).
- ``_cells.py``: :func:`cells_report_section` (cell shares, unresolved cells, duplicate rows,
  unargmaxable tokens with their cause).
- ``_bounds.py``: :func:`bounds_report_section` (slopes per support, lambda and when it is
  usable, n*, why the paper's formula exceeds the rigorous bound).
- ``_answer.py``: :func:`build_answer`, the block that opens report.md.
- ``_cram.py``: :func:`read_cram_summary` / :func:`find_cram_summary` (C_emp from a cramming run).
- ``_markdown.py``: number formatting and one-line markdown tables.
- :mod:`embgeom.report.figures`: every figure, matplotlib's object API only.

Geometry modules (:mod:`embgeom.supports`, :mod:`embgeom.bounds`, :mod:`embgeom.cells`,
:mod:`embgeom.volumes`) compute and return; they never import matplotlib or write files.
"""

from __future__ import annotations

from . import figures
from ._answer import build_answer
from ._bounds import bounds_report_section
from ._build import REPORT_SIZES, build_report
from ._cells import cells_report_section, duplicate_rows
from ._cram import find_cram_summary, read_cram_summary
from ._hidden import hidden_state_summary
from ._supports import supports_report_section
from .figures import plot_accessible_fraction

__all__ = [
    "build_report",
    "REPORT_SIZES",
    "hidden_state_summary",
    "supports_report_section",
    "cells_report_section",
    "bounds_report_section",
    "build_answer",
    "duplicate_rows",
    "read_cram_summary",
    "find_cram_summary",
    "plot_accessible_fraction",
]
