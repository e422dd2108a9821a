"""Facts of the rows of W: distinct rows, the rounding constant, and the scan's result type.

The leaf of :mod:`embgeom.cells` (imports nothing from its siblings).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["distinct_rows", "STATUS_NAMES", "UnargmaxableResult"]

_UNIT_ROUNDOFF32 = 2.0**-24


def _gamma(n: int, u: float) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: bound on the relative error of an n-term dot product."""
    return n * u / (1.0 - n * u)


def distinct_rows(W, bias=None):
    """The distinct rows ``(w_t, b_t)`` of an unembedding, and each token's representative.

    Two tokens with the same row (and bias) have the same logit everywhere: exact duplicates,
    of which only the lowest id can be the greedy output (ties go to the lowest id).
    Comparison is bitwise on the float32 values, with ``-0.0`` equal to ``+0.0``.

    Parameters
    ----------
    W : numpy.ndarray of float32, shape (n_tokens, d)
        The unembedding (e.g. ``Decoder.W_``).
    bias : numpy.ndarray of float32, shape (n_tokens,), optional

    Returns
    -------
    uniq : numpy.ndarray of int64, shape (n_distinct,)
        Sorted ids of the first (lowest) occurrence of each distinct row.
    rep : numpy.ndarray of int64, shape (n_tokens,)
        Per token, the id of its representative (the lowest id with the same row).

    Raises
    ------
    ValueError
        ``W`` not 2-D float32, or ``bias`` of another length.

    Examples
    --------
    >>> import numpy as np
    >>> W = np.array([[1, 0], [0, 1], [1, 0]], dtype=np.float32)
    >>> uniq, rep = distinct_rows(W)
    >>> uniq.tolist(), rep.tolist()
    ([0, 1], [0, 1, 0])
    """
    W32 = np.asarray(W)
    if W32.ndim != 2 or W32.dtype != np.float32:
        raise ValueError(f"W: expected a 2-D float32 array, got {W32.dtype} of shape {W32.shape}")
    b32 = None if bias is None else np.asarray(bias, dtype=np.float32)
    if b32 is not None and b32.shape != (W32.shape[0],):
        raise ValueError(f"bias: expected shape ({W32.shape[0]},), got {b32.shape}")
    words = _row_words(W32, b32)
    n = words.shape[0]
    # Rows are grouped by a 64-bit hash of their words (an integer sort, where a sort of the
    # rows as void records took 2.8 s on SmolLM2's 49,152 x 576), then every grouping is
    # verified bitwise; a collision of distinct rows (never seen, but possible) is resolved
    # exactly for the rows of its groups.
    _, first, inverse = np.unique(_row_hashes(words), return_index=True, return_inverse=True)
    rep = first[inverse.ravel()].astype(np.int64)  # first occurrence: the lowest id
    ids = np.arange(n, dtype=np.int64)
    cand = np.flatnonzero(rep != ids)
    if cand.size:
        bad = cand[np.any(words[cand] != words[rep[cand]], axis=1)]
        if bad.size:
            members = np.flatnonzero(np.isin(rep, rep[bad]))  # sorted: lowest id first
            rep[members] = members[_exact_first(words[members])]
    return np.flatnonzero(rep == ids).astype(np.int64), rep


#: Rows per block of :func:`_row_hashes` (a (block, d) uint64 temporary of a few MB).
_HASH_BLOCK = 2048
#: Odd 64-bit multipliers of the row hash, drawn once from a fixed seed (the hash only orders
#: the work: every grouping it proposes is verified bitwise).
_HASH_SEED = 0x5EED_0F_C311


def _row_words(W32: np.ndarray, b32) -> np.ndarray:
    """The rows (and bias) as uint32 words, ``-0.0`` mapped to ``+0.0``: uint32 (n, d [+1]).
    A view of ``W`` when it is C-contiguous, has no ``-0.0`` and no bias."""
    W32 = np.ascontiguousarray(W32)
    words = W32.view(np.uint32)
    neg0 = np.uint32(0x80000000)
    if b32 is not None:
        bw = np.ascontiguousarray(b32).view(np.uint32)[:, None]
        words = np.hstack([words, bw])
    if np.any(words == neg0):
        words = np.where(words == neg0, np.uint32(0), words)
    return words


def _row_hashes(words: np.ndarray) -> np.ndarray:
    """A uint64 hash per row of ``words`` (uint32 (n, m)): ``sum_i words[:, i] R_i mod 2^64``
    with fixed odd multipliers ``R`` (numpy's unsigned arithmetic wraps). Rows that differ in
    one word never collide (``delta R_i`` with ``|delta| < 2^32`` and ``R_i`` odd is not 0
    mod 2^64)."""
    n, m = words.shape
    R = np.random.default_rng(_HASH_SEED).integers(0, 2**63, size=m, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    h = np.empty(n, dtype=np.uint64)
    for i in range(0, n, _HASH_BLOCK):
        blk = words[i:i + _HASH_BLOCK].astype(np.uint64)
        blk *= R
        h[i:i + _HASH_BLOCK] = blk.sum(axis=1, dtype=np.uint64)
    return h


def _exact_first(words: np.ndarray) -> np.ndarray:
    """Per row of ``words`` (uint32 (n, m)), the index of the first row bitwise equal to it
    (a sort of the rows as void records: exact, and slow for many rows)."""
    words = np.ascontiguousarray(words)
    void = words.view(np.dtype((np.void, words.dtype.itemsize * words.shape[1]))).ravel()
    _, first, inverse = np.unique(void, return_index=True, return_inverse=True)
    return first[inverse.ravel()]


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
