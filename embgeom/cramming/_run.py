"""The ``embgeom cram`` job: curves for each m, n50, C_emp, and the files on disk.

:func:`run_cram` runs in named phases: check the output folder (:func:`_check_out_dir`), load
the model (:func:`_load`), one accessibility curve and n50 per m (:func:`_sweep`), the slope
(:func:`_fit`), the figures (:func:`_plots`), the summary dict (:func:`_summary`) and its two
files (:func:`_write_summary`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from embgeom import _json
from embgeom._hf import check_device, dtype_name, model_device_dtype, unwrap
from embgeom._validation import check_positive_int

from ._curve import _check_jsonl, accessibility_curve, mixed_curves
from ._optimise import _check_cram_options, _check_progress
from ._targets import source_descriptor
from .analysis import check_n_boot, fit_slope, n50
from .plots import plot_accessibility, plot_n50

__all__ = ["run_cram"]


def _check_out_dir(out_dir) -> Path:
    """``out_dir`` as a Path, after checking, before any work, that it can be written.

    The folder (or, when it does not exist yet, its nearest existing parent, where it will be
    created) must be a folder in which a probe file can be created and deleted.

    Raises
    ------
    TypeError
        Not a path.
    ValueError
        An empty path, or a path component that exists and is not a folder.
    PermissionError, OSError
        The folder cannot be written (read-only, no permission), with the path in the message.
    """
    if out_dir is None or isinstance(out_dir, bool) or not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"out_dir: expected a folder path, got {type(out_dir).__name__}")
    if not str(os.fspath(out_dir)).strip():
        raise ValueError("out_dir: expected a folder path, got an empty path (it would write "
                         "into the current folder)")
    out = Path(out_dir)
    for parent in (out, *out.parents):
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"out_dir: {str(parent)!r} exists and is not a folder")
    where = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    probe = where / f".embgeom-write-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise type(exc)(exc.errno, f"out_dir: cannot write in {str(where)!r} "
                                   f"({exc.strerror or exc})") from None
    return out


def _load(model_name):
    """A registry name or path is loaded (:func:`embgeom.adapters.load_model`); a model is kept."""
    if isinstance(model_name, str):
        from embgeom.adapters import load_model

        return load_model(model_name)
    return model_name


def _sweep(model, ms, *, jsonl, lengths, n_targets, seed, n_boot, curve_kwargs,
           mixed_batches=None):
    """One accessibility curve and one :func:`n50` per m: :func:`accessibility_curve` per m,
    or with ``mixed_batches`` :func:`mixed_curves` for all m at once."""
    if mixed_batches is not None:
        # mixed batches run in this process (one batch holds rows of every m)
        kw = {k: v for k, v in curve_kwargs.items()
              if k not in ("adaptive", "max_length", "batch_size", "executor", "load_on_workers",
                           "device")}
        curves = mixed_curves(model, {m: _lengths_for(lengths, m) for m in ms}, n_targets,
                              n_batches=mixed_batches, seed=seed, jsonl=jsonl, **kw)
    else:
        curves = {m: accessibility_curve(model, m, _lengths_for(lengths, m), n_targets,
                                         seed=seed, jsonl=jsonl, **curve_kwargs) for m in ms}
    n50s = {m: n50(curves[m], n_boot=n_boot, seed=seed) for m in ms}
    return curves, n50s


def _lengths_for(lengths, m: int):
    """The lengths of m: ``lengths[m]`` for a dict, else ``lengths`` (None: adaptive)."""
    if isinstance(lengths, dict):
        if m not in lengths:
            raise ValueError(f"lengths: no lengths for m = {m}")
        return lengths[m]
    return lengths


def _check_lengths(lengths, ms, mixed_batches):
    if isinstance(lengths, dict):
        lengths = {check_positive_int(m, "lengths key (m)"): v for m, v in lengths.items()}
        missing = [m for m in ms if m not in lengths]
        if missing:
            raise ValueError(f"lengths: no lengths for m = {missing}")
    if mixed_batches is not None:
        mixed_batches = check_positive_int(mixed_batches, "mixed_batches")
        if lengths is None:
            raise ValueError("lengths: mixed batches need the lengths (no adaptive search)")
    return lengths, mixed_batches


def _fit(n50s: dict, c_theory):
    """:func:`fit_slope` over the finite n50 values: ``(finite, fit or None, error or None)``."""
    finite = {m: v for m, v in n50s.items() if np.isfinite(v["n50"])}
    try:
        return finite, fit_slope(finite, c_theory=c_theory), None
    except ValueError as e:
        return finite, None, str(e)


def _plots(out: Path, curves, finite, fit) -> dict:
    files = {"accessibility_png": plot_accessibility(curves, out / "accessibility.png")}
    if finite:
        files["n50_png"] = plot_n50(finite, fit, out / "n50_vs_m.png")
    return files


def _summary(model, name, mdtype, dev, *, settings, curves, n50s, fit, fit_error, files, t0):
    return {
        "model": name,
        "source_dtype": getattr(model, "source_dtype", None),
        "dtype": dtype_name(mdtype),
        "device": str(dev),
        "settings": settings,
        "curves": {str(m): c.to_dict() for m, c in curves.items()},
        "n50": {str(m): v for m, v in n50s.items()},
        "fit": fit,
        "fit_error": fit_error,
        "files": files,
        "wall_s": time.perf_counter() - t0,
    }


def _write_summary(out: Path, summary: dict) -> None:
    """``cram_summary.md`` and ``cram_summary.json`` (strict JSON); adds ``summary_lines``."""
    files = summary["files"]
    files["summary_json"] = str(out / "cram_summary.json")
    files["summary_md"] = str(out / "cram_summary.md")
    text = _summary_markdown(summary)
    (out / "cram_summary.md").write_text(text)
    _json.dump(summary, out / "cram_summary.json")
    summary["summary_lines"] = text.splitlines() + ["", *(f"wrote {f}" for f in files.values())]


def run_cram(
    model_name,
    mems,
    out_dir,
    *,
    lengths=None,
    n_targets: int = 16,
    steps: int = 1000,
    lr: float = 1e-2,
    seed: int = 0,
    plot: bool = True,
    adaptive: bool = True,
    target_source="random-tokens",
    max_length: int = 4096,
    batch_size: int = 8,
    device=None,
    n_boot: int = 200,
    c_theory: float | None = None,
    check_generation: bool = True,
    start_token="auto",
    progress: bool | None = None,
    precision: str = "float32",
    weight_decay: float = 0.0,
    patience: int | None = None,
    betas=None,
    mixed_batches: int | None = None,
    protocol: dict | None = None,
    executor="local",
    on_load=None,
) -> dict:
    """The ``embgeom cram`` job: accessibility curves for each m, n50, C_emp, files on disk.

    Writes into ``out_dir``: ``cram.jsonl`` (one line per target, appended as results come;
    a rerun with the same settings skips finished targets), ``cram_summary.json`` (the returned
    dict), and with ``plot`` ``accessibility.png`` (one line per m) and ``n50_vs_m.png`` (with
    the fitted line).

    Parameters
    ----------
    model_name : str, LoadedModel or HF causal LM
        A registry name / path for ``embgeom.adapters.load_model``, or a loaded model.
    mems : sequence of int
        Numbers of memory vectors m.
    out_dir : str or Path
    lengths : sequence of int, dict {m: sequence of int} or None
        Target lengths (one list for every m, or one per m); None: adaptive search.
    n_targets, steps, lr, seed, adaptive, target_source, max_length, batch_size, device,
    check_generation, start_token, precision, weight_decay, patience :
        see :func:`accessibility_curve` and :func:`cram`.
    betas : pair of float, optional
        Adam's betas (default: :func:`cram`'s, and then left out of the settings hash).
    mixed_batches : int, optional
        Cram all (m, n) rows together in this many batches (:func:`mixed_curves`; needs
        ``lengths``, no adaptive search): the GPU layout of ``embgeom cram --protocol paper``.
    protocol : dict, optional
        A description of the preset the settings came from (e.g.
        :func:`embgeom.cramming._gpu_protocol.paper_protocol`), stored in the summary.
    plot : bool, default True
    n_boot : int, default 200
        Bootstrap draws of :func:`n50`: 0 (no interval) or at least 100.
    c_theory : float, optional
        Theoretical slope for the ratio in :func:`fit_slope`.
    progress : bool or None, default None
        tqdm bars; None: only where stderr is a terminal (a job writing to a log file gets
        none).
    on_load : callable, optional
        ``on_load(loaded)``, called with the loaded model right after it loads and before
        anything is written: raise there to refuse arguments the model cannot take (the CLI
        checks token ids against the vocabulary and lengths against the context length).
    executor : {"local", "ray"} or embgeom.parallel.Executor, default "local"
        Where the batches of targets run (see :func:`accessibility_curve`); one connection for
        the whole sweep. When ``model_name`` is a name or path, each Ray worker process loads
        the model from it once (and moves it to ``device``) instead of receiving a copy. Same
        records, ``cram.jsonl`` and summary on every executor.

    Returns
    -------
    dict (JSON-able)
        ``model``, ``dtype``, ``device``, ``settings``, ``curves`` {m: curve dict}, ``n50``
        {m: dict}, ``fit`` (:func:`fit_slope`, or None with ``fit_error`` when fewer than two
        finite n50), ``files``, ``wall_s``.

    Raises
    ------
    TypeError, ValueError
        Bad arguments, checked before the model is loaded where they do not need it;
        ``out_dir`` or its ``cram.jsonl`` exists and is not a folder / a file.
    OSError
        ``out_dir`` cannot be written (checked before the model is loaded).
    """
    t0 = time.perf_counter()
    ms = sorted({check_positive_int(m, "mems") for m in np.atleast_1d(mems).tolist()})
    if not ms:
        raise ValueError("mems: expected at least one number of memory vectors")
    n_targets = check_positive_int(n_targets, "n_targets")
    batch_size = check_positive_int(batch_size, "batch_size")
    n_boot = check_n_boot(n_boot)
    lengths, mixed_batches = _check_lengths(lengths, ms, mixed_batches)
    cram_kwargs = {} if betas is None else {"betas": tuple(betas) if isinstance(betas, list)
                                            else betas}
    _check_cram_options(steps=steps, lr=lr, weight_decay=weight_decay, patience=patience,
                        precision=precision, **cram_kwargs)
    check_device(device)
    progress = _check_progress(progress)
    out = _check_out_dir(out_dir)
    _check_jsonl(out / "cram.jsonl", "out_dir")
    model = _load(model_name)
    if on_load is not None:
        on_load(model)
    hf, _, name, _ = unwrap(model)
    device = check_device(device)
    if device is not None:
        hf.to(device)
    dev, mdtype = model_device_dtype(hf)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "cram.jsonl"
    from embgeom.parallel import executor_scope

    with executor_scope(executor) as ex:
        curves, n50s = _sweep(model, ms, jsonl=jsonl, lengths=lengths, n_targets=n_targets,
                              seed=seed, n_boot=n_boot, mixed_batches=mixed_batches,
                              curve_kwargs=dict(
                                  target_source=target_source, adaptive=adaptive,
                                  max_length=max_length, steps=steps, lr=lr,
                                  batch_size=batch_size, check_generation=check_generation,
                                  start_token=start_token, progress=progress,
                                  precision=precision, weight_decay=weight_decay,
                                  patience=patience, executor=ex, device=device,
                                  load_on_workers=model_name if isinstance(model_name, str) else None,
                                  **cram_kwargs))
    finite, fit, fit_error = _fit(n50s, c_theory)
    files = {"jsonl": str(jsonl)}
    if plot:
        files.update(_plots(out, curves, finite, fit))
    settings = {
        "mems": ms,
        "lengths": (None if lengths is None else
                    {str(m): [int(x) for x in np.atleast_1d(v)] for m, v in lengths.items()}
                    if isinstance(lengths, dict) else [int(x) for x in np.atleast_1d(lengths)]),
        "n_targets": n_targets, "steps": steps, "lr": lr, "seed": seed, "adaptive": adaptive,
        "target_source": source_descriptor(target_source), "max_length": max_length,
        "batch_size": batch_size, "n_boot": n_boot,
        "start_token": next(iter(curves.values())).settings.get("start_token"),
        "precision": precision, "weight_decay": weight_decay, "patience": patience,
        "betas": None if betas is None else [float(b) for b in betas],
        "mixed_batches": mixed_batches, "protocol": protocol,
    }
    summary = _summary(model, name, mdtype, dev, settings=settings, curves=curves, n50s=n50s,
                       fit=fit, fit_error=fit_error, files=files, t0=t0)
    _write_summary(out, summary)
    return summary


def _converged_text(conv) -> str:
    """The budget sweep's verdict on n50, in words (``conv`` as :func:`budget_converged`, a
    bounded verdict with ``change_at_least``, or None)."""
    if conv and conv.get("converged"):
        return f"n50 has converged in the budget (change {conv['change']:.1%})."
    if conv and conv.get("converged") is False:
        ch = conv.get("change", conv.get("change_at_least"))
        by = "" if ch is None else (f" (budget sweep: change {'>= ' if 'change' not in conv else ''}"
                                    f"{ch:.1%} at the next budget)")
        return (f"n50 has not converged in the budget{by}: it is a lower bound on the model's "
                "capacity.")
    return "n50 is not known to have converged in the budget: it is a lower bound on the model's capacity."


def _summary_markdown(summary: dict) -> str:
    """The readable form of a :func:`run_cram` summary: one table per m, n50s, the fit."""
    from embgeom.report._markdown import fmt, md_table

    st = summary["settings"]
    if summary.get("kind") == "horizons":
        p = st["protocol"]
        conv = st.get("converged")
        lines = [
            f"# Cramming horizons: {summary['model']}",
            "",
            f"dtype {summary['dtype']}"
            + (f" on {summary['device']}" if summary.get("device") else "") + "; start token "
            f"{st.get('start_token')}; protocol {p['name']} ({p['source']}); at most "
            f"{st['steps_per_length']} updates per length"
            + (f", {st['max_steps']} per target" if st.get("max_steps") else "")
            + f"; {_targets_text(st['n_targets'])} targets ({st['target_source']}), "
            f"seed {st['seed']}; "
            + (f"wall {summary['wall_s']:.0f} s." if summary.get("wall_s") is not None else
               "interim: the finished targets of whole batches, read from the records while "
               "the run goes on."),
            "Accessibility(n) = P(h >= n) over the targets' horizons h; n50 = median horizon. "
            + _converged_text(conv),
        ]
    else:
        lines = [
            f"# Cramming: {summary['model']}",
            "",
            f"dtype {summary['dtype']} on {summary['device']}; start token "
            f"{st.get('start_token')}; Adam lr {st['lr']}, at most {st['steps']} steps; "
            f"{st['n_targets']} targets per length ({st['target_source']}), seed {st['seed']}; "
            f"wall {summary['wall_s']:.0f} s.",
        ]
    extra = [f"{k} {st[k]}" for k in ("precision", "weight_decay", "patience", "betas")
             if st.get(k) not in (None, 0, 0.0, "float32")]
    if st.get("protocol") and summary.get("kind") != "horizons":
        extra.insert(0, f"protocol {st['protocol'].get('name', 'custom')}")
    if extra:
        lines.append("Settings: " + "; ".join(extra) + ".")
    lines[1:1] = ["", _headline(summary)]
    for m, c in summary["curves"].items():
        rows = _collapse_runs([
            [n, f"{k}/{N}", a, f"[{fmt(lo, 3)}, {fmt(hi, 3)}]", f"{kg}/{N}"]
            for n, k, N, a, lo, hi, kg in zip(c["lengths"], c["successes"], c["trials"],
                                               c["accessibility"], c["lower"], c["upper"],
                                               c["successes_generation"])
        ])
        r = summary["n50"][m]
        note = f" (censored {r['censored']})" if r.get("censored") else ""
        lines += ["", f"## m = {m}", "",
                  md_table(["length n", "crammed", "accessibility", "95% Wilson", "generation"], rows),
                  "", f"n50 = {fmt(r['n50'])} tokens [{fmt(r['lower'])}, {fmt(r['upper'])}]{note}"]
    fit = summary.get("fit")
    lines += [""]
    if fit:
        lines.append(f"C_emp = {fmt(fit['c_emp'])} tokens per vector "
                     f"[{fmt(fit['c_emp_lower'])}, {fmt(fit['c_emp_upper'])}], R² through the "
                     f"origin {fmt(fit['r2_uncentred'])} (centred {fmt(fit['r2'])}), affine R² "
                     f"{fmt(fit['affine']['r2'])}")
        if "ratio" in fit:
            lines.append(f"C_theory / C_emp = {fmt(fit['ratio'])}")
    else:
        lines.append(f"no slope: {summary.get('fit_error')}")
    return "\n".join(lines) + "\n"


def _headline(summary: dict) -> str:
    """The answer first: n50 per m with its interval, and C_emp (or why there is none)."""
    from embgeom.report._markdown import fmt

    n50 = "; ".join(f"m = {m}: {fmt(r['n50'])} [{fmt(r['lower'])}, {fmt(r['upper'])}]"
                    for m, r in summary["n50"].items())
    fit = summary.get("fit")
    slope = (f"C_emp = {fmt(fit['c_emp'])} tokens per vector [{fmt(fit['c_emp_lower'])}, "
             f"{fmt(fit['c_emp_upper'])}]" if fit else "no C_emp yet")
    return f"**n50 (tokens, 95% interval)**: {n50}. **{slope}**."


def _collapse_runs(rows: list[list], min_run: int = 3) -> list[list]:
    """Table rows with every run of ``min_run`` or more consecutive rows that agree on all but
    the length as one row, its length ``"30-40"``: a horizon table runs to the longest length
    tried, mostly ``16/16`` and ``0/16`` rows, and between two horizons nothing changes."""
    out, i = [], 0
    while i < len(rows):
        j = i + 1
        while j < len(rows) and rows[j][1:] == rows[i][1:]:
            j += 1
        out += ([[f"{rows[i][0]}-{rows[j - 1][0]}", *rows[i][1:]]] if j - i >= min_run
                else rows[i:j])
        i = j
    return out


def _targets_text(n) -> str:
    """``16``, or for per-m counts ``16 (m = 1), 8 (m = 2)``."""
    if isinstance(n, dict):
        return ", ".join(f"{v} (m = {k})" for k, v in n.items())
    return str(n)
