"""The copy task: its vocabulary, example generator and the seeds of a run.

Shared by the other modules of :mod:`embgeom.copying`: :class:`CopyTask`, the three derived
seeds of a run (:func:`_seeds`), torch's thread count for a block (:func:`_torch_threads`) and
the one check of a list of lengths (:func:`_check_lengths`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from embgeom._validation import check_int_array, check_positive_int, seed_sequence

#: Name of the task's description beside a saved checkpoint (:func:`embgeom.copying.run_copy`).
TASK_FILE = "copy_task.json"


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


def _check_threads(n, name: str = "num_threads") -> int | None:
    """``n`` as None (torch's setting) or an int >= 1 (torch's ``set_num_threads(0)`` raises a
    RuntimeError that names nothing)."""
    return None if n is None else check_positive_int(n, name)


@contextlib.contextmanager
def _torch_threads(n: int | None):
    """Temporarily set torch's intra-op thread count (restored on exit).

    Raises
    ------
    TypeError, ValueError
        ``n`` neither None nor an int >= 1, naming ``num_threads``.
    """
    n = _check_threads(n)
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _check_lengths(lengths, name="lengths") -> np.ndarray:
    return check_int_array(lengths, name, ndim=1, low=1)


def _check_task_fits(model, task: CopyTask, name: str = "task") -> None:
    """Refuse a task whose vocabulary (``alphabet + 2``: the symbols, ``<sep>``, padding) is not
    the model's: a larger alphabet fails inside torch's embedding lookup with an IndexError
    that names nothing, a smaller one would treat one of the model's symbols as ``<sep>``."""
    from embgeom._hf import input_embeddings, output_embeddings

    rows = {int(input_embeddings(model).weight.shape[0]),
            int(output_embeddings(model).weight.shape[0])}
    if rows != {task.vocab_size}:
        n = "/".join(str(r) for r in sorted(rows))
        raise ValueError(f"{name}: CopyTask(alphabet={task.alphabet}) has {task.vocab_size} "
                         f"tokens (the alphabet, <sep> and padding), but the model has {n}: "
                         f"pass the task the model was trained on (alphabet "
                         f"{min(rows) - 2}; a checkpoint's {TASK_FILE} records it)")
