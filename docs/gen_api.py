"""Regenerate docs/api.md from the modules' ``__all__`` and first docstring lines.

Usage: ``.venv/bin/python docs/gen_api.py`` (rewrites docs/api.md);
``tests/test_package.py`` checks that the file on disk is current.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

HEADER = """# API

Everything below is importable as `embgeom.<module>.<name>`; the geometry's main names are also
re-exported from `embgeom` itself (`embgeom.Decoder`, `embgeom.cell_volumes`, `embgeom.fit_support`, the
`embgeom.bounds` functions). The full docstrings (shapes, dtypes, units, errors, sources) are in the code:
`help(embgeom.fit_support)`.

Data flow: model -> (unembedding, hidden states) -> (cells, supports) -> bounds -> report.
"""

MODULES = {
    "adapters": "Hugging Face / GGUF model -> unembedding, final norm, hidden states (torch).",
    "cells": "Decoder cells E_t: assignment, margins, unargmaxable tokens, Chebyshev centres "
    "(numpy + numba kernels in `_kernels.py`).",
    "volumes": "Monte Carlo cell volumes with intervals and histograms.",
    "supports": "Supports fitted to hidden states: Ball, Box, Ellipsoid, Cone, FinalNormShell; "
    "`fit_support`.",
    "bounds": "Packing numbers, Theorem 4.5, the linear law, lambda, Cor. 4.10 (log space).",
    "cramming": "Soft-prompt (memory vector) cramming, accessibility curves, n50, C_emp (torch).",
    "copying": "The copy task and its accuracy cliff (torch).",
    "report": "One model's report (report.json opening with the answer, report.md, figures): "
    "sections, markdown and `report.figures` (matplotlib object API).",
}

SIG_CHARS = 120


def _entry(name, obj) -> str:
    if inspect.isclass(obj) or inspect.isfunction(obj):
        sig = str(inspect.signature(obj))
        if len(name) + len(sig) > SIG_CHARS:
            sig = sig[: SIG_CHARS - len(name)] + "...)"
        doc = (inspect.getdoc(obj) or "").strip().split("\n\n")[0]
        first = " ".join(doc.split())
        prefix = "class " if inspect.isclass(obj) else ""
        return f"- `{prefix}{name}{sig}`: {first}"
    return f"- `{name}`: constant."


def render() -> str:
    parts = [HEADER]
    for mod, blurb in MODULES.items():
        m = importlib.import_module(f"embgeom.{mod}")
        lines = [_entry(n, getattr(m, n)) for n in m.__all__]
        parts.append(f"## `embgeom.{mod}`\n\n{blurb}\n\n" + "\n".join(lines) + "\n")
    return "\n".join(parts)


if __name__ == "__main__":
    path = Path(__file__).with_name("api.md")
    path.write_text(render())
    print(f"wrote {path}")
