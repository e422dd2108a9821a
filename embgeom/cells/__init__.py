"""Decoder cells ``E_t``: greedy assignment, margins, unargmaxable tokens, Chebyshev centres.

The decoder cell of token ``t`` is ``E_t = {h : z_t(h) >= z_s(h) for all s}`` with logits
``z = W h + b`` (``W`` the unembedding, ``b`` its bias). Cells are convex polyhedra; with ``b = 0``
they are convex cones with apex at the origin. They form a *power diagram*, not the Euclidean
nearest-row (Voronoi) diagram of the rows of ``W``::

    argmax_t (w_t . h + b_t) = argmin_t (|h - w_t|^2 - |w_t|^2 - 2 b_t)

(docs/theory.md, section 1 "Cells, and the power diagram behind them"), so the two partitions agree only when every ``|w_t|^2 + 2 b_t`` is
the same. ``method="nearest"`` of :meth:`Decoder.assign` exists for comparison with earlier work
that estimated "Voronoi" volumes.

Reference: M. Meyer et al., "How Many Different Outputs Can a Transformer Generate?", ICML 2026,
Sec. 4 (decoder cells); unargmaxable tokens: Grivas et al., ACL 2022; Demeter et al., ACL 2020.

Layout (data flows one way: ``_rows`` <- ``_region`` <- ``_scan`` <- ``_decoder``):

- ``_decoder``: :class:`Decoder` (blocked float32 assignment, margins, top-2; the public door
  to the cell facts below);
- ``_scan``: the exact unargmaxable scan in named phases (prepare once, witnesses, LPs);
- ``_region``: the region where ``h`` may lie at unit scale, :func:`max_margin_lp` (the one
  cutting-plane LP), the Chebyshev centre and :func:`cone_is_empty`;
- ``_rows``: :func:`distinct_rows`, :data:`STATUS_NAMES`, :class:`UnargmaxableResult`.
"""

from __future__ import annotations

from ._decoder import POINT_BLOCK, VOCAB_BLOCK, Decoder
from ._region import cone_is_empty, max_margin_lp
from ._rows import STATUS_NAMES, UnargmaxableResult, distinct_rows

__all__ = ["Decoder", "UnargmaxableResult", "STATUS_NAMES", "distinct_rows", "max_margin_lp",
           "cone_is_empty", "POINT_BLOCK", "VOCAB_BLOCK"]
