"""The report's hidden-states section: norms and pairwise cosines, overall and per length."""

from __future__ import annotations

import numpy as np

from .._validation import check_array, check_positive_int, check_seed
from ._markdown import md_table

__all__ = ["hidden_state_summary", "hidden_markdown"]


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


def hidden_markdown(h: dict, max_cos_points: int) -> str:
    """The hidden-states section of report.md."""
    lines = ["## Hidden states", "",
             f"{h['n']:,} last-position final hidden states (after the final norm) of random "
             f"token sequences, {h['n_per_length']} per length. The pairwise cosines are quadratic "
             f"in the number of rows: each group uses at most {max_cos_points:,} rows (a seeded "
             "subsample when larger)."]
    if h.get("certified_radius") is not None:
        lines[-1] += (f" The final norm certifies L2 <= {h['certified_radius']:.4g} "
                      "(sqrt(d) max|gain|); the sample reaches "
                      f"{h['r2_max']:.4g}.")
    lines.append("")
    rows = [[r["length"], r["n"], r["r2_max"], r["r2_mean"], r["rinf_max"], r["cos_min"],
             r["cos_mean"]] for r in h["per_length"]]
    rows.append(["all", h["n"], h["r2_max"], h["r2_mean"], h["rinf_max"], h["cos_min"],
                 h["cos_mean"]])
    lines.append(md_table(["length", "n", "max L2", "mean L2", "max L-inf", "min cos",
                           "mean cos"], rows))
    if h.get("sources"):
        lines += ["", _sources_line(h["sources"])]
    if h.get("figure"):
        lines += ["", f"![norms vs length]({h['figure']})"]
    return "\n".join(lines)


_CACHE_WORDS = {"hit": "from the cache", "written": "computed and cached",
                "rebuilt": "recomputed (its cache file was not trusted) and cached again",
                "not written": "computed (the cache folder could not be written)",
                "off": "computed (no cache)"}


def _sources_line(sources: dict) -> str:
    """Where each sample of hidden states came from, one sentence: the cache file, or computed
    (cached, rebuilt, uncached); ``sources`` is the report's ``hidden_states.sources``."""
    parts = []
    for which, src in sources.items():
        text = f"{which} (seed {src['seed']}): {_CACHE_WORDS.get(src['cache'], src['cache'])}"
        if src.get("why"):
            text += f", {src['why']}"
        if src.get("path"):
            text += f", `{src['path']}`"
        parts.append(text)
    return "Provenance: " + "; ".join(parts) + "."
