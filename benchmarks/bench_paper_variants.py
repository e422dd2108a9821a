"""embgeom beside the paper's public code: every difference measured with embgeom's own variants.

The paper's replication code (github mario-michelessa/transformers_accessibility) estimates
cell volumes, cones, packing bounds and lambda in its own way. This script never runs or copies
that code: it measures each difference with the variant that embgeom labels as the paper's
(``Decoder.assign(method="nearest")``, ``Cone.paper_half_angle_`` / ``paper_log_volume_``,
``log_packing_number(..., variant="paper")``) or with an input transformation stated below, on
the real SmolLM2-135M (and Gemma-3-270m when its optional packages are installed).
docs/paper.md quotes this script's output.

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_paper_variants.py            # ~10 min on 2 busy cores
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_paper_variants.py --quick    # ~5 min
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_paper_variants.py --gemma    # + Gemma norms

What is measured (one section each in the output):

1. Cell assignment. Random token sequences (uniform over the vocabulary, no BOS) go through the
   model; its own greedy next token (argmax of the model's logits) is compared with the argmax
   cell ``Decoder.assign(H)`` and with the nearest-row (Voronoi) cell
   ``Decoder.assign(H, method="nearest")`` of the same final hidden states.
2. The cone. ``Cone().fit(H)``: the smallest cone's half-angle against the paper's estimate
   ``arccos(min_ij cos(h_i, h_j)) / 2``; the share of the sample inside the paper's cone (that
   half-angle, around the best axis embgeom found, radius ``r_inf = max |h|_inf`` as the paper
   takes it); ``log f(alpha)`` (the cap fraction, embgeom's log-space formula) checked by Monte
   Carlo in small d; the float64 value of the cap's upper tail ``1 - betainc(1/2, (d+1)/2,
   cos^2 alpha)`` computed in linear space, as a plain implementation would.
3. Volumes in linear space: the smallest d at which ``pi^(d/2) / gamma(d/2 + 1)`` (the unit-ball
   volume, not in logs) overflows float64, against ``log_unit_ball_volume``.
4. lambda. ``cell_volume_rate`` on Monte Carlo cell fractions of SmolLM2 in the origin ball
   around the sample: zero-hit tokens filled with the rule of three (embgeom) against the same
   fractions with the zero-hit tokens dropped (``f[f > 0]``, renormalised).
5. Packing bounds: ``slope_bound(..., variant="paper")`` against the rigorous default.
6. (``--gemma``) Gemma-3-270m GGUF: max L-inf and L2 norms of the final hidden states against
   the paper's published row (L_inf 9.95, L_2 51).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embgeom import Ball, Cone, Decoder, adapters, bounds, cell_volumes  # noqa: E402
from embgeom._special import log_cap_fraction, log_unit_ball_volume  # noqa: E402

#: the paper's published row for Gemma-3-270m (models_list.csv of its public code)
PUBLISHED_GEMMA = {"L_inf (max)": 9.95, "L_2 (max)": 51.0, "L_1 (max)": 1050.0}


def _ids(rng, vocab: int, length: int, n: int) -> np.ndarray:
    return rng.integers(0, vocab, size=(n, length), dtype=np.int64)


def hidden_and_greedy(lm, u, lengths, n, seed, batch=16):
    """Final hidden states and the model's own greedy token for random sequences."""
    rng = np.random.default_rng(seed)
    H, greedy, row_len = [], [], []
    for length in lengths:
        ids = _ids(rng, u.vocab_size, length, n)
        for s in range(0, n, batch):
            part = ids[s:s + batch]
            H.append(adapters.hidden_states(lm, part))
            greedy.append(adapters.logits(lm, part).argmax(axis=1))
            row_len.append(np.full(part.shape[0], length))
    return np.concatenate(H), np.concatenate(greedy), np.concatenate(row_len)


def section_assign(dec, H, greedy, row_len):
    arg = dec.assign(H)
    near = dec.assign(H, method="nearest")
    out = {"n": int(H.shape[0]),
           "argmax_vs_greedy_disagree": float(np.mean(arg != greedy)),
           "nearest_vs_greedy_disagree": float(np.mean(near != greedy)),
           "per_length": {}}
    for length in np.unique(row_len):
        m = row_len == length
        out["per_length"][int(length)] = {
            "n": int(m.sum()),
            "argmax_vs_greedy_disagree": float(np.mean(arg[m] != greedy[m])),
            "nearest_vs_greedy_disagree": float(np.mean(near[m] != greedy[m])),
        }
    return out


def section_cone(H, seed):
    d = H.shape[1]
    cone = Cone().fit(H)
    rinf = float(np.abs(H).max())
    r2 = float(np.linalg.norm(H, axis=1).max())
    paper = Cone.from_params(cone.axis_, cone.paper_half_angle_, rinf)
    paper_angle_only = Cone.from_params(cone.axis_, cone.paper_half_angle_, r2)
    # Monte Carlo check of embgeom's cap fraction (small d, where the fraction is measurable)
    mc = []
    rng = np.random.default_rng(seed)
    for dd, al in ((3, 0.6), (5, 1.0), (10, 0.9), (20, 1.2)):
        X = Ball.from_params(None, 1.0, dim=dd).sample(400_000, seed=rng)
        axis = np.zeros(dd)
        axis[0] = 1.0
        frac = float(np.mean(X[:, 0] / np.linalg.norm(X, axis=1) >= math.cos(al)))
        mc.append({"d": dd, "half_angle": al, "monte_carlo": frac,
                   "exp_log_cap_fraction": float(np.exp(log_cap_fraction(al, dd)))})
    from scipy import special

    tails = {}
    for dd, al in ((d, cone.paper_half_angle_), (d, cone.half_angle_), (640, cone.paper_half_angle_)):
        with np.errstate(divide="ignore"):
            lin = 1.0 - special.betainc(0.5, 0.5 * (dd + 1), math.cos(al) ** 2)
        tails[f"d={dd}, alpha={al:.4f}"] = {
            "linear_space_tail": float(lin),
            "log_cap_fraction": float(log_cap_fraction(al, dd)),
        }
    return {
        "d": d,
        "half_angle_smallest_cone": cone.half_angle_,
        "half_angle_paper": cone.paper_half_angle_,
        "r2": r2,
        "rinf": rinf,
        "paper_cone_holds_share": float(np.mean(paper.contains(H))),
        "paper_angle_r2_holds_share": float(np.mean(paper_angle_only.contains(H))),
        "smallest_cone_holds_share": float(np.mean(cone.contains(H))),
        "log_volume": cone.log_volume,
        "paper_log_volume": cone.paper_log_volume_,
        "log_cap_fraction_smallest": float(log_cap_fraction(cone.half_angle_, d)),
        "log_cap_fraction_paper": float(log_cap_fraction(cone.paper_half_angle_, d)),
        "cap_fraction_monte_carlo": mc,
        "cap_tail_float64": tails,
        "log4_nats": math.log(4.0),
    }


def section_ball_overflow():
    first = None
    for d in range(2, 2000):
        try:
            v = math.pi ** (d / 2.0) / math.gamma(d / 2.0 + 1.0)
            if not math.isfinite(v) or v == 0.0:
                first = (d, "inf/0")
                break
        except OverflowError:
            first = (d, "OverflowError")
            break
    return {"first_d_linear_overflow": first[0], "how": first[1],
            "log_unit_ball_volume_at_that_d": float(log_unit_ball_volume(first[0])),
            "log_unit_ball_volume_640": float(log_unit_ball_volume(640))}


def section_lambda(dec, H, n_samples, seed):
    ball = Ball("origin").fit(H)
    t0 = time.perf_counter()
    cv = cell_volumes(dec, ball, n_samples, seed=seed, progress=False)
    t_cv = time.perf_counter() - t0
    f = cv.fractions
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        keep = bounds.cell_volume_rate(f, n_samples=n_samples, upper=cv.upper)
        pos = f[f > 0]
        drop = bounds.cell_volume_rate(pos / pos.sum())
    return {
        "n_samples": n_samples, "seconds": t_cv, "n_tokens": int(f.size),
        "n_zero_hit": int((f == 0).sum()),
        "lambda_zero_filled": keep.rate, "lambda_conservative": keep.rate_conservative,
        "lambda_zero_dropped": drop.rate,
        "log_vocab": math.log(f.size), "log_vocab_dropped": math.log(pos.size),
        "zero_fill": keep.zero_fill,
    }


def section_slopes(u, H):
    eps = bounds.precision_eps(float(np.abs(H).max()), 11)
    out = {"eps": eps}
    shapes = {"ball (origin)": Ball("origin").fit(H), "cone": Cone().fit(H)}
    for name, S in shapes.items():
        out[name] = {v: bounds.slope_bound(S, eps, u.vocab_size, variant=v)
                     for v in ("rigorous", "paper")}
    return out


def section_gemma(n, seed):
    try:
        lm = adapters.load_model("gemma-3-270m", progress=False)
    except (ModuleNotFoundError, FileNotFoundError, ValueError) as exc:
        return {"skipped": str(exc)}
    H, _ = adapters.sample_hidden_states(lm, [4, 16, 64], n, seed=seed, progress=False)
    return {"n": int(H.shape[0]), "d": int(H.shape[1]),
            "max_L_inf": float(np.abs(H).max()),
            "max_L2": float(np.linalg.norm(H, axis=1).max()),
            "max_L1": float(np.abs(H).sum(axis=1).max()),
            "published": PUBLISHED_GEMMA}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer hidden states and samples")
    p.add_argument("--gemma", action="store_true", help="also measure Gemma-3-270m's norms")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    p.add_argument("--json", type=Path, default=None, help="write the results to this file")
    a = p.parse_args(argv)
    n = 32 if a.quick else 64
    lengths = [4, 16, 64] if a.quick else [4, 16, 64, 256]
    n_cells = 50_000 if a.quick else 100_000

    res = {"command": " ".join(sys.argv), "seed": a.seed}
    t0 = time.perf_counter()
    lm = adapters.load_model("smollm2-135m", progress=False)
    u = adapters.unembedding(lm)
    dec = Decoder.from_unembedding(u)
    H, greedy, row_len = hidden_and_greedy(lm, u, lengths, n, a.seed)
    res["model"] = {"name": "smollm2-135m", "d": int(H.shape[1]), "vocab": u.vocab_size,
                    "hidden_states": int(H.shape[0]), "lengths": lengths,
                    "seconds_load_and_sample": time.perf_counter() - t0}
    res["assign"] = section_assign(dec, H, greedy, row_len)
    res["cone"] = section_cone(H.astype(np.float64), a.seed)
    res["ball_overflow"] = section_ball_overflow()
    res["slopes"] = section_slopes(u, H)
    res["lambda"] = section_lambda(dec, H, n_cells, a.seed)
    if a.gemma:
        res["gemma"] = section_gemma(n, a.seed)

    A, C, L = res["assign"], res["cone"], res["lambda"]
    print(f"# embgeom vs the paper's variants, SmolLM2-135M (d={res['model']['d']}, "
          f"|V|={res['model']['vocab']}), {A['n']} hidden states, lengths {lengths}, seed {a.seed}")
    print("\n## 1. cell assignment vs the model's own greedy token (share that disagrees)")
    print("| length | n | argmax cell (embgeom) | nearest row (paper) |\n|---|---|---|---|")
    for length, r in A["per_length"].items():
        print(f"| {length} | {r['n']} | {r['argmax_vs_greedy_disagree']:.1%} | "
              f"{r['nearest_vs_greedy_disagree']:.1%} |")
    print(f"| all | {A['n']} | {A['argmax_vs_greedy_disagree']:.1%} | "
          f"{A['nearest_vs_greedy_disagree']:.1%} |")
    print("\n## 2. the cone")
    print(f"half-angle: smallest cone {C['half_angle_smallest_cone']:.4f} rad, paper "
          f"acos(min cos)/2 {C['half_angle_paper']:.4f} rad; r2 {C['r2']:.2f}, r_inf {C['rinf']:.2f}")
    print(f"share of the sample inside: smallest cone {C['smallest_cone_holds_share']:.1%}, "
          f"paper cone (paper angle, radius r_inf) {C['paper_cone_holds_share']:.1%}, "
          f"paper angle with radius r2 {C['paper_angle_r2_holds_share']:.1%}")
    print(f"log cap fraction (nats): smallest {C['log_cap_fraction_smallest']:.2f}, paper angle "
          f"{C['log_cap_fraction_paper']:.2f}; log 4 = {C['log4_nats']:.4f}")
    for r in C["cap_fraction_monte_carlo"]:
        print(f"  cap fraction d={r['d']} alpha={r['half_angle']}: Monte Carlo "
              f"{r['monte_carlo']:.5f}, exp(log_cap_fraction) {r['exp_log_cap_fraction']:.5f}")
    for k, r in C["cap_tail_float64"].items():
        print(f"  cap tail {k}: 1 - betainc in float64 = {r['linear_space_tail']:.3g}; "
              f"log_cap_fraction = {r['log_cap_fraction']:.2f} nats")
    B = res["ball_overflow"]
    print(f"\n## 3. unit-ball volume in linear space first fails at d = {B['first_d_linear_overflow']}"
          f" ({B['how']}); log_unit_ball_volume there = {B['log_unit_ball_volume_at_that_d']:.1f} nats")
    S = res["slopes"]
    print(f"\n## 4. slopes C (tokens per prompt vector), eps = r_inf 2^-11 = {S['eps']:.4g}")
    for name in ("ball (origin)", "cone"):
        print(f"  {name}: rigorous {S[name]['rigorous']:.1f}, variant='paper' {S[name]['paper']:.1f}")
    print(f"\n## 5. lambda from {L['n_samples']} Monte Carlo points in the origin ball "
          f"({L['seconds']:.0f} s)")
    print(f"  zero-hit tokens: {L['n_zero_hit']} of {L['n_tokens']}")
    print(f"  lambda zero-filled (embgeom, {L['zero_fill']}) {L['lambda_zero_filled']:.3f}, "
          f"conservative {L['lambda_conservative']:.3f}; zero-hit dropped {L['lambda_zero_dropped']:.3f}; "
          f"log|V| {L['log_vocab']:.3f} (dropped: log {L['n_tokens'] - L['n_zero_hit']} = "
          f"{L['log_vocab_dropped']:.3f})")
    if "gemma" in res:
        G = res["gemma"]
        if "skipped" in G:
            print(f"\n## 6. Gemma-3-270m: skipped ({G['skipped']})")
        else:
            print(f"\n## 6. Gemma-3-270m GGUF, {G['n']} hidden states: max L_inf {G['max_L_inf']:.1f}, "
                  f"max L2 {G['max_L2']:.1f}, max L1 {G['max_L1']:.0f}; published "
                  f"{G['published']}")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        from embgeom._json import dump

        dump(res, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
