"""Benchmark of embgeom.cramming.

Each figure is measured in this one run (timings on shared 2-core machines are noisy; the
ratio is what to read, both sides measured back to back):

1. Tiny random Llama (d = 32, 2 layers, |V| = 128, initializer_range 0.3, as in the tests):
   sweep m = 1..4, n50 per m, C_emp with R^2, and the ratio C_theory / C_emp with C_theory from
   embgeom.bounds on a ball fitted to the model's sampled hidden states (eps = r_inf 2^-11).
2. SmolLM2-135M, the attention sink: distinct argmax tokens over 512 random inputs at position
   0, and after the start token (why ``cram`` puts BOS before the memory vectors).
3. SmolLM2-135M: optimisation steps x targets per second, batched (B = 8) vs one target at a
   time, n = 32, m = 1 (goal >= 4x), next to the roofline: the FLOPs of one step
   (FlopCounterMode) at this CPU's float32 GEMM peak bound any batching's speedup.
4. SmolLM2-135M, m = 1: accessibility at n in {8, 16, 32, 64}, 8 targets each, with its wall
   time. The step budget is capped (``--steps``); results go to a JSONL file so an interrupted
   run resumes where it stopped.

Measured here (2 cores; 2026-11-29):

- tiny: n50 = 3.70, 5.27, 7.51, 10.28 for m = 1..4; C_emp = 2.60 [2.21, 2.98] tokens/vector,
  R^2 through the origin 0.994 (centred 0.947), affine R^2 0.985; C_theory 51.3, ratio 19.8
  (6 s).
- sink: 3 distinct argmax tokens for 512 random vectors at position 0, 1 for 512 random
  vocabulary tokens, 25 for the same vectors after BOS.
- throughput (quiet machine): batched 5.23 vs single 2.77 steps x targets/s, speedup 1.89x.
  One target-step is 17.6 GFLOP; the GEMM peak is 192 GFLOP/s; batched runs at 48% of it,
  single at 25%. No batching can beat 3.93x here, so the >= 4x goal is out of reach of this
  CPU by FLOP count alone. It is a GPU goal: one target leaves a GPU idle.
- accessibility, ``--steps 1000 --lr 1e-2``, with another job on the machine part of the time:
  n = 8: 7/8 (both verdicts; 153-313 steps; 357 s); n = 16: 3/8 (498-594 steps; 1052 s);
  n = 32: 0/8 (best token accuracy 0.34-0.53; 1451 s); n = 64: 0/8 (best
  0.06-0.19; 2502 s); whole run 5361 s.
  n50(1) = 14.3 [9.7, 17.6] tokens for this step budget (the paper allows up to 5000 steps).

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_cramming.py \
        [--steps 1000] [--lengths 8 16 32 64] [--n-targets 8] [--throughput-steps 3] \
        [--skip-tiny] [--skip-sink] [--skip-throughput] [--skip-accessibility] [--out runs/bench_cramming]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from embgeom import _hf, cramming  # noqa: E402
from embgeom.cramming._optimise import _embedding_stats  # noqa: E402


def tiny_slope(steps: int = 100, lr: float = 0.05) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    from embgeom.adapters import sample_hidden_states
    from embgeom.bounds import precision_eps
    from embgeom.supports import fit_support

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
            initializer_range=0.3, tie_word_embeddings=False, attn_implementation="eager",
        )
        model = LlamaForCausalLM(cfg).eval()
        t0 = time.perf_counter()
        n50s, curves = {}, {}
        for m in (1, 2, 3, 4):
            curves[m] = cramming.accessibility_curve(
                model, m, [2, 4, 8, 16], 8, adaptive=True, max_length=64, steps=steps, lr=lr,
                progress=False,
            )
            n50s[m] = cramming.n50(curves[m], n_boot=200)
        H, _ = sample_hidden_states(model, [4, 16], 64, batch_size=64, seed=0, progress=False)
        support = fit_support(H.astype(np.float64), "ball", center="origin")
        eps = precision_eps(float(np.abs(H).max()), 11)
        c_theory = cramming.theory_slope(support, eps, 128)
        fit = cramming.fit_slope(n50s, c_theory=c_theory)
        wall = time.perf_counter() - t0
    finally:
        torch.set_num_threads(old)
    return {
        "n50": {m: round(v["n50"], 2) for m, v in n50s.items()},
        "n50_interval": {m: (round(v["lower"], 2), round(v["upper"], 2)) for m, v in n50s.items()},
        "c_emp": fit["c_emp"], "c_emp_interval": (fit["c_emp_lower"], fit["c_emp_upper"]),
        "r2_through_origin_uncentred": fit["r2_uncentred"], "r2_through_origin_centred": fit["r2"],
        "affine": fit["affine"], "c_theory": c_theory, "ratio": fit["ratio"], "wall_s": wall,
    }


def attention_sink(lm, n: int = 512, seed: int = 0) -> dict:
    """How much the first position's output depends on its input: distinct argmax tokens over
    ``n`` random inputs at position 0 (memory vectors at the embedding scale, or vocabulary
    tokens), and over the same vectors placed after the start token (BOS) at position 1."""
    hf = lm.model
    emb = hf.get_input_embeddings()
    start = _hf.resolve_start_token(hf, lm.tokenizer, "auto", emb.weight.shape[0])
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        rows = _hf.vocab_rows(hf)
        mu, sd = _embedding_stats(emb, rows)  # cram's own initialisation statistics
        P = mu + sd * torch.randn(n, 1, mu.shape[0], generator=g)
        ids = torch.randint(0, rows, (n, 1), generator=g)
        distinct = lambda logits: len(set(logits[:, -1].argmax(-1).tolist()))  # noqa: E731
        out = {
            "n": n, "start_token": start,
            "vectors_at_position_0": distinct(hf(inputs_embeds=P, use_cache=False).logits),
            "tokens_at_position_0": distinct(hf(input_ids=ids, use_cache=False).logits),
        }
        if start is not None:
            x = torch.cat([emb(torch.full((n, 1), start)), P], 1)
            out["vectors_after_start_token"] = distinct(hf(inputs_embeds=x, use_cache=False).logits)
    return out


def gemm_peak_gflops(size: int = 2048, reps: int = 5) -> float:
    """float32 GFLOP/s of one large torch.mm (size^3), best of ``reps``: this CPU's roofline."""
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best / 1e9


def step_flops(lm, T) -> float:
    """FLOPs of one cram step (forward + backward to the memory vectors) on targets T.

    Counted by torch.utils.flop_counter.FlopCounterMode as the difference between a 2-step and a
    1-step cram (each ends with one extra forward for the final check), i.e. one full step.
    """
    from torch.utils.flop_counter import FlopCounterMode

    counts = []
    for k in (1, 2):
        with FlopCounterMode(display=False) as fc:
            cramming.cram(lm, T, 1, steps=k, lr=1e-2, check_generation=False)
        counts.append(fc.get_total_flops())
    return float(counts[1] - counts[0])


def throughput(lm, n: int = 32, B: int = 8, steps: int = 3, n_single: int = 2) -> dict:
    """steps x targets per second, batched (B targets) vs one at a time (n_single targets),
    and the roofline: how close the batched step is to this CPU's float32 GEMM peak, hence the
    largest speedup any batching could reach here."""
    T = cramming.sample_targets(lm, n, B, seed=0)
    kw = dict(steps=steps, lr=1e-2, check_generation=False)
    cramming.cram(lm, T[:1], 1, steps=1, lr=1e-2, check_generation=False)  # warm-up
    t0 = time.perf_counter()
    rb = cramming.cram(lm, T, 1, seed=list(range(B)), **kw)
    t_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(n_single):
        cramming.cram(lm, T[i : i + 1], 1, seed=[i], **kw)
    t_single = time.perf_counter() - t0
    assert not rb.success.any(), "a 32-token target crammed in 3 steps: the timing is not of full steps"
    batched = steps * B / t_batched
    single = steps * n_single / t_single
    flops_target = step_flops(lm, T) / B  # FLOPs of one step of one target
    peak = gemm_peak_gflops() * 1e9
    return {
        "n": n, "B": B, "steps": steps, "threads": torch.get_num_threads(),
        "batched_steps_targets_per_s": batched, "single_steps_targets_per_s": single,
        "speedup": batched / single, "t_batched_s": t_batched, "t_single_s": t_single,
        "gflop_per_target_step": flops_target / 1e9,
        "gemm_peak_gflops": peak / 1e9,
        "batched_fraction_of_peak": batched * flops_target / peak,
        "single_fraction_of_peak": single * flops_target / peak,
        # a step cannot run faster than its FLOPs at the GEMM peak: the ceiling of any batching
        "speedup_ceiling": peak / (single * flops_target),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000, help="Adam step cap per target (accessibility)")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--lengths", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--n-targets", type=int, default=8)
    ap.add_argument("--throughput-steps", type=int, default=3)
    ap.add_argument("--skip-tiny", action="store_true")
    ap.add_argument("--skip-sink", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-accessibility", action="store_true")
    ap.add_argument("--out", default="runs/bench_cramming")
    args = ap.parse_args(argv)
    report = {}
    if not args.skip_tiny:
        report["tiny"] = tiny_slope()
        t = report["tiny"]
        print(f"[tiny] n50 {t['n50']}  C_emp {t['c_emp']:.3f} "
              f"[{t['c_emp_interval'][0]:.3f}, {t['c_emp_interval'][1]:.3f}] tokens/vector  "
              f"R2 (origin, uncentred) {t['r2_through_origin_uncentred']:.4f}  "
              f"R2 (origin, centred) {t['r2_through_origin_centred']:.4f}  "
              f"R2 (affine) {t['affine']['r2']:.4f}  C_theory {t['c_theory']:.1f}  "
              f"ratio {t['ratio']:.1f}  ({t['wall_s']:.0f} s)", flush=True)
    if args.skip_sink and args.skip_throughput and args.skip_accessibility:
        print(json.dumps(report, indent=1, default=str))
        return 0
    from embgeom.adapters import load_model

    t0 = time.perf_counter()
    lm = load_model("smollm2-135m")
    report["load_s"] = time.perf_counter() - t0
    print(f"[smollm2] loaded in {report['load_s']:.0f} s ({lm.source_dtype}), "
          f"{torch.get_num_threads()} threads", flush=True)
    r = attention_sink(lm) if not args.skip_sink else None
    report["attention_sink"] = r
    if r is not None:
        print(f"[smollm2 attention sink] distinct argmax tokens over {r['n']} random inputs: "
              f"vectors at position 0 {r['vectors_at_position_0']}, vocabulary tokens at "
              f"position 0 {r['tokens_at_position_0']}, the same vectors after the start token "
              f"{r.get('vectors_after_start_token')} (start token {r['start_token']})", flush=True)
    if not args.skip_throughput:
        r = throughput(lm, steps=args.throughput_steps)
        report["throughput"] = r
        print(f"[smollm2 throughput] n=32 m=1: batched B=8 {r['batched_steps_targets_per_s']:.3f} "
              f"steps*targets/s, one at a time {r['single_steps_targets_per_s']:.3f}; "
              f"speedup {r['speedup']:.2f}x (goal >= 4x)", flush=True)
        print(f"[smollm2 roofline] one target-step = {r['gflop_per_target_step']:.1f} GFLOP "
              f"(FlopCounterMode); float32 GEMM peak {r['gemm_peak_gflops']:.0f} GFLOP/s; batched "
              f"runs at {100 * r['batched_fraction_of_peak']:.0f}% of it, one at a time at "
              f"{100 * r['single_fraction_of_peak']:.0f}%: no batching can beat "
              f"{r['speedup_ceiling']:.2f}x on this machine", flush=True)
    if not args.skip_accessibility:
        os.makedirs(args.out, exist_ok=True)
        t0 = time.perf_counter()
        c = cramming.accessibility_curve(
            lm, 1, args.lengths, args.n_targets, steps=args.steps, lr=args.lr, batch_size=8,
            jsonl=os.path.join(args.out, "smollm2_m1.jsonl"), progress=True,
        )
        wall = time.perf_counter() - t0
        d = c.to_dict()
        d.pop("settings")
        report["accessibility"] = {**d, "steps_cap": args.steps, "wall_s": wall}
        print(f"[smollm2 accessibility] m=1 steps<={args.steps}: " + ", ".join(
            f"n={n}: {k}/{N}" for n, k, N in zip(d["lengths"], d["successes"], d["trials"])
        ) + f"  (wall {wall:.0f} s; a rerun reuses finished targets from the JSONL)", flush=True)
        r = cramming.n50(c)
        report["accessibility"]["n50"] = r
        print(f"[smollm2 accessibility] n50 {r['n50']:.1f} [{r['lower']:.1f}, {r['upper']:.1f}]"
              + (f" censored {r['censored']}" if r["censored"] else ""), flush=True)
    print(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
