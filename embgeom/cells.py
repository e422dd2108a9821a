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
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from . import _kernels
from ._validation import check_array, check_positive, check_positive_int

__all__ = ["Decoder", "UnargmaxableResult"]

#: Default number of points per block of the blocked logits product (tuned on 2 cores, see
#: ``benchmarks/bench_cell_volumes.py``).
POINT_BLOCK = 1024
#: Default number of tokens per block (the (POINT_BLOCK, VOCAB_BLOCK) float32 logits buffer is
#: 16 MiB: it stays in the last-level cache between the product and the kernel; larger blocks
#: keep the BLAS product efficient, measured best on 2 cores in a sweep of 256..1024 x 1024..8192).
VOCAB_BLOCK = 4096

_UNIT_ROUNDOFF32 = 2.0**-24


def _gamma(n: int, u: float) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: bound on the relative error of an n-term dot product."""
    return n * u / (1.0 - n * u)


class Decoder:
    """The greedy decoder ``t(h) = argmax_t (W h + b)_t`` and its cells.

    Parameters
    ----------
    W : array_like of float32 or float64, shape (n_tokens, d)
        The unembedding (one row per token). Stored as float32, the precision the assignment is
        computed in (float64 input is cast; the rounding is below anything a float32 model can
        resolve). The exact tests of :meth:`unargmaxable` and :meth:`chebyshev_center` use the
        stored float32 values promoted to float64.
    bias : array_like of float, shape (n_tokens,), optional
        The output bias ``b``. ``None`` (default) means ``b = 0``: every cell is then a cone.
    point_block, vocab_block : int, optional
        Block sizes of the blocked product (points per block, tokens per block). The defaults
        keep one float32 logits block in cache.

    Attributes
    ----------
    W_ : numpy.ndarray of float32, shape (n_tokens, d)
    bias_ : numpy.ndarray of float32, shape (n_tokens,), or None
    n_tokens : int
    dim : int

    Raises
    ------
    TypeError
        ``W`` or ``bias`` not a real floating-point array (float16 and integers refused).
    ValueError
        NaN/inf, empty ``W``, ``bias`` of the wrong length, bad block sizes.

    Notes
    -----
    Ties go to the lowest token id everywhere (assignment, margins, the definition of
    "argmaxable"), as ``numpy.argmax`` and greedy decoding in every framework do.

    Examples
    --------
    >>> import numpy as np
    >>> from embgeom.cells import Decoder
    >>> dec = Decoder(np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=np.float32))
    >>> dec.assign(np.array([[2.0, 1.0], [-2.0, -3.0], [0.5, 1.0]])).tolist()
    [0, 2, 1]

    A tie (here all three logits are 0) goes to the lowest token id:

    >>> dec.assign(np.zeros((1, 2))).tolist()
    [0]
    """

    def __init__(self, W, bias=None, *, point_block: int = POINT_BLOCK, vocab_block: int = VOCAB_BLOCK):
        W = check_array(W, "W", ndim=2, dtype=None)
        if W.shape[1] == 0:
            raise ValueError(f"W: expected at least one column (d >= 1), got shape {W.shape}")
        self.W_ = np.ascontiguousarray(W, dtype=np.float32)
        if not np.isfinite(self.W_).all():
            raise ValueError("W: overflows float32 (values beyond 3.4e38)")
        if bias is None:
            self.bias_ = None
        else:
            b = check_array(bias, "bias", ndim=1, dtype=None, shape=(W.shape[0],))
            self.bias_ = np.ascontiguousarray(b, dtype=np.float32)
            if not np.isfinite(self.bias_).all():
                raise ValueError("bias: overflows float32")
        self.point_block = check_positive_int(point_block, "point_block")
        self.vocab_block = check_positive_int(vocab_block, "vocab_block")
        self._zero_bias = None
        self._nearest_bias = None
        self._row_norm_max = None
        self._bias_abs_max = 0.0

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_unembedding(cls, u, *, keep_padded: bool = False, **kw) -> "Decoder":
        """Build from an :class:`embgeom.adapters.Unembedding` (or anything with the same fields).

        Parameters
        ----------
        u : object
            Needs ``weight`` (float32, shape (n_rows, d)), ``bias`` ((n_rows,) or None),
            ``vocab_size`` and ``padded_rows``.
        keep_padded : bool, default False
            Padding rows (``n_rows - vocab_size`` rows no tokenizer id reaches) are dropped by
            default, so token ids and cells are those of the real vocabulary. ``True`` keeps
            them (they then take part in the argmax, as they do in the model's raw logits).
        **kw
            Passed to :class:`Decoder` (block sizes).

        Returns
        -------
        Decoder

        Raises
        ------
        TypeError
            ``u`` lacks ``weight``.
        """
        if not hasattr(u, "weight"):
            raise TypeError(f"u: expected an Unembedding (with .weight), got {type(u).__name__}")
        W = u.weight
        b = getattr(u, "bias", None)
        padded = int(getattr(u, "padded_rows", 0) or 0)
        if padded > 0 and not keep_padded:
            n = int(u.vocab_size)
            W = W[:n]
            b = None if b is None else b[:n]
        return cls(W, b, **kw)

    @property
    def n_tokens(self) -> int:
        """Number of tokens ``|V|`` (rows of ``W``)."""
        return int(self.W_.shape[0])

    @property
    def dim(self) -> int:
        """Hidden size ``d``."""
        return int(self.W_.shape[1])

    def __repr__(self) -> str:
        return f"Decoder(n_tokens={self.n_tokens}, d={self.dim}, bias={'yes' if self.bias_ is not None else 'None'})"

    def __getstate__(self) -> dict:
        """Pickle without the cached zero and nearest-neighbour biases (rebuilt on first use)."""
        state = self.__dict__.copy()
        state["_zero_bias"] = state["_nearest_bias"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        """Unpickle. A read-only ``bias_`` is copied (Ray's object store hands out read-only
        numpy buffers and the numba kernels take writable ones); ``W_`` is only read, so it stays
        shared (zero-copy) however large it is."""
        self.__dict__.update(state)
        if self.bias_ is not None and not self.bias_.flags.writeable:
            self.bias_ = self.bias_.copy()

    # ------------------------------------------------------------------ validation helpers
    def _check_H(self, H, name: str = "H") -> np.ndarray:
        H = check_array(H, name, ndim=(1, 2), dtype=None)
        if H.ndim == 1:
            H = H[None, :]
        if H.shape[1] != self.dim:
            raise ValueError(f"{name}: expected hidden states of dimension d={self.dim} (shape (N, {self.dim})), got shape {H.shape}")
        # Cauchy-Schwarz: |w . h + b| <= |w| |h| + |b|; refuse inputs whose float32 logits could overflow
        if self._row_norm_max is None:
            self._row_norm_max = float(np.sqrt(np.einsum("ij,ij->i", self.W_, self.W_, dtype=np.float64).max()))
            self._bias_abs_max = 0.0 if self.bias_ is None else float(np.abs(self.bias_).max())
        hmax = float(np.sqrt(np.einsum("ij,ij->i", H, H, dtype=np.float64).max()))
        if not hmax * self._row_norm_max + self._bias_abs_max < 1e38:
            raise ValueError(
                f"{name}: the float32 logits could overflow (|h| up to {hmax:.3g}, |w| up to "
                f"{self._row_norm_max:.3g}); rescale the hidden states"
            )
        return H

    def _bias_for(self, method: str) -> np.ndarray:
        if method == "argmax":
            if self.bias_ is not None:
                return self.bias_
            if self._zero_bias is None:
                self._zero_bias = np.zeros(self.n_tokens, dtype=np.float32)
            return self._zero_bias
        if method == "nearest":
            # argmin_t |h - w_t|^2 = argmax_t (w_t . h - |w_t|^2 / 2)
            if self._nearest_bias is None:
                sq = np.einsum("ij,ij->i", self.W_.astype(np.float64), self.W_.astype(np.float64))
                self._nearest_bias = (-0.5 * sq).astype(np.float32)
            return self._nearest_bias
        raise ValueError(f"method: expected 'argmax' or 'nearest', got {method!r}")

    # ------------------------------------------------------------------ blocked product
    def _scan(self, H: np.ndarray, bias: np.ndarray, top2: bool, W: np.ndarray | None = None):
        """Blocked ``H @ W.T`` folded into a running argmax (or top-2) per point.

        ``H`` (N, d) float32 or float64 (cast per block); returns float32/int64 arrays.
        """
        W = self.W_ if W is None else W
        N = H.shape[0]
        V = W.shape[0]
        nb = min(self.point_block, N)
        vb = min(self.vocab_block, V)
        best_val = np.full(N, -np.inf, dtype=np.float32)
        best_idx = np.zeros(N, dtype=np.int64)
        if top2:
            best_idx.fill(-1)
            second_val = np.full(N, -np.inf, dtype=np.float32)
            second_idx = np.full(N, -1, dtype=np.int64)
        bufs: dict = {}
        for p0 in range(0, N, nb):
            xb = np.ascontiguousarray(H[p0 : p0 + nb], dtype=np.float32)
            rows = xb.shape[0]
            for v0 in range(0, V, vb):
                wb = W[v0 : v0 + vb]
                shape = (rows, wb.shape[0])
                buf = bufs.get(shape)
                if buf is None:
                    buf = bufs[shape] = np.empty(shape, dtype=np.float32)
                np.matmul(xb, wb.T, out=buf)
                if top2:
                    _kernels.running_top2_update(
                        buf, bias[v0 : v0 + vb], v0, best_val[p0 : p0 + rows], best_idx[p0 : p0 + rows],
                        second_val[p0 : p0 + rows], second_idx[p0 : p0 + rows],
                    )
                else:
                    _kernels.running_argmax_update(
                        buf, bias[v0 : v0 + vb], v0, best_val[p0 : p0 + rows], best_idx[p0 : p0 + rows]
                    )
        if not np.isfinite(best_val).all() or (top2 and V > 1 and not np.isfinite(second_val).all()):
            raise ValueError(
                "H: the float32 logits overflow (|W h + b| beyond 3.4e38); rescale the hidden states"
            )
        if top2:
            return best_val, best_idx, second_val, second_idx
        return best_val, best_idx

    # ------------------------------------------------------------------ public API
    def assign(self, H, method: str = "argmax") -> np.ndarray:
        """The cell (greedy next token) of each hidden state.

        Parameters
        ----------
        H : array_like of float32 or float64, shape (N, d) or (d,)
            Hidden states (after the final norm).
        method : {"argmax", "nearest"}, default "argmax"
            ``"argmax"``: ``argmax_t (w_t . h + b_t)``, the decoder cell. ``"nearest"``: the
            Euclidean nearest row ``argmin_t |h - w_t|`` (a Voronoi cell, ignoring ``b``), for
            comparison with earlier work only; computed as ``argmax_t (w_t . h - |w_t|^2 / 2)``.

        Returns
        -------
        numpy.ndarray of int64, shape (N,)
            Token ids. Ties go to the lowest token id.

        Raises
        ------
        TypeError
            ``H`` not a real float array (float16, integers refused).
        ValueError
            NaN/inf, wrong dimension, empty, unknown ``method``, float32 overflow of the logits.

        Notes
        -----
        Cost: one ``N x d x |V|`` float32 product, computed in blocks of ``point_block`` points by
        ``vocab_block`` tokens (BLAS) and folded into a running argmax by a numba kernel
        (:func:`embgeom._kernels.running_argmax_update`); the ``(N, |V|)`` logits are never
        held. Logits are float32, as in a float32 model.
        """
        bias = self._bias_for(method)
        H = self._check_H(H)
        return self._scan(H, bias, top2=False)[1]

    def margins(self, H) -> np.ndarray:
        """Top-1 minus top-2 logit of each hidden state (0 on a tie; ``inf`` when ``|V| = 1``).

        Parameters
        ----------
        H : array_like of float, shape (N, d) or (d,)

        Returns
        -------
        numpy.ndarray of float32, shape (N,)
            ``z_(1) - z_(2) >= 0`` in logit units (nats of the softmax's log-odds).

        Raises
        ------
        TypeError, ValueError
            As :meth:`assign`.
        """
        H = self._check_H(H)
        b1, _, b2, _ = self._scan(H, self._bias_for("argmax"), top2=True)
        return (b1 - b2).astype(np.float32)

    def top2(self, H):
        """Top-1 and top-2 logits and tokens of each hidden state.

        Parameters
        ----------
        H : array_like of float, shape (N, d) or (d,)

        Returns
        -------
        best_val : float32 (N,)
        best_idx : int64 (N,)
            Same as :meth:`assign` (ties to the lowest id).
        second_val : float32 (N,)
        second_idx : int64 (N,)
            The runner-up (the next lowest id on a tie); ``-1`` when ``|V| = 1``.

        Raises
        ------
        TypeError, ValueError
            As :meth:`assign`.
        """
        H = self._check_H(H)
        return self._scan(H, self._bias_for("argmax"), top2=True)

    # ------------------------------------------------------------------ exact cell facts
    def unargmaxable(
        self,
        support=None,
        *,
        tokens=None,
        witness_steps: int = 30,
        batch_size: int = 256,
        max_lp: int | None = None,
        lp_time_limit: float = 300.0,
        tol: float = 1e-9,
        progress: bool = True,
    ) -> "UnargmaxableResult":
        """The tokens whose cell is empty (never the greedy output), decided exactly.

        A token ``t`` is *argmaxable* when some ``h`` (in the support, if given) makes it the
        strict winner, ``z_t(h) > z_s(h)`` for every token ``s`` whose row ``(w_s, b_s)`` differs
        from ``(w_t, b_t)``, and ``t`` is the lowest id among exact duplicate rows (ties go to
        the lowest id). Equivalently, the region where ``t`` is the greedy output has positive
        volume. Otherwise it is *unargmaxable*: ``t`` can only win on a set of measure zero (a
        face shared with another cell, e.g. a row lying on an edge of the convex hull, or the
        origin when ``b = 0``) or never. With ``b = 0`` the cells are cones and ``t`` is
        argmaxable iff ``w_t`` is a vertex of the convex hull of the rows (Gordan's theorem:
        otherwise ``w_t`` is a convex combination of the others), so a row planted inside the
        hull is unargmaxable.

        Procedure (exact, cheapest first):

        1. exact duplicate rows: all but the lowest id are unargmaxable (``"duplicate"``);
        2. witnesses: for each token, candidate points (``w_t - mean(W)``, ``w_t``, then
           ``witness_steps`` steps of normalised margin ascent ``h <- h + eta (w_t - w_c)``
           towards the current strongest competitor ``c``), checked in batches with the fast
           float32 top-2 kernel. A candidate counts only if the float32 margin exceeds the
           worst-case rounding error ``2 gamma_d max_s |w_s| |h| + ...`` (Higham's bound), so a
           witness is a proof (``"witness"``);
        3. a linear program (scipy ``linprog``, HiGHS) for every token left:
           ``maximise s subject to (w_t - w_s) . h + (b_t - b_s) tau >= s`` for all ``s``, with
           ``h`` in the box ``[-1, 1]^d`` (or the support's box) and, when ``b != 0`` and there is
           no support, the homogenising variable ``0 <= tau <= 1``. Solved by cutting planes:
           the LP over the most violated constraints is re-solved, the solution checked against
           every token in float64, the worst violators added, until the relaxed optimum is
           ``<= tol`` (a certificate of emptiness for the full LP: ``"lp_empty"``) or the point
           wins strictly against all tokens (``"lp_witness"``).

        Parameters
        ----------
        support : Support, optional
            Restrict ``h`` to a support. Exact for a support given by linear constraints
            (``support.lp_region()`` not None: a :class:`~embgeom.supports.Box`, rotated or not)
            and, when ``bias`` is None, for any support with ``support.star_about_origin()``
            (origin-centred ball, origin-centred ellipsoid, the RMSNorm final-norm shell without
            bias): cells are cones, so the answer is that of the whole space. Other supports
            (and a LayerNorm shell, which is flat) raise ``TypeError``.
        tokens : array_like of int, optional
            Only decide these token ids (default all).
        witness_steps : int, default 30
            Margin-ascent steps before falling back to LPs.
        batch_size : int, default 256
            Tokens per batch in the witness phase.
        max_lp : int, optional
            Cap on the number of tokens sent to the LP; the rest are ``"undecided"``.
        lp_time_limit : float, default 300
            Seconds per token's cutting-plane loop before it is ``"undecided"``.
        tol : float, default 1e-9
            Relaxed LP optimum below which the cell is declared empty (the solver's own
            feasibility tolerance is 1e-9; a cell whose depth is within ``tol`` is a boundary
            case and is reported empty).
        progress : bool, default True
            tqdm progress bars.

        Returns
        -------
        UnargmaxableResult

        Raises
        ------
        TypeError
            Unsupported support type; bad argument types.
        ValueError
            Support of another dimension; token ids out of range.
        """
        witness_steps = check_positive_int(witness_steps, "witness_steps", minimum=0)
        batch_size = check_positive_int(batch_size, "batch_size")
        if max_lp is not None:
            max_lp = check_positive_int(max_lp, "max_lp", minimum=0)
        lp_time_limit = check_positive(lp_time_limit, "lp_time_limit")
        tol = check_positive(tol, "tol", allow_zero=True)
        return _scan_unargmaxable(
            self, support, tokens=tokens, witness_steps=witness_steps, batch_size=batch_size,
            max_lp=max_lp, lp_time_limit=lp_time_limit, tol=tol, progress=progress,
        )

    def chebyshev_center(self, t, support=None, *, radius: float = 1.0, max_iter: int = 200):
        """The deepest point of the cell ``E_t``: the centre of the largest ball inside it.

        Solves ``maximise r subject to (w_t - w_s) . h + (b_t - b_s) >= r |w_t - w_s|`` for all
        ``s`` with a differing row, with ``h`` in the region (Boyd & Vandenberghe, Convex
        Optimization, Sec. 8.5.1), by cutting planes over the most violated constraints
        (HiGHS), each iterate checked against every token in float64.

        Parameters
        ----------
        t : int
            Token id.
        support : Box, optional
            Bounding region. Default: the box ``[-radius, radius]^d`` (cells with ``b = 0`` are
            unbounded cones: the centre is then the deepest point of the cone inside that box).
            A support with linear constraints (``support.lp_region()``: a
            :class:`~embgeom.supports.Box`) adds them; other supports raise ``TypeError``.
        radius : float, default 1.0
            Half-width of the default box.
        max_iter : int, default 200
            Cutting-plane iterations.

        Returns
        -------
        center : numpy.ndarray of float64, shape (d,)
        depth : float
            Radius ``r`` of the largest ball inside the cell (and the region); ``<= 0`` means the
            cell has an empty interior (unargmaxable), in which case ``center`` is the point of
            least violation.

        Raises
        ------
        TypeError
            Unsupported support.
        ValueError
            ``t`` out of range, support of another dimension, no convergence.
        """
        radius = check_positive(radius, "radius")
        max_iter = check_positive_int(max_iter, "max_iter")
        return _chebyshev_center(self, t, support, radius=radius, max_iter=max_iter)


#: Status codes of :class:`UnargmaxableResult`.
STATUS_NAMES = ("witness", "lp_witness", "lp_empty", "duplicate", "undecided", "skipped")


@dataclass
class UnargmaxableResult:
    """Outcome of :meth:`Decoder.unargmaxable`.

    Attributes
    ----------
    tokens : numpy.ndarray of int64
        Sorted ids of the unargmaxable tokens (status ``"lp_empty"`` or ``"duplicate"``).
    status : numpy.ndarray of int8, shape (n_tokens,)
        Per-token code, an index into :data:`STATUS_NAMES`: 0 ``witness`` (argmaxable, a
        witness point found by the fast pass), 1 ``lp_witness`` (argmaxable, found by the LP),
        2 ``lp_empty`` (unargmaxable, LP certificate), 3 ``duplicate`` (unargmaxable: an exact
        duplicate of a lower-id row), 4 ``undecided`` (LP cap or time limit reached), 5
        ``skipped`` (not in ``tokens``).
    n_lp : int
        Tokens that needed a linear program.
    n_undecided : int
        Tokens left undecided.
    seconds : float
        Wall time.
    support : str
        ``"none"`` or the support's class name (``"Box"``, ``"Ball"``, ...).
    """

    tokens: np.ndarray
    status: np.ndarray
    n_lp: int
    n_undecided: int
    seconds: float
    support: str = "none"
    extra: dict = field(default_factory=dict)

    @property
    def n_unargmaxable(self) -> int:
        """Number of unargmaxable tokens."""
        return int(self.tokens.size)

    @property
    def undecided(self) -> np.ndarray:
        """Ids of the undecided tokens (int64)."""
        return np.flatnonzero(self.status == STATUS_NAMES.index("undecided")).astype(np.int64)

    def status_of(self, t: int) -> str:
        """The status name of token ``t``."""
        return STATUS_NAMES[int(self.status[t])]

    def to_dict(self) -> dict:
        """JSON-able summary (counts per status, the unargmaxable ids, timings)."""
        counts = {name: int((self.status == i).sum()) for i, name in enumerate(STATUS_NAMES)}
        return {
            "n_unargmaxable": self.n_unargmaxable,
            "unargmaxable": self.tokens.tolist(),
            "n_lp": int(self.n_lp),
            "n_undecided": int(self.n_undecided),
            "undecided": self.undecided.tolist()[:1000],
            "status_counts": counts,
            "seconds": float(self.seconds),
            "support": self.support,
            **self.extra,
        }


# ---------------------------------------------------------------------------------------------
# exact scan: regions, witnesses, cutting-plane linear programs
# ---------------------------------------------------------------------------------------------
@dataclass
class _Region:
    """Where ``h`` may lie, in region coordinates ``y`` (``h = y @ R`` for a rotated box)."""

    Wr: np.ndarray  # float64 (V, d): rows in region coordinates
    c: np.ndarray | None  # float64 (V,) bias, or None
    lb: np.ndarray  # float64 (d,)
    ub: np.ndarray  # float64 (d,)
    homog: bool  # free space with a bias: homogenising variable tau in [0, 1]
    R: np.ndarray | None  # rotation (rows = box axes) or None
    name: str
    directions: bool  # witnesses are directions of a cone (bias ignored), not points


def _region(dec: Decoder, support, W64: np.ndarray, b64: np.ndarray | None, *, radius: float = 1.0) -> _Region:
    """Where the exact scan looks: the support answers through ``lp_region()`` (a box of linear
    constraints) or ``star_about_origin()`` (a bias-free decoder's cells are cones)."""
    d = W64.shape[1]
    ones = np.ones(d)
    if support is None:
        return _Region(W64, b64, -radius * ones, radius * ones, b64 is not None, None, "none", True)
    if not all(hasattr(type(support), m) for m in ("lp_region", "star_about_origin")):
        raise TypeError(
            "support: expected an embgeom.supports.Support (with .dim, .lp_region(), "
            f".star_about_origin()), got {type(support).__name__}"
        )
    if int(support.dim) != d:
        raise ValueError(f"support: has dimension {support.dim}, the decoder's hidden size is d={d}")
    label = type(support).__name__
    box = support.lp_region()
    if box is not None:
        R = box.rotation
        lb = np.asarray(box.lower, dtype=np.float64)
        ub = np.asarray(box.upper, dtype=np.float64)
        Wr = W64 if R is None else W64 @ np.asarray(R, dtype=np.float64).T
        return _Region(np.ascontiguousarray(Wr), b64, lb, ub, False, R, label, False)
    if b64 is None and support.star_about_origin():
        # cells are cones with apex 0 and the support meets every ray from an interior origin:
        # a cell meets the support's interior iff it has an interior at all
        return _Region(W64, None, -radius * ones, radius * ones, False, None, label, True)
    raise TypeError(
        f"support: the exact scan handles no support, a support with linear constraints (Box), or "
        f"(bias None) a support star-shaped about an interior origin (origin-centred ball or "
        f"ellipsoid, RMSNorm final-norm shell without bias); got {label}"
        + (" with a bias" if b64 is not None else "")
    )


def _unique_rows(W32: np.ndarray, b32: np.ndarray | None):
    """Ids of the first occurrence of each distinct row ``(w_t, b_t)`` (sorted) and, per token, its representative."""
    key = W32 + np.float32(0.0)  # -0.0 -> +0.0
    if b32 is not None:
        key = np.hstack([key, (b32 + np.float32(0.0))[:, None]])
    key = np.ascontiguousarray(key)
    void = key.view(np.dtype((np.void, key.dtype.itemsize * key.shape[1]))).ravel()
    _, first, inverse = np.unique(void, return_index=True, return_inverse=True)
    rep = first[inverse.ravel()].astype(np.int64)
    return np.sort(first).astype(np.int64), rep


def _witness_pass(dec_u: Decoder, Y: np.ndarray, ts: np.ndarray, region: _Region, bias_max: float, row_max: float):
    """Check candidate points (region coordinates) for a batch; returns (ok, best_idx, second_idx)."""
    H = Y if region.R is None else Y @ region.R
    H32 = H.astype(np.float32)
    b1, i1, b2, i2 = dec_u.top2(H32)
    hn = np.linalg.norm(H32.astype(np.float64), axis=1)
    err = _gamma(dec_u.dim + 2, _UNIT_ROUNDOFF32) * (row_max * hn + bias_max) * 1.01 + 1e-30
    ok = (i1 == ts) & ((b1.astype(np.float64) - b2.astype(np.float64)) > 2.0 * err)
    if not region.directions:  # points in a box region: they must lie inside it
        lb, ub = region.lb, region.ub
        Yc = H32.astype(np.float64) if region.R is None else H32.astype(np.float64) @ region.R.T
        ok &= np.all((Yc >= lb) & (Yc <= ub), axis=1)
    return ok, i1, i2


def _box_points(D: np.ndarray, region: _Region, corner: bool) -> np.ndarray:
    """Points inside the box along directions ``D`` from its centre (0.999 of the way to the wall)."""
    centre = 0.5 * (region.lb + region.ub)
    half = 0.5 * (region.ub - region.lb)
    if corner:
        return centre + 0.999 * half * np.sign(D)
    scale = np.max(np.abs(D) / np.maximum(half, 1e-300), axis=1, keepdims=True)
    scale[scale == 0] = 1.0
    return centre + 0.999 * D / scale


def _lp_token(region: _Region, t: int, S0: np.ndarray, tol: float, time_limit: float, k_add: int):
    """Cutting-plane LP for token ``t`` (an index into ``region.Wr``). Returns (status, y, n_iter)."""
    from scipy.optimize import linprog

    Wr, c = region.Wr, region.c
    V, d = Wr.shape
    wt = Wr[t]
    ct = 0.0 if c is None else c[t]
    S = np.unique(S0[(S0 >= 0) & (S0 != t)])
    homog = region.homog
    n = d + (1 if homog else 0) + 1
    bounds = [(float(lo), float(hi)) for lo, hi in zip(region.lb, region.ub)]
    if homog:
        bounds.append((0.0, 1.0))
    bounds.append((None, None))
    cost = np.zeros(n)
    cost[-1] = -1.0
    t0 = time.perf_counter()
    gam = _gamma(d + 2, 2.0**-53)
    row_max = float(np.max(np.linalg.norm(Wr, axis=1)))
    bias_max = 0.0 if c is None else float(np.max(np.abs(c)))
    for it in range(1, 10_000):
        A = np.empty((S.size, n))
        A[:, :d] = Wr[S] - wt
        if homog:
            A[:, d] = c[S] - ct
            rhs = np.zeros(S.size)
        else:
            rhs = np.zeros(S.size) if c is None else ct - c[S]
        A[:, -1] = 1.0
        left = time_limit - (time.perf_counter() - t0)
        if left <= 0:
            return "undecided", None, it
        res = linprog(cost, A_ub=A, b_ub=rhs, bounds=bounds, method="highs", options={"time_limit": left})
        if res.status != 0:
            return "undecided", None, it
        s_opt = -res.fun
        if s_opt <= tol:
            return "lp_empty", None, it
        x = res.x
        y = x[:d]
        tau = x[d] if homog else 1.0
        m = Wr @ (-y) + wt @ y  # (w_t - w_s) . y for all s
        if c is not None:
            m += tau * (ct - c)
        m[t] = np.inf
        err = 4.0 * gam * (row_max * float(np.linalg.norm(y)) + bias_max) + 1e-300
        if m.min() > err:
            return "lp_witness", y, it
        # add the most violated constraints not yet present
        order = np.argsort(m)[: k_add + S.size]
        new = np.setdiff1d(order[m[order] <= max(s_opt, err)], S, assume_unique=False)[:k_add]
        if new.size == 0:
            return "undecided", y, it
        S = np.union1d(S, new)
    return "undecided", None, it


def _scan_unargmaxable(dec: Decoder, support, *, tokens, witness_steps, batch_size, max_lp, lp_time_limit, tol, progress):
    from tqdm.auto import tqdm

    t_start = time.perf_counter()
    V, d = dec.n_tokens, dec.dim
    status = np.full(V, STATUS_NAMES.index("skipped"), dtype=np.int8)
    if tokens is None:
        want = np.arange(V, dtype=np.int64)
    else:
        want = np.asarray(tokens)
        if want.dtype.kind not in "iu" or want.ndim != 1:
            raise TypeError("tokens: expected a 1-d array of integer token ids")
        want = np.unique(want.astype(np.int64))
        if want.size and (want[0] < 0 or want[-1] >= V):
            raise ValueError(f"tokens: ids must lie in [0, {V}), got {want[0]}..{want[-1]}")
    uniq, rep = _unique_rows(dec.W_, dec.bias_)
    W64 = dec.W_[uniq].astype(np.float64)
    b64 = None if dec.bias_ is None else dec.bias_[uniq].astype(np.float64)
    region = _region(dec, support, W64, b64)
    dup = want[rep[want] != want]
    status[dup] = STATUS_NAMES.index("duplicate")
    todo_ids = want[rep[want] == want]
    pos = np.searchsorted(uniq, todo_ids)  # index into the unique rows
    n_u = uniq.size
    extra = {"n_distinct_rows": int(n_u)}
    if n_u == 1:
        status[todo_ids] = STATUS_NAMES.index("witness")
        pos = pos[:0]
    # the fast float32 decoder over the distinct rows (bias ignored when witnesses are directions)
    dec_u = Decoder(dec.W_[uniq], None if region.directions or dec.bias_ is None else dec.bias_[uniq],
                    point_block=dec.point_block, vocab_block=dec.vocab_block)
    row_max = float(np.max(np.linalg.norm(W64, axis=1)))
    bias_max = 0.0 if (region.directions or b64 is None) else float(np.max(np.abs(b64)))
    Wr = region.Wr
    mu = Wr.mean(axis=0)
    cov = np.cov(Wr.T) if n_u > 1 else np.eye(d)
    cov = np.atleast_2d(cov)
    ridge = 1e-6 * max(float(np.trace(cov)) / d, 1e-30)
    Cinv = np.linalg.inv(cov + ridge * np.eye(d))

    won = np.zeros(pos.size, dtype=bool)
    last = np.zeros((pos.size, d))
    bar = tqdm(total=int(pos.size), desc="unargmaxable: witnesses", unit="tok", disable=not progress)
    for s0 in range(0, pos.size, batch_size):
        idx = pos[s0 : s0 + batch_size]
        D0 = (Wr[idx] - mu) @ Cinv
        cands = [D0, Wr[idx] - mu, Wr[idx]]
        ok_b = np.zeros(idx.size, dtype=bool)
        cur = D0.copy()
        comp = None
        for D in cands:
            sub = np.flatnonzero(~ok_b)
            if sub.size == 0:
                break
            if region.directions:
                Ys = [D[sub]]
            else:
                Ys = [_box_points(D[sub], region, corner=False), _box_points(D[sub], region, corner=True)]
            for k, Y in enumerate(Ys):
                live = ~ok_b[sub]
                if not live.any():
                    break
                ok, i1, i2 = _witness_pass(dec_u, Y[live], idx[sub[live]], region, bias_max, row_max)
                ok_b[sub[live][ok]] = True
                if comp is None:  # first pass: every token of the batch, at the whitened point
                    comp = np.where(i1 == idx, i2, i1)
        # margin ascent from the whitened direction for the stragglers
        rest = np.flatnonzero(~ok_b)
        if rest.size and witness_steps and comp is not None:
            if region.directions:
                h = cur[rest] / np.maximum(np.linalg.norm(cur[rest], axis=1, keepdims=True), 1e-300)
            else:
                h = _box_points(cur[rest], region, corner=False)
            cpt = comp[rest]
            alive = np.ones(rest.size, dtype=bool)
            for step in range(witness_steps):
                cand = np.flatnonzero(alive)
                if cand.size == 0:
                    break
                g = Wr[idx[rest[cand]]] - Wr[np.maximum(cpt[cand], 0)]
                g /= np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-300)
                eta = 0.3 / math.sqrt(step + 1)
                if region.directions:
                    hn = h[cand] + eta * g
                    hn /= np.maximum(np.linalg.norm(hn, axis=1, keepdims=True), 1e-300)
                else:
                    centre = 0.5 * (region.lb + region.ub)
                    half = 0.5 * (region.ub - region.lb)
                    hn = centre + np.clip(h[cand] - centre + eta * half * g / np.maximum(np.abs(g).max(axis=1, keepdims=True), 1e-300),
                                          -0.999 * half, 0.999 * half)
                h[cand] = hn
                ok, i1, i2 = _witness_pass(dec_u, hn, idx[rest[cand]], region, bias_max, row_max)
                alive[cand[ok]] = False
                ok_b[rest[cand[ok]]] = True
                cpt[cand] = np.where(i1 == idx[rest[cand]], i2, i1)
            last[s0 + rest] = h
        won[s0 : s0 + idx.size] = ok_b
        still = np.flatnonzero(~ok_b)
        if still.size and not (rest.size and witness_steps):
            last[s0 + still] = D0[still]
        bar.update(idx.size)
    bar.close()
    status[uniq[pos[won]]] = STATUS_NAMES.index("witness")

    # linear programs for the tokens without a witness
    need = np.flatnonzero(~won)
    n_lp = 0
    if need.size:
        if max_lp is not None and need.size > max_lp:
            status[uniq[pos[need[max_lp:]]]] = STATUS_NAMES.index("undecided")
            need = need[:max_lp]
        k0 = min(n_u - 1, max(d // 2, 64))
        k_add = min(n_u - 1, 64)
        bar = tqdm(total=int(need.size), desc="unargmaxable: LPs", unit="tok", disable=not progress)
        iters = []
        for s0 in range(0, need.size, 64):
            chunk = need[s0 : s0 + 64]
            Y = last[chunk]
            scores = Y @ Wr.T
            if region.c is not None and not region.directions:
                scores += region.c
            S0s = _kernels.topk_competitors(np.ascontiguousarray(scores), pos[chunk].astype(np.int64), int(k0))
            for j, q in enumerate(chunk):
                t_u = int(pos[q])
                st, _, it = _lp_token(region, t_u, S0s[j], tol, lp_time_limit, k_add)
                iters.append(it)
                status[uniq[t_u]] = STATUS_NAMES.index(st)
                n_lp += 1
                bar.update(1)
        bar.close()
        extra["lp_iterations_mean"] = float(np.mean(iters)) if iters else 0.0
    empty = np.isin(status, [STATUS_NAMES.index("lp_empty"), STATUS_NAMES.index("duplicate")])
    n_und = int((status == STATUS_NAMES.index("undecided")).sum())
    return UnargmaxableResult(
        tokens=np.flatnonzero(empty).astype(np.int64), status=status, n_lp=n_lp, n_undecided=n_und,
        seconds=time.perf_counter() - t_start, support=region.name, extra=extra,
    )


def _chebyshev_center(dec: Decoder, t, support, *, radius: float, max_iter: int):
    from scipy.optimize import linprog

    V, d = dec.n_tokens, dec.dim
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
        raise TypeError(f"t: expected an integer token id, got {type(t).__name__}")
    t = int(t)
    if not 0 <= t < V:
        raise ValueError(f"t: expected a token id in [0, {V}), got {t}")
    W64 = dec.W_.astype(np.float64)
    b64 = None if dec.bias_ is None else dec.bias_.astype(np.float64)
    region = _region(dec, support, W64, b64, radius=radius)
    if support is not None and region.directions:
        raise TypeError("support: chebyshev_center handles None (a box of half-width radius) or a "
                        "support with linear constraints (Box)")
    Wr, c = region.Wr, region.c
    wt = Wr[t]
    ct = 0.0 if c is None else c[t]
    diff = wt - Wr
    norms = np.linalg.norm(diff, axis=1)
    cdiff = np.zeros(V) if c is None else ct - c
    active = norms > 0  # exact duplicates of t impose nothing (ties go to the lowest id)
    # start from the top competitors at the centre of the box along w_t - mean
    centre = 0.5 * (region.lb + region.ub)
    y0 = centre + 0.5 * (wt - Wr.mean(axis=0))
    slack0 = diff @ y0 + cdiff
    cand = np.flatnonzero(active)
    S = cand[np.argsort(slack0[cand] / norms[cand])[: min(cand.size, 2 * d + 16)]]
    bounds = [(None, None)] * d + [(None, None)]
    cost = np.zeros(d + 1)
    cost[-1] = -1.0
    # ball inside the box: y_i + r <= ub_i, -y_i + r <= -lb_i
    Abox = np.zeros((2 * d, d + 1))
    Abox[:d, :d] = np.eye(d)
    Abox[d:, :d] = -np.eye(d)
    Abox[:, -1] = 1.0
    bbox = np.concatenate([region.ub, -region.lb])
    for _ in range(max_iter):
        A = np.empty((S.size, d + 1))
        A[:, :d] = -diff[S]
        A[:, -1] = norms[S]
        res = linprog(cost, A_ub=np.vstack([A, Abox]), b_ub=np.concatenate([cdiff[S], bbox]), bounds=bounds, method="highs")
        if res.status != 0:
            raise ValueError(f"chebyshev_center: the LP failed ({res.message})")
        y, r = res.x[:d], res.x[-1]
        viol = diff @ y + cdiff - r * norms
        viol[~active] = np.inf
        scale = 1e-9 * (1.0 + np.abs(y).max() * norms.max())
        bad = np.flatnonzero(viol < -scale)
        bad = np.setdiff1d(bad[np.argsort(viol[bad])][: max(d // 2, 32)], S)
        if bad.size == 0:
            h = y if region.R is None else y @ region.R
            return h, float(r)
        S = np.union1d(S, bad)
    raise ValueError(f"chebyshev_center: no convergence in {max_iter} cutting-plane iterations")
