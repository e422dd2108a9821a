"""Packing bounds: how many distinct outputs a finite-precision model can produce.

From the geometry of the embedding space (a support ``S`` holding the vectors, a precision
``eps``) to hard numbers: the packing number ``P(S, eps)``, Theorem 4.5's count of accessible
sequences for ``m`` prompt vectors, the linear law ``n*(m) = C m`` (Cor. 4.6), the non-uniform
cell refinement (the rate ``lambda``), and a computable form of Cor. 4.10 (unbounded context).
Everything is in log space (nats), so ``d = 4096``, ``|V| = 262144``, ``m = 1000`` never
overflows. The derivations are written out in ``docs/theory.md``.

One concept per module:

- ``_precision.py``: :func:`precision_eps`, :data:`FORMAT_BITS`.
- ``_packing.py``: :func:`packing_bound_terms`, :func:`log_packing_number` (the shapes compute
  their own terms: ``Support.packing_bound_terms``), :func:`accessible_log_count`,
  :func:`slope_bound`, :func:`slope_from_log_packing`, :func:`theorem45_log_count`.
- ``_linear_law.py``: :func:`linear_law_slope`, :func:`n_star`, :func:`accessible_fraction_bound`.
- ``_rate.py``: :class:`CellVolumeRate`, :func:`cell_volume_rate`, :func:`cell_volume_rate_from_logs`.
- ``_unbounded.py``: :func:`log_multiset_count`, :func:`threshold_length_unbounded` (Cor. 4.10).
- ``_published.py``: :data:`PUBLISHED`, the paper's numbers.

The report section and the accessible-fraction figure live in :mod:`embgeom.report`: this
package writes no files, never imports matplotlib and never imports the report.

This package is numpy/scipy only: no torch, and scipy.signal / scipy.optimize are imported inside
the functions that use them, so ``import embgeom.bounds`` stays light.

References
----------
M. Meyer, M. Michelessa, C. Chaux, V. Y. F. Tan, "How Many Different Outputs Can a Transformer
Generate?", ICML 2026 (arXiv 2605.22223), Sec. 4: Theorem 4.5, Cor. 4.6, Cor. 4.10 and the
refinements. Volumetric packing bounds: e.g. R. Vershynin, "High-Dimensional Probability"
(2018), Prop. 4.2.12. Steiner formula: R. Schneider, "Convex Bodies: the Brunn-Minkowski
Theory" (2014), Sec. 4.2.
"""

from __future__ import annotations

from ._linear_law import accessible_fraction_bound, linear_law_slope, n_star
from ._packing import (
    accessible_log_count,
    log_packing_number,
    packing_bound_terms,
    slope_bound,
    slope_from_log_packing,
    theorem45_log_count,
)
from ._precision import FORMAT_BITS, precision_eps
from ._published import PUBLISHED
from ._rate import CellVolumeRate, cell_volume_rate, cell_volume_rate_from_logs
from ._unbounded import log_multiset_count, threshold_length_unbounded

__all__ = [
    "PUBLISHED",
    "FORMAT_BITS",
    "precision_eps",
    "log_packing_number",
    "packing_bound_terms",
    "accessible_log_count",
    "slope_bound",
    "slope_from_log_packing",
    "theorem45_log_count",
    "linear_law_slope",
    "n_star",
    "accessible_fraction_bound",
    "CellVolumeRate",
    "cell_volume_rate",
    "cell_volume_rate_from_logs",
    "log_multiset_count",
    "threshold_length_unbounded",
]

