"""Cramming: optimise soft prompts (memory vectors) so a frozen causal LM emits a target sequence.

This is the empirical check of the paper's bounds. Freeze a causal language model, prepend
``m`` trainable input vectors (memory vectors, a soft prompt) to the input embeddings of a target
sequence, and optimise them with Adam until, teacher-forced, every next-token argmax of the
target is right (100% token accuracy). The *accessibility* at length ``n`` is the fraction of
random targets of that length that reach 100%; ``n50(m)`` is the length where accessibility crosses
50%, and the slope ``C_emp`` of ``n50 = C_emp m`` (tokens per vector) is compared with the
theoretical slope ``C_theory`` of :mod:`embgeom.bounds` (a valid bound needs
``C_theory / C_emp >= 1``).

Protocol from Y. Kuratov et al., "Cramming 1568 Tokens into a Single Vector and Back Again",
ACL 2025 (arXiv 2502.13063), as used in M. Meyer et al., "How Many Different Outputs Can a
Transformer Generate?", ICML 2026 (arXiv 2605.22223), Sec. 5 (empirical slopes, Cor. 4.6).

Public API
----------
- :func:`cram`: optimise B independent sets of memory vectors in one batch.
- :func:`greedy_generate`, :func:`teacher_forced_accuracy`: the two success checks.
- :func:`sample_targets`: seeded targets (random tokens, random words, or given texts).
- :func:`horizons`: each target's horizon (longest crammable prefix) by progressive cramming,
  one run per target; :class:`HorizonCurve` gives ``P(h >= n)`` and n50 (median horizon).
- :class:`CramProtocol`, :data:`PROTOCOLS`: the named optimisers (presets with sources).
- :func:`accessibility_curve`: accessibility vs length, with Wilson intervals, adaptive mode,
  results appended to a JSONL file and reused on a rerun.
- :func:`mixed_curves`: the curves of several m at once, rows of every (m, n) crammed in a few
  mixed batches (the GPU layout of ``embgeom cram --protocol paper``), same records.
- :func:`n50`: logistic fit of accessibility vs length, with a bootstrap interval.
- :func:`fit_slope`: ``C_emp`` with intervals and R^2, ratio against ``C_theory``.
- :func:`theory_slope`: ``C_theory`` from :mod:`embgeom.bounds`.
- :func:`plot_accessibility`, :func:`plot_n50`: PNG figures.
- :func:`run_horizons`: the horizons job (``embgeom cram --horizons``), same summary format;
  :func:`budget_converged`: the budget-sweep rule (n50 changes by < 10%);
  :func:`summarise_horizons`: the same summary from a run folder's finished records (a run
  in progress, read without a model).
- :func:`run_cram`: the whole ``embgeom cram`` job (JSONL + JSON summary + PNGs).
- :class:`ResumeRecordWarning`: a line of a resume JSONL file that was not trusted (re-run).

Layout
------
- ``analysis``: :class:`AccessibilityCurve`, :func:`n50`, :func:`fit_slope`,
  :func:`theory_slope` (numpy/scipy only: importable without torch);
- ``_optimise``: :class:`CramResult`, :func:`cram` (Adam in named phases);
- ``_checks``: :func:`greedy_generate`, :func:`teacher_forced_accuracy`;
- ``_targets``: :func:`sample_targets`, the token pools;
- ``_curve``: :func:`accessibility_curve` (resume from JSONL, batching, adaptive search);
- ``_run``: :func:`run_cram`; ``plots``: the figures.

Every public name is importable as ``embgeom.cramming.<name>``; the torch-using modules are
imported on first use, so ``import embgeom.cramming.analysis`` does not import torch.
"""

from __future__ import annotations

import importlib as _importlib

__all__ = [
    "CramResult",
    "AccessibilityCurve",
    "cram",
    "greedy_generate",
    "teacher_forced_accuracy",
    "sample_targets",
    "accessibility_curve",
    "mixed_curves",
    "n50",
    "fit_slope",
    "theory_slope",
    "plot_accessibility",
    "plot_n50",
    "run_cram",
    "HorizonCurve",
    "horizons",
    "CramProtocol",
    "PROTOCOLS",
    "DEFAULT_PROTOCOL",
    "run_horizons",
    "budget_converged",
    "summarise_horizons",
    "ResumeRecordWarning",
]

#: Where each public name lives (the module is imported on first access).
_HOME = {
    "AccessibilityCurve": "analysis",
    "n50": "analysis",
    "fit_slope": "analysis",
    "theory_slope": "analysis",
    "CramResult": "_optimise",
    "cram": "_optimise",
    "greedy_generate": "_checks",
    "teacher_forced_accuracy": "_checks",
    "sample_targets": "_targets",
    "WORD_BOUNDARY_MARKERS": "_targets",
    "accessibility_curve": "_curve",
    "mixed_curves": "_curve",
    "plot_accessibility": "plots",
    "plot_n50": "plots",
    "run_cram": "_run",
    "HorizonCurve": "analysis",
    "horizons": "_horizons",
    "CramProtocol": "_protocols",
    "PROTOCOLS": "_protocols",
    "DEFAULT_PROTOCOL": "_protocols",
    "run_horizons": "_horizon_run",
    "budget_converged": "_horizon_run",
    "summarise_horizons": "_horizon_run",
    "ResumeRecordWarning": "_curve",
}


_SUBMODULES = ("analysis", "plots", "_optimise", "_checks", "_targets", "_curve", "_run",
               "_horizons", "_protocols", "_horizon_run")


def __getattr__(name):
    if name in _SUBMODULES:
        return _importlib.import_module(f".{name}", __name__)
    if name in _HOME:
        value = getattr(_importlib.import_module(f".{_HOME[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'embgeom.cramming' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_HOME))
