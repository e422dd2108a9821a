"""embgeom: the geometry of a language model's embedding space, turned into hard limits on
what the model can generate.

Data flows one way: model -> (unembedding, hidden states) -> (cells, supports) -> bounds ->
report. Only :mod:`embgeom.adapters`, :mod:`embgeom.cramming` and :mod:`embgeom.copying` import
torch; the geometry works on numpy arrays.

Reference: M. Meyer, M. Michelessa, C. Chaux, V. Y. F. Tan, "How Many Different Outputs Can a
Transformer Generate?", ICML 2026 (arXiv 2605.22223).
"""

__version__ = "0.1.0"
