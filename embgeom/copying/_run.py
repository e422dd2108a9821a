"""The whole ``embgeom copy`` job: train, evaluate, find the cliff, compare with the bounds, write."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from embgeom import _json
from embgeom._validation import check_positive_int

from ._bounds import compare_with_bounds
from ._evaluate import detect_cliff, evaluate_copy
from ._model import make_copy_model, train_copy_model
from ._task import TASK_FILE, CopyTask, _seeds, _torch_threads
from .plots import plot_copy_accuracy


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
