"""The vocabulary-wide workloads split into keyed tasks for :mod:`embgeom.parallel`.

Thin adapters over today's serial code, so that the split is tested before it is wired in:

- :func:`unargmaxable_chunked`: :meth:`Decoder.unargmaxable` over token chunks (task key: the
  chunk's index; task: the exact scan restricted to ``tokens=chunk``), verdicts merged into one
  :class:`~embgeom.cells.UnargmaxableResult`. No randomness: every verdict is exact.
- :func:`cell_volume_counts`: the hit counts of :func:`embgeom.volumes.cell_volumes` over sample
  chunks (task key ``i``: chunk ``i`` of ``batch_size`` points drawn from
  ``task_seed(root, i)``, which is the ``SeedSequence.spawn`` child ``i`` the serial loop uses),
  counts summed. Bit-identical to ``cell_volumes(...).counts`` for the same seed and
  ``batch_size``, whatever the executor.

The decoder (its ``W``, 113 MB for SmolLM2) is a *shared* object: stored once per map in Ray's
object store, its arrays read zero-copy by every task on a node.
"""

from __future__ import annotations

import time

import numpy as np

from ._validation import check_positive_int
from .cells import STATUS_NAMES, Decoder, UnargmaxableResult
from .parallel import get_executor, map_keyed
from .volumes import _count_chunk, _direction_map

__all__ = ["unargmaxable_chunked", "cell_volume_counts", "token_chunks", "sample_chunks"]


def token_chunks(n_tokens: int, tokens=None, chunk_size: int = 2048) -> dict:
    """Split the token ids to decide into contiguous chunks: ``{i: (ids,)}``.

    Parameters
    ----------
    n_tokens : int
        Vocabulary size ``|V|``.
    tokens : array_like of int, optional
        Ids to decide (default all); sorted and de-duplicated.
    chunk_size : int, default 2048
        Tokens per task.

    Returns
    -------
    dict {int: (numpy.ndarray of int64,)}
        Chunk ``i`` holds ids ``sorted_ids[i * chunk_size : (i + 1) * chunk_size]``.

    Raises
    ------
    TypeError
        ``tokens`` not a 1-d integer array.
    ValueError
        Ids outside ``[0, n_tokens)``; bad ``chunk_size``.
    """
    n_tokens = check_positive_int(n_tokens, "n_tokens")
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    if tokens is None:
        want = np.arange(n_tokens, dtype=np.int64)
    else:
        want = np.asarray(tokens)
        if want.dtype.kind not in "iu" or want.ndim != 1:
            raise TypeError("tokens: expected a 1-d array of integer token ids")
        want = np.unique(want.astype(np.int64))
        if want.size and (want[0] < 0 or want[-1] >= n_tokens):
            raise ValueError(f"tokens: ids must lie in [0, {n_tokens}), got {want[0]}..{want[-1]}")
    return {i: (want[s : s + chunk_size],) for i, s in enumerate(range(0, want.size, chunk_size))}


def _unargmaxable_chunk(ids, *, decoder, support, scan_kwargs):
    """One task: the exact scan of ``ids`` (int64 (k,)); returns the chunk's verdicts and counts."""
    t0 = time.perf_counter()
    res = decoder.unargmaxable(support, tokens=ids, progress=False, **scan_kwargs)
    return {
        "ids": ids,
        "status": res.status[ids],
        "n_lp": int(res.n_lp),
        "n_undecided": int(res.n_undecided),
        "lp_iterations_mean": float(res.extra.get("lp_iterations_mean", 0.0)),
        "n_distinct_rows": int(res.extra["n_distinct_rows"]),
        "support": res.support,
        "seconds": time.perf_counter() - t0,
    }


def unargmaxable_chunked(decoder: Decoder, support=None, *, tokens=None, chunk_size: int = 2048,
                         executor="local", max_lp_per_chunk: int | None = None, progress: bool = True,
                         **scan_kwargs) -> UnargmaxableResult:
    """:meth:`Decoder.unargmaxable` run as one task per chunk of tokens.

    Every verdict is exact and depends only on the token (its row, the other rows, the
    support), so the merged result is the same for every executor and every completion order;
    the unargmaxable set equals that of one unchunked call.

    Parameters
    ----------
    decoder : Decoder
        Shared with the tasks (Ray: stored once in the object store).
    support : Support, optional
        As :meth:`Decoder.unargmaxable`.
    tokens : array_like of int, optional
        Ids to decide (default all).
    chunk_size : int, default 2048
        Tokens per task. Each task repeats the scan's set-up (distinct rows by sorting, the
        whitening covariance: about ``|V| d^2`` flops; 3-7 s for SmolLM2 on this 2-core machine),
        so chunks should hold thousands of tokens (SmolLM2 costs about 5 ms per token).
    executor : {"local", "ray"} or Executor, default "local"
    max_lp_per_chunk : int, optional
        LP cap of each chunk (``max_lp`` of the chunk's scan). A global cap does not split
        across independent chunks, so ``max_lp`` itself is refused.
    progress : bool, default True
        Bar over finished chunks.
    **scan_kwargs
        ``witness_steps``, ``batch_size``, ``lp_time_limit``, ``tol`` of
        :meth:`Decoder.unargmaxable`.

    Returns
    -------
    UnargmaxableResult
        ``seconds`` is the wall time of the whole map; ``extra`` adds ``n_chunks``,
        ``chunk_size``, ``executor``, ``task_seconds_sum`` (the summed task times) and
        ``chunk_seconds`` (each task's time, in chunk order).

    Raises
    ------
    TypeError, ValueError
        As :meth:`Decoder.unargmaxable` and :func:`token_chunks`; ``max_lp`` given.
    """
    if not isinstance(decoder, Decoder):
        raise TypeError(f"decoder: expected an embgeom.cells.Decoder, got {type(decoder).__name__}")
    if "max_lp" in scan_kwargs:
        raise ValueError("max_lp: a global LP cap does not split across chunks; use max_lp_per_chunk")
    if "progress" in scan_kwargs:
        raise TypeError("progress: pass it once, as the keyword of unargmaxable_chunked")
    scan_kwargs = dict(scan_kwargs, max_lp=max_lp_per_chunk)
    t0 = time.perf_counter()
    tasks = token_chunks(decoder.n_tokens, tokens, chunk_size)
    ex = get_executor(executor)
    out = map_keyed(_unargmaxable_chunk, tasks, executor=ex, progress=progress, desc="unargmaxable chunks",
                    shared={"decoder": decoder, "support": support}, kwargs={"scan_kwargs": scan_kwargs})
    status = np.full(decoder.n_tokens, STATUS_NAMES.index("skipped"), dtype=np.int8)
    n_lp = n_und = 0
    iters = 0.0
    for r in out.values():
        status[r["ids"]] = r["status"]
        n_lp += r["n_lp"]
        n_und += r["n_undecided"]
        iters += r["lp_iterations_mean"] * r["n_lp"]
    first = next(iter(out.values()), None)
    empty = np.isin(status, [STATUS_NAMES.index("lp_empty"), STATUS_NAMES.index("duplicate")])
    extra = {
        "n_distinct_rows": first["n_distinct_rows"] if first else 0,
        "n_chunks": len(tasks),
        "chunk_size": int(chunk_size),
        "executor": ex.name,
        "task_seconds_sum": float(sum(r["seconds"] for r in out.values())),
        "chunk_seconds": [float(r["seconds"]) for r in out.values()],
    }
    if n_lp:
        extra["lp_iterations_mean"] = iters / n_lp
    return UnargmaxableResult(
        tokens=np.flatnonzero(empty).astype(np.int64), status=status, n_lp=n_lp, n_undecided=n_und,
        seconds=time.perf_counter() - t0, support=first["support"] if first else "none", extra=extra,
    )


def sample_chunks(n_samples: int, batch_size: int = 8192) -> dict:
    """``{i: (m_i,)}``: chunk ``i`` of ``batch_size`` points (the last one may be shorter).

    Raises
    ------
    TypeError, ValueError
        Non-integer or non-positive arguments.
    """
    n_samples = check_positive_int(n_samples, "n_samples")
    batch_size = check_positive_int(batch_size, "batch_size")
    return {i: (min(batch_size, n_samples - s),) for i, s in enumerate(range(0, n_samples, batch_size))}


def cell_volume_counts(decoder: Decoder, support, n_samples: int, seed, *, batch_size: int = 8192,
                       executor="local", progress: bool = True) -> np.ndarray:
    """Hits per decoder cell of ``n_samples`` uniform points, one task per chunk of points.

    Chunk ``i`` draws ``batch_size`` points from ``task_seed(root, i)`` = child ``i`` of
    ``root.spawn``, exactly as :func:`embgeom.volumes.cell_volumes` does serially, and the
    counts are summed: the result equals ``cell_volumes(decoder, support, n_samples, seed,
    batch_size=batch_size).counts`` bit for bit, whatever the executor and the completion order.

    Parameters
    ----------
    decoder : Decoder
        Shared with the tasks.
    support : Support
        As :func:`~embgeom.volumes.cell_volumes` (shared with the tasks).
    n_samples : int
    seed : int >= 0 or numpy.random.SeedSequence
        Root seed (a SeedSequence that has not spawned children, for the identity above).
    batch_size : int, default 8192
        Points per task.
    executor : {"local", "ray"} or Executor, default "local"
    progress : bool, default True

    Returns
    -------
    numpy.ndarray of int64, shape (n_tokens,)
        Sums to ``n_samples``.

    Raises
    ------
    TypeError, ValueError
        As :func:`~embgeom.volumes.cell_volumes`; ``seed=None`` (a parallel run must be
        repeatable: pass a seed).
    """
    if not isinstance(decoder, Decoder):
        raise TypeError(f"decoder: expected an embgeom.cells.Decoder, got {type(decoder).__name__}")
    if not (hasattr(support, "dim") and hasattr(support, "sample")):
        raise TypeError(f"support: expected a Support with .dim and .sample, got {type(support).__name__}")
    if int(support.dim) != decoder.dim:
        raise ValueError(f"support: has dimension {support.dim}, the decoder's hidden size is d={decoder.dim}")
    if seed is None:
        raise TypeError("seed: expected an int >= 0 or a SeedSequence, got None")
    tasks = sample_chunks(n_samples, batch_size)
    directions, G32 = _direction_map(decoder, support)
    out = map_keyed(_count_chunk, tasks, executor=executor, seed=seed, progress=progress,
                    desc="cell volume chunks", shared={"decoder": decoder, "support": support},
                    kwargs={"directions": directions, "G32": G32})
    counts = np.zeros(decoder.n_tokens, dtype=np.int64)
    for c in out.values():  # integer sums: exact in any order
        counts += c
    return counts
