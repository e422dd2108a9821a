"""Evaluation of a copy model: greedy copies per length, and the cliff in the accuracy curve."""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from embgeom._hf import greedy_decode, measuring
from embgeom._progress import tqdm_kwargs
from embgeom._stats import wilson_interval
from embgeom._validation import (
    check_array,
    check_int_array,
    check_positive,
    check_positive_int,
    seed_sequence,
)

from ._task import CopyTask, _check_lengths, _check_task_fits, _torch_threads


def greedy_copy(model, prompts: torch.Tensor, n_new: int) -> torch.Tensor:
    """Batched greedy decoding (argmax over the whole vocabulary, with the KV cache).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM with ``generate`` (decoded in eval mode; its own mode is restored).
    prompts : torch.Tensor, int64 (n, p)
        Prompts of one common length (the copy task's ``x_1 .. x_L <sep>``): no padding.
    n_new : int
        Tokens to generate (no early stop).

    Returns
    -------
    torch.Tensor, int64 (n, n_new)
        The generated tokens.

    Raises
    ------
    TypeError
        ``prompts`` not a torch tensor; a model without ``generate``.
    ValueError
        ``n_new < 1`` or ``prompts`` not of shape (n, p) with p >= 1.

    Notes
    -----
    The copy model is a transformers model (:func:`make_copy_model`), so this is
    ``model.generate`` through :func:`embgeom._hf.greedy_decode`, embgeom's one greedy decoder
    (a clean generation config, exactly ``n_new`` tokens, no end-of-sequence stop; eval mode
    and no gradient inside, the caller's state restored after).
    """
    n_new = check_positive_int(n_new, "n_new")
    if not isinstance(prompts, torch.Tensor):
        raise TypeError(f"prompts: expected a torch.Tensor of token ids, got {type(prompts).__name__}")
    if prompts.ndim != 2 or prompts.shape[1] < 1:
        raise ValueError(f"prompts: expected shape (n, p) with p >= 1, got {tuple(prompts.shape)}")
    return greedy_decode(model, n_new, input_ids=prompts, use_cache=True)


def evaluate_copy(
    model,
    task: CopyTask,
    lengths,
    *,
    n_eval: int = 200,
    batch_size: int = 256,
    seed: int = 0,
    num_threads: int | None = 1,
    progress: bool = True,
) -> dict:
    """Exact-match and per-token accuracy of greedy copying, per length.

    For each length ``L``, ``n_eval`` fresh random strings are prompted as ``x_1 .. x_L <sep>``
    and ``L`` tokens are decoded greedily (:func:`greedy_copy`). Exact match: all ``L`` generated
    tokens equal the input. Per-token accuracy: the fraction of the ``L`` positions where the
    generated token equals the input symbol at that position (free-running, so a token after a
    first mistake is judged against the same target).

    Parameters
    ----------
    model : transformers.PreTrainedModel
    task : CopyTask
    lengths : sequence of int, shape (k,)
        Lengths to evaluate (each >= 1).
    n_eval : int, default 200
        Strings per length.
    batch_size : int, default 256
    seed : seed, default 0
        Seed of the evaluation strings (anything ``numpy.random.default_rng`` accepts); length
        ``L`` draws from ``seed_sequence(seed, L)``, so the same seed gives the same strings per
        length whatever the other lengths (for an int, ``default_rng([seed, L])``).
    num_threads : int or None, default 1
    progress : bool, default True

    Returns
    -------
    dict
        ``lengths`` (list of int), ``exact_match`` (list of float in [0, 1]),
        ``exact_match_count`` (list of int), ``per_token`` (list of float), ``n_eval`` (int),
        ``wall_s``. JSON-able.

    Raises
    ------
    ValueError
        Empty ``lengths``, a length < 1, ``n_eval < 1``, a task that is not the model's.
    TypeError
        Non-integer lengths.
    """
    if not isinstance(task, CopyTask):
        raise TypeError(f"task: expected a CopyTask, got {type(task).__name__}")
    lengths = _check_lengths(lengths)
    n_eval = check_positive_int(n_eval, "n_eval")
    batch_size = check_positive_int(batch_size, "batch_size")
    _check_task_fits(model, task)
    t0 = time.perf_counter()
    em_counts, per_token = [], []
    with _torch_threads(num_threads), measuring(model):
        for length in tqdm(lengths.tolist(), desc="copy eval", **tqdm_kwargs(progress)):
            rng = np.random.default_rng(seed_sequence(seed, length))
            symbols = task.sample_symbols(n_eval, length, rng)
            hits, tok = 0, 0
            for start in range(0, n_eval, batch_size):
                x = symbols[start : start + batch_size]
                gen = greedy_copy(model, task.prompts(x), length).numpy()
                eq = gen == x
                hits += int(eq.all(axis=1).sum())
                tok += int(eq.sum())
            em_counts.append(hits)
            per_token.append(tok / (n_eval * length))
    return {
        "lengths": [int(v) for v in lengths],
        "exact_match": [c / n_eval for c in em_counts],
        "exact_match_count": em_counts,
        "per_token": per_token,
        "n_eval": n_eval,
        "wall_s": time.perf_counter() - t0,
    }


def _z_to_confidence(z: float) -> float:
    """Two-sided coverage of a normal quantile ``z`` (1.96 -> 0.95)."""
    return float(math.erf(z / math.sqrt(2.0)))


def detect_cliff(lengths, exact_match, n_eval, *, threshold: float = 0.5, z: float = 1.959963984540054):
    """The length where exact-match accuracy first falls below ``threshold``, with an interval.

    The cliff is the smallest evaluated length ``L_c`` whose exact match is below
    ``threshold`` *after* the curve has been at or above it (lengths are sorted first). There is
    no cliff (``None``) when the curve never falls below the threshold (the model copies every
    length evaluated) or never reaches it (the model never learned to copy): a flat curve.

    The interval accounts for the finite number ``n_eval`` of strings per length with a Wilson
    score interval per length. A length is *surely above* when its interval lies entirely above
    the threshold and *surely below* when it lies entirely below. The interval is
    ``(lo, hi)`` with ``lo`` the first length after the last surely-above length preceding
    ``L_c`` (i.e. the first length not surely above, once the curve has been surely above)
    and ``hi`` the first surely-below length at or after ``L_c`` (or the largest length
    evaluated when none is surely below). ``lo <= L_c <= hi`` always holds; a sharp step
    measured with enough strings gives ``lo == L_c == hi``.

    Parameters
    ----------
    lengths : array_like of int, shape (k,)
        Evaluated lengths (distinct, >= 1).
    exact_match : array_like of float, shape (k,)
        Exact-match accuracy per length, in [0, 1].
    n_eval : int or array_like of int, shape (k,)
        Strings evaluated per length (> 0).
    threshold : float, default 0.5
        Accuracy level that defines the cliff (0.5: the n50 convention of the paper).
    z : float, default 1.96
        Normal quantile of the Wilson intervals (95%).

    Returns
    -------
    cliff : int or None
        ``L_c``, or ``None`` when there is no cliff.
    interval : tuple of (int, int) or None
        ``(lo, hi)`` as above; ``None`` with ``cliff``.

    Raises
    ------
    ValueError
        Empty or mismatched inputs, repeated lengths, accuracies outside [0, 1], ``n_eval < 1``.
    TypeError
        Non-integer lengths or non-float accuracies.

    See Also
    --------
    wilson_interval : the per-length interval.

    Examples
    --------
    >>> import numpy as np
    >>> lengths = np.arange(1, 31)
    >>> detect_cliff(lengths, np.where(lengths < 13, 1.0, 0.0), 200)
    (13, (13, 13))
    >>> detect_cliff(lengths, np.full(30, 0.9), 200)
    (None, None)
    """
    lengths = _check_lengths(lengths)
    if np.unique(lengths).size != lengths.size:
        raise ValueError("lengths: expected distinct lengths, got repeats")
    acc = np.asarray(exact_match)
    if acc.dtype.kind in "iu":
        acc = acc.astype(np.float64)
    acc = check_array(acc, "exact_match", ndim=1, shape=(lengths.size,))
    if np.any(acc < 0) or np.any(acc > 1):
        raise ValueError("exact_match: expected accuracies in [0, 1]")
    try:
        n = np.broadcast_to(check_int_array(n_eval, "n_eval", low=1), lengths.shape)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    threshold = check_positive(threshold, "threshold")
    if threshold >= 1:
        raise ValueError(f"threshold: expected a level in (0, 1), got {threshold}")

    order = np.argsort(lengths, kind="stable")
    lengths, acc, n = lengths[order], acc[order], n[order]
    above = acc >= threshold
    if not above.any():
        return None, None
    first_above = int(np.argmax(above))
    below_after = np.flatnonzero(~above[first_above:])
    if below_after.size == 0:
        return None, None
    ic = first_above + int(below_after[0])
    lower, upper = wilson_interval(acc * n, n, _z_to_confidence(z))
    surely_above = lower > threshold
    surely_below = upper < threshold
    before = np.flatnonzero(surely_above[:ic])
    ilo = int(before[-1]) + 1 if before.size else 0
    after = np.flatnonzero(surely_below[ic:])
    ihi = ic + int(after[0]) if after.size else lengths.size - 1
    return int(lengths[ic]), (int(lengths[ilo]), int(lengths[ihi]))
