"""One model's accessibility report: ``report.json``, ``report.md`` and PNG figures.

The report runs the library's data flow once, end to end::

    model -> (unembedding, hidden states) -> (cells, supports) -> bounds -> report

Every key of ``report.json`` is documented in ``docs/report.md``.
"""

from __future__ import annotations

import contextlib
import platform
import time
from pathlib import Path

import numpy as np

from . import _json
from ._markdown import fmt as _fmt
from ._markdown import md_table as _md_table
from ._validation import check_array, check_positive_int, check_seed

__all__ = ["build_report", "hidden_state_summary", "REPORT_SIZES"]

#: Sizes of the default and the ``--quick`` report. ``lengths`` are prompt lengths in tokens,
#: ``n_per_length`` hidden states per length, ``cell_samples`` Monte Carlo samples for the cell
#: volumes, ``heldout_min`` the share of held-out hidden states a fitted support must contain to
#: count as a bound, ``shapes`` the supports fitted (the ellipsoid and the principal-axes box need
#: well over d hidden states, so ``--quick`` leaves them out). The paper used lengths 4..4096 and 10,000 sequences per length (GPU); these sizes fit
#: 10 minutes (default) and 2 minutes (quick) on 2 CPU cores for SmolLM2-135M.
REPORT_SIZES = {
    "default": {"lengths": (4, 8, 16, 32, 64, 128, 256), "n_per_length": 128,
                "cell_samples": 100_000, "max_cos_points": 2000,
                "unargmaxable": "full", "heldout_min": 0.99,
                "shapes": ("ball", "ball_origin", "ellipsoid", "cone", "box", "box_pca")},
    "quick": {"lengths": (4, 16, 64), "n_per_length": 64,
              "cell_samples": 10_000, "max_cos_points": 500,
              "unargmaxable": "off", "heldout_min": 0.99,
              "shapes": ("ball", "ball_origin", "cone", "box")},
}


def hidden_state_summary(H, lengths=None, *, max_cos_points: int = 2000, seed=0) -> dict:
    """Norms and pairwise cosines of hidden states, overall and per prompt length.

    Parameters
    ----------
    H : ndarray of shape (N, d), float32 or float64
        Hidden states (after the final norm), one per row.
    lengths : ndarray of shape (N,), int, optional
        Prompt length (tokens) of each row; gives the per-length breakdown.
    max_cos_points : int, default 2000
        The pairwise cosines are quadratic in N: at most this many rows (drawn uniformly without
        replacement, seeded) enter the cosine statistics; ``cos_subsample`` says how many did.
    seed : seed, default 0
        Seed of that subsample: anything ``numpy.random.default_rng`` accepts.

    Returns
    -------
    dict
        ``n``, ``dim``, ``r2_max`` (max L2 norm), ``r2_mean``, ``rinf_max`` (max |h_i| over rows
        and coordinates), ``cos_min`` and ``cos_mean`` (over distinct pairs of the subsample),
        ``cos_subsample``, and ``per_length`` (a list of the same statistics per length).

    Raises
    ------
    ValueError, TypeError
        Non-finite or non-float ``H``, fewer than 2 rows, or ``lengths`` of another length.
    """
    H = check_array(H, "H", ndim=2)
    if H.shape[0] < 2:
        raise ValueError(f"H: need at least 2 hidden states, got {H.shape[0]}")
    max_cos_points = check_positive_int(max_cos_points, "max_cos_points", minimum=2)
    rng = check_seed(seed)
    if lengths is not None:
        lengths = np.asarray(lengths)
        if lengths.shape != (H.shape[0],):
            raise ValueError(f"lengths: expected shape ({H.shape[0]},), got {lengths.shape}")

    def stats(X, rng):
        norms = np.linalg.norm(X, axis=1)
        out = {
            "n": int(X.shape[0]),
            "r2_max": float(norms.max()),
            "r2_mean": float(norms.mean()),
            "rinf_max": float(np.abs(X).max()),
        }
        idx = np.arange(X.shape[0])
        if X.shape[0] > max_cos_points:
            idx = np.sort(rng.choice(X.shape[0], size=max_cos_points, replace=False))
        if idx.size >= 2:
            U = X[idx] / np.maximum(norms[idx], np.finfo(float).tiny)[:, None]
            G = U @ U.T
            iu = np.triu_indices(idx.size, k=1)
            cos = np.clip(G[iu], -1.0, 1.0)
            out.update(cos_min=float(cos.min()), cos_mean=float(cos.mean()))
        else:
            out.update(cos_min=None, cos_mean=None)
        out["cos_subsample"] = int(idx.size)
        return out

    summary = stats(H, rng)
    summary["dim"] = int(H.shape[1])
    summary["per_length"] = []
    if lengths is not None:
        for ell in np.unique(lengths):
            row = stats(H[lengths == ell], rng)
            row["length"] = int(ell)
            summary["per_length"].append(row)
    return summary


def _plot_norms(summary: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    rows = summary["per_length"]
    if not rows:
        return
    L = [r["length"] for r in rows]
    fig = Figure(figsize=(7.5, 3.6))
    ax = fig.subplots()
    ax.plot(L, [r["r2_max"] for r in rows], "o-", label="max L2 norm")
    ax.plot(L, [r["r2_mean"] for r in rows], "s--", label="mean L2 norm")
    ax.plot(L, [r["rinf_max"] for r in rows], "^-", label="max L-inf norm")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("norm of the final hidden state")
    ax.set_title("Hidden-state norms vs prompt length")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def build_report(
    model="smollm2-135m",
    out_dir="reports/smollm2-135m",
    *,
    quick: bool = False,
    lengths=None,
    n_per_length: int | None = None,
    n_cell_samples: int | None = None,
    seed: int = 0,
    cache_dir=None,
    progress: bool = True,
) -> dict:
    """Run the whole accessibility report on one model and write it to ``out_dir``.

    Parameters
    ----------
    model : str or LoadedModel
        A registry name (``"smollm2-135m"``, ``"gemma-3-270m"``), a Hugging Face folder, a
        ``.gguf`` file, or an already loaded :class:`embgeom.adapters.LoadedModel`.
    out_dir : str or Path
        Output folder, created if missing; must not be an existing file.
    quick : bool, default False
        Use :data:`REPORT_SIZES` ``["quick"]`` (about 2 minutes on 2 cores) instead of
        ``["default"]`` (about 10 minutes).
    lengths : sequence of int, optional
        Prompt lengths (tokens) of the random sequences; overrides the size preset.
    n_per_length : int, optional
        Hidden states per length; overrides the preset.
    n_cell_samples : int, optional
        Monte Carlo samples for the cell volumes; overrides the preset.
    seed : int, default 0
        Seed of every random draw (token sequences, subsamples, Monte Carlo); an int >= 0
        because it is recorded in ``report.json`` and the held-out sample uses ``seed + 1``.
    cache_dir : str or Path, optional
        Folder for the ``.npy`` cache of hidden states.
    progress : bool, default True
        Show tqdm progress bars.

    Returns
    -------
    dict
        The report (the content of ``report.json``) plus ``summary_lines``, a few lines of
        headline numbers for the terminal. ``report.json`` is strict JSON
        (:mod:`embgeom._json`): a number that is not finite is written as ``null``.

    Raises
    ------
    ValueError
        Unknown model name (the message lists the known ones), non-positive sizes, or
        ``out_dir`` pointing at a file.
    ModuleNotFoundError
        The model's offline package is missing (the message gives the pip command).
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir: {str(out)!r} exists and is not a folder")
    size = _report_sizes(quick, lengths, n_per_length, n_cell_samples)
    seed = check_positive_int(seed, "seed", minimum=0)
    timings: dict[str, float] = {}
    t_start = time.perf_counter()
    with _timed(timings, "load_model"):
        loaded, u, model_facts = _load_phase(model, progress)
    out.mkdir(parents=True, exist_ok=True)
    with _timed(timings, "hidden_states"):
        H, row_lengths = _sample(loaded, size, size["n_per_length"], seed, cache_dir, progress)
    geo = _hidden_phase(H, row_lengths, size, seed, out)
    with _timed(timings, "supports"):
        sup_section, fitted, valid = _supports_phase(loaded, H, u, geo, size, seed, cache_dir,
                                                     progress, out)
    with _timed(timings, "cells"):
        cells_section, cell_result = _cells_phase(loaded, u, fitted, size, seed, out, progress)
    with _timed(timings, "bounds"):
        bounds_section = _bounds_phase(loaded, u, model_facts, fitted, valid, geo, sup_section,
                                       cell_result, size, out)
    timings["total"] = round(time.perf_counter() - t_start, 2)
    report = {
        "embgeom_version": _version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "platform": platform.platform(),
        "settings": {"quick": bool(quick), "seed": int(seed), **{
            k: (list(v) if isinstance(v, tuple) else v) for k, v in size.items()}},
        "model": model_facts,
        "hidden_states": geo,
        "supports": sup_section,
        "cells": cells_section,
        "bounds": bounds_section,
        "timings_s": timings,
    }
    _json.dump(report, out / "report.json")
    (out / "report.md").write_text(_markdown(report))
    report["summary_lines"] = _summary_lines(report, out)
    return report


# --------------------------------------------------------------------------------------------
# The phases of build_report
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _timed(timings: dict, name: str):
    """Record the wall time of the block in ``timings[name]`` (seconds, 2 decimals)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = round(time.perf_counter() - t0, 2)


def _report_sizes(quick: bool, lengths, n_per_length, n_cell_samples) -> dict:
    """The size preset (:data:`REPORT_SIZES`) with the caller's overrides, validated."""
    size = dict(REPORT_SIZES["quick" if quick else "default"])
    if lengths is not None:
        lengths = [check_positive_int(ell, "lengths") for ell in lengths]
        if not lengths:
            raise ValueError("lengths: expected at least one prompt length")
        size["lengths"] = tuple(lengths)
    if n_per_length is not None:
        size["n_per_length"] = check_positive_int(n_per_length, "n_per_length", minimum=2)
    if n_cell_samples is not None:
        size["cell_samples"] = check_positive_int(n_cell_samples, "n_cell_samples")
    return size


def _load_phase(model, progress: bool):
    """1. model -> unembedding: ``(loaded, unembedding, model facts)``."""
    from . import adapters

    loaded = (model if isinstance(model, adapters.LoadedModel)
              else adapters.load_model(model, progress=progress))
    u = adapters.unembedding(loaded)
    model_facts = u.to_dict()
    model_facts["name"] = loaded.name
    model_facts["source"] = str(loaded.source)
    return loaded, u, model_facts


def _sample(loaded, size: dict, n_per_length: int, seed: int, cache_dir, progress: bool):
    from . import adapters

    return adapters.sample_hidden_states(loaded, size["lengths"], n_per_length, seed=seed,
                                         cache_dir=cache_dir, progress=progress)


def _hidden_phase(H, row_lengths, size: dict, seed: int, out: Path) -> dict:
    """2. hidden states -> their summary and the norms figure."""
    geo = hidden_state_summary(H, row_lengths, max_cos_points=size["max_cos_points"], seed=seed)
    geo["lengths"] = [int(x) for x in size["lengths"]]
    geo["n_per_length"] = int(size["n_per_length"])
    _plot_norms(geo, out / "hidden_norms.png")
    geo["figure"] = "hidden_norms.png"
    return geo


def _supports_phase(loaded, H, u, geo: dict, size: dict, seed: int, cache_dir, progress, out):
    """3. supports, checked on held-out hidden states: ``(section, fitted, valid)``.

    A support fitted to a sample is only a bound if it also holds hidden states it has not
    seen: every shape is checked on a held-out sample (seed ``seed + 1``), and only the shapes
    that contain at least ``heldout_min`` of it count as bounds.
    """
    from . import supports

    H_test, _ = _sample(loaded, size, max(2, size["n_per_length"] // 4), seed + 1, cache_dir,
                        progress)
    sup_section, fitted = supports.supports_report_section(
        H, out, shapes=size["shapes"], unembedding=u, heldout=H_test,
        heldout_min=size["heldout_min"], return_supports=True)
    valid = {k: S for k, S in fitted.items() if sup_section[k]["heldout_valid"]}
    geo["heldout_rinf_max"] = float(np.abs(H_test).max())
    geo["heldout_r2_max"] = float(np.linalg.norm(H_test, axis=1).max())
    sup_section["heldout"] = {"n": int(H_test.shape[0]), "seed": int(seed) + 1,
                              "cube_contained": float(np.mean(
                                  np.abs(H_test).max(axis=1) <= geo["rinf_max"])),
                              "min_contained": size["heldout_min"],
                              "not_valid": sorted(set(fitted) - set(valid))}
    sup_section["figures"] = {k: Path(v).name for k, v in sup_section["figures"].items()}
    sup_section["markdown"] = _supports_markdown(sup_section, H.shape)
    return sup_section, fitted, valid


def _cells_phase(loaded, u, fitted: dict, size: dict, seed: int, out: Path, progress: bool):
    """4. decoder cells: ``(section, CellVolumes)``.

    With no bias every cell is a cone, so its share of an origin-centred ball is its
    solid-angle fraction (the estimator then samples directions only).
    """
    from . import cells, volumes

    decoder = cells.Decoder.from_unembedding(u)
    cell_support = fitted["ball_origin"] if "ball_origin" in fitted else fitted["ball"]
    cells_section, cell_result = volumes.cells_report_section(
        decoder, cell_support, size["cell_samples"], seed, out, tokenizer=loaded.tokenizer,
        unargmaxable=size["unargmaxable"], progress=progress, return_volumes=True,
    )
    cells_section["support"] = "ball_origin" if "ball_origin" in fitted else "ball"
    cells_section["fractions_path"] = Path(cells_section["fractions_path"]).name
    cells_section["histogram_path"] = Path(cells_section["histogram_path"]).name
    cells_section["markdown"] = _cells_markdown(cells_section, len(cell_result.fractions))
    return cells_section, cell_result


def _bounds_phase(loaded, u, model_facts, fitted, valid, geo, sup_section, cell_result, size, out):
    """5. packing bounds from the valid supports and the cell volumes."""
    from . import bounds

    published = bounds.PUBLISHED.get(loaded.name, {})
    return bounds.bounds_report_section(
        model_facts, fitted, rinf=geo["rinf_max"], fractions=cell_result,
        published_c_emp=published.get("c_emp"), out_dir=out, dtype=u.dtype,
        n_samples=cell_result.n_samples,
        valid=set(valid) | ({"cube"} if sup_section["heldout"]["cube_contained"]
                            >= size["heldout_min"] else set()),
    )


def _version() -> str:
    from . import __version__

    return __version__


def _summary_lines(rep: dict, out: Path) -> list[str]:
    m, h, b = rep["model"], rep["hidden_states"], rep["bounds"]
    lines = [
        f"embgeom report: {m['name']} (d = {m['hidden_size']}, |V| = {m['vocab_size']:,})",
        f"  hidden states: n = {h['n']}, max L2 = {_fmt(h['r2_max'])}, "
        f"max L-inf = {_fmt(h['rinf_max'])}, min cosine = {_fmt(h['cos_min'])}",
    ]
    for shape, c in b.get("slope", {}).items():
        ok = b.get("heldout_valid", {}).get(shape, True)
        lines.append(f"  slope bound C [{shape}]: {_fmt(c)} tokens per prompt vector"
                     + ("" if ok else "  (support missed held-out hidden states: not a bound)"))
    lines.append(f"  tightest valid: {b.get('tightest')}")
    un = rep["cells"].get("unargmaxable")
    lines.append("  unargmaxable tokens: " + ("not computed (--quick)" if un is None else
                 f"{un.get('n_unargmaxable')} ({un.get('n_undecided')} undecided)"))
    lines.append(f"  written: {out / 'report.json'}, {out / 'report.md'} "
                 f"({rep['timings_s']['total']} s)")
    return lines


def _supports_markdown(section: dict, shape) -> str:
    rows = []
    for name, e in section.items():
        if name in ("figures", "heldout", "markdown"):
            continue
        if "error" in e:
            rows.append([name, "not fitted: " + e["error"], None, None, None, None])
            continue
        params = []
        keys = e["summary_keys"]  # each shape names its own (the shell: its gains, not sqrt(d))
        for key in keys:
            if e.get(key) is not None and not isinstance(e.get(key), (list, dict)):
                params.append(f"{key} {_fmt(e[key])}")
        rows.append([name, ", ".join(params) or "—", e["log_volume"], e["log_volume_per_dim"],
                     e.get("heldout_contained"), e.get("fit_seconds")])
    lines = ["## Supports", "",
             f"Smallest sets of each shape holding the {shape[0]:,} hidden states (d = {shape[1]}); "
             "`final_norm` is the shell certified by the final norm (no data; its log-volume is "
             "the enclosing solid's). Log-volumes in nats.", "",
             _md_table(["support", "parameters", "log-volume", "per dimension",
                        "held-out contained", "fit (s)"], rows)]
    ho = section.get("heldout")
    if ho:
        lines += ["", f"Held-out check: {ho['n']:,} fresh hidden states (seed {ho['seed']}); a "
                  f"support enters the bounds only if it contains at least "
                  f"{_fmt(ho['min_contained'])} of them (the cube: {_fmt(ho['cube_contained'])}). "
                  f"Not valid: {', '.join(ho['not_valid']) or 'none'}."]
    if "final_norm" in section and "contains_fraction" in section["final_norm"]:
        lines += ["", "Share of the hidden states on the final-norm shell (relative tol 1e-4): "
                  f"{_fmt(section['final_norm']['contains_fraction'])}."]
    lines += ["", f"![support log-volumes]({Path(section['figures']['log_volume']).name})"]
    return "\n".join(lines)


def _cells_markdown(section: dict, n_tokens: int) -> str:
    vol = section["volumes"]
    lines = ["## Decoder cells", "",
             f"Monte Carlo shares of the {n_tokens:,} decoder cells E_t (argmax of W h + b) in the "
             f"`{section['support']}` support, {vol.get('n_samples', 0):,} samples, 95% "
             f"{vol.get('interval', '')} intervals. Largest 1% of cells hold "
             f"{_fmt(section['top1pct_share'])} of the volume; "
             f"{_fmt(vol.get('n_zero', vol.get('n_empty_sample')))} tokens got no sample.", ""]
    un = section.get("unargmaxable")
    if un is None:
        lines.append("Unargmaxable tokens: not computed at this size (`--quick`).")
    else:
        lines.append(f"Unargmaxable tokens (exact: witnesses, then LPs): {un.get('n_unargmaxable')}"
                     f" ({un.get('n_lp')} LPs, {un.get('n_undecided')} undecided, "
                     f"{_fmt(un.get('seconds'))} s; status counts {un.get('status_counts')}).")
        if un.get("undecided"):
            lines.append("Undecided token ids (LP time limit reached): "
                         + ", ".join(str(i) for i in un["undecided"][:30]) + ".")
        if un.get("tokens"):
            lines.append("Tokens: " + ", ".join(f"`{t}`" for t in un["tokens"][:30]))
    top = section.get("top") or []
    if top:
        lines += ["", "Largest cells:", ""]
        keys = [k for k in ("token_id", "token", "fraction", "lower", "upper") if k in top[0]]
        lines.append(_md_table(keys, [[t.get(k) for k in keys] for t in top]))
    lines += ["", f"![cell-volume histogram]({section['histogram_path']})"]
    return "\n".join(lines)


def _markdown(rep: dict) -> str:
    m, h = rep["model"], rep["hidden_states"]
    parts = [f"# embgeom report: {m['name']}", ""]
    parts.append(f"embgeom {rep['embgeom_version']}, {rep['created']}, seed {rep['settings']['seed']}"
                 f"{', quick' if rep['settings']['quick'] else ''}.")
    parts += ["", "## Model", ""]
    fn = m["final_norm"]
    parts.append(_md_table(["fact", "value"], [
        ["source", m["source"]], ["weights", m["source_dtype"]], ["compute dtype", m["dtype"]],
        ["hidden size d", m["hidden_size"]], ["vocabulary size |V| (tokenizer)", m["vocab_size"]],
        ["unembedding rows", m["n_rows"]], ["padded rows", m["padded_rows"]],
        ["tied embedding", m["tied"]], ["unembedding bias", m["has_bias"]],
        ["final norm", f"{fn['kind']} ({fn.get('module')}, eps {_fmt(fn['eps'])}, "
                       f"gain offset {_fmt(fn.get('gain_offset'))}, max |gain| "
                       f"{_fmt(fn.get('gain_abs_max'))}, bias {fn.get('has_bias')})"],
        ["logit soft-cap", m.get("logit_softcap")],
    ]))
    parts += ["", "## Hidden states", "",
              f"{h['n']:,} last-position final hidden states (after the final norm) of random "
              f"token sequences, {h['n_per_length']} per length. The pairwise cosines are quadratic in "
              f"the number of rows: each group uses at most {rep['settings']['max_cos_points']:,} "
              "rows (a seeded subsample when larger).", ""]
    rows = [[r["length"], r["n"], r["r2_max"], r["r2_mean"], r["rinf_max"], r["cos_min"],
             r["cos_mean"]] for r in h["per_length"]]
    rows.append(["all", h["n"], h["r2_max"], h["r2_mean"], h["rinf_max"], h["cos_min"],
                 h["cos_mean"]])
    parts.append(_md_table(["length", "n", "max L2", "mean L2", "max L-inf", "min cos",
                            "mean cos"], rows))
    parts += ["", f"![norms vs length]({h['figure']})", ""]
    for key in ("supports", "cells", "bounds"):
        md = rep[key].get("markdown")
        if md:
            parts += [md, ""]
    parts += ["## Timings (s)", "",
              _md_table(["step", "seconds"], [[k, v] for k, v in rep["timings_s"].items()]), ""]
    return "\n".join(parts)
