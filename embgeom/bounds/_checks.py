"""Argument checks shared by the bounds modules (each names the argument it refuses)."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._validation import check_positive, check_positive_int


def _check_eps(eps) -> float:
    return check_positive(eps, "eps")


def _check_vocab(vocab_size) -> int:
    return check_positive_int(vocab_size, "vocab_size", minimum=2)


def _check_rate(rate, vocab_size) -> float:
    """The per-token rate (nats): ``log|V|`` by default, or a positive number."""
    if rate is None:
        return math.log(vocab_size)
    return check_positive(rate, "rate")


def _check_log_packing(log_packing) -> float:
    if isinstance(log_packing, bool) or not isinstance(log_packing, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"log_packing: expected a real number (nats), got {type(log_packing).__name__}")
    v = float(log_packing)
    if not np.isfinite(v) or v < 0:
        raise ValueError(f"log_packing: expected a finite number >= 0 (nats), got {v}")
    return v


def _m_array(m) -> np.ndarray:
    arr = np.asarray(m)
    if arr.size == 0:  # a value problem, not a type one: np.asarray([]) is float64
        raise ValueError(f"m: expected at least one number of prompt vectors (an integer >= 1 "
                         f"or a non-empty array of them), got {m!r}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"m: expected an integer or an array of integers, got {m!r}")
    if np.any(arr < 1):
        raise ValueError(f"m: expected integers >= 1, got min {arr.min()}")
    return arr.astype(np.float64)


