"""The trained copy model against :mod:`embgeom.bounds`: hidden states, cell shares, the bound.

:func:`compare_with_bounds` runs in three phases, each a function here: the prompt-side bound
(:func:`_prompt_bound`: a ball fitted to the prompt vectors, its precision, packing number and
slope), the hidden-state geometry (:func:`_alphabet_cells`: a ball fitted to the final hidden
states and the alphabet's decoder-cell shares in it, by :func:`embgeom.volumes.cell_volumes`),
and the per-length comparison (:func:`_per_length`: Wilson lower counts against Theorem 4.5).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from embgeom._hf import base_model, input_embeddings, measuring, output_embeddings
from embgeom._stats import wilson_interval
from embgeom._validation import check_positive_int, seed_sequence

from ._task import CopyTask, _check_lengths, _check_task_fits, _torch_threads


def copy_hidden_states(
    model,
    task: CopyTask,
    lengths,
    *,
    n_per_length: int = 64,
    seed: int = 0,
    num_threads: int | None = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Final hidden states of the trained copy model at every decoding position.

    For each length ``L``, ``n_per_length`` random strings are fed teacher-forced as
    ``x_1 .. x_L <sep> x_1 .. x_{L-1}``; the hidden states returned are those of the ``L``
    positions that predict the copy (from ``<sep>`` on), after the final RMSNorm, i.e. the
    vectors ``h`` multiplied by the unembedding (logits ``z = W h``).

    Parameters
    ----------
    model : transformers.LlamaForCausalLM
    task : CopyTask
    lengths : array_like of int, shape (k,)
        Copy lengths (each >= 1).
    n_per_length : int, default 64
    seed : seed, default 0
        Anything ``numpy.random.default_rng`` accepts; length ``L`` draws its strings from
        ``seed_sequence(seed, L, 7)``.
    num_threads : int or None, default 1

    Returns
    -------
    H : numpy.ndarray, float32 (N, d)
        ``N = n_per_length * sum(lengths)``.
    row_lengths : numpy.ndarray, int64 (N,)
        The copy length ``L`` each row comes from.

    Raises
    ------
    TypeError, ValueError
        Non-integer or non-positive ``lengths`` or ``n_per_length``.
    embgeom.adapters.UnsupportedModelError
        A model without a distinct base transformer.

    Notes
    -----
    Runs under :func:`embgeom._hf.measuring`: eval mode and no gradient inside, the caller's
    training flags restored after.
    """
    if not isinstance(task, CopyTask):
        raise TypeError(f"task: expected a CopyTask, got {type(task).__name__}")
    lengths = _check_lengths(lengths)
    n_per_length = check_positive_int(n_per_length, "n_per_length")
    _check_task_fits(model, task)
    rows, row_lengths = [], []
    base = base_model(model)
    with _torch_threads(num_threads), measuring(model):
        for length in lengths.tolist():
            rng = np.random.default_rng(seed_sequence(seed, length, 7))
            x = task.sample_symbols(n_per_length, length, rng)
            ids = torch.cat([task.prompts(x), torch.from_numpy(x[:, :-1])], dim=1)
            h = base(input_ids=ids).last_hidden_state[:, length:, :]
            rows.append(h.reshape(-1, h.shape[-1]).float().numpy())
            row_lengths.append(np.full(h.shape[0] * h.shape[1], length, dtype=np.int64))
    return np.concatenate(rows).astype(np.float32), np.concatenate(row_lengths)



def compare_with_bounds(
    model,
    task: CopyTask,
    evaluation: dict,
    *,
    precision: str = "float32",
    n_hidden_per_length: int = 32,
    n_cell_samples: int = 20000,
    seed: int = 0,
) -> dict:
    """Set the measured copy cliff against what :mod:`embgeom.bounds` allows for this model.

    What is compared, per evaluated length ``L``:

    * **Measured accessible count (a lower estimate).** The model emitted the exact copy for a
      fraction ``p(L)`` of uniformly random strings; with the Wilson lower bound ``p_lo(L)``
      (:func:`embgeom._stats.wilson_interval`) the number of length-``L`` outputs the model
      reaches from its own prompts is at least about ``p_lo(L) A^L``:
      ``log_accessible_lower = log p_lo + L log A`` nats (``-inf`` when ``p_lo = 0``).
    * **Theorem 4.5 upper bound.** The prompt ``x_1 .. x_L <sep>`` is ``m = L + 1`` input vectors,
      all rows of the input embedding, hence inside the ball fitted to those rows (radius ``r``).
      At precision ``eps`` (``precision_eps(r, precision)``) at most ``(1 + 2r/eps)^(d m)``
      distinct outputs exist: ``log_bound = accessible_log_count(ball, eps, m)``.
      ``consistent`` is ``log_accessible_lower <= log_bound`` at every length; a ``False``
      would mean the bound (or the precision model) is wrong.
    * **The bound's own threshold.** All ``A^L`` strings can be accessible only while
      ``L log A <= C (L + 1) log A`` with ``C`` the slope (tokens per prompt vector,
      ``slope_bound(ball, eps, A)``): ``L <= C / (1 - C)`` when ``C < 1``, no limit otherwise.
      ``C`` is also reported refined by the hidden-state geometry: a ball fitted to the final
      hidden states at the decoding positions (:func:`copy_hidden_states`), every decoder
      cell's share of it (:func:`embgeom.volumes.cell_volumes`, uniform points, seeded by
      ``seed``), the alphabet's shares renormalised over the alphabet (the copy targets are
      alphabet strings), and their rate ``lambda`` (:func:`embgeom.bounds.cell_volume_rate`)
      in place of ``log A``.

    Parameters
    ----------
    model : transformers.LlamaForCausalLM
        The trained copy model.
    task : CopyTask
    evaluation : dict
        Output of :func:`evaluate_copy`.
    precision : str, default "float32"
        Precision of the prompt vectors for ``precision_eps`` ("float32", "bfloat16", "float16").
    n_hidden_per_length : int, default 32
        Strings per length for the hidden-state sample (:func:`copy_hidden_states`).
    n_cell_samples : int, default 20000
        Uniform points in the hidden-state support for the cell shares (>= 100).
    seed : seed, default 0
        Seed of the hidden-state strings and of the uniform points (anything
        ``numpy.random.default_rng`` accepts); ``cell_volumes(..., seed=seed)`` draws the points.

    Returns
    -------
    dict
        JSON-able: ``precision``, ``r_inf``, ``eps``, ``hidden_size``, ``prompt_support``
        (``shape``, ``radius``, ``log_volume``), ``log_packing_number`` (nats),
        ``hidden_support`` (ball radius, log volume, sample size, lengths used),
        ``cell_counts`` (int, one per token of the vocabulary: the hits of
        :func:`~embgeom.volumes.cell_volumes`), ``log_alphabet``, ``slope_tokens_per_vector``
        (``C`` with ``log A``), ``rate_lambda`` and ``slope_refined`` (``None`` when no
        uniform point falls in an alphabet cell), ``alphabet_cell_fractions``,
        ``fraction_of_support_in_alphabet_cells``, ``bound_threshold_length`` and
        ``bound_threshold_length_refined`` (``None`` = no limit),
        ``cor410_n_threshold_unbounded`` (tokens; scale only), ``per_length`` (lists
        ``lengths``, ``log_accessible_lower`` (``None`` for ``log 0``), ``log_bound``, in nats),
        ``consistent`` (bool), ``notes`` (str).

    Raises
    ------
    TypeError, ValueError
        ``task`` not a CopyTask or not the model's (its ``alphabet + 2`` tokens are not the
        model's vocabulary), ``evaluation`` not the dict of :func:`evaluate_copy` (a key
        missing, counts not one whole number in ``[0, n_eval]`` per length),
        ``n_cell_samples < 100``, an unknown ``precision``. All before any work.

    Notes
    -----
    The two numbers measure different things; see ``docs/copying.md``. The bound counts outputs
    reachable from *some* prompt of ``m`` vectors at finite precision; the copy cliff is where a
    trained model stops generalising to lengths it never saw. Agreement of the two is not
    expected; the bound must only never be *below* what the model demonstrably does.
    """
    from embgeom import bounds

    if not isinstance(task, CopyTask):
        raise TypeError(f"task: expected a CopyTask, got {type(task).__name__}")
    if not isinstance(evaluation, dict):
        raise TypeError(f"evaluation: expected the dict of evaluate_copy, got "
                        f"{type(evaluation).__name__}")
    for key in ("lengths", "exact_match_count", "n_eval"):
        if key not in evaluation:
            raise ValueError(f"evaluation: expected the dict of evaluate_copy, missing {key!r}")
    lengths = _check_lengths(evaluation["lengths"], "evaluation['lengths']")
    n_eval = check_positive_int(evaluation["n_eval"], "evaluation['n_eval']")
    counts = _check_counts(evaluation["exact_match_count"], lengths, n_eval)
    n_cell_samples = check_positive_int(n_cell_samples, "n_cell_samples", minimum=100)
    n_hidden_per_length = check_positive_int(n_hidden_per_length, "n_hidden_per_length")
    _check_precision(precision)
    _check_task_fits(model, task)

    prompt = _prompt_bound(model, task, precision)
    ball, eps, alphabet = prompt["ball"], prompt["eps"], task.alphabet
    cells = _alphabet_cells(model, task, lengths, n_hidden_per_length=n_hidden_per_length,
                            n_cell_samples=n_cell_samples, seed=seed)
    slope_refined = None
    if cells["rate"] is not None and cells["rate"] > 0:
        slope_refined = float(bounds.slope_bound(ball, eps, alphabet, rate=cells["rate"]))
    per, consistent = _per_length(ball, eps, lengths, counts, n_eval, math.log(alphabet))
    # Cor. 4.10 (mean-field, any prompt length): reported for scale only, see Notes.
    unbounded = bounds.threshold_length_unbounded(prompt["log_packing"], alphabet)
    hidden, cv = cells["support"], cells["cell_volumes"]
    return {
        "precision": str(precision),
        "r_inf": prompt["r_inf"],
        "eps": eps,
        "hidden_size": prompt["d"],
        "prompt_support": {"shape": "ball", "radius": float(ball.radius_),
                           "log_volume": float(ball.log_volume)},
        "log_packing_number": prompt["log_packing"],
        "hidden_support": {"shape": "ball", "radius": float(hidden.radius_),
                           "log_volume": float(hidden.log_volume),
                           "n_hidden_states": cells["n_hidden"], "lengths": cells["lengths"]},
        "cell_counts": cv.counts.tolist(),
        "log_alphabet": math.log(alphabet),
        "slope_tokens_per_vector": prompt["slope"],
        "rate_lambda": cells["rate"],
        "slope_refined": slope_refined,
        "alphabet_cell_fractions": cells["fractions"].tolist(),
        "fraction_of_support_in_alphabet_cells": cells["n_in"] / cv.n_samples,
        "bound_threshold_length": _threshold_length(prompt["slope"]),
        "bound_threshold_length_refined": (None if slope_refined is None
                                           else _threshold_length(slope_refined)),
        "cor410_n_threshold_unbounded": float(unbounded["n_threshold_unbounded"]),
        "per_length": per,
        "consistent": consistent,
        "notes": _NOTES,
    }


_NOTES = (
    "The bound limits how many outputs ANY prompt of m vectors can reach at finite "
    "precision; copying needs only A^L outputs from L+1 vectors, far below it, so the "
    "bound allows copying at every length (bound_threshold_length None = no limit) and "
    "the cliff is a length-generalisation failure of the trained model, not an "
    "accessibility limit. The comparison checks that the bound is never contradicted "
    "(consistent=True). Cor. 4.10 assumes a permutation-invariant (mean-field) model; "
    "this RoPE model is not one, so cor410_n_threshold_unbounded is for scale only."
)


def _check_counts(raw, lengths: np.ndarray, n_eval: int) -> np.ndarray:
    """``evaluation['exact_match_count']`` as float64, one whole count in ``[0, n_eval]`` per
    length (a count above ``n_eval`` is a Wilson bound above 1, a fraction no count at all)."""
    name = "evaluation['exact_match_count']"
    try:
        counts = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected one count (an int) per length, got "
                        f"{type(raw).__name__}") from None
    if counts.shape != lengths.shape:
        raise ValueError(f"evaluation: expected one exact_match_count per length, got "
                         f"{counts.shape[0] if counts.ndim == 1 else counts.shape} for "
                         f"{lengths.size} lengths")
    if not np.all(np.isfinite(counts)) or np.any(counts != np.round(counts)):
        raise ValueError(f"{name}: expected whole counts of exact copies, got "
                         f"{[float(c) for c in counts if not (np.isfinite(c) and c == round(c))][:3]}")
    if np.any(counts < 0) or np.any(counts > n_eval):
        bad = [int(c) for c in counts if c < 0 or c > n_eval][:3]
        raise ValueError(f"{name}: expected counts in [0, n_eval={n_eval}] (strings per "
                         f"length), got {bad}")
    return counts


def _check_precision(precision) -> None:
    """An unknown ``precision`` names the argument here, before any work."""
    from embgeom import bounds

    try:
        bounds.precision_eps(1.0, precision)
    except (TypeError, ValueError) as exc:
        text = str(exc).split(": ", 1)[-1]
        raise ValueError(f"precision: {text}") from None


def _threshold_length(c: float) -> float | None:
    """Largest ``L`` with ``L <= C (L + 1)``: ``C / (1 - C)`` for ``C < 1``, else None (no limit)."""
    return None if c >= 1 else float(c / (1.0 - c))


def _prompt_bound(model, task: CopyTask, precision: str) -> dict:
    """The prompt side: a ball fitted to the prompt vectors and the bounds at their precision.

    The prompt vectors are the input-embedding rows of the alphabet and ``<sep>``, at the
    paper's precision convention ``eps = r_inf 2^-bits`` with ``r_inf`` their largest
    coordinate magnitude. Returns ``ball`` (fitted, centred at the origin), ``d``, ``r_inf``,
    ``eps``, ``log_packing`` (nats) and ``slope`` (tokens per vector, with ``log A``).
    """
    from embgeom import bounds, supports

    emb = input_embeddings(model).weight.detach().double().cpu().numpy()
    rows = emb[: task.sep_id + 1]
    ball = supports.fit_support(rows, "ball", center="origin")
    r_inf = float(np.abs(rows).max())
    eps = float(bounds.precision_eps(r_inf, precision))
    return {
        "ball": ball, "d": int(rows.shape[1]), "r_inf": r_inf, "eps": eps,
        "log_packing": float(bounds.log_packing_number(ball, eps)),
        "slope": float(bounds.slope_bound(ball, eps, task.alphabet)),
    }


def _alphabet_cells(model, task: CopyTask, lengths: np.ndarray, *, n_hidden_per_length: int,
                    n_cell_samples: int, seed) -> dict:
    """The hidden side: the alphabet's decoder-cell shares of the hidden-state ball, and lambda.

    The hidden states are those of :func:`copy_hidden_states` at every evaluated length up to
    ``3 l_train`` (at most 12 of them, evenly spread); the ball is fitted to them with a free
    centre; the shares of every cell (argmax of ``W h``; the copy model has no bias) come from
    :func:`embgeom.volumes.cell_volumes` with ``method="uniform"`` and ``seed``. Returns
    ``support``, ``cell_volumes`` (the :class:`~embgeom.volumes.CellVolumes`), ``lengths``
    (list of the lengths used), ``n_hidden``, ``n_in`` (points in alphabet cells),
    ``fractions`` (float64 (A,), the alphabet's counts over ``n_in``; zeros when ``n_in = 0``)
    and ``rate`` (:func:`embgeom.bounds.cell_volume_rate` of those, ``None`` without a point in
    an alphabet cell or where the rate is not defined).
    """
    from embgeom import bounds, supports
    from embgeom.cells import Decoder
    from embgeom.volumes import cell_volumes

    pool = lengths[lengths <= 3 * task.l_train]
    if pool.size == 0:
        pool = np.sort(lengths)[:1]
    picked = pool[np.unique(np.linspace(0, pool.size - 1, min(12, pool.size)).round().astype(int))]
    H, _ = copy_hidden_states(model, task, picked, n_per_length=n_hidden_per_length, seed=seed)
    hidden = supports.fit_support(H.astype(np.float64), "ball", center="free")
    W = output_embeddings(model).weight.detach().float().cpu().numpy()
    cv = cell_volumes(Decoder(W), hidden, n_cell_samples, seed=seed, method="uniform",
                      progress=False)
    alphabet_counts = cv.counts[: task.alphabet]
    n_in = int(alphabet_counts.sum())
    fractions = alphabet_counts.astype(np.float64)
    rate = None
    if n_in > 0:
        fractions /= n_in
        try:
            rate = float(bounds.cell_volume_rate(fractions, k_max=16, n_samples=n_in).rate)
        except (TypeError, ValueError):  # e.g. one alphabet cell holds every point
            rate = None
    return {"support": hidden, "cell_volumes": cv, "lengths": picked.tolist(),
            "n_hidden": int(H.shape[0]), "n_in": n_in, "fractions": fractions, "rate": rate}


def _per_length(ball, eps: float, lengths: np.ndarray, counts: np.ndarray, n_eval: int,
                log_a: float) -> tuple[dict, bool]:
    """Per length: the Wilson lower log count of exact copies against Theorem 4.5 at ``m = L + 1``.

    Returns the JSON-able lists ``lengths``, ``log_accessible_lower`` (nats; ``None`` for
    ``log 0``) and ``log_bound`` (nats), and whether the lower count is at most the bound at
    every length (``log 0 = -inf`` always is).
    """
    from embgeom import bounds

    lo, _ = wilson_interval(counts, n_eval)
    with np.errstate(divide="ignore"):
        log_acc = np.log(lo) + lengths * log_a
    log_bound = [float(bounds.accessible_log_count(ball, eps, int(L) + 1)) for L in lengths]
    per = {
        "lengths": lengths.tolist(),
        "log_accessible_lower": [float(v) if np.isfinite(v) else None for v in log_acc],
        "log_bound": log_bound,
    }
    return per, bool(np.all(log_acc <= np.asarray(log_bound)))
