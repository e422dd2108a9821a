"""The empirical slope C_emp on a real model, from the JSONL files of resumable cramming runs.

Issue 14: n50 at m = 1, 2, 3 on SmolLM2-135M with one step budget for every m, ``fit_slope``
(C_emp with its interval and R^2) and C/C_emp for every support that holds held-out hidden
states. The cramming itself runs in the background (hours on 2 cores), one ``embgeom cram``
per m writing ``<folder>/cram.jsonl``; this script only reads those files, so it can be rerun
at any time, on partial data, and says what is missing.

What it does, with the library's own functions:

1. reads each folder's ``cram.jsonl`` (``embgeom.cramming._curve._read_jsonl``: a line cut
   short by a running job is skipped), checks every record's settings hash against its settings
   (``_settings_hash``) and that every m ran under the same settings (the same step budget);
2. builds one :class:`embgeom.cramming.AccessibilityCurve` per m from the finished targets
   (a length with fewer than ``--n-targets`` records is used with the trials it has, and
   flagged), and compares it with the plan (``--plan``; default: the background run of issue
   14) to say which m are incomplete;
3. :func:`embgeom.cramming.n50` per m (logistic fit, parametric bootstrap interval, seeded);
   :func:`embgeom.cramming.fit_slope` over the m with a finite n50;
4. C/C_emp for every support of ``--report`` (an ``embgeom report`` ``report.json``) whose
   ``heldout_valid`` is true, from its ``bounds.slope`` (and ``bounds.slope_refined`` where
   ``bounds.lambda_usable``); a ratio below 1 would be a broken bound and is printed as such;
5. prints the table and writes ``--json`` (strict JSON) and ``--png`` (n50 vs m with the fit,
   :func:`embgeom.cramming.plot_n50`). Small files only; no checkpoints.

Usage (from the repository root)::

    .venv/bin/python benchmarks/cram_slope.py benchmarks/results/smollm2_cram/m1 \
        benchmarks/results/smollm2_cram/m2 benchmarks/results/smollm2_cram/m3 [--report reports/smollm2-135m/report.json] \
        [--plan 1:8,12,16,20 2:16,24,32 3:28,36,44] [--n-targets 8] [--n-boot 1000]

A folder that does not exist yet (its m not started) is reported as missing, not an error.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from embgeom import _json  # noqa: E402
from embgeom.cramming import AccessibilityCurve, fit_slope, n50, plot_n50  # noqa: E402
from embgeom.cramming._curve import _read_jsonl, _settings_hash  # noqa: E402

#: The background run of issue 14 (benchmarks/run_smollm2_cram.sh): 1000 Adam steps, lr 1e-2,
#: 8 targets per length, lengths bracketing each n50.
DEFAULT_PLAN = {1: [8, 12, 16, 20], 2: [16, 24, 32], 3: [28, 36, 44]}
DEFAULT_RUNS = [f"benchmarks/results/smollm2_cram/m{m}" for m in (1, 2, 3)]


def _plan(specs) -> dict:
    """``["2:16,24", ...]`` -> ``{2: [16, 24], ...}``."""
    out = {}
    for s in specs:
        m, _, ns = s.partition(":")
        out[int(m)] = sorted(int(n) for n in ns.split(","))
    return out


def read_records(paths) -> tuple[list, list]:
    """Records of every ``cram.jsonl`` under ``paths`` (folders or files), and notes."""
    recs, notes = [], []
    for p in paths:
        p = Path(p)
        f = p / "cram.jsonl" if p.suffix != ".jsonl" else p
        if not f.exists():
            notes.append(f"{f}: not there yet")
            continue
        got = list(_read_jsonl(f).values())
        bad = [r for r in got if _settings_hash(r.get("settings", {})) != r.get("settings_hash")]
        if bad:
            raise ValueError(f"{f}: {len(bad)} record(s) whose settings do not give their hash")
        recs += got
        notes.append(f"{f}: {len(got)} finished targets")
    return recs, notes


def build_curves(recs, plan: dict, n_targets: int):
    """One AccessibilityCurve per m (the settings shared by every m), and per-m status."""
    by_hash = collections.Counter(r["settings_hash"] for r in recs)
    if not by_hash:
        return {}, {}, None
    shash = by_hash.most_common(1)[0][0]
    other = {h: c for h, c in by_hash.items() if h != shash}
    settings = next(r["settings"] for r in recs if r["settings_hash"] == shash)
    groups = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in recs:
        if r["settings_hash"] == shash:
            groups[r["n_mem"]][r["length"]].append(r)
    curves, status = {}, {}
    for m in sorted(set(groups) | set(plan)):
        lens = groups.get(m, {})
        planned = plan.get(m, [])
        partial = {n: len(v) for n, v in lens.items() if len(v) < n_targets}
        missing = [n for n in planned if n not in lens]
        status[m] = {
            "planned_lengths": planned,
            "lengths_done": sorted(n for n in lens if n not in partial),
            "lengths_partial": partial,
            "lengths_missing": missing,
            "complete": not missing and not partial and bool(planned),
            "targets_done": sum(len(v) for v in lens.values()),
            # one batch_wall_s per batch of targets (every record of a batch carries it)
            "wall_s": float(sum(w for _, w in {(r["length"], r["batch_wall_s"])
                                               for v in lens.values() for r in v})),
        }
        if not lens:
            continue
        ls = np.array(sorted(lens), np.int64)
        curves[m] = AccessibilityCurve(
            n_mem=m, lengths=ls,
            successes=np.array([sum(r["success_teacher_forced"] for r in lens[n]) for n in ls]),
            successes_generation=np.array(
                [sum(bool(r["success_generation"]) for r in lens[n]) for n in ls]),
            trials=np.array([len(lens[n]) for n in ls]),
            settings={**settings, "settings_hash": shash})
    return curves, status, {"settings": settings, "settings_hash": shash,
                            "other_hashes": other}


def support_ratios(report_path, fit):
    """C/C_emp for each support valid on held-out hidden states (``report.json``)."""
    if report_path is None or not Path(report_path).exists():
        return None, f"no report.json at {report_path}: C/C_emp skipped (run `embgeom report`)"
    rep = json.loads(Path(report_path).read_text())
    b = rep.get("bounds", {})
    valid = {k for k, v in b.get("heldout_valid", {}).items() if v}
    out = {}
    refined = b.get("slope_refined") if b.get("lambda_usable") else None
    for shape, c in sorted(b.get("slope", {}).items()):
        if shape not in valid or c is None:
            continue
        row = {"c_theory": c}
        if isinstance(refined, dict) and refined.get(shape) is not None:
            row["c_theory_refined"] = refined[shape]
        if fit is not None:
            row["ratio"] = c / fit["c_emp"]
            row["ratio_lower"] = c / fit["c_emp_upper"] if fit["c_emp_upper"] > 0 else math.nan
            row["ratio_upper"] = c / fit["c_emp_lower"] if fit["c_emp_lower"] > 0 else math.inf
            if "c_theory_refined" in row:
                row["ratio_refined"] = row["c_theory_refined"] / fit["c_emp"]
        out[shape] = row
    note = None if out else f"{report_path}: no support is valid on held-out hidden states"
    if out and fit is None:
        note = "C/C_emp needs C_emp (n50 at two or more m)"
    return out, note


def _fmt(x, p=3):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-" if x is None else str(x)
    return f"{x:.{p}g}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", default=DEFAULT_RUNS,
                    help="folders holding cram.jsonl (or .jsonl files)")
    ap.add_argument("--report", default="benchmarks/results/smollm2_report_bounds.json",
                    help="report.json of `embgeom report` (or its trimmed bounds, the default)")
    ap.add_argument("--plan", nargs="*", default=None,
                    help="m:n1,n2,... per m (default: the issue-14 background run)")
    ap.add_argument("--n-targets", type=int, default=8)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    # "*cram_summary*.json" with "model", "n50" and "fit": `embgeom report --cram-summary auto`
    # finds it and puts C_emp (all m together) next to the bounds
    ap.add_argument("--json", default="benchmarks/results/smollm2_cram_summary.json")
    ap.add_argument("--png", default="benchmarks/results/smollm2_cram_slope.png")
    args = ap.parse_args(argv)
    plan = DEFAULT_PLAN if args.plan is None else _plan(args.plan)

    recs, notes = read_records(args.runs)
    curves, status, meta = build_curves(recs, plan, args.n_targets)
    n50s = {m: n50(c, n_boot=args.n_boot, seed=args.seed) for m, c in curves.items()}
    finite = {m: v for m, v in n50s.items() if math.isfinite(v["n50"])}
    fit, fit_note = None, None
    try:
        fit = fit_slope(finite)
    except ValueError as e:
        fit_note = f"no slope yet: {e}"
    ratios, ratio_note = support_ratios(args.report, fit)

    st = meta["settings"] if meta else {}
    print(f"# C_emp from cramming runs: {st.get('model', {}).get('name', '?')}")
    print(f"settings hash {meta and meta['settings_hash']}: at most {st.get('steps')} Adam steps, "
          f"lr {st.get('lr')}, {args.n_targets} targets per length, start token "
          f"{st.get('start_token')}, {st.get('dtype')}, the same for every m"
          + (f"; other hashes ignored: {meta['other_hashes']}" if meta and meta["other_hashes"] else ""))
    for line in notes:
        print("  " + line)
    print()
    print("| m | status | length n: crammed/trials (generation) | n50 [95% bootstrap] | wall (h) |")
    print("|---|---|---|---|---|")
    for m in sorted(status):
        s = status[m]
        c = curves.get(m)
        cells = "—" if c is None else ", ".join(
            f"{n}: {k}/{N} ({kg})" for n, k, N, kg in zip(c.lengths, c.successes, c.trials,
                                                         c.successes_generation))
        if s["complete"]:
            state = "complete"
        else:
            state = "incomplete: missing " + (",".join(map(str, s["lengths_missing"])) or "-")
            if s["lengths_partial"]:
                state += f"; partial {s['lengths_partial']}"
        r = n50s.get(m)
        if r is None:
            n50_txt = "—"
        elif r["censored"]:
            n50_txt = (f"censored {r['censored']} (n50 > {_fmt(r['lengths_max'])})"
                       if r["censored"] == "above" else
                       f"censored below (n50 < {_fmt(r['lengths_min'])})")
        else:
            n50_txt = f"{_fmt(r['n50'])} [{_fmt(r['lower'])}, {_fmt(r['upper'])}]"
            if r["separated"]:
                n50_txt += " (separated)"
        print(f"| {m} | {state} | {cells} | {n50_txt} | {s['wall_s'] / 3600:.2f} |")
    print()
    if fit is not None:
        print(f"C_emp = {_fmt(fit['c_emp'])} tokens per vector [{_fmt(fit['c_emp_lower'])}, "
              f"{_fmt(fit['c_emp_upper'])}], R² through the origin {_fmt(fit['r2_uncentred'])} "
              f"(centred {_fmt(fit['r2'])}), affine R² {_fmt(fit['affine']['r2'])}, "
              f"over m = {fit['m']}")
    else:
        print(fit_note)
    if ratios:
        for shape, row in ratios.items():
            r = row.get("ratio")
            flag = "  BROKEN BOUND (ratio < 1)" if r is not None and r < 1 else ""
            print(f"  {shape}: C = {_fmt(row['c_theory'])}"
                  + (f", C/C_emp = {_fmt(r)} [{_fmt(row['ratio_lower'])}, "
                     f"{_fmt(row['ratio_upper'])}]" if r is not None else "") + flag)
    if ratio_note:
        print(ratio_note)

    png = None
    if finite:
        png = plot_n50(finite, fit, args.png)
    result = {
        "model": st.get("model", {}).get("name"),
        "runs": [str(p) for p in args.runs], "notes": notes, "plan": plan,
        "n_targets": args.n_targets, "n_boot": args.n_boot, "seed": args.seed,
        "settings": st, "settings_hash": meta and meta["settings_hash"],
        "step_budget": st.get("steps"),
        "curves": {m: c.to_dict() | {"settings": None} for m, c in curves.items()},
        "status": status, "n50": n50s, "fit": fit, "fit_note": fit_note,
        "report": args.report, "ratios": ratios, "ratio_note": ratio_note,
        "incomplete_m": [m for m, s in status.items() if not s["complete"]],
        "png": png,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    _json.dump(result, args.json)
    print(f"wrote {args.json}" + (f" and {png}" if png else " (no PNG: no finite n50 yet)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
