"""The linear law (Cor. 4.6): ``n*(m) = C m`` and the accessible fraction past it."""

from __future__ import annotations

import numpy as np

from ._checks import (_check_log_packing, _check_rate, _check_vocab, _exact_ints, _log_count,
                      _m_array, _per_token)
from .._validation import check_bool
from ._packing import theorem45_log_count

__all__ = ["linear_law_slope", "n_star", "accessible_fraction_bound"]


def linear_law_slope(d, r, eps, vocab_size, rate=None) -> float:
    """Cor. 4.6 for the cube/ball: ``C = d log(1 + 2r/eps) / log|V|`` tokens per prompt vector.

    Parameters
    ----------
    d : int
        >= 1.
    r, eps : float
        > 0.
    vocab_size : int
        >= 2.
    rate : float, optional
        Replaces ``log|V|`` (nats per token).

    Returns
    -------
    float

    Raises
    ------
    TypeError, ValueError
        As :func:`theorem45_log_count`, plus ``vocab_size < 2`` and ``rate <= 0``.
    """
    V = _check_vocab(vocab_size)
    return float(_per_token(theorem45_log_count(d, 1, r, eps), _check_rate(rate, V), "C",
                            "d log(1 + 2r/eps) and rate"))


def n_star(m, log_packing, vocab_size, rate=None) -> np.ndarray:
    """The cliff ``n*(m) = m log P / log|V|`` (Cor. 4.6), in tokens.

    Parameters
    ----------
    m : int or array_like of int
        Prompt vectors, each >= 1.
    log_packing : float
        ``log P(S, eps)`` in nats (from :func:`log_packing_number`).
    vocab_size : int
        >= 2.
    rate : float, optional
        Nats per token replacing ``log|V|``.

    Returns
    -------
    ndarray of float64, shape of ``m``
        The longest length at which all sequences can be accessible (real-valued; the integer
        length is its floor).

    Raises
    ------
    TypeError, ValueError
        ``m < 1`` or empty, ``log_packing < 0`` or NaN, ``vocab_size < 2``, ``rate <= 0`` or
        subnormal, a log-count beyond float64 (``m log P`` above 1.8e308 nats), a cliff beyond
        float64 (``m log P / rate`` above 1.8e308 tokens). Integers beyond int64 (``10**30``)
        are accepted, as float64; beyond float64 (``10**400``) they are a ValueError.
    """
    mm = _m_array(m)
    lp = _check_log_packing(log_packing)
    lam = _check_rate(rate, _check_vocab(vocab_size))
    return _per_token(_log_count(mm, lp), lam, "n*", "m log_packing and rate")


def accessible_fraction_bound(n, m, log_packing, vocab_size, rate=None, *, log: bool = False):
    """Upper bound on the accessible fraction of the ``|V|^n`` sequences of length ``n``.

    ``min(1, exp(m log P - n log|V|)) = exp(-(n - n*) log|V|)`` past ``n*`` (Cor. 4.6).

    Parameters
    ----------
    n : int or array_like of int
        Sequence lengths, >= 1.
    m : int
        Prompt vectors, >= 1 (broadcast against ``n``).
    log_packing : float
        ``log P`` (nats).
    vocab_size : int
        >= 2.
    rate : float, optional
        Replaces ``log|V|`` (the refinement; then a heuristic for typical sequences).
    log : bool, default False
        Return the natural log of the fraction (never underflows) instead of the fraction.

    Returns
    -------
    ndarray of float64
        Broadcast shape of ``n`` and ``m``; fraction in [0, 1] (or its log, <= 0).

    Raises
    ------
    TypeError, ValueError
        As :func:`n_star` (``m log P`` beyond float64 included), ``n < 1`` or empty, shapes of
        ``n`` and ``m`` that do not broadcast, and ``n log|V|`` (``n rate``) beyond float64,
        above 1.8e308 nats: refused as :func:`n_star` refuses its overflow, not returned as a
        fraction of 0 or 1.
    """
    nn, big_n = _exact_ints(n, "n")
    if nn.size == 0:
        raise ValueError(f"n: expected at least one length (an integer >= 1 or a non-empty "
                         f"array of them), got {n!r}")
    if nn.dtype.kind not in "iu" and not big_n:
        raise TypeError(f"n: expected an integer or an array of integers, got {n!r}")
    if np.any(nn < 1):
        raise ValueError(f"n: expected lengths >= 1, got min {nn.min()}")
    mm = _m_array(m)
    try:
        np.broadcast_shapes(nn.shape, np.shape(mm))
    except ValueError:
        raise ValueError(f"n and m: expected shapes that broadcast, got {nn.shape} and "
                         f"{np.shape(mm)}") from None
    lp = _check_log_packing(log_packing)
    lam = _check_rate(rate, _check_vocab(vocab_size))
    check_bool(log, "log")
    # m log P - n log|V|, each refused where it overflows (n_star's rule), never inf - inf
    spent = (_log_count(nn.astype(np.float64), lam, "n and vocab_size", "n log|V|") if rate is None
             else _log_count(nn.astype(np.float64), lam, "n and rate", "n rate"))
    logf = np.minimum(0.0, _log_count(mm, lp) - spent)
    return logf if log else np.exp(logf)
