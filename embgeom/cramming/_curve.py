"""Accessibility curves: cram targets at several lengths, resume from a JSONL file.

:func:`accessibility_curve` runs in named phases, each testable on its own:

1. :func:`_length_grid`: the lengths to run (every given length, or the adaptive coarse grid);
2. :func:`_curve_settings` and :func:`_settings_hash`: what identifies the run in the JSONL file
   (the hash is pinned in the tests: a run writing ``cram.jsonl`` must resume after an
   upgrade);
3. :class:`_ResumeStore`: the per-target records already in the JSONL file, new ones appended;
4. :class:`_LengthRunner`: one length = the targets still missing, crammed in batches;
5. :func:`_adaptive_search`: doubling while accessibility >= 0.5, then bisection, driven by
   a ``run(n) -> accessibility`` callable and holding no state of its own.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import torch

from embgeom import _json
from embgeom._hf import (
    check_device,
    dtype_name,
    input_embeddings,
    model_device_dtype,
    resolve_start_token,
    unwrap,
    vocab_rows,
)
from embgeom._validation import check_positive, check_positive_int

from ._optimise import cram
from ._targets import _TAG_INIT, sample_targets, source_descriptor
from .analysis import AccessibilityCurve

__all__ = ["accessibility_curve"]


# --------------------------------------------------------------------------------------------
# What identifies a run (the JSONL resume key): keep bit-for-bit stable
# --------------------------------------------------------------------------------------------


def _model_fingerprint(hf, name: str) -> dict:
    """Name, class, parameter count and a digest of the first 256 embedding weights."""
    emb = input_embeddings(hf)
    with torch.no_grad():
        w = emb.weight.detach().reshape(-1)[:256].float().cpu().numpy()
    return {
        "name": name,
        "class": type(hf).__name__,
        "n_params": int(sum(p.numel() for p in hf.parameters())),
        "embedding_digest": hashlib.sha256(w.tobytes()).hexdigest()[:16],
    }


def _settings_hash(settings: dict) -> str:
    """16 hex digits of the SHA-256 of the settings as ``json.dumps(..., sort_keys=True)``.

    Not :mod:`embgeom._json`: this text is a digest input, not a file, and must stay exactly
    what earlier versions hashed (the settings hold only finite numbers, strings, bools, None).
    """
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def _curve_settings(hf, name, mdtype, *, start, steps, lr, seed, target_source,
                    check_generation, cram_kwargs) -> dict:
    """The settings a curve's records are keyed on (their hash is the resume key)."""
    return {
        "model": _model_fingerprint(hf, name),
        "dtype": dtype_name(mdtype),
        "start_token": start,
        "steps": steps,
        "lr": lr,
        "seed": seed,
        "target_source": source_descriptor(target_source),
        "check_generation": bool(check_generation),
        "cram_kwargs": {k: (list(v) if isinstance(v, tuple) else v)
                        for k, v in sorted(cram_kwargs.items())},
    }


def _length_grid(lengths, adaptive: bool, max_length: int) -> list[int]:
    """The lengths to run: all given ones (sorted, distinct), or the adaptive coarse grid
    (given lengths up to ``max_length``, default ``1, 2, 4, ...`` up to ``max_length``)."""
    if lengths is None:
        if not adaptive:
            raise ValueError("lengths: required unless adaptive=True")
        return [2**k for k in range(int(math.log2(max_length)) + 1)]
    grid = [check_positive_int(x, "lengths") for x in np.atleast_1d(lengths).tolist()]
    if not grid:
        raise ValueError("lengths: expected at least one length")
    grid = sorted(set(grid)) if not adaptive else sorted(set(x for x in grid if x <= max_length))
    if not grid:
        raise ValueError(f"lengths: every length exceeds max_length={max_length}")
    return grid


# --------------------------------------------------------------------------------------------
# The JSONL file
# --------------------------------------------------------------------------------------------


def _read_jsonl(path) -> dict:
    """Finished per-target records keyed by (settings_hash, n_mem, length, target_index)."""
    done = {}
    if path is None or not os.path.exists(path):
        return done
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by an interrupted run
                continue
            key = (r.get("settings_hash"), r.get("n_mem"), r.get("length"), r.get("target_index"))
            done[key] = r
    return done


def _append_lines(path, lines: list[str]) -> None:
    """Append JSON lines to ``path``, first ending a last line that an interrupted run cut short
    (so a new record never lands on the same line as the fragment)."""
    with open(path, "a+b") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                fh.write(b"\n")
        fh.write(("\n".join(lines) + "\n").encode())


class _ResumeStore:
    """The per-target records of one curve: those already in the JSONL file, and new ones.

    Records are keyed by ``(settings_hash, n_mem, length, target_index)``; :meth:`add` writes
    each new record as one strict-JSON line (:mod:`embgeom._json`) as soon as its batch ends.
    """

    def __init__(self, jsonl, settings: dict, n_mem: int):
        self.path = jsonl
        self.settings = settings
        self.shash = _settings_hash(settings)
        self.n_mem = n_mem
        self.records = _read_jsonl(jsonl)
        if jsonl is not None:
            Path(jsonl).parent.mkdir(parents=True, exist_ok=True)

    def _key(self, n: int, j: int):
        return (self.shash, self.n_mem, n, j)

    def missing(self, n: int, n_targets: int) -> list[int]:
        """Target indices of length ``n`` without a record."""
        return [j for j in range(n_targets) if self._key(n, j) not in self.records]

    def add(self, n: int, indices, res) -> None:
        """Record the :class:`CramResult` ``res`` of targets ``indices`` at length ``n``."""
        lines = []
        for j, rec in zip(indices, res.to_records()):
            rec = {
                "settings_hash": self.shash, "n_mem": self.n_mem, "length": n, "target_index": j,
                **rec, "dtype": res.dtype, "device": res.device,
                "batch_wall_s": res.wall_s, "settings": self.settings,
            }
            self.records[self._key(n, j)] = rec
            lines.append(_json.dumps(rec))
        if self.path is not None:
            _append_lines(self.path, lines)

    def counts(self, n: int, n_targets: int) -> tuple[int, int, int]:
        """``(teacher-forced successes, generation successes, trials)`` at length ``n``."""
        recs = [self.records[self._key(n, j)] for j in range(n_targets)]
        k = sum(bool(r["success_teacher_forced"]) for r in recs)
        kg = sum(bool(r["success_generation"]) for r in recs)
        return k, kg, n_targets


# --------------------------------------------------------------------------------------------
# Running lengths, and the adaptive search
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _worker_model(load: str, device):
    """The model a worker process loads by name or path, once per process
    (:func:`embgeom.adapters.load_model` with its defaults, as ``run_cram`` loads it)."""
    from embgeom.adapters import load_model

    model = load_model(load, progress=False)
    if device is not None:
        unwrap(model)[0].to(device)
    return model


def _cram_task(n: int, idx: tuple, *, model, load, device, n_mem, seed, target_source, start,
               steps, lr, check_generation, progress, cram_kwargs):
    """One task of a curve: cram targets ``idx`` (target indices) at length ``n``.

    Module-level so that Ray ships it by reference. ``model`` is the model itself (local, or
    a copy from the object store), or None with ``load`` naming what each worker process
    loads once (:func:`_worker_model`). Targets and initial memory vectors come from the keyed
    seeds ``[seed, 0, j, chunk]`` and ``[seed, 1, n_mem, n, j]`` of target ``j``: the same
    numbers in any process and any order. Returns the :class:`CramResult` of the batch.
    """
    if model is None:
        model = _worker_model(load, device)
    T = np.concatenate([
        sample_targets(model, n, 1, target_source=target_source, seed=seed, start=j)
        for j in idx
    ])
    kw = dict(cram_kwargs)
    if device is not None:
        kw["device"] = device
    return cram(
        model, T, n_mem, steps=steps, lr=lr, seed=[[seed, _TAG_INIT, n_mem, n, j] for j in idx],
        start_token=start, check_generation=check_generation, progress=progress, **kw,
    )


class _LengthRunner:
    """Runs lengths: crams the targets the store lacks, one task per batch of targets (keyed
    ``(n_mem, length, first target index)``) on an executor, records results in task order,
    and keeps the counts of every length run (``results``)."""

    def __init__(self, model, store: _ResumeStore, *, n_targets, batch_size, target_source,
                 seed, start, steps, lr, check_generation, progress, cram_kwargs, bar=None,
                 executor=None, load=None, device=None):
        from embgeom.parallel import LocalExecutor

        self.model, self.store, self.bar = model, store, bar
        self.n_targets, self.batch_size = n_targets, batch_size
        self.progress = progress
        self.executor = LocalExecutor() if executor is None else executor
        local = self.executor.name == "local"
        # local: the model object itself and today's progress bars; elsewhere: loaded by name
        # once per worker process, or the object shipped once (ray.put)
        if local:
            self.shared = {"model": model}
        elif load is not None:
            self.shared = {"model": None}
        else:
            self.shared = {"model": self.executor.put(model)}
        self.kwargs = {
            "load": load, "device": None if local else device, "n_mem": store.n_mem,
            "seed": seed, "target_source": target_source, "start": start, "steps": steps,
            "lr": lr, "check_generation": check_generation, "progress": progress and local,
            "cram_kwargs": cram_kwargs,
        }
        self.results: dict[int, tuple[int, int, int]] = {}

    def _tasks(self, lengths) -> dict:
        tasks = {}
        for n in lengths:
            missing = self.store.missing(n, self.n_targets)
            for s in range(0, len(missing), self.batch_size):
                idx = tuple(missing[s : s + self.batch_size])
                tasks[(self.store.n_mem, n, idx[0])] = (n, idx)
        return tasks

    def run_all(self, lengths) -> None:
        """Every length of ``lengths``: one map over all their batches (records in task order:
        length by length, batch by batch, as a serial run writes them)."""
        tasks = self._tasks(lengths)
        if tasks:
            self.executor.map_keyed(
                _cram_task, tasks, shared=self.shared, kwargs=self.kwargs,
                on_result=lambda key, res: self.store.add(tasks[key][0], list(tasks[key][1]), res),
                progress=self.progress and self.executor.name != "local",
                desc=f"cram m={self.store.n_mem}",
            )
        for n in lengths:
            self._count(n)

    def _count(self, n: int) -> float:
        k, kg, N = self.store.counts(n, self.n_targets)
        self.results[n] = (k, kg, N)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(length=n, accessibility=f"{k / N:.2f}")
        return k / N

    def run(self, n: int) -> float:
        """Accessibility at length ``n`` (cramming only the targets not yet recorded)."""
        self.run_all([n])
        return self.results[n][0] / self.results[n][2]


def _adaptive_search(grid: list[int], run) -> None:
    """Run the coarse ``grid`` in order while ``run(n) >= 0.5``; at the first length below 0.5,
    bisect (integer lengths) between the last length at or above 0.5 (0 when there is none)
    and that one until they are adjacent."""
    lo = hi = None
    for n in grid:
        if run(n) >= 0.5:
            lo = n
        else:
            hi = n
            break
    if hi is None:
        return
    lo_b = lo if lo is not None else 0  # below the first grid point: bisect from 0
    while hi - lo_b > 1:
        mid = (lo_b + hi) // 2
        if run(mid) >= 0.5:
            lo_b = mid
        else:
            hi = mid


# --------------------------------------------------------------------------------------------
# The curve
# --------------------------------------------------------------------------------------------


def accessibility_curve(
    model,
    n_mem: int,
    lengths=None,
    n_targets: int = 16,
    *,
    target_source="random-tokens",
    seed: int = 0,
    start_token="auto",
    adaptive: bool = False,
    max_length: int = 4096,
    steps: int = 1000,
    lr: float = 1e-2,
    batch_size: int = 8,
    jsonl=None,
    device=None,
    check_generation: bool = True,
    progress: bool = True,
    executor="local",
    load_on_workers: str | None = None,
    **cram_kwargs,
) -> AccessibilityCurve:
    """Accessibility (fraction of crammable targets) vs target length, for m = ``n_mem``.

    Parameters
    ----------
    model : LoadedModel or HF causal LM
    n_mem : int
        Memory vectors per target (m >= 1).
    lengths : sequence of int, optional
        Target lengths. Without ``adaptive`` every length is run. With ``adaptive`` they are the
        coarse grid (default ``1, 2, 4, ...`` up to ``max_length``): run in order while
        accessibility stays >= 0.5; at the first length below 0.5, bisect (integer lengths)
        between the last length with accessibility >= 0.5 and that one until they are adjacent,
        then stop.
    n_targets : int, default 16
        Targets per length (target j of length n is a prefix of target j of longer lengths).
    target_source : "random-tokens", "words" or list of str
        See :func:`sample_targets`.
    seed : int, default 0
        An int >= 0 (not a Generator: it is recorded in the settings and their hash, the key
        under which a rerun finds finished targets). Targets use ``default_rng([seed, 0, j, chunk])``; the memory vectors of target j at
        length n start from ``default_rng([seed, 1, n_mem, n, j])``.
    start_token : "auto", int or None, default "auto"
        See :func:`cram`; resolved once and recorded in the settings (and their hash).
    adaptive : bool, default False
    max_length : int, default 4096
        Adaptive mode never goes past this length.
    steps, lr : cram settings (see :func:`cram`).
    batch_size : int, default 8
        Targets crammed together (does not change the verdicts, only the speed).
    jsonl : path, optional
        Append one line per target as results come (settings hash, n_mem, length,
        target_index, verdicts, steps, loss, accuracy, dtype, device). A rerun with the same
        settings reads the file and skips the targets already done.
    device : optional
        Move the model to this device first.
    check_generation : bool, default True
    progress : bool, default True
        tqdm bars: one over lengths, and one over the Adam steps of each batch of targets
        (local) or over the finished batches (Ray).
    executor : {"local", "ray"} or embgeom.parallel.Executor, default "local"
        Where the batches run (:mod:`embgeom.parallel`): one task per batch of targets, keyed
        ``(n_mem, length, first target index)``; the targets already in ``jsonl`` are skipped
        before the tasks are made. Without ``adaptive`` all lengths go in one map; with it, one
        map per grid or bisection step. Records are appended in task order, so the file is
        the same whatever the completion order, and a crash leaves a prefix that a rerun
        completes. The keyed seeds make every executor give the records of the local run.
        Ray: set ``num_gpus`` on the executor for GPU tasks (the CLI does it for
        ``--device cuda``).
    load_on_workers : str, optional
        Registry name or path from which each worker process loads the model once
        (:func:`embgeom.adapters.load_model` with its defaults, then ``device``), instead of
        receiving a pickled copy of ``model`` through the object store. Must name the same
        model as ``model`` (the settings hash is computed from ``model``). Ignored locally.
    **cram_kwargs
        Passed to :func:`cram` (``init_scale``, ``betas``, ``adam_eps``, ``use_cache``); they
        enter the settings hash.

    Returns
    -------
    AccessibilityCurve

    Raises
    ------
    TypeError, ValueError
        Bad arguments (as in :func:`cram` and :func:`sample_targets`), lengths not positive.
    """
    n_mem = check_positive_int(n_mem, "n_mem")
    n_targets = check_positive_int(n_targets, "n_targets")
    batch_size = check_positive_int(batch_size, "batch_size")
    max_length = check_positive_int(max_length, "max_length")
    seed = check_positive_int(seed, "seed", minimum=0)
    steps = check_positive_int(steps, "steps", minimum=0)
    lr = check_positive(lr, "lr")
    grid = _length_grid(lengths, adaptive, max_length)
    hf, tokenizer, name, _ = unwrap(model)
    start = resolve_start_token(hf, tokenizer, start_token, vocab_rows(hf))
    device = check_device(device)
    if device is not None:
        hf.to(device)
    _, mdtype = model_device_dtype(hf)
    settings = _curve_settings(hf, name, mdtype, start=start, steps=steps, lr=lr, seed=seed,
                               target_source=target_source, check_generation=check_generation,
                               cram_kwargs=cram_kwargs)
    store = _ResumeStore(jsonl, settings, n_mem)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc=f"accessibility m={n_mem}", unit="length")
    from embgeom.parallel import executor_scope

    try:
        with executor_scope(executor) as ex:
            runner = _LengthRunner(model, store, n_targets=n_targets, batch_size=batch_size,
                                   target_source=target_source, seed=seed, start=start,
                                   steps=steps, lr=lr, check_generation=check_generation,
                                   progress=progress, cram_kwargs=cram_kwargs, bar=bar,
                                   executor=ex, load=load_on_workers, device=device)
            if adaptive:
                _adaptive_search(grid, runner.run)
            else:
                runner.run_all(grid)
    finally:
        if bar is not None:
            bar.close()

    results = runner.results
    ls = np.array(sorted(results), np.int64)
    return AccessibilityCurve(
        n_mem=n_mem,
        lengths=ls,
        successes=np.array([results[n][0] for n in ls], np.int64),
        successes_generation=np.array([results[n][1] for n in ls], np.int64),
        trials=np.array([results[n][2] for n in ls], np.int64),
        settings={**settings, "settings_hash": store.shash, "adaptive": bool(adaptive),
                  "n_targets": n_targets},
    )
