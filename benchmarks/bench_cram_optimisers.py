"""The optimiser study of issue 23: n50 (median horizon) against CPU-seconds per target.

SmolLM2-135M, m = 1, the same 16 random-token targets (seed 0, up to 64 tokens), one progressive
run per target (:func:`embgeom.cramming.horizons`) for each preset of
:data:`embgeom.cramming.PROTOCOLS`, all under the same budget: at most ``--steps-per-length``
updates for each new length and ``--max-steps`` updates per target in all. float32, one thread,
BOS before the memory vector.

The runs are long (about an hour of one core per method) and resumable: each method appends one
JSON line per finished target to ``<out>/<method>.jsonl`` when its batch of ``--batch-size``
targets ends, and checkpoints the batch every 25 updates (git-ignored), so an interrupted run
resumes where it stopped (same figures); a fresh clone re-runs only the unfinished batches.
Two processes can run side by side on different methods (``--methods``). ``--summarize`` reads whatever is there and
writes ``<out>/summary.json``, ``summary.md`` and ``optimisers.png`` (n50 with its bootstrap
interval against the median CPU-seconds per target); nothing is re-run.

Usage::

    nohup .venv/bin/python benchmarks/bench_cram_optimisers.py --methods progressive adam \\
        > runs/opt_a.log 2>&1 &
    .venv/bin/python benchmarks/bench_cram_optimisers.py --summarize

CPU-seconds are ``time.process_time`` of the batch steps, each step's time shared equally by the
targets it holds: the machine is shared, and process time is what a method costs, whatever else
runs. The table's figures are in ``docs/cramming.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "cram_optimisers"


def _args(argv=None):
    from embgeom.cramming import PROTOCOLS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--methods", nargs="+", default=list(PROTOCOLS), choices=list(PROTOCOLS))
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--n-mem", type=int, default=1)
    p.add_argument("--n-targets", type=int, default=16)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--steps-per-length", type=int, default=500)
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument("--target-source", default="random-tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=4,
                   help="targets per batch; a batch's records land when it ends (default 4: "
                        "about 20 minutes of one core, so a cut session loses little)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    p.add_argument("--summarize", action="store_true", help="only summarise the records")
    return p.parse_args(argv)


def _run(a) -> None:
    import torch

    from embgeom import adapters
    from embgeom.cramming import horizons

    torch.set_num_threads(a.threads)
    lm = adapters.load_model(a.model)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    for name in a.methods:
        print(f"[{name}] start", flush=True)
        hc = horizons(lm, a.n_mem, n_targets=a.n_targets, max_length=a.max_length,
                      target_source=a.target_source, protocol=name,
                      steps_per_length=a.steps_per_length, max_steps=a.max_steps, seed=a.seed,
                      batch_size=a.batch_size,
                      jsonl=a.out_dir / f"{name}.jsonl", progress=sys.stderr.isatty())
        print(f"[{name}] horizons {hc.horizons.tolist()} n50 {hc.n50()}", flush=True)


def summarize(out_dir: Path) -> dict:
    """The table (JSON + markdown) and the figure from the records in ``out_dir``."""
    from embgeom import _json
    from embgeom.cramming import PROTOCOLS, HorizonCurve

    rows = []
    for name in PROTOCOLS:
        path = out_dir / f"{name}.jsonl"
        if not path.exists():
            continue
        recs = {}
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            recs[(r["settings_hash"], r["target_index"])] = r
        by_hash: dict = {}
        for (h, _), r in recs.items():
            by_hash.setdefault(h, []).append(r)
        for h, rs in by_hash.items():
            s = rs[0]["settings"]
            hc = HorizonCurve.from_records(rs, n_mem=s["n_mem"], max_length=s["max_length"],
                                           settings=s)
            n50 = hc.n50()
            cpu = hc.cpu_seconds()
            reasons: dict = {}
            for r in rs:
                reasons[r["stop_reason"]] = reasons.get(r["stop_reason"], 0) + 1
            rows.append({
                "method": name, "settings_hash": h, "n_finished": len(rs),
                "steps_per_length": s["steps_per_length"], "max_steps": s["max_steps"],
                "batch_size": s.get("batch_size"),
                "n50": n50["n50"], "n50_lower": n50["lower"], "n50_upper": n50["upper"],
                "n50_censored": n50["censored"],
                "mean_horizon": float(hc.horizons.mean()),
                "cpu_s_median": cpu["median"], "cpu_s_mean": cpu["mean"],
                "steps_mean": float(sum(r["steps"] for r in rs) / len(rs)),
                "stop_reasons": reasons, "horizons": hc.horizons.tolist(),
                "generation_ok": sum(bool(r["generation_ok"]) for r in rs),
                "source": PROTOCOLS[name].source,
            })
    summary = {"out_dir": str(out_dir), "rows": rows}
    _json.dump(summary, out_dir / "summary.json")
    lines = ["| method | batch | targets | n50 [95% bootstrap] | mean h | CPU-s / target (median) "
             "| updates / target | stops |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: -r["n50"]):
        stops = ", ".join(f"{k} {v}" for k, v in sorted(r["stop_reasons"].items()))
        lines.append(f"| {r['method']} | {r['batch_size']} | {r['n_finished']} | {r['n50']:.1f} "
                     f"[{r['n50_lower']:.1f}, {r['n50_upper']:.1f}] | {r['mean_horizon']:.1f} | "
                     f"{r['cpu_s_median']:.0f} | {r['steps_mean']:.0f} | {stops} |")
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if rows:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7.4, 4.2))
        ax = fig.add_subplot()
        markers = "osD^vP*Xhp"
        for i, r in enumerate(sorted(rows, key=lambda r: -r["n50"])):
            # a legend, not labels at the points: several methods share (cost, n50) closely
            ax.errorbar([r["cpu_s_median"]], [r["n50"]],
                        yerr=[[r["n50"] - r["n50_lower"]], [r["n50_upper"] - r["n50"]]],
                        fmt=markers[i % len(markers)], capsize=3,
                        label=f"{r['method']}: {r['n50']:.1f} ({r['n_finished']} targets)")
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        ax.set_xlabel("CPU-seconds per target (median, 1 thread)")
        ax.set_ylabel("n50 = median horizon (tokens)")
        ax.set_title("SmolLM2-135M, m = 1, random tokens: optimisers at equal budget")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "optimisers.png", dpi=120)
    return summary


def main(argv=None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    a = _args(argv)
    if a.summarize:
        summarize(a.out_dir)
        return
    _run(a)
    summarize(a.out_dir)


if __name__ == "__main__":
    main()
