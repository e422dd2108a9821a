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

Public API
----------
- :class:`CopyTask`: the vocabulary and the example generator.
- :func:`make_copy_model`, :func:`train_copy_model`, :func:`load_copy_model`: the model.
- :func:`greedy_copy`, :func:`evaluate_copy`: greedy copies and their accuracy per length.
- :func:`detect_cliff`: the length where exact match falls below 0.5, with an interval.
- :func:`copy_hidden_states`, :func:`compare_with_bounds`: the trained model's geometry
  against :mod:`embgeom.bounds` (cell shares by :func:`embgeom.volumes.cell_volumes`).
- :func:`plot_copy_accuracy`: the figure.
- :func:`run_copy`: the whole ``embgeom copy`` job (checkpoint + JSON summary + PNG).

Layout
------
- ``_task``: :class:`CopyTask`, the seeds of a run, torch's thread count, the length check;
- ``_model``: :func:`make_copy_model`, :func:`train_copy_model` (:class:`TrainingHistory`),
  :func:`load_copy_model`;
- ``_evaluate``: :func:`greedy_copy`, :func:`evaluate_copy`, :func:`detect_cliff`;
- ``_bounds``: :func:`copy_hidden_states`, :func:`compare_with_bounds` (in three phases);
- ``plots``: :func:`plot_copy_accuracy`; ``_run``: :func:`run_copy`.

Binomial intervals come from :mod:`embgeom._stats` (the one home), greedy decoding from
:func:`embgeom._hf.greedy_decode` and cell shares from :func:`embgeom.volumes.cell_volumes`.
"""

from __future__ import annotations

from ._bounds import compare_with_bounds, copy_hidden_states
from ._evaluate import detect_cliff, evaluate_copy, greedy_copy
from ._model import TrainingHistory, load_copy_model, make_copy_model, train_copy_model
from ._run import run_copy
from ._task import CopyTask
from .plots import plot_copy_accuracy

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
