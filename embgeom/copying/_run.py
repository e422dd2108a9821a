"""The whole ``embgeom copy`` job: train, evaluate, find the cliff, compare with the bounds, write."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch

from embgeom import _json
from embgeom._validation import check_bool, check_positive, check_positive_int

from ._bounds import _check_precision, compare_with_bounds
from ._evaluate import detect_cliff, evaluate_copy
from ._model import make_copy_model, train_copy_model
from ._task import TASK_FILE, CopyTask, _check_threads, _seeds, _torch_threads
from .plots import plot_copy_accuracy


#: the evaluation's batch (:func:`evaluate_copy`'s default, capped by ``n_eval``)
_EVAL_BATCH = 256


def _check_out_dir(out_dir) -> Path:
    """``out_dir`` as a Path: a non-empty path that is a folder or does not exist yet."""
    if isinstance(out_dir, bool) or not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"out_dir: expected a folder path, got {type(out_dir).__name__}")
    if not str(os.fspath(out_dir)).strip():
        raise ValueError("out_dir: expected a folder path, got an empty path (it would write "
                         "into the current folder)")
    out = Path(out_dir).expanduser()
    for parent in (out, *out.parents):
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"out_dir: {str(parent)!r} exists and is not a folder")
    return out


def _memory_estimate(task: CopyTask, *, max_length: int, batch_size: int, hidden_size: int,
                     num_layers: int, n_eval: int) -> dict:
    """Bytes a training step and the longest evaluation need, roughly (float32).

    Training: a batch of ``batch_size`` sequences of ``2 l_train + 1`` tokens keeps, per token,
    about ``24 d`` activations per layer for the backward pass plus the logits and their
    gradient (``4 V``). Evaluation: prompts of ``L + 1`` tokens and ``L`` decoded ones, batches
    of ``min(256, n_eval)``: the KV cache (``2 d`` per layer and token) and the prefill's
    activations and logits. Attention itself runs in torch's fused kernels (memory linear in
    the length), so these are lower estimates: a run they refuse cannot fit.
    """
    d, V, layers = hidden_size, task.vocab_size, num_layers
    t_train = 2 * task.l_train + 1
    train = 4 * batch_size * t_train * (layers * 24 * d + 4 * V)
    b_eval = min(_EVAL_BATCH, n_eval)
    t_eval = 2 * max_length + 1
    evaluate = 4 * b_eval * t_eval * (layers * 2 * d + 8 * d + V)
    return {"train": int(train), "evaluate": int(evaluate)}


def _available_memory() -> int | None:
    """Bytes of memory available now (``MemAvailable`` of ``/proc/meminfo``), else the machine's
    physical memory, else None (unknown: nothing is refused)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


def _check_memory(task: CopyTask, **sizes) -> None:
    """Refuse sizes whose training step or evaluation cannot fit in memory, before any work
    (``--l-train 100000`` allocated 22 GB until the OOM killer ended it, with no message)."""
    need = _memory_estimate(task, **sizes)
    have = _available_memory()
    if have is None:
        return
    gib = 2**30
    if need["train"] > have:
        raise ValueError(
            f"l_train, alphabet: a training step at l_train={task.l_train} and alphabet="
            f"{task.alphabet} (sequences of "
            f"{2 * task.l_train + 1} tokens, batch_size={sizes['batch_size']}, hidden_size="
            f"{sizes['hidden_size']}, num_layers={sizes['num_layers']}) needs at least "
            f"{need['train'] / gib:.1f} GiB, more than the {have / gib:.1f} GiB available; "
            "lower l_train or alphabet (or batch_size)")
    if need["evaluate"] > have:
        raise ValueError(
            f"max_length: evaluating copies up to length {sizes['max_length']} (default "
            f"3 l_train) needs at least {need['evaluate'] / gib:.1f} GiB, more than the "
            f"{have / gib:.1f} GiB available; lower max_length or l_train")


#: The longest evaluation :func:`run_copy` accepts, in multiples of ``l_train``.
MAX_LENGTH_FACTOR = 16


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
        Largest evaluated length; default ``3 * l_train``, at most
        ``MAX_LENGTH_FACTOR * l_train`` (16).
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
        Every argument is checked before any work, and nothing is created on a refused call:
        bad sizes (``l_train < 1``, ``alphabet < 2``, ``n_eval < 1``, ``hidden_size`` not
        divisible by ``num_heads``, ...), ``num_threads`` neither None nor >= 1, an unknown
        ``precision``, an ``out_dir`` that is empty or exists and is not a folder, and sizes
        whose training step or evaluation would need more memory than the machine has
        (:func:`_memory_estimate`; the message names ``l_train`` or ``max_length``).
    """
    t0 = time.perf_counter()
    out, task, c = _check_copy_args(
        out_dir, l_train=l_train, alphabet=alphabet, steps=steps, batch_size=batch_size, lr=lr,
        hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads, n_eval=n_eval,
        max_length=max_length, seed=seed, num_threads=num_threads, compare_bounds=compare_bounds,
        precision=precision, progress=progress)
    seed_init, seed_data, seed_eval = c.pop("seeds")
    num_threads, max_length = c["num_threads"], c["max_length"]
    out.mkdir(parents=True, exist_ok=True)

    with _torch_threads(num_threads):
        model = make_copy_model(
            task,
            hidden_size=c["hidden_size"],
            num_layers=c["num_layers"],
            num_heads=c["num_heads"],
            max_length=max(8 * task.l_train + 2, 2 * max_length + 2),
            seed=seed_init,
        )
    history = train_copy_model(
        model, task, steps=c["steps"], batch_size=c["batch_size"], lr=lr, seed=seed_data,
        num_threads=num_threads, progress=progress,
    )
    ckpt = out / "checkpoint"
    model.save_pretrained(ckpt)
    _json.dump({
        "alphabet": task.alphabet, "l_train": task.l_train, "sep_id": task.sep_id,
        "pad_id": task.pad_id, "format": "x_1..x_L <sep> x_1..x_L; loss on the copy only",
    }, ckpt / TASK_FILE)

    evaluation = evaluate_copy(
        model, task, np.arange(1, max_length + 1), n_eval=c["n_eval"], seed=seed_eval,
        num_threads=num_threads, progress=progress,
    )
    cliff, interval = detect_cliff(evaluation["lengths"], evaluation["exact_match"], c["n_eval"])

    bound_section, bound_note = None, None
    if compare_bounds:
        try:
            with _torch_threads(num_threads):
                bound_section = compare_with_bounds(model, task, evaluation, precision=precision, seed=seed)
        except ImportError as exc:
            bound_note = f"bounds comparison skipped: {exc}"

    figure = plot_copy_accuracy(evaluation, task.l_train, out / "copy_accuracy.png", cliff=cliff, interval=interval)
    summary = {
        "config": _config_record(task, c, seed),
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


def _check_copy_args(out_dir, *, l_train, alphabet, steps, batch_size, lr, hidden_size,
                     num_layers, num_heads, n_eval, max_length, seed, num_threads,
                     compare_bounds, precision, progress) -> tuple:
    """Every argument of :func:`run_copy`, checked before any work (nothing is created here).

    Returns ``(out, task, checked)``: the output folder, the :class:`CopyTask` and a dict of the
    checked sizes (``steps``, ``batch_size``, ``lr`` as given, ``hidden_size``, ``num_layers``, ``num_heads``,
    ``n_eval``, ``max_length``, ``num_threads``) and ``seeds``, the three derived seeds
    (initialisation, training data, evaluation data).
    """
    out = _check_out_dir(out_dir)
    task = CopyTask(alphabet=alphabet, l_train=l_train)
    if max_length is None:
        max_length = 3 * task.l_train
    max_length = check_positive_int(max_length, "max_length")
    if max_length > MAX_LENGTH_FACTOR * task.l_train:
        # every length 1..max_length is evaluated by greedy decoding: the cost grows like
        # max_length^3, so a typo (10**6) would run for days instead of failing
        raise ValueError(f"max_length: expected at most {MAX_LENGTH_FACTOR} x l_train = "
                         f"{MAX_LENGTH_FACTOR * task.l_train}, got {max_length} (every length up "
                         "to it is evaluated; the cost grows like its cube)")
    seeds = _seeds(seed)
    steps = check_positive_int(steps, "steps")
    batch_size = check_positive_int(batch_size, "batch_size")
    check_positive(lr, "lr")
    hidden_size = check_positive_int(hidden_size, "hidden_size")
    num_layers = check_positive_int(num_layers, "num_layers")
    num_heads = check_positive_int(num_heads, "num_heads")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size: must be divisible by num_heads={num_heads}, got "
                         f"{hidden_size}")
    n_eval = check_positive_int(n_eval, "n_eval")
    num_threads = _check_threads(num_threads)
    for flag, name in ((compare_bounds, "compare_bounds"), (progress, "progress")):
        check_bool(flag, name)
    _check_precision(precision)
    _check_memory(task, max_length=max_length, batch_size=batch_size, hidden_size=hidden_size,
                  num_layers=num_layers, n_eval=n_eval)
    return out, task, {
        "steps": steps, "batch_size": batch_size, "lr": lr, "hidden_size": hidden_size,
        "num_layers": num_layers, "num_heads": num_heads, "n_eval": n_eval,
        "max_length": max_length, "num_threads": num_threads, "seeds": seeds,
    }


def _config_record(task: CopyTask, c: dict, seed) -> dict:
    """The ``config`` section of ``copy_summary.json``: the checked sizes ``c`` of
    :func:`_check_copy_args`, the seed as given, the architecture and torch's version."""
    return {
        "l_train": task.l_train, "alphabet": task.alphabet, "steps": c["steps"],
        "batch_size": c["batch_size"], "lr": c["lr"], "hidden_size": c["hidden_size"],
        "num_layers": c["num_layers"], "num_heads": c["num_heads"], "n_eval": c["n_eval"],
        "max_length": c["max_length"], "seed": seed, "num_threads": c["num_threads"],
        "architecture": "LlamaForCausalLM (RoPE, RMSNorm, SwiGLU, untied unembedding)",
        "torch": torch.__version__,
    }
