"""numba kernels behind :mod:`embgeom.cells` and :mod:`embgeom.volumes`.

Small typed kernels over plain arrays, in the style of pynndescent's distance module. The
orchestration (blocking, matrix products, progress bars) lives in the callers; a kernel only sees
one block of logits.

The cell-assignment loop works on a logits block ``L`` of shape ``(nb, vb)`` (``nb`` points,
``vb`` consecutive tokens starting at token id ``offset``), produced by one BLAS product
``X_block @ W_block.T`` into a preallocated cache-sized buffer. The kernels fold that block into a
*running* best per point, so the full ``(N, |V|)`` logits never exist. Each row is first reduced
to its maximum with a vectorisable loop; only when the block maximum beats the running best (rare
after the first blocks) is the row scanned again for the index. Token blocks are visited in
increasing id order and only a strictly larger value replaces the running best, which is what makes
ties go to the lowest token id.

:meth:`embgeom.cells.Decoder.assign` folds with :func:`argmax_fold`, plain numpy: numpy's
``argmax`` over float32 rows is hand-vectorised, where LLVM leaves the numba loop below scalar,
and with the product at full speed the fold's share of the time decides whether assign reaches
the blocked-GEMM roofline (measured in ``benchmarks/bench_cell_volumes.py``). The numba argmax
stays as the reference it is tested against.

All kernels are compiled with ``nogil=True`` and run serially: the matrix product that feeds them
already uses every core through BLAS, and these kernels cost a few percent of it. They are compiled by :func:`embgeom._numba.njit`,
the package's one compile policy: numba's on-disk cache where a cache location is writable,
compiled in memory (one ``RuntimeWarning``) where none is.
"""

from __future__ import annotations

import numpy as np

from ._numba import njit

__all__ = [
    "argmax_fold",
    "running_argmax_update",
    "running_top2_update",
    "count_tokens",
    "topk_competitors",
]

# fastmath only for the max-reduction loop (nnan/ninf are guaranteed: inputs are validated
# finite and the callers check the running best for overflow); comparisons stay exact.
_FM = {"nnan", "ninf"}


def argmax_fold(logits, bias, offset, best_val, best_idx, add_bias: bool = True) -> bool:
    """Fold one logits block into the running argmax of each point, with numpy's SIMD argmax.

    The same contract as :func:`running_argmax_update` (ties to the lowest token id: the first
    maximum inside the block, and only a strictly larger value from a later block replaces the
    running best), plus a NaN check.

    Parameters
    ----------
    logits : float32 (nb, vb), C-contiguous
        ``X_block @ W_block.T`` for tokens ``offset .. offset + vb - 1``; overwritten with
        ``logits + bias`` when ``add_bias`` (it is the caller's scratch buffer).
    bias : float32 (vb,)
    offset : int
        Token id of column 0.
    best_val : float32 (nb,), updated in place
    best_idx : int64 (nb,), updated in place
    add_bias : bool, default True
        ``False`` when the bias is known to be zero (saves one pass over the block).

    Returns
    -------
    bool
        True when some row holds a NaN (an overflowed float32 product, ``inf - inf``): the
        caller must not trust those rows.
    """
    if add_bias:
        np.add(logits, bias, out=logits)
    j = logits.argmax(axis=1)  # first maximum; a NaN row returns its first NaN
    m = np.take_along_axis(logits, j[:, None], axis=1)[:, 0]
    bad = bool(np.isnan(m).any())
    upd = m > best_val
    best_val[upd] = m[upd]
    best_idx[upd] = j[upd] + offset
    return bad


@njit(
    "void(float32[:, ::1], float32[::1], int64, float32[::1], int64[::1])",
    readonly=(1,),
    nogil=True,
    fastmath=_FM,
)
def running_argmax_update(logits, bias, offset, best_val, best_idx):
    """Fold one logits block into the running argmax of each point.

    For each row ``i``: ``m = max_j (logits[i, j] + bias[j])``; if ``m > best_val[i]`` then
    ``best_val[i] = m`` and ``best_idx[i] = offset + min{j : logits[i, j] + bias[j] == m}``.

    Parameters
    ----------
    logits : float32 (nb, vb), C-contiguous
        ``X_block @ W_block.T`` for tokens ``offset .. offset + vb - 1``.
    bias : float32 (vb,)
        The bias of those tokens (zeros when the decoder has none).
    offset : int64
        Token id of column 0.
    best_val : float32 (nb,), updated in place
        Running maximum logit (start at ``-inf``).
    best_idx : int64 (nb,), updated in place
        Running argmax token id.
    """
    nb, vb = logits.shape
    for i in range(nb):
        row = logits[i]
        m = row[0] + bias[0]
        for j in range(1, vb):
            v = row[j] + bias[j]
            m = max(m, v)
        if m > best_val[i]:
            for j in range(vb):
                if row[j] + bias[j] == m:
                    best_idx[i] = offset + j
                    break
            best_val[i] = m


@njit(
    "void(float32[:, ::1], float32[::1], int64, float32[::1], int64[::1], float32[::1], int64[::1])",
    readonly=(1,),
    nogil=True,
    fastmath=_FM,
)
def running_top2_update(logits, bias, offset, best_val, best_idx, second_val, second_idx):
    """Fold one logits block into the running top-2 (value and token id) of each point.

    After all blocks, ``best_val - second_val`` is the margin (top-1 minus top-2 logit; 0 when the
    top value is tied between two tokens), ``best_idx`` the argmax (lowest id among ties) and
    ``second_idx`` the runner-up. Rows whose block maximum does not exceed ``second_val`` are
    skipped after one vectorised pass.

    Parameters
    ----------
    logits : float32 (nb, vb), C-contiguous
    bias : float32 (vb,)
    offset : int64
    best_val, second_val : float32 (nb,), updated in place (start at ``-inf``)
    best_idx, second_idx : int64 (nb,), updated in place (start at ``-1``)
    """
    nb, vb = logits.shape
    for i in range(nb):
        row = logits[i]
        m = row[0] + bias[0]
        for j in range(1, vb):
            v = row[j] + bias[j]
            m = max(m, v)
        if m <= second_val[i]:
            continue
        b1 = best_val[i]
        i1 = best_idx[i]
        b2 = second_val[i]
        i2 = second_idx[i]
        for j in range(vb):
            v = row[j] + bias[j]
            if v > b1:
                b2 = b1
                i2 = i1
                b1 = v
                i1 = offset + j
            elif v > b2:
                b2 = v
                i2 = offset + j
        best_val[i] = b1
        best_idx[i] = i1
        second_val[i] = b2
        second_idx[i] = i2


@njit("int64[::1](int64[::1], int64)", readonly=(0,), nogil=True)
def count_tokens(idx, n_tokens):
    """Histogram of token ids: ``counts[t] = #{i : idx[i] == t}`` for ``t < n_tokens``.

    Raises
    ------
    ValueError
        An id outside ``[0, n_tokens)``.
    """
    counts = np.zeros(n_tokens, dtype=np.int64)
    for i in range(idx.shape[0]):
        t = idx[i]
        if t < 0 or t >= n_tokens:
            raise ValueError("count_tokens: token id out of range")
        counts[t] += 1
    return counts


@njit("int64[:, ::1](float64[:, ::1], int64[::1], int64)", readonly=(0, 1), nogil=True)
def topk_competitors(scores, own, k):
    """The ``k`` largest entries of each row of ``scores``, excluding column ``own[i]``.

    Used by the cutting-plane linear programs of :meth:`embgeom.cells.Decoder.unargmaxable`: for
    a candidate point of token ``t`` the rows of ``scores`` are the logits ``z_s(h)`` minus a
    reference, and the returned columns are the most violated constraints ``z_t(h) >= z_s(h)``.
    Order within a row is by decreasing score; ``-1`` pads rows with fewer than ``k`` columns.

    Parameters
    ----------
    scores : float64 (B, V)
    own : int64 (B,)
        Column to leave out of row ``i`` (the token itself).
    k : int64

    Returns
    -------
    int64 (B, k)
    """
    B, V = scores.shape
    out = np.full((B, k), -1, dtype=np.int64)
    vals = np.empty(k, dtype=np.float64)
    for i in range(B):
        n = 0
        row = scores[i]
        for j in range(V):
            if j == own[i]:
                continue
            v = row[j]
            if n < k:
                # insertion into the sorted (descending) buffer
                p = n
                while p > 0 and vals[p - 1] < v:
                    vals[p] = vals[p - 1]
                    out[i, p] = out[i, p - 1]
                    p -= 1
                vals[p] = v
                out[i, p] = j
                n += 1
            elif v > vals[k - 1]:
                p = k - 1
                while p > 0 and vals[p - 1] < v:
                    vals[p] = vals[p - 1]
                    out[i, p] = out[i, p - 1]
                    p -= 1
                vals[p] = v
                out[i, p] = j
    return out
