"""Supports: bounded sets that hold the hidden states, fitted as minimum-volume enclosures.

A *support* ``S`` is a bounded subset of ``R^d`` that contains the hidden states (or the prompt
vectors) in practice. Its volume enters the packing-number bounds (docs/theory.md, section 4 "Packing bounds per support"), and
it is the sampling region of the Monte Carlo cell volumes. Tighter support, tighter bound.

Each shape is a scikit-learn estimator of the outlier-detector family (:class:`Support`:
``fit(X)``, ``predict`` +1 inside / -1 outside, ``decision_function``, ``score_samples``), with a
``from_params`` classmethod for a ready set, and answers every question the rest of embgeom
asks about it (log-volume, packing-bound terms, sampling, whether it is an origin-centred
ellipsoid ``G B``, its LP description, its JSON form). One shape per module:

- :class:`Ball` ``{x : |x - c| <= r}`` (``_ball.py``): minimum enclosing ball (free centre) or
  the origin-centred ball (``r = max |h_i|``); also the L-infinity radius ``rinf_`` of the
  paper's precision ``eps = r_inf 2^-11``.
- :class:`Ellipsoid` ``{x : (x - c)^T A (x - c) <= 1}`` (``_ellipsoid.py``, solvers in
  ``_mvee.py``): minimum-volume enclosing ellipsoid.
- :class:`Cone` ``{x : |x| <= r, angle(x, axis) <= alpha}`` (``_cone.py``): smallest circular cone
  holding every direction, intersected with the origin-centred enclosing ball.
- :class:`Box` ``{x : lower <= R x <= upper}`` (``_box.py``): axis-aligned or principal-axes box.
- :class:`FinalNormShell` (``_shell.py``): the set certified by the final RMSNorm/LayerNorm, no
  data needed (:func:`support_from_final_norm`).

:func:`fit_support` (``_fit.py``, with the shape registry) is the functional front door; its
``calibrate=alpha`` option and :func:`calibrate_support` (``_conformal.py``) give split-conformal
coverage for fresh points, and :func:`containment_check` (``_validity.py``) the held-out share
with its one-sided Clopper-Pearson lower bound. Volumes
are in log space (nats), so ``d = 4096`` never overflows; the special functions live in
:mod:`embgeom._special`.

This package is numpy/scipy/scikit-learn only (cvxpy is imported lazily, as the reference
solver); it never imports torch.

References
----------
M. Meyer, M. Michelessa, C. Chaux, V. Y. F. Tan, "How Many Different Outputs Can a Transformer
Generate?", ICML 2026, Sec. 4 (Theorem 4.5 and the support refinements).
"""

from __future__ import annotations

from .._special import log_cap_fraction, log_unit_ball_volume
from ._ball import Ball
from ._base import CONTAINS_TOL, BoxRegion, ComplexDataError, Support
from ._box import Box
from ._cone import Cone
from ._ellipsoid import Ellipsoid
from ._conformal import calibrate_support, conformal_rank, split_for_calibration
from ._fit import SHAPES, fit_support
from ._shell import FinalNormShell, support_from_final_norm
from ._validity import ContainmentCheck, clopper_pearson_lower, containment_check, min_points_for

__all__ = [
    "Support",
    "Ball",
    "Box",
    "Ellipsoid",
    "Cone",
    "FinalNormShell",
    "BoxRegion",
    "SHAPES",
    "CONTAINS_TOL",
    "ComplexDataError",
    "fit_support",
    "support_from_final_norm",
    "calibrate_support",
    "conformal_rank",
    "split_for_calibration",
    "ContainmentCheck",
    "containment_check",
    "clopper_pearson_lower",
    "min_points_for",
    "log_unit_ball_volume",
    "log_cap_fraction",
]

