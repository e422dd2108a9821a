"""Cor. 4.10 made computable: unbounded context, in the mean-field view."""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from .._validation import check_positive_int
from ._checks import _check_log_packing, _check_rate, _check_vocab, _exact_ints, _per_token

__all__ = ["log_multiset_count", "threshold_length_unbounded"]


def log_multiset_count(log_points, n) -> np.ndarray:
    """``log C(n + P, n)``: the number of multisets of size ``<= n`` drawn from ``P`` points,
    equivalently of integer vectors ``c >= 0`` in ``R^P`` with ``sum c <= n`` (nats).

    Parameters
    ----------
    log_points : float
        ``log P`` (nats, >= 0); ``P`` may be astronomically large (``log P`` in the thousands)
        and need not be an integer (it is then the generalised binomial via Gamma functions,
        increasing in ``P``).
    n : int or array_like of int
        Sizes, >= 0.

    Returns
    -------
    ndarray of float64
        Shape of ``n``.

    Raises
    ------
    TypeError, ValueError
        ``log_points`` negative or NaN; ``n`` empty, negative, not integer or beyond float64; a count
        beyond float64 (``n log P`` above 1.8e308 nats).

    Notes
    -----
    ``log C(n+P, n) = -log(n+P+1) - betaln(P+1, n+1)`` while ``P`` is a float; for ``log P > 700``
    the rigorous upper form ``n log P - log n! + n(n+1)/(2P)`` (from
    ``log(P+j) <= log P + j/P``), whose last term is below 1e-290.
    """
    lp = _check_log_packing(log_points)
    nn, big = _exact_ints(n, "n")
    if nn.size == 0:  # first: np.asarray([]) is float64, which read as "not integers"
        raise ValueError(f"n: expected at least one sequence length, got {n!r}")
    if nn.dtype.kind not in "iu" and not big:
        raise TypeError(f"n: expected integers, got {n!r}")
    if np.any(nn < 0):
        raise ValueError(f"n: expected integers >= 0, got min {nn.min()}")
    nf = nn.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if lp <= 700.0:
            P = math.exp(lp)
            out = -np.log(nf + P + 1.0) - special.betaln(P + 1.0, nf + 1.0)
        else:
            out = nf * lp - special.gammaln(nf + 1.0) + nf * (nf + 1.0) * 0.5 * math.exp(-lp)
    if not np.all(np.isfinite(out)):
        # the count is finite for finite log P and n; returned as inf it would be a wrong number
        raise ValueError(f"log_points and n: log C(n + P, n) overflows float64 (above 1.8e308 "
                         f"nats; got log P = {lp!r} nats and n up to {nf.max():.3g})")
    return out


def threshold_length_unbounded(log_packing, vocab_size, *, weight_bits: int = 11,
                               context_length=None, rate=None) -> dict:
    """Cor. 4.10 made computable: a length beyond which almost no sequence is accessible, for
    prompts of any length (mean-field view).

    Parameters
    ----------
    log_packing : float
        ``log P(S, eps)`` of one prompt vector's support (nats, from
        :func:`log_packing_number`).
    vocab_size : int
        ``|V|``, >= 2.
    weight_bits : int, default 11
        Resolution of the empirical measure's weights: weights are resolved to
        ``delta = 2**-weight_bits`` (assumption A3 in ``docs/theory.md``); ``K = 2**weight_bits``.
    context_length : int or array_like of int, optional
        If given, also the bound for prompts of at most ``L`` vectors (no A3 needed there), and
        the minimum of the two.
    rate : float, optional
        Nats per token replacing ``log|V|``.

    Returns
    -------
    dict
        ``log_count`` (nats): log of the number of distinguishable prompt measures,
        ``log C(K + P, K)`` (or ``min`` with ``log C(L + P, L)`` when ``context_length`` is given;
        an array then); ``n_threshold`` = ``log_count / log|V|`` (tokens): past it the
        accessible fraction is at most ``exp(-(n - N) log|V|)``; ``weight_levels`` ``K``;
        ``log_count_unbounded`` and ``n_threshold_unbounded`` (the A3 bound alone);
        ``ordered_equivalent_m`` = ``log_count_unbounded / log_packing`` (how many ordered prompt
        vectors of Theorem 4.5 carry the same count).

    Raises
    ------
    TypeError, ValueError
        ``log_packing < 0``/NaN, ``vocab_size < 2``, ``weight_bits < 1`` or > 62,
        ``context_length < 1`` or empty, ``rate <= 0`` or subnormal, a threshold beyond
        float64. Integers beyond int64 (``10**30``) are accepted, as float64; beyond float64
        (``10**400``) they are a ValueError.

    Notes
    -----
    Assumptions (derivation in ``docs/theory.md``): (A1) the map from prompt to output is
    permutation invariant in the prompt vectors, so it depends only on their empirical measure
    (mean-field view of attention, no positional information); (A2) each prompt vector is one
    of at most ``P`` distinguishable points (precision ``eps``); (A3) two measures whose weights
    agree after flooring to multiples of ``delta`` give the same output; (A4) greedy decoding
    is deterministic. Under A1, A2, A4 a prompt of length ``<= L`` is a multiset: at most
    ``C(L + P, L)`` outputs; with A3 at most ``C(K + P, K)`` for any length. Then ``N`` is the
    length at which ``|V|^N`` reaches that count.
    """
    lp = _check_log_packing(log_packing)
    V = _check_vocab(vocab_size)
    lam = _check_rate(rate, V)
    bits = check_positive_int(weight_bits, "weight_bits")
    if bits > 62:
        raise ValueError(f"weight_bits: expected <= 62, got {bits}")
    K = 2**bits
    log_unb = float(log_multiset_count(lp, K))
    out = {
        "log_count_unbounded": log_unb,
        "n_threshold_unbounded": float(_per_token(log_unb, lam, "N", "log_count_unbounded and rate")),
        "weight_levels": K,
        # P = 1 (log P = 0): no number of ordered vectors reaches the count, inf
        "ordered_equivalent_m": log_unb / lp if lp > 0 else float("inf"),
        "rate": lam,
    }
    if context_length is None:
        out["log_count"] = log_unb
        out["n_threshold"] = out["n_threshold_unbounded"]
        return out
    L, big = _exact_ints(context_length, "context_length")
    if L.size == 0:
        raise ValueError(f"context_length: expected at least one length, got {context_length!r}")
    if L.dtype.kind not in "iu" and not big:
        raise TypeError(f"context_length: expected integers, got {context_length!r}")
    if np.any(L < 1):
        raise ValueError(f"context_length: expected integers >= 1, got min {L.min()}")
    log_L = np.minimum(log_multiset_count(lp, context_length), log_unb)
    out["context_length"] = L
    out["log_count"] = log_L
    out["n_threshold"] = _per_token(log_L, lam, "N", "log_count and rate")
    return out
