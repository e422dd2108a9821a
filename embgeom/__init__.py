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

# Every name is imported on first use (PEP 562), so ``import embgeom`` and ``embgeom --help``
# stay light: no numba compilation, no scipy.signal/stats, no torch until a name is used.
#: public name -> the submodule that defines it
_HOME = {
    "accessible_fraction_bound": "bounds",
    "accessible_log_count": "bounds",
    "cell_volume_rate": "bounds",
    "cell_volume_rate_from_logs": "bounds",
    "linear_law_slope": "bounds",
    "log_packing_number": "bounds",
    "n_star": "bounds",
    "precision_eps": "bounds",
    "slope_bound": "bounds",
    "theorem45_log_count": "bounds",
    "threshold_length_unbounded": "bounds",
    "Decoder": "cells",
    "Ball": "supports",
    "Box": "supports",
    "Cone": "supports",
    "Ellipsoid": "supports",
    "FinalNormShell": "supports",
    "Support": "supports",
    "fit_support": "supports",
    "support_from_final_norm": "supports",
    "CellVolumes": "volumes",
    "cell_volumes": "volumes",
}
_MODULES = ("bounds", "cells", "supports", "volumes", "adapters", "cramming", "copying",
            "report", "cli", "parallel")


def __getattr__(name):
    if name in _MODULES:
        module = _importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    if name in _HOME:
        value = getattr(_importlib.import_module(f".{_HOME[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'embgeom' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_HOME) | set(_MODULES))


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
    "cell_volume_rate_from_logs",
    "cell_volumes",
    "cells",
    "fit_support",
    "linear_law_slope",
    "log_packing_number",
    "n_star",
    "precision_eps",
    "slope_bound",
    "support_from_final_norm",
    "supports",
    "theorem45_log_count",
    "threshold_length_unbounded",
    "volumes",
    "adapters",
    "cramming",
    "copying",
    "report",
    "cli",
    "parallel",
]
