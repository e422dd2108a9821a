"""The greedy decoder ``t(h) = argmax_t (W h + b)_t``: assignment, margins, top-2, cell facts.

See :mod:`embgeom.cells` for what the cells are; the exact scan lives in
:mod:`embgeom.cells._scan` and the LP machinery in :mod:`embgeom.cells._region`.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .. import _kernels
from .._special import row_norms
from .._validation import check_array, check_positive, check_positive_int
from ._region import _chebyshev_center
from ._rows import UnargmaxableResult, distinct_rows
from ._scan import scan

__all__ = ["Decoder", "POINT_BLOCK", "VOCAB_BLOCK"]

#: Default number of points per block of the blocked logits product (tuned on 2 cores, see
#: ``benchmarks/bench_cell_volumes.py``).
POINT_BLOCK = 2048
#: Default number of tokens per block: the (POINT_BLOCK, VOCAB_BLOCK) float32 logits buffer is
#: 128 MiB, kept between calls (one per thread, see ``Decoder._scratch_buffer``); the block
#: sizes and their measured speed against the plain blocked GEMM are in ``docs/performance.md``
#: (``benchmarks/bench_cell_volumes.py``).
VOCAB_BLOCK = 16384

#: Rows whose Cauchy-Schwarz bound on ``|W h + b|`` reaches this go to the float64 path.
_FLOAT32_SAFE = 1e38
#: With a bias, rows holding a nonzero ``|h_k|`` below this go to the float64 path (float32
#: keeps its 24 significant bits, and products with ``w`` stay normal, above it).
_FLOAT32_FULL_PRECISION = 2.0**-100


def _refuse_float32_underflow(W: np.ndarray, b: np.ndarray | None) -> None:
    """Refuse float64 entries of ``W`` or ``b`` that are nonzero but below float32's normal
    range (1.2e-38).

    The decoder stores ``W`` and ``b`` in float32; such entries would become 0 or lose their
    significant bits, silently changing the cells (``W * 1e-46`` would be all zeros). The
    message says what rescaling keeps the cells: a positive factor on ``W`` alone for a
    bias-free decoder (its cells are cones), the *same* factor on ``W`` and ``b`` otherwise
    (``argmax_t s (W h + b)_t = argmax_t (W h + b)_t``); rescaling ``b`` alone dilates every cell
    about the origin, which is another decoder. Where the nonzero entries span more than
    float32's range, no common factor exists, and the message says so.
    """
    tiny, big = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
    for x, name in ((W, "W"), (b, "bias")):
        if x is None or x.dtype == np.float32:
            continue
        a = np.abs(x)
        bad = int(np.count_nonzero((a > 0) & (a < tiny)))
        if not bad:
            continue
        msg = (f"{name}: {bad} nonzero entries are below float32's normal range (|x| < 1.2e-38); "
               "the float32 copy would flush them to 0 or round away their digits. ")
        if b is None:
            raise ValueError(msg + "Multiply W by a positive factor: the cells of a bias-free "
                             "decoder are cones, which no positive factor changes")
        nz = np.concatenate([np.abs(W[W != 0]).ravel(), np.abs(b[b != 0])]).astype(np.float64)
        lo, hi = float(nz.min()), float(nz.max())
        msg += ("Multiply W and bias by the same positive factor s (argmax_t s (W h + b)_t is "
                "argmax_t (W h + b)_t, so no cell changes); rescaling bias or W alone changes the "
                "cells. ")
        if hi / lo > big / tiny:
            raise ValueError(
                msg + f"Here no such s exists: the nonzero entries of W and bias span {lo:.3g} to "
                f"{hi:.3g}, a ratio of {hi / lo:.3g}, beyond float32's range (about 2.8e+76), so "
                "no float32 decoder holds both; set the entries meant as 0 to 0")
        k = int(round((math.log2(tiny) + math.log2(big) - math.log2(lo) - math.log2(hi)) / 2))
        raise ValueError(msg + f"E.g. s = 2**{k} puts every nonzero entry of both in range")


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
        An all-zero bias is the same decoder and is stored as ``None`` (so the methods that
        need cone cells, such as rare-event splitting, accept it).
    point_block, vocab_block : int, optional
        Block sizes of the blocked product (points per block, tokens per block). Each thread
        that calls the decoder keeps one float32 logits buffer of ``point_block * vocab_block``
        entries between calls (128 MiB at the defaults; it is not pickled).

    Attributes
    ----------
    W_ : numpy.ndarray of float32, shape (n_tokens, d)
    bias_ : numpy.ndarray of float32, shape (n_tokens,), or None
        None when no bias or an all-zero one was given.
    n_tokens : int
    dim : int

    Raises
    ------
    TypeError
        ``W`` or ``bias`` not a real floating-point array (float16 and integers refused).
    ValueError
        NaN/inf, empty ``W``, ``bias`` of the wrong length, bad block sizes, float64 entries
        beyond float32's range (``|x| > 3.4e38``) or nonzero below its normal range
        (``|x| < 1.2e-38``: they would be flushed or rounded away).

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
        with np.errstate(over="ignore"):
            self.W_ = np.ascontiguousarray(W, dtype=np.float32)
        if not np.isfinite(self.W_).all():
            raise ValueError("W: overflows float32 (values beyond 3.4e38)")
        if bias is None:
            self.bias_ = None
        else:
            b = check_array(bias, "bias", ndim=1, dtype=None, shape=(W.shape[0],))
            with np.errstate(over="ignore"):
                self.bias_ = np.ascontiguousarray(b, dtype=np.float32)
            if not np.isfinite(self.bias_).all():
                raise ValueError("bias: overflows float32")
        _refuse_float32_underflow(W, None if bias is None else b)
        if self.bias_ is not None and not self.bias_.any():
            self.bias_ = None  # b = 0: argmax W h + 0 is argmax W h, the cone cells
        self.point_block = check_positive_int(point_block, "point_block")
        self.vocab_block = check_positive_int(vocab_block, "vocab_block")
        self._zero_bias = None
        self._dups = {}  # method -> (rep, second) for decoders with exact duplicate rows
        self._nearest_bias = None
        self._row_norm_max = None
        self._bias_abs_max = 0.0
        self._scratch = threading.local()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_unembedding(cls, u, *, keep_padded: bool = False, **kw) -> "Decoder":
        """Build from an :class:`embgeom.adapters.Unembedding` (or anything with the same fields).

        Parameters
        ----------
        u : object
            Needs ``weight`` (float32, shape (n_rows, d)), ``bias`` ((n_rows,) or None),
            ``vocab_size`` and ``padded_rows``. With ``effective_weight_bias()`` (an
            :class:`embgeom.adapters.Unembedding`), the decoder is built from the scaled
            ``(s W, s b)``, so margins are in the model's own logit units; the cells do not
            depend on ``s > 0``.
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
        if hasattr(u, "effective_weight_bias"):
            # the model's own logits s (W h + b): margins in its units (Cohere's logit_scale)
            W, b = u.effective_weight_bias()
        else:
            W, b = u.weight, getattr(u, "bias", None)
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
        state.pop("_scratch", None)  # per-thread buffers: neither picklable nor worth shipping
        return state

    def __setstate__(self, state: dict) -> None:
        """Unpickle. ``W_`` and ``bias_`` stay as they come, read-only ones included (Ray's
        object store hands out read-only numpy buffers; every kernel that only reads an array
        is compiled for read-only arrays too, :func:`embgeom._numba.njit`): zero-copy."""
        self.__dict__.update(state)
        self.__dict__.setdefault("_dups", {})

    # ------------------------------------------------------------------ validation helpers
    def _check_H(self, H, name: str = "H") -> np.ndarray:
        H = check_array(H, name, ndim=(1, 2), dtype=None)
        if H.ndim == 1:
            H = H[None, :]
        if H.shape[1] != self.dim:
            raise ValueError(f"{name}: expected hidden states of dimension d={self.dim} (shape (N, {self.dim})), got shape {H.shape}")
        if self._row_norm_max is None:
            self._row_norm_max = float(np.sqrt(np.einsum("ij,ij->i", self.W_, self.W_, dtype=np.float64).max()))
            self._bias_abs_max = 0.0 if self.bias_ is None else float(np.abs(self.bias_).max())
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
                with np.errstate(over="ignore"):
                    self._nearest_bias = (-0.5 * self._nearest_bias64()).astype(np.float32)
            return self._nearest_bias
        raise ValueError(f"method: expected 'argmax' or 'nearest', got {method!r}")

    def _nearest_bias64(self) -> np.ndarray:
        """``|w_t|^2`` in float64, shape (n_tokens,)."""
        return np.einsum("ij,ij->i", self.W_, self.W_, dtype=np.float64)

    def _bias64_for(self, method: str) -> np.ndarray | None:
        """The bias of ``method`` in float64 (``None``: no bias, the scale-free case)."""
        if method == "nearest":
            return -0.5 * self._nearest_bias64()
        return None if self.bias_ is None else self.bias_.astype(np.float64)

    # ------------------------------------------------------------------ scale plan
    def _plan(self, H: np.ndarray, scale_free: bool, bias_max: float):
        """Per-row exponents and the rows that the float32 product cannot take.

        Without a bias the greedy token and the order of the logits do not change when a row of
        ``H`` is multiplied by a positive number, so each row is divided by a power of two
        ``2^e`` (exact) that brings its largest entry into ``[0.5, 1)``: the float32 product
        then neither underflows (``H ~ 1e-46``) nor overflows (``H ~ 1e160``), and values are
        mapped back by ``2^e``. With a bias that is not so (``W (s h) + b`` is not ``s`` times
        anything), so rows whose float32 product could overflow (Cauchy-Schwarz:
        ``|h| max|w_t| + max|b_t| >= 1e38``) or that hold entries float32 cannot represent to
        full precision (nonzero ``|h_k| < 2^-100``) are computed exactly in float64 instead.
        In the scale-free case only a ``W`` of norm near ``1e38`` can send a row there.

        Returns
        -------
        exps : ndarray of int64, shape (N,), or None
            ``e`` per row (``None`` with a bias: rows are used as given).
        exact : ndarray of bool, shape (N,)
            Rows for the exact float64 path.
        """
        N = H.shape[0]
        exps = np.zeros(N, dtype=np.int64) if scale_free else None
        exact = np.zeros(N, dtype=bool)
        step = max(1, self.point_block)
        for p0 in range(0, N, step):
            xb = np.asarray(H[p0 : p0 + step], dtype=np.float64)
            ab = np.abs(xb)
            mx = ab.max(axis=1)
            if scale_free:
                e = np.where(mx > 0, np.frexp(mx)[1], 0).astype(np.int64)
                exps[p0 : p0 + step] = e
                xb = np.ldexp(xb, -e[:, None])
            else:
                tiny = np.where(ab > 0, ab, np.inf).min(axis=1)
                exact[p0 : p0 + step] |= tiny < _FLOAT32_FULL_PRECISION
            hn = row_norms(xb)
            with np.errstate(over="ignore"):
                exact[p0 : p0 + step] |= ~(hn * self._row_norm_max + bias_max < _FLOAT32_SAFE)
        return exps, exact

    def _rows64(self, H: np.ndarray, rows: np.ndarray, exps) -> np.ndarray:
        """Rows of ``H`` in float64, divided by ``2^exps`` when given (exact)."""
        X = np.asarray(H[rows], dtype=np.float64)
        return X if exps is None else np.ldexp(X, -exps[rows][:, None])

    def _exact64(self, X: np.ndarray, b64: np.ndarray | None, top2: bool):
        """Argmax (and runner-up) of ``X W^T + b`` computed in float64, ties to the lowest id."""
        n, V = X.shape[0], self.n_tokens
        i1 = np.empty(n, dtype=np.int64)
        i2 = np.full(n, -1, dtype=np.int64)
        rb = max(1, (1 << 22) // max(V, 1))
        vb = self.vocab_block
        for r0 in range(0, n, rb):
            xb = X[r0 : r0 + rb]
            z = np.empty((xb.shape[0], V))
            with np.errstate(over="ignore", invalid="ignore"):
                for v0 in range(0, V, vb):
                    z[:, v0 : v0 + vb] = xb @ self.W_[v0 : v0 + vb].astype(np.float64).T
                if b64 is not None:
                    z += b64
            if not np.isfinite(z).all():
                raise ValueError(
                    "H: the logits W h + b exceed the float64 range (about 1.8e308) for some rows; "
                    "rescale the hidden states"
                )
            rr = np.arange(xb.shape[0])
            a = np.argmax(z, axis=1)
            i1[r0 : r0 + rb] = a
            if top2 and V > 1:
                z[rr, a] = -np.inf
                i2[r0 : r0 + rb] = np.argmax(z, axis=1)
        return i1, i2

    def _winners(self, H: np.ndarray, method: str, top2: bool):
        """Greedy token (and runner-up) of each row, at any scale; see :meth:`_plan`.

        Returns ``(i1, i2 or None, exps or None, b64 or None)``.
        """
        bias32 = self._bias_for(method)
        b64 = self._bias64_for(method)
        scale_free = b64 is None
        bias_max = 0.0 if scale_free else float(np.abs(b64).max())
        exps, exact = self._plan(H, scale_free, bias_max)
        res = self._scan(H, bias32, top2, exps=exps, skip=exact if exact.any() else None)
        i1 = res[1]
        i2 = res[3] if top2 else None
        if exact.any():
            rows = np.flatnonzero(exact)
            e1, e2 = self._exact64(self._rows64(H, rows, exps), b64, top2)
            i1[rows] = e1
            if top2:
                i2[rows] = e2
        i1, i2 = self._lowest_duplicate(i1, i2, method)
        return i1, i2, exps, b64

    def _duplicates(self, method: str):
        """``(rep, second)`` int64 (n_tokens,) each, or None when no two rows are equal:
        ``rep[t]``, the lowest id whose row (and bias, for ``"argmax"``) equals t's;
        ``second[t]``, the second-lowest id of that group (-1 when t's row is unique).
        Computed once per method (exact duplicates are known at construction)."""
        if method not in self._dups:
            b = self.bias_ if method == "argmax" else None
            uniq, rep = distinct_rows(self.W_, b)
            if uniq.size == self.n_tokens:
                self._dups[method] = None
            else:
                second = np.full(self.n_tokens, -1, np.int64)
                order = np.lexsort((np.arange(self.n_tokens), rep))  # by group, then id
                g = rep[order]
                starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
                sizes = np.diff(np.r_[starts, g.size])
                multi = starts[sizes > 1]
                second[g[multi]] = order[multi + 1]
                second = second[rep]
                self._dups[method] = (rep, second)
        return self._dups[method]

    def _lowest_duplicate(self, i1, i2, method: str):
        """Exact duplicate rows tie exactly, whatever rounding the blocked float32 product gave
        them (it can put a copy's logit 1 ulp above the original's in some rows of a block):
        the winner is the lowest id of its group and, when the group has two or more ids, the
        runner-up is the group's second-lowest id (a tie: margin 0)."""
        dup = self._duplicates(method)
        if dup is None:
            return i1, i2
        rep, second = dup
        valid = i1 >= 0
        w = np.where(valid, rep[np.maximum(i1, 0)], i1)
        if i2 is not None:
            sec = np.where(valid, second[np.maximum(w, 0)], -1)
            other = np.where(i2 >= 0, rep[np.maximum(i2, 0)], i2)
            i2 = np.where(sec >= 0, sec, other)
        return w, i2

    def _logits_at(self, H: np.ndarray, idx: np.ndarray, exps, b64) -> np.ndarray:
        """``w_idx . h + b_idx`` per row in float64, in the units of ``H`` (``-inf`` for id -1)."""
        N = H.shape[0]
        out = np.full(N, -np.inf)
        step = max(1, self.point_block)
        for p0 in range(0, N, step):
            rows = np.arange(p0, min(p0 + step, N))
            t = idx[rows]
            ok = t >= 0
            X = self._rows64(H, rows[ok], exps)
            v = np.einsum("ij,ij->i", X, self.W_[t[ok]].astype(np.float64))
            if b64 is not None:
                v = v + b64[t[ok]]
            with np.errstate(over="ignore"):
                out[rows[ok]] = v if exps is None else np.ldexp(v, exps[rows[ok]])
        if not np.all(np.isfinite(out) | (idx < 0)):
            raise ValueError("H: the logits exceed the float64 range (about 1.8e308); rescale the hidden states")
        return out

    # ------------------------------------------------------------------ blocked product
    def _scratch_buffer(self, size: int) -> np.ndarray:
        """This thread's flat float32 logits buffer of at least ``size`` entries, kept between
        calls: a fresh 128 MiB ``np.empty`` per call pays its page faults on first touch."""
        local = self.__dict__.get("_scratch")
        if local is None:  # unpickled, or built by a subclass that skipped __init__
            local = self._scratch = threading.local()
        buf = getattr(local, "buf", None)
        if buf is None or buf.size < size:
            buf = local.buf = np.empty(size, dtype=np.float32)
        return buf

    def _scan(self, H: np.ndarray, bias: np.ndarray, top2: bool, W: np.ndarray | None = None, *,
              exps=None, skip=None):
        """Blocked ``H @ W.T`` folded into a running argmax (or top-2) per point.

        ``H`` (N, d) float32 or float64, cast to float32 per block, after dividing row ``i`` by
        ``2^exps[i]`` when ``exps`` is given; rows flagged in ``skip`` are zeroed (their answer
        comes from the float64 path). Returns float32/int64 arrays.
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
        flat = self._scratch_buffer(nb * vb)
        has_bias = bool(np.any(bias))  # a zero bias skips one pass over every block
        nan_rows = False
        for p0 in range(0, N, nb):
            if exps is None and skip is None:
                xb = np.ascontiguousarray(H[p0 : p0 + nb], dtype=np.float32)
            else:
                x64 = np.asarray(H[p0 : p0 + nb], dtype=np.float64)
                if exps is not None:
                    x64 = np.ldexp(x64, -exps[p0 : p0 + nb][:, None])
                with np.errstate(over="ignore"):
                    xb = np.ascontiguousarray(x64, dtype=np.float32)
                if skip is not None:
                    xb[skip[p0 : p0 + nb]] = 0.0
            rows = xb.shape[0]
            for v0 in range(0, V, vb):
                wb = W[v0 : v0 + vb]
                buf = flat[: rows * wb.shape[0]].reshape(rows, wb.shape[0])  # C-contiguous view
                np.matmul(xb, wb.T, out=buf)
                if top2:
                    _kernels.running_top2_update(
                        buf, bias[v0 : v0 + vb], v0, best_val[p0 : p0 + rows], best_idx[p0 : p0 + rows],
                        second_val[p0 : p0 + rows], second_idx[p0 : p0 + rows],
                    )
                else:
                    nan_rows |= _kernels.argmax_fold(
                        buf, bias[v0 : v0 + vb], v0, best_val[p0 : p0 + rows],
                        best_idx[p0 : p0 + rows], add_bias=has_bias,
                    )
        live = slice(None) if skip is None else ~skip
        if nan_rows or not np.isfinite(best_val[live]).all() or (
            top2 and V > 1 and not np.isfinite(second_val[live]).all()
        ):  # pragma: no cover - _plan sends every row that could overflow to float64
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
            Hidden states (after the final norm), at any scale float64 holds.
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
            NaN/inf, wrong dimension, empty, unknown ``method``, or logits beyond the float64
            range (a row of norm near ``1e308`` with a bias or for ``"nearest"``).

        Notes
        -----
        Cost: one ``N x d x |V|`` float32 product, computed in blocks of ``point_block`` points by
        ``vocab_block`` tokens (BLAS) and folded into a running argmax with numpy's SIMD argmax
        (:func:`embgeom._kernels.argmax_fold`); the ``(N, |V|)`` logits are never held. Logits
        are float32, as in a float32 model.

        Scale: without a bias (``method="argmax"``, ``bias=None``) the cell of ``h`` is the cell
        of ``s h`` for every ``s > 0``, so each row is divided by a power of two that brings its
        largest entry into ``[0.5, 1)`` before the float32 cast (exact): ``H * 1e-46`` and
        ``H * 1e160`` get the cells of ``H``. With a bias (and for ``"nearest"``) scaling is not
        an equivalence; rows whose float32 product could overflow or underflow (see
        :meth:`_plan`) are computed exactly in float64 instead.
        """
        H = self._check_H(H)
        self._bias_for(method)  # validates method before any work
        return self._winners(H, method, top2=False)[0]

    def margins(self, H) -> np.ndarray:
        """Top-1 minus top-2 logit of each hidden state (0 on a tie; ``inf`` when ``|V| = 1``).

        Parameters
        ----------
        H : array_like of float, shape (N, d) or (d,)

        Returns
        -------
        numpy.ndarray of float64, shape (N,)
            ``z_(1) - z_(2) >= 0`` in logit units (nats of the softmax's log-odds), in the true
            units of ``H``: the two tokens are found as in :meth:`assign` (float32, scale-free
            without a bias), then ``(w_1 - w_2) . h + (b_1 - b_2)`` is computed in float64 (for a
            bias-free decoder on the normalised row, times its power-of-two scale). A pair whose
            float64 order differs from float32's (a tie at float32 resolution) gets 0.

        Raises
        ------
        TypeError, ValueError
            As :meth:`assign`; a margin beyond the float64 range.
        """
        H = self._check_H(H)
        i1, i2, exps, b64 = self._winners(H, "argmax", top2=True)
        if self.n_tokens == 1:
            return np.full(H.shape[0], np.inf)
        N = H.shape[0]
        out = np.empty(N)
        step = max(1, self.point_block)
        for p0 in range(0, N, step):
            rows = np.arange(p0, min(p0 + step, N))
            X = self._rows64(H, rows, exps)
            D = self.W_[i1[rows]].astype(np.float64) - self.W_[i2[rows]].astype(np.float64)
            m = np.einsum("ij,ij->i", X, D)
            if b64 is not None:
                m = m + (b64[i1[rows]] - b64[i2[rows]])
            with np.errstate(over="ignore"):
                out[rows] = m if exps is None else np.ldexp(m, exps[rows])
        if not np.isfinite(out).all():
            raise ValueError("H: the margins exceed the float64 range (about 1.8e308); rescale the hidden states")
        return np.maximum(out, 0.0)

    def top2(self, H):
        """Top-1 and top-2 logits and tokens of each hidden state.

        Parameters
        ----------
        H : array_like of float, shape (N, d) or (d,)

        Returns
        -------
        best_val : float64 (N,)
            ``w_1 . h + b_1`` computed in float64 in the true units of ``H`` (as in
            :meth:`margins`).
        best_idx : int64 (N,)
            Same as :meth:`assign` (ties to the lowest id).
        second_val : float64 (N,)
            ``-inf`` when ``|V| = 1``.
        second_idx : int64 (N,)
            The runner-up (the next lowest id on a tie); ``-1`` when ``|V| = 1``.

        Raises
        ------
        TypeError, ValueError
            As :meth:`assign`; logits beyond the float64 range.
        """
        H = self._check_H(H)
        i1, i2, exps, b64 = self._winners(H, "argmax", top2=True)
        return self._logits_at(H, i1, exps, b64), i1, self._logits_at(H, i2, exps, b64), i2

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
        executor="local",
        chunk_size: int | None = None,
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
           ``maximise s subject to (w_t - w_s) . h + (b_t - b_s) tau >= s |a_s|`` for all ``s``
           (``a_s`` the constraint's row, so ``s`` is a depth: a distance in the region's unit
           coordinates, whatever the rows' lengths), with ``h`` in the box ``[-1, 1]^d`` (or the
           support's box; a bias-free decoder's cones use the free space when the box holds
           the origin strictly inside) and, when ``b != 0`` and there is no support, the
           homogenising variable ``0 <= tau <= 1``. Solved by cutting planes:
           the LP over the most violated constraints is re-solved, the solution checked against
           every token in float64, the worst violators added, until the relaxed optimum is
           ``<= tol`` (a certificate of emptiness for the full LP: ``"lp_empty"``) or the point
           wins strictly against all tokens (``"lp_witness"``).
           Without a bias, at iterations 1, 2, 4, ... a point that does not win is repaired by
           relaxation steps on the normalised constraints (Agmon 1954; Motzkin and Schoenberg
           1954) and checked in the same way: near-duplicate rows bound the LP's absolute margin
           and leave its optimal face large (SmolLM2's token 8: undecided after 300 s, now
           ``"lp_witness"`` in about 2 s).

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
            Depth of the relaxed LP (the radius of the largest ball about its point inside
            every working-set halfspace, in the region's unit coordinates: the box scaled to
            size about 1) at or below which the cell is declared empty; a cell thinner than
            ``tol`` is a boundary case and is reported empty. Measured on unit rows, so two
            rows one float32 ulp apart (``|w_t - w_s|`` of 1e-10) do not make a cell with room
            in it look empty.
        progress : bool, default True
            tqdm progress bars (over chunks of tokens).
        executor : {"local", "ray"} or embgeom.parallel.Executor, default "local"
            Where the witness and LP tasks run (:mod:`embgeom.parallel`). The set-up (distinct
            rows, region, whitening; about ``|V| d^2`` flops) is computed once here and shipped
            to the tasks once (``ray.put``). A name starts and afterwards closes its executor;
            pass an instance to reuse one connection.
        chunk_size : int, optional
            Tokens per witness task (default 2048), rounded up to a multiple of ``batch_size``;
            LP tasks take ``chunk_size // 32`` tokens (a multiple of 64). Chunks follow the
            batches of the unchunked scan, so the verdicts and status codes do not depend on
            ``chunk_size`` or the executor; it changes only the speed.

        Returns
        -------
        UnargmaxableResult
            ``extra`` holds ``n_distinct_rows``, ``executor``, ``phase_seconds`` (wall
            seconds of the set-up, of shipping it, of the witness and of the LP phase) and,
            when LPs ran, ``lp_iterations_mean``.

        Raises
        ------
        TypeError
            Unsupported support type; bad argument types.
        ValueError
            Support of another dimension; empty ``tokens``, token ids out of range.
        """
        witness_steps = check_positive_int(witness_steps, "witness_steps", minimum=0)
        batch_size = check_positive_int(batch_size, "batch_size")
        if max_lp is not None:
            max_lp = check_positive_int(max_lp, "max_lp", minimum=0)
        lp_time_limit = check_positive(lp_time_limit, "lp_time_limit")
        tol = check_positive(tol, "tol", allow_zero=True)
        return scan(
            self, support, tokens=tokens, witness_steps=witness_steps, batch_size=batch_size,
            max_lp=max_lp, lp_time_limit=lp_time_limit, tol=tol, progress=progress,
            executor=executor, chunk_size=chunk_size,
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
            least violation. An exact duplicate of a lower id's row and bias (ties go to the
            lowest id) gives depth 0 at the lowest twin's centre; a row equal to another whose
            bias is larger (that token wins everywhere) gives depth ``-inf`` at the box's centre.

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
