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
    key = W32 + np.float32(0.0)  # -0.0 -> +0.0
    if b32 is not None:
        key = np.hstack([key, (b32 + np.float32(0.0))[:, None]])
    key = np.ascontiguousarray(key)
    void = key.view(np.dtype((np.void, key.dtype.itemsize * key.shape[1]))).ravel()
    _, first, inverse = np.unique(void, return_index=True, return_inverse=True)
    rep = first[inverse.ravel()].astype(np.int64)
    return np.sort(first).astype(np.int64), rep


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
