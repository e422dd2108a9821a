"""One model's accessibility report: :func:`build_report` and its phases.

The report runs the library's data flow once, end to end::

    model -> (unembedding, hidden states) -> (cells, supports) -> bounds -> answer -> files

Each phase is a function of its own (``_load_phase``, ``_sample_phase``, ``_hidden_phase``,
``_supports_phase``, ``_cells_phase``, ``_bounds_phase``, ``_answer_phase``, ``_write``). Every
key of ``report.json`` is documented in ``docs/report.md``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import time
from pathlib import Path

import numpy as np

from .. import _json
from .._validation import check_positive_int, check_probability
from . import figures
from ._answer import build_answer
from ._bounds import bounds_report_section
from ._cells import cells_markdown, cells_report_section
from ._cram import find_cram_summary, read_cram_summary
from ._hidden import hidden_markdown, hidden_state_summary
from ._markdown import fmt, md_table
from ._supports import certified_radius, supports_markdown, supports_report_section

__all__ = ["build_report", "REPORT_SIZES"]

_log = logging.getLogger(__name__)

#: Sizes of the default and the ``--quick`` report. ``lengths`` are the prompt lengths (tokens)
#: of the fit sample, ``n_per_length`` hidden states per length; ``heldout_lengths`` and
#: ``heldout_per_length`` the fresh sample of the validity check (other lengths, seed + 1);
#: ``calibration_per_length`` the conformal calibration sample (the fit lengths, seed + 2) at
#: miscoverage ``alpha``; a support is valid when the one-sided ``confidence`` Clopper-Pearson
#: lower bound on its contained share of the fresh sample is at least ``heldout_min`` (299 fresh
#: states all inside are the least that can pass; the default draws 2,004, ``--quick`` 300).
#: ``cell_samples``: Monte Carlo samples for the cell shares; ``cell_tokens``: the seeded token
#: sample given rare-event log-shares (>= 1,000 for lambda; the cost per token is in
#: ``docs/performance.md``); ``shapes``: the supports fitted
#: (the ellipsoid and the principal-axes box need well over d hidden states, so ``--quick``
#: leaves them out). The paper used lengths 4..4096 and 10,000 sequences per length (GPU).
REPORT_SIZES = {
    "default": {"lengths": (4, 8, 16, 32, 64, 128, 256), "n_per_length": 128,
                "heldout_lengths": (6, 12, 24, 48, 96, 192), "heldout_per_length": 334,
                "calibration_per_length": 64, "alpha": 0.01, "confidence": 0.95,
                "heldout_min": 0.99, "cell_samples": 100_000, "cell_tokens": 1000,
                "max_cos_points": 2000, "unargmaxable": "full",
                "shapes": ("ball", "ball_origin", "ellipsoid", "cone", "box", "box_pca")},
    "quick": {"lengths": (4, 16, 64), "n_per_length": 64,
              "heldout_lengths": (8, 32), "heldout_per_length": 150,
              "calibration_per_length": 34, "alpha": 0.01, "confidence": 0.95,
              "heldout_min": 0.99, "cell_samples": 10_000, "cell_tokens": 32, "max_cos_points": 500,
              "unargmaxable": "off", "shapes": ("ball", "ball_origin", "cone", "box")},
}


def build_report(
    model="smollm2-135m",
    out_dir="reports/smollm2-135m",
    *,
    quick: bool = False,
    lengths=None,
    n_per_length: int | None = None,
    n_cell_samples: int | None = None,
    heldout_lengths=None,
    n_heldout_per_length: int | None = None,
    n_calibration_per_length: int | None = None,
    cram_summary=None,
    seed: int = 0,
    cache_dir="auto",
    progress: bool = True,
    executor="local",
    vocabulary="auto",
    on_load=None,
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
        Use :data:`REPORT_SIZES` ``["quick"]`` instead of ``["default"]``.
    lengths : sequence of int, optional
        Prompt lengths (tokens) of the fit sample; overrides the preset.
    n_per_length : int, optional
        Hidden states per length of the fit sample; overrides the preset.
    n_cell_samples : int, optional
        Monte Carlo samples for the cell shares; overrides the preset.
    heldout_lengths : sequence of int, optional
        Prompt lengths of the fresh sample of the validity check; overrides the preset.
    n_heldout_per_length : int, optional
        Fresh hidden states per held-out length; overrides the preset.
    n_calibration_per_length : int, optional
        Calibration hidden states per fit length (conformal); overrides the preset. Too few for
        the level (``n >= 1/alpha - 1`` in all) and the conformal shapes are skipped, with the
        reason in ``supports.<name>.calibration_error``.
    cram_summary : None, "auto", str or Path, default None
        A cramming measurement for C_emp: a ``cram_summary.json`` (or its folder) of this model;
        ``"auto"``: the best one under ``benchmarks/results/`` or ``runs/`` of the working
        directory (a horizons run over per-length runs, random tokens over words, then more m
        and more targets, the newer file on ties: :func:`embgeom.report._cram.find_cram_summary`); None: only a published C_emp (:data:`embgeom.bounds.PUBLISHED`) is used.
    seed : int, default 0
        Seed of every random draw, an int >= 0: the fit sample uses ``seed``, the fresh sample
        ``seed + 1``, the calibration sample ``seed + 2``.
    cache_dir : None, "auto", str or Path, default "auto"
        Where the sampled hidden states are cached (see
        :func:`embgeom.adapters.sample_hidden_states`): ``"auto"``, the user's cache folder
        (:func:`embgeom.adapters.default_cache_dir`: ``$EMBGEOM_CACHE``, else
        ``$XDG_CACHE_HOME/embgeom``, else ``~/.cache/embgeom``), so that a second report on the
        same model and sizes skips the sampling; a folder; ``None``: no cache.
    progress : bool, default True
        Show tqdm progress bars.
    executor : {"local", "ray"} or embgeom.parallel.Executor, default "local"
        Where the cell-volume chunks, the rare-event token chunks and the unargmaxable scan run
        (:mod:`embgeom.parallel`); the same numbers on every executor.
    on_load : callable, optional
        ``on_load(loaded)``, called with the loaded model right after it loads and before
        anything is written: raise there to refuse arguments the model cannot take (the CLI
        checks token ids against the vocabulary and lengths against the context length).
    vocabulary : None, "auto", str, Path or a list of them, default "auto"
        ``.npz`` files of every token's cell share
        (:func:`embgeom.volumes.vocabulary_cell_volumes`, ``benchmarks/all_cells.py``); the
        first complete one made for this model's unembedding and the cells' support adds lambda
        from all tokens, the smallest and largest cells and a histogram over every token to the
        cells section. ``"auto"``: the files under ``benchmarks/results/all_cells/`` of the
        working directory; None: none.

    Returns
    -------
    dict
        The report (the content of ``report.json``, with the ``answer`` first among the
        results) plus ``summary_lines``, the answer for the terminal. ``report.json`` is strict
        JSON (:mod:`embgeom._json`: a number that is not finite is written as ``null``).

    Raises
    ------
    ValueError
        Unknown model name (the message lists the known ones), non-positive sizes, ``out_dir``
        pointing at a file, a ``cache_dir`` that is empty or a file (or, with
        ``"auto"``, an ``$EMBGEOM_CACHE`` that is a file: the message names
        ``EMBGEOM_CACHE``), a cram summary of another model; all before the model loads.
    FileNotFoundError
        ``cram_summary`` names a file that does not exist.
    ModuleNotFoundError
        The model's offline package is missing (the message gives the pip command).
    """
    if isinstance(out_dir, str) and not out_dir.strip():
        raise ValueError("out_dir: expected a folder path, got an empty string (it would be "
                         "the current folder)")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir: {str(out)!r} exists and is not a folder")
    from ..adapters._sample import _cache_folder

    _cache_folder(cache_dir)  # '' or a file (cache_dir or $EMBGEOM_CACHE): refused before work
    size = _report_sizes(quick, lengths, n_per_length, n_cell_samples, heldout_lengths,
                         n_heldout_per_length, n_calibration_per_length)
    seed = check_positive_int(seed, "seed", minimum=0)
    if cram_summary not in (None, "auto"):  # a bad path fails before the model loads
        read_cram_summary(cram_summary)
    vocabulary = _vocabulary_files(vocabulary)
    timings: dict[str, float] = {}
    t_start = time.perf_counter()
    with _timed(timings, "load_model"):
        loaded, u, model_facts = _load_phase(model, progress)
    if on_load is not None:
        on_load(loaded)
    out.mkdir(parents=True, exist_ok=True)
    with _timed(timings, "hidden_states"):
        samples = _sample_phase(loaded, size, seed, cache_dir, progress)
    from ..supports import support_from_final_norm

    shell = support_from_final_norm(u) if u.norm.kind is not None else None
    geo = _hidden_phase(samples, size, seed, out, shell)
    with _timed(timings, "supports"):
        sup_section, fitted = _supports_phase(samples, u, geo, size, seed, out, shell)
    with _timed(timings, "cells"):
        from ..parallel import executor_scope

        with executor_scope(executor) as ex:  # one connection for both workloads
            cells_section, cv = _cells_phase(loaded, u, fitted, size, seed, out, progress,
                                             executor=ex, vocabulary=vocabulary)
    with _timed(timings, "bounds"):
        cram = _cram_phase(cram_summary, loaded.name)
        bounds_section = _bounds_phase(loaded, u, model_facts, fitted, geo, sup_section,
                                       cells_section, cv, cram, out)
    answer = build_answer(model_facts, sup_section, cells_section, bounds_section,
                          heldout_desc=_heldout_desc(size, seed))
    timings["total"] = round(time.perf_counter() - t_start, 2)
    report = {
        "embgeom_version": _version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "platform": platform.platform(),
        "settings": {"quick": bool(quick), "seed": int(seed),
                     "cram_summary": None if cram_summary is None else str(cram_summary),
                     **{k: (list(v) if isinstance(v, tuple) else v) for k, v in size.items()}},
        "answer": answer,
        "model": model_facts,
        "hidden_states": geo,
        "supports": sup_section,
        "cells": cells_section,
        "bounds": bounds_section,
        "figures": _figure_list(geo, sup_section, cells_section, bounds_section),
        "timings_s": timings,
    }
    _write(report, out)
    report["summary_lines"] = _summary_lines(report, out)
    return report


# --------------------------------------------------------------------------------------------
# The phases of build_report
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _timed(timings: dict, name: str):
    """Record the wall time of the block in ``timings[name]`` (seconds, 2 decimals), and log the
    phase's start and end at INFO (the sign of life when no progress bar is drawn). A phase
    that raises is not called done: its error is what the user reads next."""
    _log.info("%s ...", name)
    t0 = time.perf_counter()
    try:
        yield
    except BaseException:
        timings[name] = round(time.perf_counter() - t0, 2)
        _log.debug("%s failed after %.0f s", name, timings[name])
        raise
    timings[name] = round(time.perf_counter() - t0, 2)
    _log.info("%s done in %.0f s", name, timings[name])


def _report_sizes(quick: bool, lengths, n_per_length, n_cell_samples, heldout_lengths=None,
                  n_heldout_per_length=None, n_calibration_per_length=None) -> dict:
    """The size preset (:data:`REPORT_SIZES`) with the caller's overrides, validated."""
    size = dict(REPORT_SIZES["quick" if quick else "default"])
    for key, val in (("lengths", lengths), ("heldout_lengths", heldout_lengths)):
        if val is not None:
            val = [check_positive_int(ell, key) for ell in val]
            if not val:
                raise ValueError(f"{key}: expected at least one prompt length")
            size[key] = tuple(val)
    if n_per_length is not None:
        size["n_per_length"] = check_positive_int(n_per_length, "n_per_length", minimum=2)
    if n_cell_samples is not None:
        size["cell_samples"] = check_positive_int(n_cell_samples, "n_cell_samples")
    if n_heldout_per_length is not None:
        size["heldout_per_length"] = check_positive_int(n_heldout_per_length,
                                                        "n_heldout_per_length", minimum=1)
    if n_calibration_per_length is not None:
        size["calibration_per_length"] = check_positive_int(
            n_calibration_per_length, "n_calibration_per_length", minimum=0)
    check_probability(size["alpha"], "alpha", open_right=True)  # as calibrate_support
    return size


def _load_phase(model, progress: bool):
    """1. model -> unembedding: ``(loaded, unembedding, model facts)``."""
    from .. import adapters

    loaded = (model if isinstance(model, adapters.LoadedModel)
              else adapters.load_model(model, progress=progress))
    u = adapters.unembedding(loaded)
    model_facts = u.to_dict()
    model_facts["name"] = loaded.name
    model_facts["source"] = str(loaded.source)
    return loaded, u, model_facts


def _sample(loaded, lengths, n_per_length: int, seed: int, cache_dir, progress: bool,
            sources: dict, which: str):
    """:func:`embgeom.adapters.sample_hidden_states`, its provenance (cache hit, written,
    rebuilt, off) recorded in ``sources[which]`` for the report's ``hidden_states.sources``."""
    from ..adapters._sample import _sample_with_provenance

    H, row_lengths, prov = _sample_with_provenance(loaded, lengths, n_per_length, 32, seed,
                                                   cache_dir, progress)
    sources[which] = {"lengths": [int(x) for x in lengths], "n_per_length": int(n_per_length),
                      "seed": int(seed), **prov}
    return H, row_lengths


def _sample_phase(loaded, size: dict, seed: int, cache_dir, progress: bool) -> dict:
    """2. hidden states: the fit sample, the fresh sample (other lengths, ``seed + 1``) and the
    calibration sample (the fit lengths, ``seed + 2``)."""
    sources: dict = {}
    H, row_lengths = _sample(loaded, size["lengths"], size["n_per_length"], seed, cache_dir,
                             progress, sources, "fit")
    H_fresh, _ = _sample(loaded, size["heldout_lengths"], size["heldout_per_length"], seed + 1,
                         cache_dir, progress, sources, "heldout")
    H_cal = None
    if size["calibration_per_length"] > 0:
        H_cal, _ = _sample(loaded, size["lengths"], size["calibration_per_length"], seed + 2,
                           cache_dir, progress, sources, "calibration")
    return {"H": H, "lengths": row_lengths, "fresh": H_fresh, "calibration": H_cal,
            "sources": sources}


def _hidden_phase(samples: dict, size: dict, seed: int, out: Path, shell) -> dict:
    """3. hidden states -> their summary and the norms figure (with the certified radius)."""
    geo = hidden_state_summary(samples["H"], samples["lengths"],
                               max_cos_points=size["max_cos_points"], seed=seed)
    geo["lengths"] = [int(x) for x in size["lengths"]]
    geo["n_per_length"] = int(size["n_per_length"])
    geo["certified_radius"] = None if shell is None else certified_radius(shell)
    # where each sample came from (the cache, or computed and cached, rebuilt, uncached)
    geo["sources"] = samples.get("sources", {})
    H_fresh = samples["fresh"]
    geo["heldout_rinf_max"] = float(np.abs(H_fresh).max())
    geo["heldout_r2_max"] = float(np.linalg.norm(H_fresh, axis=1).max())
    fig = figures.plot_hidden_norms(geo, out / "hidden_norms.png",
                                    certified_radius=geo["certified_radius"])
    geo["figure"] = None if fig is None else Path(fig).name
    geo["markdown"] = hidden_markdown(geo, size["max_cos_points"])
    return geo


def _heldout_desc(size: dict, seed: int) -> str:
    return (f" (prompt lengths {', '.join(map(str, size['heldout_lengths']))}; seed {seed + 1})")


def _supports_phase(samples: dict, u, geo: dict, size: dict, seed: int, out: Path, shell):
    """4. supports: fits, conformal versions, the cube, each checked on the fresh sample."""
    section, fitted = supports_report_section(
        samples["H"], out, shapes=size["shapes"], unembedding=u if shell is not None else None,
        heldout=samples["fresh"], heldout_min=size["heldout_min"], confidence=size["confidence"],
        calibration=samples["calibration"], alpha=size["alpha"], rinf=geo["rinf_max"],
        return_supports=True)
    section["heldout"].update(lengths=list(size["heldout_lengths"]), seed_offset=1)
    if section["calibration"] is not None:
        section["calibration"].update(lengths=list(size["lengths"]), seed_offset=2)
    section["markdown"] = supports_markdown(section, samples["H"].shape,
                                            heldout_desc=_heldout_desc(size, seed))
    return section, fitted


#: Folder (relative to the working directory) searched by ``vocabulary="auto"``.
VOCABULARY_SEARCH_DIR = "benchmarks/results/all_cells"


def _vocabulary_files(vocabulary) -> list | None:
    """The whole-vocabulary files to try: ``"auto"`` globs :data:`VOCABULARY_SEARCH_DIR`."""
    if vocabulary is None:
        return None
    if isinstance(vocabulary, str) and vocabulary == "auto":
        return sorted(Path(VOCABULARY_SEARCH_DIR).glob("*.npz")) or None
    paths = [vocabulary] if isinstance(vocabulary, (str, os.PathLike)) else list(vocabulary)
    for p in paths:  # a file named by the caller must exist (a typo fails before the model loads)
        if not Path(p).expanduser().is_file():
            raise FileNotFoundError(f"vocabulary: no such file {p} (a .npz of "
                                    "vocabulary_cell_volumes, benchmarks/all_cells.py)")
    return [Path(p).expanduser() for p in paths]


def _cells_phase(loaded, u, fitted: dict, size: dict, seed: int, out: Path, progress: bool,
                 executor="local", vocabulary=None):
    """5. decoder cells: ``(section, CellVolumes)``.

    With no bias every cell is a cone, so its share of an origin-centred ball is its
    solid-angle fraction (the estimator then samples directions only).
    """
    from ..cells import Decoder

    decoder = Decoder.from_unembedding(u)
    name = "ball_origin" if "ball_origin" in fitted else "ball"
    section, cv = cells_report_section(
        decoder, fitted[name], size["cell_samples"], seed, out, tokenizer=loaded.tokenizer,
        unargmaxable=size["unargmaxable"], progress=progress, return_volumes=True,
        tokens=size["cell_tokens"], executor=executor, vocabulary=vocabulary)
    section["support"] = name
    section["markdown"] = cells_markdown(section, name)
    return section, cv


def _cram_phase(cram_summary, model_name: str):
    if cram_summary is None:
        return None
    if cram_summary == "auto":
        return find_cram_summary(model_name)
    return read_cram_summary(cram_summary, model_name)


def _bounds_phase(loaded, u, model_facts, fitted, geo, sup_section, cells_section, cv, cram, out):
    """6. packing bounds from the valid supports and the cell shares."""
    from ..bounds import PUBLISHED
    from ._answer import _rejection

    published = PUBLISHED.get(loaded.name, {})
    valid = {k for k, e in sup_section.items()
             if isinstance(e, dict) and e.get("heldout_valid") is True}
    reasons = {k: _rejection(k, e).split(": ", 1)[1] for k, e in sup_section.items()
               if isinstance(e, dict) and "kind" in e and e.get("heldout_valid") is False}
    return bounds_report_section(
        model_facts, fitted, rinf=geo["rinf_max"], fractions=cv,
        published_c_emp=published.get("c_emp"), out_dir=out, dtype=u.dtype,
        valid=valid, c_emp=cram,
        unresolved_share=cells_section["unresolved_share"], reasons=reasons)


def _figure_list(geo, sup, cells, bounds) -> dict:
    figs = {"hidden_norms": geo.get("figure"), "supports_log_volume": sup["figures"]["log_volume"],
            "cell_volumes": cells["figure"], "cell_histogram": cells.get("histogram"),
            # every token's histogram, when a complete whole-vocabulary file matched
            "cell_histogram_all": ((cells.get("vocabulary") or {}).get("histogram")
                                   if (cells.get("vocabulary") or {}).get("complete") else None)}
    figs.update(bounds.get("figures", {}))
    return {k: v for k, v in figs.items() if v}


def _version() -> str:
    from .. import __version__

    return __version__


def _write(report: dict, out: Path) -> None:
    """7. ``report.json`` (strict JSON) and ``report.md``."""
    _json.dump(report, out / "report.json")
    (out / "report.md").write_text(report_markdown(report))


def _summary_lines(rep: dict, out: Path) -> list[str]:
    m = rep["model"]
    lines = [f"embgeom report: {m['name']} (d = {m['hidden_size']}, |V| = {m['vocab_size']:,})"]
    lines += ["  " + ln.replace("**", "") for ln in rep["answer"]["lines"]]
    lines.append(f"  figures: {', '.join(rep['figures'].values())}")
    lines.append(f"  written: {out / 'report.json'}, {out / 'report.md'} "
                 f"({rep['timings_s']['total']} s)")
    return lines


def report_markdown(rep: dict) -> str:
    """report.md: the answer block first, then the model, each section, the timings."""
    from ._answer import answer_markdown

    m = rep["model"]
    parts = [f"# embgeom report: {m['name']}", "",
             f"embgeom {rep['embgeom_version']}, {rep['created']}, seed {rep['settings']['seed']}"
             f"{', quick' if rep['settings']['quick'] else ''}.", "",
             answer_markdown(rep["answer"]), "",
             "Figures: " + ", ".join(f"`{f}`" for f in rep["figures"].values()) + ".", "",
             "## Model", ""]
    fn = m["final_norm"]
    parts.append(md_table(["fact", "value"], [
        ["source", m["source"]], ["weights", m["source_dtype"]], ["compute dtype", m["dtype"]],
        ["hidden size d", m["hidden_size"]], ["vocabulary size |V| (tokenizer)", m["vocab_size"]],
        ["unembedding rows", m["n_rows"]], ["padded rows", m["padded_rows"]],
        ["tied embedding", m["tied"]], ["unembedding bias", m["has_bias"]],
        ["final norm", f"{fn['kind']} ({fn.get('module')}, eps {fmt(fn['eps'])}, gain offset "
                       f"{fmt(fn.get('gain_offset'))}, max |gain| {fmt(fn.get('gain_abs_max'))}, "
                       f"bias {fn.get('has_bias')})"],
        ["logit soft-cap", m.get("logit_softcap")],
    ]))
    parts.append("")
    for key in ("hidden_states", "supports", "cells", "bounds"):
        md = rep[key].get("markdown")
        if md:
            parts += [md, ""]
    parts += ["## Timings (s)", "",
              md_table(["step", "seconds"], [[k, v] for k, v in rep["timings_s"].items()]), ""]
    return "\n".join(parts)
