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
from embgeom._progress import tqdm_kwargs
from embgeom._validation import check_positive_int

from ._optimise import cram
from ._targets import _TAG_INIT, sample_targets, source_descriptor
from .analysis import AccessibilityCurve

__all__ = ["accessibility_curve", "mixed_curves", "ResumeRecordWarning"]


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
                    check_generation, cram_kwargs, precision="float32", weight_decay=0.0,
                    patience=None) -> dict:
    """The settings a curve's records are keyed on (their hash is the resume key).

    ``precision``, ``weight_decay`` and ``patience`` enter only when they differ from their
    defaults (``"float32"``, 0, None), so the hash of a run with the defaults is the one of
    the code before these options existed (pinned in the tests: a running job resumes).
    """
    settings = {
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
    if precision != "float32":
        settings["precision"] = precision
    if weight_decay:
        settings["weight_decay"] = weight_decay
    if patience is not None:
        settings["patience"] = patience
    return settings


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


class ResumeRecordWarning(RuntimeWarning):
    """A line of a resume JSONL file was not trusted: its target is run again.

    Raised (as a warning) for a line that is not a JSON object, a record missing a key the
    resume reads, or a record whose fields have the wrong type, are out of range or do not
    match its ``settings_hash``. A last line cut short by an interrupted write (no final
    newline) is the expected resume case and is repaired without a warning.
    """


def _check_jsonl(jsonl, name: str = "jsonl", *, checkpoints: bool = False):
    """``jsonl`` (None or a path) after checking, before any work, that it can name a file.

    Raises
    ------
    TypeError
        Neither None nor a str / path-like.
    ValueError
        An empty path, a path that is an existing folder (or another non-file), a parent
        component that exists and is not a folder, or, with ``checkpoints`` (horizons, whose
        batch checkpoints go to ``<jsonl>.ckpt/``), a ``<jsonl>.ckpt`` that exists and is not a
        folder; the message names ``name``.
    """
    if jsonl is None:
        return None
    if not isinstance(jsonl, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a file path or None, got {type(jsonl).__name__}")
    if not str(os.fspath(jsonl)).strip():
        raise ValueError(f"{name}: expected a file path, got an empty string")
    p = Path(jsonl)
    if p.is_dir():
        raise ValueError(f"{name}: {str(p)!r} is a folder; expected the path of a JSONL file")
    if p.exists() and not p.is_file():
        raise ValueError(f"{name}: {str(p)!r} exists and is not a regular file")
    for parent in p.parents:
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"{name}: {str(parent)!r} exists and is not a folder")
    ckpt = Path(str(p) + ".ckpt")
    if checkpoints and ckpt.exists() and not ckpt.is_dir():
        raise ValueError(f"{name}: {str(ckpt)!r} (the checkpoint folder) exists and is not a "
                         "folder")
    return jsonl


def _is_int(v, low: int = 0) -> bool:
    return type(v) is int and v >= low


def _settings_problem(r: dict) -> str | None:
    """Why a record's ``settings`` and ``settings_hash`` cannot be trusted, or None."""
    if not isinstance(r.get("settings_hash"), str):
        return "settings_hash is not a string"
    if not isinstance(r.get("settings"), dict):
        return "settings is missing or not an object"
    if _settings_hash(r["settings"]) != r["settings_hash"]:
        return "settings do not hash to settings_hash (edited?)"
    return None


def _per_length_problem(r: dict) -> str | None:
    """Why a per-length record (:class:`_ResumeStore`) cannot be trusted, or None."""
    for k, low in (("n_mem", 1), ("length", 1), ("target_index", 0), ("steps", 0)):
        if k not in r:
            return f"no {k!r}"
        if not _is_int(r[k], low):
            return f"{k} = {r[k]!r} is not an int >= {low}"
    if not isinstance(r.get("success_teacher_forced"), bool):
        return "success_teacher_forced is missing or not true/false"
    if "success_generation" not in r or not isinstance(r["success_generation"], (bool, type(None))):
        return "success_generation is missing or not true/false/null"
    acc = r.get("accuracy")
    if acc is not None and not (isinstance(acc, (int, float)) and not isinstance(acc, bool)
                                and 0 <= acc <= 1):
        return f"accuracy = {acc!r} is not a number in [0, 1]"
    return _settings_problem(r)


def _per_length_key(r: dict):
    return (r.get("settings_hash"), r.get("n_mem"), r.get("length"), r.get("target_index"))


class _Records(dict):
    """Trusted records by key (a dict), and the bad lines of the file that still matter.

    ``untrusted`` holds ``(line number, why)`` of each bad line that no trusted record of the
    same key supersedes; :meth:`warn_untrusted` warns about them, once, when the run finds
    targets to run again. A bad line whose target has since been run again (its valid record
    appended after it by the resume that warned) is therefore not warned about on every later
    run: the file is left as it is (never rewritten, so nothing in it is lost), and the line is
    ignored as it always was.
    """

    def __init__(self, path=None):
        super().__init__()
        self.path = path
        self.untrusted: list[tuple[int, str]] = []

    def warn_untrusted(self) -> None:
        pending, self.untrusted = self.untrusted, []
        for lineno, problem in pending:
            _distrust(self.path, lineno, problem)


def _read_jsonl(path, key=None, check=None) -> _Records:
    """Trusted records of a JSONL file keyed by ``key(record)``; a later record of a key wins.

    ``key`` defaults to the per-length key ``(settings_hash, n_mem, length, target_index)`` and
    ``check`` (``record -> None or why it cannot be trusted``) to the per-length record's check.
    A last line without its final newline that is not JSON was cut short by an interrupted
    write: it is skipped silently (the next append removes it). Any other line that is not a
    JSON object, or a record that ``check`` refuses, is skipped; unless a trusted record of
    its key is in the file too (the target was run again since), it is kept in the result's
    ``untrusted``, for a :class:`ResumeRecordWarning` naming the file and the line number
    (:meth:`_Records.warn_untrusted`, called by the run once it has targets to run again).
    """
    key = _per_length_key if key is None else key
    check = _per_length_problem if check is None else check
    done = _Records(path)
    if path is None or not os.path.exists(path):
        return done
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        text = fh.read()
    lines = text.split("\n")
    bad: list[tuple[int, str, object]] = []
    for i, line in enumerate(lines):
        line = line.strip()
        if not line:
            continue
        torn = i == len(lines) - 1  # no newline after it: an interrupted write
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            if not torn:
                bad.append((i + 1, "not a JSON line", None))
            continue
        problem = "not a JSON object" if not isinstance(r, dict) else check(r)
        if problem is not None:
            bad.append((i + 1, problem, r))
            continue
        done[key(r)] = r
    for lineno, problem, r in bad:
        if isinstance(r, dict):
            try:
                if key(r) in done:  # superseded: its target has a trusted record
                    continue
            except TypeError:  # a key field that is not hashable (a list): not superseded
                pass
        done.untrusted.append((lineno, problem))
    return done


def _distrust(path, lineno: int, problem: str) -> None:
    import warnings

    what = ("it is skipped (no target can be read from it; targets without a trusted "
            "record are run again)" if problem == "not a JSON line"
            else "the record is not trusted and its target is run again")
    warnings.warn(f"{os.fspath(path)}, line {lineno}: {problem}; {what}", ResumeRecordWarning,
                  stacklevel=5)


def _append_lines(path, lines: list[str]) -> None:
    """Append JSON lines to ``path``. A last line without its final newline is first repaired:
    ended with a newline when it is a whole JSON line, removed when it is the fragment of an
    interrupted write (so a new record never lands on the fragment's line, and the fragment
    does not stay behind as a bad line in the middle of the file)."""
    with open(path, "a+b") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        if size > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                start = _last_line_start(fh, size)
                fh.seek(start)
                tail = fh.read()
                try:
                    json.loads(tail.decode("utf-8"))
                    whole = True
                except (UnicodeDecodeError, json.JSONDecodeError):
                    whole = False
                if whole:
                    fh.write(b"\n")
                else:
                    fh.truncate(start)
        fh.seek(0, os.SEEK_END)
        fh.write(("\n".join(lines) + "\n").encode())


def _last_line_start(fh, size: int, chunk: int = 1 << 16) -> int:
    """Offset just after the last newline of an open binary file of ``size`` bytes (0: none)."""
    end = size
    while end > 0:
        begin = max(0, end - chunk)
        fh.seek(begin)
        at = fh.read(end - begin).rfind(b"\n")
        if at >= 0:
            return begin + at + 1
        end = begin
    return 0


#: Record keys added after the first format; written after it, so its key order stays a prefix.
_LATER_KEYS = ("stop_reason", "precision")


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
        """Target indices of length ``n`` without a record (when there are any, the file's bad
        lines not yet superseded are warned about first: :meth:`_Records.warn_untrusted`)."""
        out = [j for j in range(n_targets) if self._key(n, j) not in self.records]
        if out:
            self.records.warn_untrusted()
        return out

    def add(self, n: int, indices, res) -> None:
        """Record the :class:`CramResult` ``res`` of targets ``indices`` at length ``n``."""
        lines = []
        for j, rec in zip(indices, res.to_records()):
            later = {k: rec.pop(k) for k in _LATER_KEYS}  # after the keys of the first format
            rec = {
                "settings_hash": self.shash, "n_mem": self.n_mem, "length": n, "target_index": j,
                **rec, "dtype": res.dtype, "device": res.device,
                "batch_wall_s": res.wall_s, "settings": self.settings, **later,
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
               options):
    """One task of a curve: cram targets ``idx`` (target indices) at length ``n``.

    Module-level so that Ray ships it by reference. ``model`` is the model itself (local, or
    a copy from the object store), or None with ``load`` naming what each worker process
    loads once (:func:`_worker_model`). Targets and initial memory vectors come from the keyed
    seeds ``[seed, 0, j, chunk]`` and ``[seed, 1, n_mem, n, j]`` of target ``j``: the same
    numbers in any process and any order. ``options`` are :func:`cram`'s other keywords.
    Returns the :class:`CramResult` of the batch.
    """
    if model is None:
        model = _worker_model(load, device)
    T = np.concatenate([
        sample_targets(model, n, 1, target_source=target_source, seed=seed, start=j)
        for j in idx
    ])
    kw = dict(options)
    if device is not None:
        kw["device"] = device
    return cram(model, T, n_mem, seed=[[seed, _TAG_INIT, n_mem, n, j] for j in idx],
                start_token=start, **kw)


class _LengthRunner:
    """Runs lengths: crams the targets the store lacks, one task per batch of targets (keyed
    ``(n_mem, length, first target index)``) on an executor, records results in task order,
    and keeps the counts of every length run (``results``). ``options`` are passed to
    :func:`cram`."""

    def __init__(self, model, store: _ResumeStore, *, n_targets, batch_size, target_source,
                 seed, start, options: dict, bar=None, executor=None, load=None, device=None):
        from embgeom.parallel import LocalExecutor

        self.model, self.store, self.bar = model, store, bar
        self.n_targets, self.batch_size = n_targets, batch_size
        self.progress = bool(options.get("progress", False))
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
            "seed": seed, "target_source": target_source, "start": start,
            "options": {**options, "progress": self.progress and local},
        }
        self.results: dict[int, tuple[int, int, int]] = {}

    def _tasks(self, lengths) -> dict:
        """One task per fixed batch (target indices ``[s, s + batch_size)``) holding a target
        without a record. Batched float32 is not exactly batch-independent (a target crammed
        with partners and alone differs in its last bits, and a verdict can change), so a
        batch is always re-run whole, with its original partners, and only its missing
        targets are recorded: a resumed run equals the uninterrupted one record for record."""
        tasks = {}
        for n in lengths:
            missing = set(self.store.missing(n, self.n_targets))
            for s in range(0, self.n_targets, self.batch_size):
                idx = tuple(range(s, min(s + self.batch_size, self.n_targets)))
                write = tuple(j for j in idx if j in missing)
                if write:
                    tasks[(self.store.n_mem, n, idx[0])] = (n, idx, write)
        return tasks

    def _record(self, task, res) -> None:
        n, idx, write = task
        if write != idx:
            res = _take(res, np.array([idx.index(j) for j in write]))
        self.store.add(n, list(write), res)

    def run_all(self, lengths) -> None:
        """Every length of ``lengths``: one map over all their batches (records in task order:
        length by length, batch by batch, as a serial run writes them)."""
        tasks = self._tasks(lengths)
        if tasks:
            self.executor.map_keyed(
                _cram_task, {k: v[:2] for k, v in tasks.items()}, shared=self.shared,
                kwargs=self.kwargs,
                on_result=lambda key, res: self._record(tasks[key], res),
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


def _take(res, sel) -> "object":
    """The rows ``sel`` of a :class:`CramResult` (every per-row array indexed)."""
    from dataclasses import fields, replace

    per_row = {f.name: getattr(res, f.name)[sel] for f in fields(res)
               if isinstance(getattr(res, f.name), np.ndarray)}
    return replace(res, **per_row)


def _cram_mixed_batch(model, stores: dict, rows: list, *, target_source, seed, start,
                      options: dict, write=None) -> None:
    """Cram the rows ``(m, n, j)`` (target j of length n with m memory vectors) in one batch
    and record each in its m's store, exactly as :class:`_LengthRunner` would (same targets,
    same initial memory vectors; only the padding of the batch differs)."""
    T = [sample_targets(model, n, 1, target_source=target_source, seed=seed, start=j)[0]
         for _, n, j in rows]
    res = cram(model, T, [m for m, _, _ in rows],
               seed=[[seed, _TAG_INIT, m, n, j] for m, n, j in rows], start_token=start,
               **options)
    groups: dict = {}
    for r, (m, n, j) in enumerate(rows):
        if write is None or (m, n, j) in write:
            groups.setdefault((m, n), []).append((r, j))
    for (m, n), items in groups.items():
        sel = np.array([r for r, _ in items])
        stores[m].add(n, [j for _, j in items], _take(res, sel))


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


_CRAM_KWARGS = ("init_scale", "betas", "adam_eps", "use_cache")


def _setup(model, *, seed, start_token, steps, lr, device, target_source, check_generation,
           progress, precision, weight_decay, patience, cram_kwargs):
    """Check every option before any work, resolve the start token, move the model.

    Returns ``(start, settings, options)``: the start token id (or None), the settings the
    records are keyed on (:func:`_curve_settings`) and the keyword arguments of :func:`cram`.
    """
    from ._optimise import (
        _check_cram_options,
        _check_flag,
        _check_precision_device,
        _check_progress,
    )

    unknown = sorted(set(cram_kwargs) - set(_CRAM_KWARGS))
    if unknown:
        raise TypeError(f"{unknown[0]}: not an option of cram (expected one of {_CRAM_KWARGS})")
    seed = check_positive_int(seed, "seed", minimum=0)
    opts = _check_cram_options(
        steps=steps, lr=lr, weight_decay=weight_decay, patience=patience, precision=precision,
        **{k: v for k, v in cram_kwargs.items() if k != "use_cache"})
    check_generation = _check_flag(check_generation, "check_generation")
    progress = _check_progress(progress)
    if "use_cache" in cram_kwargs:
        _check_flag(cram_kwargs["use_cache"], "use_cache")
    hf, tokenizer, name, _ = unwrap(model)
    start = resolve_start_token(hf, tokenizer, start_token, vocab_rows(hf))
    device = check_device(device)
    _check_precision_device(opts.precision, device if device is not None
                            else model_device_dtype(hf)[0])
    if device is not None:
        hf.to(device)
    _, mdtype = model_device_dtype(hf)
    settings = _curve_settings(hf, name, mdtype, start=start, steps=opts.steps, lr=opts.lr,
                               seed=seed, target_source=target_source,
                               check_generation=check_generation, cram_kwargs=cram_kwargs,
                               precision=opts.precision, weight_decay=opts.weight_decay,
                               patience=opts.patience)
    options = dict(steps=opts.steps, lr=opts.lr, check_generation=check_generation,
                   progress=progress, precision=opts.precision, weight_decay=opts.weight_decay,
                   patience=opts.patience, **cram_kwargs)
    return start, settings, options


def _curve_from_store(store: _ResumeStore, lengths, n_targets: int, settings: dict,
                      adaptive: bool) -> AccessibilityCurve:
    ls = np.array(sorted(lengths), np.int64)
    counts = [store.counts(int(n), n_targets) for n in ls]
    return AccessibilityCurve(
        n_mem=store.n_mem, lengths=ls,
        successes=np.array([c[0] for c in counts], np.int64),
        successes_generation=np.array([c[1] for c in counts], np.int64),
        trials=np.array([c[2] for c in counts], np.int64),
        settings={**settings, "settings_hash": store.shash, "adaptive": bool(adaptive),
                  "n_targets": n_targets},
    )


def mixed_curves(model, lengths: dict, n_targets: int, *, n_batches: int = 1,
                 target_source="random-tokens", seed: int = 0, start_token="auto",
                 steps: int = 1000, lr: float = 1e-2, jsonl=None, device=None,
                 check_generation: bool = True, progress: bool | None = None,
                 precision: str = "float32", weight_decay: float = 0.0,
                 patience: int | None = None, **cram_kwargs) -> dict:
    """Accessibility curves for several m at once, the rows of every (m, n) crammed together.

    The same targets, initial memory vectors, settings (and settings hash) and JSONL records
    as :func:`accessibility_curve` run once per m with the given lengths (non-adaptive): a
    rerun of either resumes the other's records. Only the batching differs: all missing rows
    ``(m, n, j)`` are sorted by input length ``m + n`` and split into ``n_batches`` batches of
    mixed m and n (:func:`cram` with rows of different m and n). On a GPU, where a step of a
    small model costs about the same for 8 rows as for 200, this is what makes a whole grid
    fit in one run (:mod:`embgeom.cramming._gpu_protocol`). Padding changes the float rounding of a
    row's arithmetic, not its maths.

    Parameters
    ----------
    model : LoadedModel or HF causal LM
    lengths : dict {m: sequence of int}
        Target lengths per number of memory vectors.
    n_targets : int
    n_batches : int, default 1
    target_source, seed, start_token, steps, lr, jsonl, device, check_generation, progress,
    precision, weight_decay, patience, **cram_kwargs
        As in :func:`accessibility_curve`.

    Returns
    -------
    dict {m: AccessibilityCurve}

    Raises
    ------
    TypeError, ValueError
        As :func:`accessibility_curve`; ``lengths`` not a dict of positive lengths.
    """
    _check_jsonl(jsonl)
    if not isinstance(lengths, dict) or not lengths:
        raise TypeError(f"lengths: expected a dict {{m: [n, ...]}}, got {type(lengths).__name__}")
    grid = {check_positive_int(m, "lengths key (m)"): _length_grid(ns, False, 1 << 62)
            for m, ns in lengths.items()}
    n_targets = check_positive_int(n_targets, "n_targets")
    n_batches = check_positive_int(n_batches, "n_batches")
    start, settings, options = _setup(
        model, seed=seed, start_token=start_token, steps=steps, lr=lr, device=device,
        target_source=target_source, check_generation=check_generation, progress=progress,
        precision=precision, weight_decay=weight_decay, patience=patience,
        cram_kwargs=cram_kwargs)
    seed = settings["seed"]
    stores = {m: _ResumeStore(jsonl, settings, m) for m in grid}
    # the batches are fixed by the whole grid, not by what is missing: a batch with a missing
    # row is re-run whole with its original partners (batched float32 is not exactly
    # batch-independent) and only its missing rows are recorded, so a resumed run equals the
    # uninterrupted one record for record
    rows = sorted(((m, n, j) for m, ns in grid.items() for n in ns for j in range(n_targets)),
                  key=lambda r: (r[0] + r[1], r))
    for idx in np.array_split(np.arange(len(rows)), n_batches):
        batch = [rows[i] for i in idx]
        write = {r for r in batch if stores[r[0]]._key(r[1], r[2]) not in stores[r[0]].records}
        if write:
            # every store read the same file: its bad lines are warned about once
            next(iter(stores.values())).records.warn_untrusted()
            _cram_mixed_batch(model, stores, batch, target_source=target_source, seed=seed,
                              start=start, options=options, write=write)
    return {m: _curve_from_store(stores[m], grid[m], n_targets, settings, False) for m in grid}


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
    progress: bool | None = None,
    precision: str = "float32",
    weight_decay: float = 0.0,
    patience: int | None = None,
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
        settings reads the file and skips the targets already done (the records it trusts:
        see Warns).
    device : optional
        Move the model to this device first.
    check_generation : bool, default True
    progress : bool or None, default None
        tqdm bars: one over lengths, and one over the Adam steps of each batch of targets
        (local) or over the finished batches (Ray). None: only where stderr is a terminal
        (a job writing to a log file gets none).
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
    precision, weight_decay, patience
        See :func:`cram`. Each enters the settings (and their hash) only when it differs from
        its default, so a run with the defaults keeps the hash of earlier versions.
    **cram_kwargs
        Passed to :func:`cram` (``init_scale``, ``betas``, ``adam_eps``, ``use_cache``); they
        enter the settings hash.

    Returns
    -------
    AccessibilityCurve

    Raises
    ------
    TypeError, ValueError
        Bad arguments (as in :func:`cram` and :func:`sample_targets`, all checked before any
        work), lengths not positive, an unknown keyword in ``cram_kwargs``, a ``jsonl`` that
        is a folder or lies below a file.

    Warns
    -----
    ResumeRecordWarning
        A line of ``jsonl`` that is not a trusted record (not JSON, a key missing, a field of
        the wrong type or range, settings that do not hash to its ``settings_hash``): named
        by file and line number, not counted, its target run again. Warned about when the run
        has targets to run again, and not at all once a trusted record of the line's target
        follows it (the resume that warned appended one): the line stays in the file, ignored.
        A last line cut short by an interrupted write is removed without a warning.
    """
    _check_jsonl(jsonl)
    n_mem = check_positive_int(n_mem, "n_mem")
    n_targets = check_positive_int(n_targets, "n_targets")
    batch_size = check_positive_int(batch_size, "batch_size")
    max_length = check_positive_int(max_length, "max_length")
    grid = _length_grid(lengths, adaptive, max_length)
    start, settings, options = _setup(
        model, seed=seed, start_token=start_token, steps=steps, lr=lr, device=device,
        target_source=target_source, check_generation=check_generation, progress=progress,
        precision=precision, weight_decay=weight_decay, patience=patience,
        cram_kwargs=cram_kwargs)
    seed, progress = settings["seed"], options["progress"]
    store = _ResumeStore(jsonl, settings, n_mem)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc=f"accessibility m={n_mem}", unit="length", **tqdm_kwargs(progress))
    from embgeom.parallel import executor_scope

    try:
        with executor_scope(executor) as ex:
            runner = _LengthRunner(model, store, n_targets=n_targets, batch_size=batch_size,
                                   target_source=target_source, seed=seed, start=start,
                                   options=options, bar=bar, executor=ex,
                                   load=load_on_workers, device=device)
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
