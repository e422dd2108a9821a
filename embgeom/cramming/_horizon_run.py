"""The horizons job (``embgeom cram --horizons``): horizons per m, n50, C_emp, files on disk.

:func:`run_horizons` is :func:`embgeom.cramming.run_cram`'s sister for progressive cramming: one
:func:`horizons` run per m into one JSONL file (resumable), n50 = median horizon per m, the slope
``C_emp`` by :func:`fit_slope`, and a ``cram_summary.json`` that :func:`embgeom.report.
read_cram_summary` reads (with ``kind: "horizons"``, the protocol, the budget, the target source
and, when a budget sweep was given, whether n50 converged).
"""

from __future__ import annotations

import os
import time

import numpy as np

from embgeom._hf import dtype_name, model_device_dtype, unwrap
from embgeom._validation import check_bool, check_positive, check_positive_int

from ._curve import _check_jsonl
from ._horizons import horizons
from ._optimise import _check_progress
from ._protocols import DEFAULT_PROTOCOL, get_protocol
from .analysis import check_n_boot
from ._run import _check_out_dir, _fit, _load, _write_summary
from ._targets import source_descriptor
from .plots import plot_accessibility, plot_n50

__all__ = ["run_horizons", "budget_converged", "summarise_horizons"]


def budget_converged(n50_by_budget: dict, *, tolerance: float = 0.1) -> dict:
    """Whether n50 has converged in the step budget: it changes by less than ``tolerance``
    (relative) from the second-largest budget to the largest.

    Parameters
    ----------
    n50_by_budget : mapping {budget (int, updates per length): n50 (float, tokens)}
        At least two budgets.
    tolerance : float, default 0.1
        Issue 23's rule: converged when the change is < 10%.

    Returns
    -------
    dict
        ``converged`` (bool), ``change`` (relative change, float), ``budgets`` (the two
        compared), ``n50`` (their n50s).

    Raises
    ------
    ValueError
        Fewer than two budgets, or a non-finite or non-positive n50 at the second budget.
    """
    items = sorted((check_positive_int(b, "n50_by_budget key"), float(v))
                   for b, v in dict(n50_by_budget).items())
    if len(items) < 2:
        raise ValueError("n50_by_budget: expected at least two budgets")
    (b2, n2), (b3, n3) = items[-2], items[-1]
    if not (np.isfinite(n2) and n2 > 0 and np.isfinite(n3)):
        raise ValueError(f"n50_by_budget: n50 at budgets {b2} and {b3} must be finite and > 0, "
                         f"got {n2}, {n3}")
    change = abs(n3 - n2) / n2
    return {"converged": bool(change < tolerance), "change": change, "budgets": [b2, b3],
            "n50": [n2, n3], "tolerance": tolerance}


def run_horizons(model_name, mems, out_dir, *, n_targets: int | dict = 16, max_length: int = 64,
                 target_source="random-tokens", protocol=DEFAULT_PROTOCOL,
                 steps_per_length: int = 500, max_steps: int | None = None, seed: int = 0,
                 batch_size: int = 16, precision: str = "float32", n_boot: int = 1000,
                 c_theory: float | None = None, check_generation: bool = True,
                 start_token="auto", plot: bool = True, progress: bool | None = None,
                 converged: dict | None = None, device=None, on_load=None) -> dict:
    """Horizons for each m, their n50 (median horizon), C_emp, and the files.

    Writes into ``out_dir``: ``horizons.jsonl`` (one line per target; a rerun resumes),
    ``cram_summary.json`` / ``.md`` and with ``plot`` ``accessibility.png`` (P(h >= n) per m)
    and ``n50_vs_m.png``.

    Parameters
    ----------
    model_name : str, LoadedModel or HF causal LM
    mems : sequence of int
        Numbers of memory vectors m.
    out_dir : str or Path
    n_targets, max_length, target_source, protocol, steps_per_length, max_steps, seed,
    batch_size, precision, check_generation, start_token, device :
        see :func:`horizons` (``n_targets`` and ``max_length`` may also be dicts {m: value};
        targets are drawn by index, so a later call with more targets for an m resumes the
        same first ones and adds the rest).
    n_boot : int, default 1000
        Bootstrap resamples of each n50 interval: 0 (no interval) or at least 100.
    c_theory : float, optional
        C_theory for the ratio of :func:`fit_slope`.
    plot : bool, default True
    progress : bool or None, default None
        A tqdm bar per m; None: only where stderr is a terminal (a job writing to a log file
        gets none, as with the other cramming entry points).
    converged : dict, optional
        A :func:`budget_converged` result for this protocol, stored in the summary (None: the
        budget sweep was not run, and the summary says n50 is not known to be converged).
    on_load : callable, optional
        ``on_load(loaded)``, called with the loaded model right after it loads and before
        anything is written: raise there to refuse arguments the model cannot take (the CLI
        checks token ids against the vocabulary and lengths against the context length).

    Returns
    -------
    dict (JSON-able)
        As :func:`run_cram`'s summary (``model``, ``curves``, ``n50``, ``fit``, ...), with
        ``kind = "horizons"`` and in ``settings`` the protocol (name, source, fields), the
        budget, the target source and ``converged``.

    Raises
    ------
    TypeError, ValueError
        Bad arguments (before the model is loaded where possible).
        ``out_dir`` (or its ``horizons.jsonl``) exists and is not a folder (a file).
    OSError
        ``out_dir`` cannot be written.
    """
    t0 = time.perf_counter()
    ms = sorted({check_positive_int(m, "mems") for m in np.atleast_1d(mems).tolist()})
    if not ms:
        raise ValueError("mems: expected at least one number of memory vectors")
    proto = get_protocol(protocol)
    if isinstance(max_length, dict):
        missing = [m for m in ms if m not in max_length]
        if missing:
            raise ValueError(f"max_length: no length for m = {missing}")
    lengths = {m: check_positive_int(max_length[m] if isinstance(max_length, dict)
                                     else max_length, "max_length") for m in ms}
    if isinstance(n_targets, dict):
        missing = [m for m in ms if m not in n_targets]
        if missing:
            raise ValueError(f"n_targets: no number of targets for m = {missing}")
    counts = {m: check_positive_int(n_targets[m] if isinstance(n_targets, dict)
                                    else n_targets, "n_targets") for m in ms}
    c_theory, n_boot = _check_summary_args(out_dir, converged, c_theory, n_boot, plot)
    progress = _check_progress(progress)
    out = _check_out_dir(out_dir)
    _check_jsonl(out / "horizons.jsonl", "out_dir", checkpoints=True)
    prior = out / "cram_summary.json"
    if prior.is_file():
        import json

        try:
            kind = json.loads(prior.read_text()).get("kind")
        except (ValueError, OSError, AttributeError):
            kind = None
        if kind != "horizons":
            raise ValueError(f"out_dir: {str(out)!r} holds another run's cram_summary.json (not "
                             "a horizons run); choose another folder")
    model = _load(model_name)
    if on_load is not None:
        on_load(model)
    hf, _, name, _ = unwrap(model)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "horizons.jsonl"
    curves, n50s = {}, {}
    for m in ms:
        hc = horizons(model, m, n_targets=counts[m], max_length=lengths[m],
                      target_source=target_source, protocol=proto,
                      steps_per_length=steps_per_length, max_steps=max_steps, seed=seed,
                      start_token=start_token, batch_size=batch_size, precision=precision,
                      jsonl=jsonl, check_generation=check_generation, n_boot=n_boot,
                      device=device, progress=progress)
        curves[m] = hc
        n50s[m] = hc.n50()
    dev, mdtype = model_device_dtype(hf)
    finite, fit, fit_error = _fit(n50s, c_theory)
    files = _files(out, jsonl, curves, finite, fit, plot)
    settings = {
        "kind": "horizons", "mems": ms,
        "n_targets": (counts[ms[0]] if len(set(counts.values())) == 1
                      else {str(m): v for m, v in counts.items()}),
        "max_length": {str(m): v for m, v in lengths.items()},
        "protocol": {"name": proto.name, "source": proto.source, **proto.to_dict()},
        "steps_per_length": steps_per_length, "max_steps": max_steps, "seed": seed,
        "target_source": source_descriptor(target_source), "batch_size": batch_size,
        "precision": precision, "n_boot": n_boot, "converged": converged,
        "start_token": next(iter(curves.values())).settings.get("start_token"),
        # the fields run_cram's markdown reads
        "lr": proto.lr, "steps": steps_per_length,
    }
    summary = {
        "kind": "horizons", "model": name, "source_dtype": getattr(model, "source_dtype", None),
        "dtype": dtype_name(mdtype), "device": str(dev), "settings": settings,
        "curves": {str(m): _curve_dict(c) for m, c in curves.items()},
        "horizons": {str(m): c.to_dict() for m, c in curves.items()},
        "n50": {str(m): v for m, v in n50s.items()}, "fit": fit, "fit_error": fit_error,
        "files": files, "wall_s": time.perf_counter() - t0,
    }
    _write_summary(out, summary)
    return summary


def _files(out, jsonl, curves: dict, finite: dict, fit, plot: bool) -> dict:
    """The summary's ``files``: the JSONL and, with ``plot``, ``accessibility.png`` (P(h >= n)
    per m) and ``n50_vs_m.png`` (when an n50 is finite)."""
    files = {"jsonl": str(jsonl)}
    if plot:
        files["accessibility_png"] = plot_accessibility(
            {m: c.as_accessibility_curve() for m, c in curves.items()}, out / "accessibility.png")
        if finite:
            files["n50_png"] = plot_n50(finite, fit, out / "n50_vs_m.png")
    return files


def _curve_dict(hc) -> dict:
    d = hc.as_accessibility_curve().to_dict()
    d.pop("settings", None)
    return d



def _check_summary_args(out_dir, converged, c_theory, n_boot, plot):
    """The arguments :func:`run_horizons` and :func:`summarise_horizons` share, checked before
    anything is read or written: ``(c_theory as a float or None, n_boot)``."""
    if converged is not None and not (isinstance(converged, dict) and "converged" in converged):
        raise TypeError("converged: expected None or a budget_converged() result (a dict with "
                        f"'converged'), got {type(converged).__name__}")
    if c_theory is not None:
        c_theory = check_positive(c_theory, "c_theory")
    n_boot = check_n_boot(n_boot)
    check_bool(plot, "plot")
    if out_dir is None or (isinstance(out_dir, str) and not out_dir.strip()):
        raise ValueError(f"out_dir: expected a folder path, got {out_dir!r}")
    if not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"out_dir: expected a folder path, got {type(out_dir).__name__}")
    return c_theory, n_boot


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _check_horizon_record(r: dict, where: str) -> None:
    """A record of ``horizons.jsonl`` that :func:`summarise_horizons` can trust: integer
    ``n_mem >= 1``, ``target_index >= 0``, ``horizon`` in ``[0, max_length]``, a boolean
    ``censored``, and settings with integer ``max_length``, ``batch_size`` (>= 1) and ``seed``.
    ``where`` ("out_dir: line 3 of '...'") starts the ValueError."""
    st = r.get("settings")
    if not isinstance(st, dict):
        raise ValueError(f"{where}: 'settings' must be an object, got {st!r}")
    for key, low in (("max_length", 1), ("batch_size", 1), ("seed", 0)):
        if not (_is_int(st.get(key)) and st[key] >= low):
            raise ValueError(f"{where}: settings '{key}' must be an integer >= {low}, got "
                             f"{st.get(key)!r}")
    for key, low in (("n_mem", 1), ("target_index", 0)):
        if not (_is_int(r.get(key)) and r[key] >= low):
            raise ValueError(f"{where}: '{key}' must be an integer >= {low}, got {r.get(key)!r}")
    h, top = r.get("horizon"), st["max_length"]
    if not (_is_int(h) and 0 <= h <= top):
        raise ValueError(f"{where}: 'horizon' must be an integer in [0, max_length = {top}] "
                         f"(tokens), got {h!r}")
    if not isinstance(r.get("censored"), bool):
        raise ValueError(f"{where}: 'censored' must be true or false, got {r.get('censored')!r}")


def summarise_horizons(out_dir, *, converged: dict | None = None, c_theory: float | None = None,
                       n_boot: int = 1000, plot: bool = True) -> dict:
    """The summary of a horizons run folder from its finished records alone: no model is loaded
    and nothing is crammed, so a run still going (or cut short) can be read mid-way.

    Reads ``out_dir/horizons.jsonl`` (written by :func:`run_horizons` or :func:`horizons`), and
    per m keeps the targets of *whole batches*: targets ``0 .. k-1`` with ``k`` the largest
    multiple of the run's ``batch_size`` such that all of them have a record. A batch's short
    horizons finish first, so a batch cut short would bias n50 low; whole batches are the
    targets drawn by index, in order, whatever their horizons. Then n50 per m, C_emp by
    :func:`fit_slope` (two or more finite n50) and ``cram_summary.json`` / ``.md`` as
    :func:`run_horizons` writes them, with ``settings["interim"] = True`` and
    ``settings["n_targets"]`` the targets used per m (``{m: k}``).

    Parameters
    ----------
    out_dir : str or Path
        A folder holding ``horizons.jsonl``.
    converged : dict, optional
        The budget sweep's verdict (:func:`budget_converged`, or one bounded from a run in
        progress: ``{"converged": False, ...}``); stored as ``settings["converged"]``.
    c_theory : float, optional
        Theorem 4.5's slope, for the ratio in the fit (tokens per vector).
    n_boot : int, default 1000
        Bootstrap resamples for n50's interval (0, or >= 100).
    plot : bool, default True
        Also write ``accessibility.png`` and ``n50_vs_m.png``.

    Returns
    -------
    dict
        The summary (the keys of :func:`run_horizons`'s).

    Raises
    ------
    FileNotFoundError
        No ``horizons.jsonl`` in ``out_dir``.
    TypeError
        A ``converged`` that is not None or a :func:`budget_converged` result, a ``c_theory``
        that is not a number, a non-boolean ``plot``, an ``out_dir`` that is not a path.
    ValueError
        Records of one m with different settings (two runs in one file), a record that is not
        a horizon record or holds a value that cannot be right (a horizon that is not an integer
        in ``[0, max_length]``, ``n_mem < 1``, ...; the message names the line), no m with a
        whole batch of finished targets; a ``c_theory`` that is not finite and > 0, a bad
        ``n_boot``, an empty ``out_dir``. All before anything is written.
    """
    import json
    from pathlib import Path

    from .analysis import HorizonCurve

    c_theory, n_boot = _check_summary_args(out_dir, converged, c_theory, n_boot, plot)
    out = Path(out_dir)
    jsonl = out / "horizons.jsonl"
    if not jsonl.is_file():
        raise FileNotFoundError(f"out_dir: no horizons.jsonl in {str(out)!r}")
    by_m: dict = {}
    for i, line in enumerate(jsonl.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError:
            raise ValueError(f"out_dir: line {i + 1} of {str(jsonl)!r} is not JSON") from None
        if not isinstance(r, dict) or r.get("kind") != "horizon" or "settings" not in r:
            raise ValueError(f"out_dir: line {i + 1} of {str(jsonl)!r} is not a horizon record")
        _check_horizon_record(r, f"out_dir: line {i + 1} of {str(jsonl)!r}")
        by_m.setdefault(int(r["n_mem"]), []).append(r)
    curves, n50s, counts, st = {}, {}, {}, None
    for m in sorted(by_m):
        rs = by_m[m]
        if len({r["settings_hash"] for r in rs}) != 1:
            raise ValueError(f"out_dir: the m = {m} records of {str(jsonl)!r} come from "
                             "runs with different settings")
        s = rs[0]["settings"]
        byi = {int(r["target_index"]): r for r in rs}
        k = 0
        while k in byi:
            k += 1
        k -= k % int(s["batch_size"])
        if k == 0:
            continue
        hc = HorizonCurve.from_records([byi[j] for j in range(k)], n_mem=m,
                                       max_length=int(s["max_length"]), settings=s,
                                       n_boot=n_boot, seed=int(s["seed"]))
        curves[m], n50s[m], counts[m], st = hc, hc.n50(), k, s
    if not curves:
        raise ValueError(f"out_dir: {str(jsonl)!r} has no m with a whole batch of finished targets")
    finite, fit, fit_error = _fit(n50s, c_theory)
    files = _files(out, jsonl, curves, finite, fit, plot)
    proto = dict(st["protocol"])
    settings = {
        "kind": "horizons", "interim": True, "mems": sorted(curves),
        "n_targets": {str(m): v for m, v in counts.items()},
        "max_length": {str(m): int(curves[m].max_length) for m in curves},
        "protocol": proto, "steps_per_length": st["steps_per_length"],
        "max_steps": st.get("max_steps"), "seed": st["seed"],
        "target_source": st.get("target_source"), "batch_size": st["batch_size"],
        "precision": st.get("precision", "float32"), "n_boot": n_boot, "converged": converged,
        "start_token": st.get("start_token"), "lr": proto.get("lr"),
        "steps": st["steps_per_length"],
    }
    model = st.get("model") or {}
    summary = {
        "kind": "horizons", "model": model.get("name") if isinstance(model, dict) else model,
        "source_dtype": None, "dtype": st.get("dtype"), "device": None, "settings": settings,
        "curves": {str(m): _curve_dict(c) for m, c in curves.items()},
        "horizons": {str(m): c.to_dict() for m, c in curves.items()},
        "n50": {str(m): v for m, v in n50s.items()}, "fit": fit, "fit_error": fit_error,
        "files": files, "wall_s": None,
    }
    _write_summary(out, summary)
    return summary
