"""The copy task's figure: accuracy against length, training range shaded (matplotlib's Figure
API: no backend switch, no pyplot state)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embgeom._stats import wilson_interval
from embgeom._validation import check_positive_int


def plot_copy_accuracy(evaluation: dict, l_train: int, path, *, cliff=None, interval=None) -> Path:
    """Exact-match and per-token accuracy vs length, training range shaded; saved as PNG.

    Parameters
    ----------
    evaluation : dict
        Output of :func:`evaluate_copy`.
    l_train : int
        Largest training length (the shaded range is ``[1, l_train]``).
    path : str or Path
        Output PNG (its folder must exist; ``.png`` is appended to a name without a suffix,
        :func:`embgeom.report.figures._figure_path`).
    cliff : int, optional
        Drawn as a vertical line, with ``interval`` (lo, hi) as a band.

    Returns
    -------
    pathlib.Path
        The path written.

    Raises
    ------
    TypeError, ValueError
        A ``path`` the plot helpers refuse (not a str or path-like; an existing directory; a
        suffix matplotlib cannot write), before anything is drawn; an ``l_train`` that is not
        an integer >= 1; an ``evaluation`` that is not a dict, lacks a key of
        :func:`evaluate_copy`'s dict or has no lengths.
    """
    from matplotlib.figure import Figure

    from ..report.figures import _figure_path, _write

    target = _figure_path(path)
    l_train = check_positive_int(l_train, "l_train")
    if not hasattr(evaluation, "keys"):
        raise TypeError(f"evaluation: expected the dict of evaluate_copy, got {type(evaluation).__name__}")
    missing = [k for k in ("lengths", "exact_match", "exact_match_count", "n_eval", "per_token")
               if k not in evaluation]
    if missing:
        raise ValueError(f"evaluation: missing key(s) {missing} (expected the dict of evaluate_copy)")
    if np.size(evaluation["lengths"]) == 0:
        raise ValueError("evaluation: expected at least one length, got none")
    lengths = np.asarray(evaluation["lengths"])
    em = np.asarray(evaluation["exact_match"])
    lo, hi = wilson_interval(np.asarray(evaluation["exact_match_count"]), evaluation["n_eval"])
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.axvspan(0.5, l_train + 0.5, color="0.9", label=f"training lengths 1..{l_train}")
    ax.fill_between(lengths, lo, hi, color="C0", alpha=0.25, linewidth=0)
    ax.plot(lengths, em, "o-", ms=3, color="C0", label="exact match (95% Wilson)")
    ax.plot(lengths, evaluation["per_token"], "s-", ms=3, color="C1", label="per-token accuracy")
    if cliff is not None:
        ax.axvline(cliff, color="C3", ls="--", label=f"cliff L={cliff}")
        if interval is not None:
            ax.axvspan(interval[0] - 0.5, interval[1] + 0.5, color="C3", alpha=0.1)
    ax.axhline(0.5, color="0.5", lw=0.8, ls=":")
    ax.set_xlabel("sequence length L (symbols to copy)")
    ax.set_ylabel("accuracy (greedy decoding)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlim(0.5, lengths.max() + 0.5)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_title(f"Copy task, n={evaluation['n_eval']} strings per length")
    fig.tight_layout()
    return _write(fig, target, dpi=120)
