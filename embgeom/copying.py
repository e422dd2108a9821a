"""The copy task: a small transformer trained to copy, and the length where it stops copying.

The second experiment of the paper (Meyer et al., ICML 2026; the task follows
Jelassi et al., "Repeat After Me: Transformers are Better than State Space Models at Copying",
ICML 2024): a decoder-only transformer trained from scratch to copy sequences of up to
``l_train`` symbols copies them perfectly, then fails abruptly, not gradually, beyond a length
set by the model.

Task
----
Over an alphabet of ``A`` symbols (token ids ``0 .. A-1``) plus a separator ``<sep>`` (id ``A``)
and a padding token (id ``A + 1``), one example of length ``L`` is::

    input   x_1 .. x_L <sep>
    target  x_1 .. x_L

trained as one causal sequence ``x_1 .. x_L <sep> x_1 .. x_L`` with the loss only on the copied
part (the ``L`` positions that predict ``x_1 .. x_L`` after ``<sep>``). Training lengths are drawn
uniformly from ``1 .. l_train`` per example, symbols uniformly from the alphabet.

Model and positional scheme
---------------------------
A Llama-style decoder (:class:`transformers.LlamaForCausalLM` built from a
:class:`transformers.LlamaConfig`, random initialisation, nothing downloaded): pre-RMSNorm blocks,
SwiGLU MLPs, untied unembedding, and **rotary position embeddings (RoPE)**. RoPE was chosen
because (i) it is the scheme of the real models this project measures (SmolLM2, Gemma-3, Llama,
Qwen, Pythia/GPT-NeoX all use rotary embeddings), and (ii) it has no position table, so a test
length beyond the training range runs through exactly the same weights as an in-range one: the
failure past the cliff is a failure of length generalisation of the learned attention pattern
(the copy head must attend ``L + 1`` tokens back, a relative offset never seen for
``L > l_train``), not an artefact of untrained position rows, as it would be with learned
absolute positions (GPT-2 style), which fail trivially at the first unseen position.

Everything here is deterministic for a fixed seed and a fixed number of torch threads
(``num_threads``, default 1: these models are so small that one thread is faster than two on a
shared machine, and float reductions depend on the thread count).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from . import _json
from ._hf import greedy_decode, input_embeddings, output_embeddings
from ._validation import (
    check_array,
    check_int_array,
    check_positive,
    check_positive_int,
    check_seed,
    seed_sequence,
)
from ._stats import wilson_interval

__all__ = [
    "CopyTask",
    "make_copy_model",
    "train_copy_model",
    "greedy_copy",
    "evaluate_copy",
    "detect_cliff",
    "copy_hidden_states",
    "compare_with_bounds",
    "plot_copy_accuracy",
    "load_copy_model",
    "run_copy",
]

TASK_FILE = "copy_task.json"


# ----------------------------------------------------------------------------------------------
# The task
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CopyTask:
    """The copy task's vocabulary and example generator.

    Parameters
    ----------
    alphabet : int
        Number of symbols ``A`` (>= 2). Symbols are token ids ``0 .. A-1``.
    l_train : int
        Largest training length (>= 1).

    Attributes
    ----------
    sep_id : int
        Token id of ``<sep>`` (``A``).
    pad_id : int
        Token id of the padding token (``A + 1``); never a target.
    vocab_size : int
        ``A + 2``.

    Raises
    ------
    TypeError
        Non-integer ``alphabet`` or ``l_train``.
    ValueError
        ``alphabet < 2`` or ``l_train < 1``.
    """

    alphabet: int
    l_train: int

    def __post_init__(self):
        check_positive_int(self.alphabet, "alphabet", minimum=2)
        check_positive_int(self.l_train, "l_train", minimum=1)

    @property
    def sep_id(self) -> int:
        return int(self.alphabet)

    @property
    def pad_id(self) -> int:
        return int(self.alphabet) + 1

    @property
    def vocab_size(self) -> int:
        return int(self.alphabet) + 2

    def sample_symbols(self, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
        """Uniform random symbol strings, int64 of shape ``(n, length)``."""
        return rng.integers(0, self.alphabet, size=(n, length), dtype=np.int64)

    def prompts(self, symbols: np.ndarray) -> torch.Tensor:
        """``x_1 .. x_L <sep>`` for each row of ``symbols`` (int64 ``(n, L)``): int64 ``(n, L+1)``."""
        n = symbols.shape[0]
        sep = np.full((n, 1), self.sep_id, dtype=np.int64)
        return torch.from_numpy(np.concatenate([symbols, sep], axis=1))

    def training_batch(self, lengths: np.ndarray, rng: np.random.Generator):
        """A right-padded training batch with per-example lengths.

        Parameters
        ----------
        lengths : numpy.ndarray of int, shape (n,)
            Length ``L_i`` of each example.
        rng : numpy.random.Generator

        Returns
        -------
        input_ids : torch.Tensor, int64 (n, 2 max(L) + 1)
            ``x_1 .. x_L <sep> x_1 .. x_L`` then padding.
        labels : torch.Tensor, int64 (n, 2 max(L) + 1)
            ``x_j`` at the copied positions, ``-100`` (ignored by the loss) elsewhere. The model
            shifts labels internally, so the loss is on the predictions made at ``<sep>`` and the
            ``L - 1`` copied positions after it.

        Notes
        -----
        Padding is on the right and attention is causal, so no example's loss sees padding and
        no attention mask is needed; every example's positions start at 0.
        """
        lengths = np.asarray(lengths, dtype=np.int64)
        n, t = lengths.shape[0], 2 * int(lengths.max()) + 1
        ids = np.full((n, t), self.pad_id, dtype=np.int64)
        labels = np.full((n, t), -100, dtype=np.int64)
        for i, length in enumerate(lengths.tolist()):
            x = rng.integers(0, self.alphabet, size=length, dtype=np.int64)
            ids[i, :length] = x
            ids[i, length] = self.sep_id
            ids[i, length + 1 : 2 * length + 1] = x
            labels[i, length + 1 : 2 * length + 1] = x
        return torch.from_numpy(ids), torch.from_numpy(labels)


def _seeds(seed) -> tuple[int, int, int]:
    """Three independent integer seeds (initialisation, training data, evaluation data).

    ``seed`` is an int >= 0 (it is recorded in ``copy_summary.json``); the three come from
    ``seed_sequence(seed).generate_state(3)``.
    """
    seed = check_positive_int(seed, "seed", minimum=0)
    children = seed_sequence(seed).generate_state(3, dtype=np.uint32)
    return tuple(int(c) for c in children)


@contextlib.contextmanager
def _torch_threads(n: int | None):
    """Temporarily set torch's intra-op thread count (restored on exit)."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------------------------
# Model and training
# ----------------------------------------------------------------------------------------------
def make_copy_model(
    task: CopyTask,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_length: int | None = None,
    seed: int = 0,
):
    """A randomly initialised Llama-style decoder (RoPE) sized for the copy task.

    Parameters
    ----------
    task : CopyTask
    hidden_size : int, default 64
        Hidden size ``d`` (a multiple of ``num_heads``). The MLP width is ``4 d``.
    num_layers : int, default 2
        Decoder blocks. Copying needs at least two (an induction-style circuit).
    num_heads : int, default 4
    max_length : int, optional
        Recorded as ``max_position_embeddings`` (RoPE has no position table; this only informs
        transformers). Default ``8 * l_train + 2``.
    seed : int, default 0
        Seed of the initialisation (``torch.manual_seed``).

    Returns
    -------
    transformers.LlamaForCausalLM
        float32, on CPU, in train mode, untied unembedding (``lm_head``), no bias.

    Raises
    ------
    TypeError, ValueError
        Non-positive sizes, or ``hidden_size`` not divisible by ``num_heads``.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if not isinstance(task, CopyTask):
        raise TypeError(f"task: expected a CopyTask, got {type(task).__name__}")
    d = check_positive_int(hidden_size, "hidden_size")
    layers = check_positive_int(num_layers, "num_layers")
    heads = check_positive_int(num_heads, "num_heads")
    if d % heads:
        raise ValueError(f"hidden_size: must be divisible by num_heads={heads}, got {d}")
    if max_length is None:
        max_length = 8 * task.l_train + 2
    max_length = check_positive_int(max_length, "max_length", minimum=2)
    config = LlamaConfig(
        vocab_size=task.vocab_size,
        hidden_size=d,
        intermediate_size=4 * d,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_length,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        tie_word_embeddings=False,
        pad_token_id=task.pad_id,
        bos_token_id=None,
        eos_token_id=None,
        use_cache=True,
    )
    config._attn_implementation = "sdpa"
    seed_init = check_positive_int(seed, "seed", minimum=0)
    torch.manual_seed(seed_init)
    model = LlamaForCausalLM(config)
    return model.float().train()


@dataclass
class TrainingHistory:
    """Loss curve of :func:`train_copy_model` (JSON-able through :meth:`to_dict`)."""

    steps: list = field(default_factory=list)
    loss: list = field(default_factory=list)
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        return {"steps": list(self.steps), "loss": list(self.loss), "wall_s": float(self.wall_s)}


def train_copy_model(
    model,
    task: CopyTask,
    *,
    steps: int = 800,
    batch_size: int = 64,
    lr: float = 3e-3,
    warmup: float = 0.1,
    seed: int = 0,
    num_threads: int | None = 1,
    progress: bool = True,
    log_every: int = 50,
):
    """Train ``model`` on the copy task in place (AdamW, one-cycle schedule, gradient clipping 1).

    Each step draws ``batch_size`` examples with lengths uniform on ``1 .. task.l_train`` and
    symbols uniform on the alphabet; the loss is the mean cross-entropy (nats per token) over the
    copied positions only.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM whose vocabulary covers ``task.vocab_size`` (see :func:`make_copy_model`).
    task : CopyTask
    steps : int, default 800
    batch_size : int, default 64
    lr : float, default 3e-3
        Peak learning rate of the one-cycle (linear warm-up, cosine decay) schedule.
    warmup : float, default 0.1
        Fraction of steps spent warming up, in (0, 1).
    seed : seed, default 0
        Seed of the training data stream: anything ``numpy.random.default_rng`` accepts
        (:func:`embgeom._validation.check_seed`).
    num_threads : int or None, default 1
        torch threads during training (restored afterwards); ``None`` leaves torch's setting.
    progress : bool, default True
        Show a tqdm bar.
    log_every : int, default 50
        Record the loss every this many steps.

    Returns
    -------
    TrainingHistory
        The recorded losses (nats per copied token) and the wall time in seconds.

    Raises
    ------
    TypeError, ValueError
        Bad step counts, batch size, learning rate or warm-up fraction.
    """
    if not isinstance(task, CopyTask):
        raise TypeError(f"task: expected a CopyTask, got {type(task).__name__}")
    steps = check_positive_int(steps, "steps")
    batch_size = check_positive_int(batch_size, "batch_size")
    lr = check_positive(lr, "lr")
    warmup = check_positive(warmup, "warmup")
    if warmup >= 1:
        raise ValueError(f"warmup: expected a fraction in (0, 1), got {warmup}")
    log_every = check_positive_int(log_every, "log_every")
    rng = check_seed(seed)
    history = TrainingHistory()
    t0 = time.perf_counter()
    with _torch_threads(num_threads):
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=lr, total_steps=steps, pct_start=warmup, anneal_strategy="cos"
        )
        bar = tqdm(range(steps), desc=f"copy train (L<={task.l_train})", disable=not progress)
        for step in bar:
            lengths = rng.integers(1, task.l_train + 1, size=batch_size)
            ids, labels = task.training_batch(lengths, rng)
            loss = model(input_ids=ids, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if step % log_every == 0 or step == steps - 1:
                value = float(loss.detach())
                history.steps.append(step)
                history.loss.append(value)
                bar.set_postfix(loss=f"{value:.4f}")
        model.eval()
    history.wall_s = time.perf_counter() - t0
    return history


# ----------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------
def greedy_copy(model, prompts: torch.Tensor, n_new: int) -> torch.Tensor:
    """Batched greedy decoding (argmax over the whole vocabulary, with the KV cache).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Causal LM in eval mode.
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
    ValueError
        ``n_new < 1`` or ``prompts`` not of shape (n, p) with p >= 1.

    Notes
    -----
    Runs :func:`embgeom._hf.greedy_decode`, embgeom's one greedy decoder.
    """
    n_new = check_positive_int(n_new, "n_new")
    if prompts.ndim != 2 or prompts.shape[1] < 1:
        raise ValueError(f"prompts: expected shape (n, p) with p >= 1, got {tuple(prompts.shape)}")
    return greedy_decode(model, n_new, input_ids=prompts, use_cache=True)


def _check_lengths(lengths, name="lengths") -> np.ndarray:
    return check_int_array(lengths, name, ndim=1, low=1)


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
        Empty ``lengths``, a length < 1, ``n_eval < 1``.
    TypeError
        Non-integer lengths.
    """
    if not isinstance(task, CopyTask):
        raise TypeError(f"task: expected a CopyTask, got {type(task).__name__}")
    lengths = _check_lengths(lengths)
    n_eval = check_positive_int(n_eval, "n_eval")
    batch_size = check_positive_int(batch_size, "batch_size")
    t0 = time.perf_counter()
    em_counts, per_token = [], []
    was_training = model.training
    model.eval()
    with _torch_threads(num_threads):
        for length in tqdm(lengths.tolist(), desc="copy eval", disable=not progress):
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
    model.train(was_training)
    return {
        "lengths": [int(v) for v in lengths],
        "exact_match": [c / n_eval for c in em_counts],
        "exact_match_count": em_counts,
        "per_token": per_token,
        "n_eval": n_eval,
        "wall_s": time.perf_counter() - t0,
    }


# ----------------------------------------------------------------------------------------------
# The cliff
# ----------------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------------
# Geometry of the trained model, and the bound
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
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
    """
    lengths = _check_lengths(lengths)
    n_per_length = check_positive_int(n_per_length, "n_per_length")
    rows, row_lengths = [], []
    base = getattr(model, "model", model)
    with _torch_threads(num_threads):
        model.eval()
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
      fraction ``p(L)`` of uniformly random strings; with the Wilson lower bound ``p_lo(L)`` the
      number of length-``L`` outputs the model reaches from its own prompts is at least about
      ``p_lo(L) A^L``: ``log_accessible_lower = log p_lo + L log A`` nats (``-inf`` when
      ``p_lo = 0``).
    * **Theorem 4.5 upper bound.** The prompt ``x_1 .. x_L <sep>`` is ``m = L + 1`` input vectors,
      all rows of the input embedding, hence inside the ball fitted to those rows (radius ``r``).
      At precision ``eps`` (``precision_eps(r, precision)``) at most ``(1 + 2r/eps)^(d m)``
      distinct outputs exist: ``log_bound = accessible_log_count(ball, eps, m)``.
      ``consistent`` is ``log_accessible_lower <= log_bound`` at every length; a ``False``
      would mean the bound (or the precision model) is wrong.
    * **The bound's own threshold.** All ``A^L`` strings can be accessible only while
      ``L log A <= C (L + 1) log A`` with ``C`` the slope (tokens per prompt vector,
      ``slope_bound(ball, eps, A)``): ``L <= C / (1 - C)`` when ``C < 1``, no limit otherwise.
      ``C`` is also reported refined by the hidden-state geometry: a support fitted to the final
      hidden states at the decoding positions, the alphabet's decoder-cell volume fractions in it
      (argmax of the unembedding rows of the alphabet), and their rate ``lambda``
      (``cell_volume_rate``) in place of ``log A``.

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
        Uniform points in the hidden-state support for the cell-volume fractions.
    seed : seed, default 0
        Seed of the hidden-state strings and of the uniform points (anything
        ``numpy.random.default_rng`` accepts).

    Returns
    -------
    dict
        JSON-able: ``precision``, ``r_inf``, ``eps``, ``hidden_size``, ``prompt_support``
        (``shape``, ``radius``, ``log_volume``), ``log_packing_number`` (nats),
        ``hidden_support`` (ball radius, log volume, sample size, lengths used),
        ``log_alphabet``, ``slope_tokens_per_vector`` (``C`` with ``log A``), ``rate_lambda``
        and ``slope_refined`` (``None`` when no uniform point falls in an alphabet cell),
        ``alphabet_cell_fractions``, ``fraction_of_support_in_alphabet_cells``,
        ``bound_threshold_length`` and ``bound_threshold_length_refined`` (``None`` = no
        limit), ``cor410_n_threshold_unbounded`` (tokens; scale only), ``per_length`` (lists
        ``lengths``, ``log_accessible_lower`` (``None`` for ``log 0``), ``log_bound``, in nats),
        ``consistent`` (bool), ``notes`` (str).

    Raises
    ------
    ImportError
        When :mod:`embgeom.bounds` or :mod:`embgeom.supports` is not installed.
    TypeError, ValueError
        ``task`` not a CopyTask, ``evaluation`` not the dict of :func:`evaluate_copy`,
        ``n_cell_samples < 100``, an unknown ``precision``.

    Notes
    -----
    The two numbers measure different things; see ``docs/copying.md``. The bound counts outputs
    reachable from *some* prompt of ``m`` vectors at finite precision; the copy cliff is where a
    trained model stops generalising to lengths it never saw. Agreement of the two is not
    expected; the bound must only never be *below* what the model demonstrably does.
    """
    from . import bounds, supports  # lazy: geometry modules, numpy only
    from .cells import Decoder

    if not isinstance(task, CopyTask):
        raise TypeError(f"task: expected a CopyTask, got {type(task).__name__}")
    for key in ("lengths", "exact_match_count", "n_eval"):
        if key not in evaluation:
            raise ValueError(f"evaluation: expected the dict of evaluate_copy, missing {key!r}")
    lengths = _check_lengths(evaluation["lengths"])
    counts = np.asarray(evaluation["exact_match_count"], dtype=np.float64)
    n_eval = check_positive_int(evaluation["n_eval"], "evaluation['n_eval']")
    n_cell_samples = check_positive_int(n_cell_samples, "n_cell_samples", minimum=100)
    alphabet = task.alphabet
    log_a = math.log(alphabet)

    # Prompt vectors: rows of the input embedding (the alphabet and <sep>), at the paper's
    # precision convention eps = r_inf 2^-bits with r_inf their largest coordinate magnitude.
    emb = input_embeddings(model).weight.detach().double().numpy()
    prompt_rows = emb[: task.sep_id + 1]
    d = prompt_rows.shape[1]
    ball = supports.fit_support(prompt_rows, "ball", center="origin")
    r_inf = float(np.abs(prompt_rows).max())
    eps = float(bounds.precision_eps(r_inf, precision))
    log_packing = float(bounds.log_packing_number(ball, eps))
    slope = float(bounds.slope_bound(ball, eps, alphabet))

    # Hidden-state geometry: a ball fitted to the final hidden states at the decoding positions
    # (every evaluated length up to 3 l_train, at most 12 of them), and the alphabet's decoder
    # cells in it: fractions of uniform points whose argmax of W h is each symbol, renormalised
    # over the alphabet (the copy targets are alphabet strings).
    pool = lengths[lengths <= 3 * task.l_train]
    picked = pool[np.unique(np.linspace(0, pool.size - 1, min(12, pool.size)).round().astype(int))]
    H, _ = copy_hidden_states(model, task, picked, n_per_length=n_hidden_per_length, seed=seed)
    hidden = supports.fit_support(H.astype(np.float64), "ball", center="free")
    W = output_embeddings(model).weight.detach().float().numpy()
    pts = hidden.sample(n_cell_samples, seed=seed)
    winners = Decoder(W).assign(pts)  # the decoder cells (argmax of W h; the copy model has no bias)
    in_alphabet = winners < alphabet
    n_in = int(in_alphabet.sum())
    rate, slope_refined = None, None
    fractions = np.bincount(winners[in_alphabet], minlength=alphabet).astype(np.float64)
    if n_in > 0:
        fractions /= n_in
        try:
            rate = float(bounds.cell_volume_rate(fractions, k_max=16, n_samples=n_in).rate)
        except (TypeError, ValueError):
            rate = None
        if rate is not None and rate > 0:
            slope_refined = float(bounds.slope_bound(ball, eps, alphabet, rate=rate))

    def threshold_length(c):
        return None if c >= 1 else float(c / (1.0 - c))

    # Cor. 4.10 (mean-field, any prompt length): reported for scale only, see Notes.
    unbounded = bounds.threshold_length_unbounded(log_packing, alphabet)

    lo, _ = wilson_interval(counts, n_eval)
    with np.errstate(divide="ignore"):
        log_acc = np.log(lo) + lengths * log_a
    log_bound = np.array([float(bounds.accessible_log_count(ball, eps, int(L) + 1)) for L in lengths])
    consistent = bool(np.all(log_acc <= log_bound))
    return {
        "precision": str(precision),
        "r_inf": r_inf,
        "eps": eps,
        "hidden_size": int(d),
        "prompt_support": {"shape": "ball", "radius": float(ball.radius_), "log_volume": float(ball.log_volume)},
        "log_packing_number": log_packing,
        "hidden_support": {"shape": "ball", "radius": float(hidden.radius_), "log_volume": float(hidden.log_volume),
                           "n_hidden_states": int(H.shape[0]), "lengths": picked.tolist()},
        "log_alphabet": log_a,
        "slope_tokens_per_vector": slope,
        "rate_lambda": rate,
        "slope_refined": slope_refined,
        "alphabet_cell_fractions": fractions.tolist(),
        "fraction_of_support_in_alphabet_cells": n_in / pts.shape[0],
        "bound_threshold_length": threshold_length(slope),
        "bound_threshold_length_refined": None if slope_refined is None else threshold_length(slope_refined),
        "cor410_n_threshold_unbounded": float(unbounded["n_threshold_unbounded"]),
        "per_length": {
            "lengths": lengths.tolist(),
            "log_accessible_lower": [float(v) if np.isfinite(v) else None for v in log_acc],
            "log_bound": log_bound.tolist(),
        },
        "consistent": consistent,
        "notes": (
            "The bound limits how many outputs ANY prompt of m vectors can reach at finite "
            "precision; copying needs only A^L outputs from L+1 vectors, far below it, so the "
            "bound allows copying at every length (bound_threshold_length None = no limit) and "
            "the cliff is a length-generalisation failure of the trained model, not an "
            "accessibility limit. The comparison checks that the bound is never contradicted "
            "(consistent=True). Cor. 4.10 assumes a permutation-invariant (mean-field) model; "
            "this RoPE model is not one, so cor410_n_threshold_unbounded is for scale only."
        ),
    }


# ----------------------------------------------------------------------------------------------
# Figure, checkpoint, and the whole job
# ----------------------------------------------------------------------------------------------
def plot_copy_accuracy(evaluation: dict, l_train: int, path, *, cliff=None, interval=None) -> Path:
    """Exact-match and per-token accuracy vs length, training range shaded; saved as PNG.

    Parameters
    ----------
    evaluation : dict
        Output of :func:`evaluate_copy`.
    l_train : int
        Largest training length (the shaded range is ``[1, l_train]``).
    path : str or Path
        Output PNG.
    cliff : int, optional
        Drawn as a vertical line, with ``interval`` (lo, hi) as a band.

    Returns
    -------
    pathlib.Path
    """
    from matplotlib.figure import Figure

    l_train = check_positive_int(l_train, "l_train")
    lengths = np.asarray(evaluation["lengths"])
    em = np.asarray(evaluation["exact_match"])
    lo, hi = wilson_interval(np.asarray(evaluation["exact_match_count"]), evaluation["n_eval"])
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.axvspan(0.5, l_train + 0.5, color="0.9", label=f"training lengths 1..{l_train}")
    ax.fill_between(lengths, lo, hi, color="C0", alpha=0.25, linewidth=0)
    ax.plot(lengths, em, "o-", ms=3, color="C0", label="exact match (95% Wilson)")
    ax.plot(lengths, evaluation["per_token"], "s-", ms=3, color="C1", label="per-token accuracy")
    if cliff is not None:
        ax.axvline(cliff, color="C3", ls="--", label=f"cliff L={cliff}")
        if interval is not None:
            ax.axvspan(interval[0] - 0.5, interval[1] + 0.5, color="C3", alpha=0.1)
    ax.axhline(0.5, color="0.5", lw=0.8, ls=":")
    ax.set_xlabel("sequence length L (symbols to copy)")
    ax.set_ylabel("accuracy (greedy decoding)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlim(0.5, lengths.max() + 0.5)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_title(f"Copy task, n={evaluation['n_eval']} strings per length")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def load_copy_model(path):
    """Load a checkpoint written by :func:`run_copy`: ``(model, task)`` (model in eval mode)."""
    from transformers import LlamaForCausalLM

    path = Path(path)
    meta = json.loads((path / TASK_FILE).read_text())
    task = CopyTask(alphabet=int(meta["alphabet"]), l_train=int(meta["l_train"]))
    model = LlamaForCausalLM.from_pretrained(path).float().eval()
    return model, task


def run_copy(
    out_dir,
    *,
    l_train: int = 20,
    alphabet: int = 16,
    steps: int = 2000,
    batch_size: int = 64,
    lr: float = 3e-3,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    n_eval: int = 200,
    max_length: int | None = None,
    seed: int = 0,
    num_threads: int | None = 1,
    compare_bounds: bool = True,
    precision: str = "float32",
    progress: bool = True,
) -> dict:
    """The whole ``embgeom copy`` job: train, evaluate ``1 .. 3 l_train``, find the cliff, compare.

    Writes into ``out_dir``: ``checkpoint/`` (``save_pretrained`` plus ``copy_task.json``),
    ``copy_accuracy.png`` and ``copy_summary.json`` (the returned dict).

    Parameters
    ----------
    out_dir : str or Path
    l_train : int, default 20
        Largest training length.
    alphabet : int, default 16
        Alphabet size ``A`` (>= 2).
    steps, batch_size, lr : training (see :func:`train_copy_model`).
    hidden_size, num_layers, num_heads : model (see :func:`make_copy_model`).
    n_eval : int, default 200
        Strings per evaluated length.
    max_length : int, optional
        Largest evaluated length; default ``3 * l_train``.
    seed : int, default 0
        Master seed; initialisation, training data and evaluation data get independent seeds
        derived from it (``numpy.random.SeedSequence``).
    num_threads : int or None, default 1
    compare_bounds : bool, default True
        Run :func:`compare_with_bounds` (skipped with a note when ``embgeom.bounds`` or
        ``embgeom.supports`` cannot be imported).
    precision : str, default "float32"
    progress : bool, default True

    Returns
    -------
    dict
        JSON-able summary: ``config``, ``training`` (loss history, wall time), ``evaluation``,
        ``cliff``, ``cliff_interval``, ``bounds`` (or ``None``), ``files``, ``wall_s``.

    Raises
    ------
    ValueError, TypeError
        Bad sizes (``l_train < 1``, ``alphabet < 2``, ...).
    """
    t0 = time.perf_counter()
    task = CopyTask(alphabet=alphabet, l_train=l_train)
    if max_length is None:
        max_length = 3 * task.l_train
    max_length = check_positive_int(max_length, "max_length")
    seed_init, seed_data, seed_eval = _seeds(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    with _torch_threads(num_threads):
        model = make_copy_model(
            task,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            max_length=max(8 * task.l_train + 2, 2 * max_length + 2),
            seed=seed_init,
        )
    history = train_copy_model(
        model, task, steps=steps, batch_size=batch_size, lr=lr, seed=seed_data,
        num_threads=num_threads, progress=progress,
    )
    ckpt = out / "checkpoint"
    model.save_pretrained(ckpt)
    _json.dump({
        "alphabet": task.alphabet, "l_train": task.l_train, "sep_id": task.sep_id,
        "pad_id": task.pad_id, "format": "x_1..x_L <sep> x_1..x_L; loss on the copy only",
    }, ckpt / TASK_FILE)

    evaluation = evaluate_copy(
        model, task, np.arange(1, max_length + 1), n_eval=n_eval, seed=seed_eval,
        num_threads=num_threads, progress=progress,
    )
    cliff, interval = detect_cliff(evaluation["lengths"], evaluation["exact_match"], n_eval)

    bound_section, bound_note = None, None
    if compare_bounds:
        try:
            with _torch_threads(num_threads):
                bound_section = compare_with_bounds(model, task, evaluation, precision=precision, seed=seed)
        except ImportError as exc:
            bound_note = f"bounds comparison skipped: {exc}"

    figure = plot_copy_accuracy(evaluation, task.l_train, out / "copy_accuracy.png", cliff=cliff, interval=interval)
    summary = {
        "config": {
            "l_train": task.l_train, "alphabet": task.alphabet, "steps": steps,
            "batch_size": batch_size, "lr": lr, "hidden_size": hidden_size,
            "num_layers": num_layers, "num_heads": num_heads, "n_eval": n_eval,
            "max_length": max_length, "seed": seed, "num_threads": num_threads,
            "architecture": "LlamaForCausalLM (RoPE, RMSNorm, SwiGLU, untied unembedding)",
            "torch": torch.__version__,
        },
        "training": history.to_dict(),
        "evaluation": evaluation,
        "cliff": cliff,
        "cliff_interval": None if interval is None else list(interval),
        "bounds": bound_section,
        "bounds_note": bound_note,
        "files": {"checkpoint": str(ckpt), "figure": str(figure), "summary": str(out / "copy_summary.json")},
    }
    summary["wall_s"] = time.perf_counter() - t0
    _json.dump(summary, out / "copy_summary.json")
    return summary
