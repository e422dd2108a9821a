"""embgeom: the geometry of a language model's embedding space, turned into hard limits on
what the model can generate.

Data flows one way: model -> (unembedding, hidden states) -> (cells, supports) -> bounds ->
report. Only :mod:`embgeom.adapters`, :mod:`embgeom.cramming` and :mod:`embgeom.copying` import
torch; the geometry works on numpy arrays.

Reference: M. Meyer, M. Michelessa, C. Chaux, V. Y. F. Tan, "How Many Different Outputs Can a
Transformer Generate?", ICML 2026 (arXiv 2605.22223).
"""

__version__ = "0.1.0"

import importlib as _importlib

from . import bounds, cells, volumes
from .bounds import (
    accessible_fraction_bound,
    accessible_log_count,
    cell_volume_rate,
    linear_law_slope,
    log_packing_number,
    n_star,
    precision_eps,
    slope_bound,
    theorem45_log_count,
    threshold_length_unbounded,
)
from .cells import Decoder
from .volumes import CellVolumes, cell_volumes

# The torch-using modules are imported on first use, so that ``import embgeom`` (the geometry)
# stays light and works without touching torch. The supports are scikit-learn estimators, and
# scikit-learn pulls in scipy.stats (about 0.3 s): they too are imported on first use
# (``embgeom.Ball``, ``embgeom.supports``).
_LAZY = ("adapters", "cramming", "copying", "report", "cli", "supports")
_LAZY_NAMES = {
    name: "supports"
    for name in ("Ball", "Box", "Cone", "Ellipsoid", "FinalNormShell", "Support", "fit_support",
                 "support_from_final_norm")
}


def __getattr__(name):
    if name in _LAZY:
        module = _importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    if name in _LAZY_NAMES:
        value = getattr(_importlib.import_module(f".{_LAZY_NAMES[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'embgeom' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_LAZY_NAMES))


__all__ = [
    "Ball",
    "Box",
    "CellVolumes",
    "Cone",
    "Decoder",
    "Ellipsoid",
    "FinalNormShell",
    "Support",
    "accessible_fraction_bound",
    "accessible_log_count",
    "bounds",
    "cell_volume_rate",
    "cell_volumes",
    "cells",
    "fit_support",
    "linear_law_slope",
    "log_packing_number",
    "n_star",
    "precision_eps",
    "slope_bound",
    "support_from_final_norm",
    "theorem45_log_count",
    "threshold_length_unbounded",
    "volumes",
    *_LAZY,
]
