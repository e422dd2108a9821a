"""Tests of embgeom.cramming on a tiny random Llama built here (seeded), plus analytic checks of
the statistics (Wilson interval, logistic n50, slope fit).

The tiny model: d = 32, 2 layers, |V| = 128, initializer_range = 0.3 (THEORY.md: with the default
0.02 a tiny random Llama cannot be crammed past one token; with 0.3 one memory vector crams short
targets and fails on long ones, a usable accessibility transition).
"""

from __future__ import annotations

import json
import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

from embgeom import cramming
from embgeom._hf import check_device
from embgeom.cramming import (
    AccessibilityCurve,
    accessibility_curve,
    cram,
    fit_slope,
    greedy_generate,
    n50,
    run_cram,
    sample_targets,
    teacher_forced_accuracy,
    theory_slope,
)
from embgeom._stats import wilson_interval

VOCAB = 128
D = 32
STEPS = 100
LR = 0.05


@pytest.fixture(scope="module", autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model is overhead-bound: one thread is fastest
    yield
    torch.set_num_threads(old)


def _tiny_llama(seed: int = 0, initializer_range: float = 0.3):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=D, intermediate_size=2 * D, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        initializer_range=initializer_range, tie_word_embeddings=False,
        attn_implementation="eager",
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def tiny():
    return _tiny_llama()


@pytest.fixture(scope="module")
def sweep(tiny, tmp_path_factory):
    """The full m = 1..4 sweep through run_cram (adaptive lengths), written to a folder."""
    out = tmp_path_factory.mktemp("cram")
    summary = run_cram(
        tiny, [1, 2, 3, 4], out, lengths=[2, 4, 8, 16], n_targets=8, steps=STEPS, lr=LR,
        seed=0, adaptive=True, max_length=64, n_boot=100, progress=False,
    )
    return summary, out


# ------------------------------------------------------------------ the sweep and the slope


def test_sweep_n50_grows_with_m_and_is_linear(sweep):
    summary, _ = sweep
    n50s = [summary["n50"][str(m)]["n50"] for m in (1, 2, 3, 4)]
    assert all(np.isfinite(n50s))
    assert all(b > a for a, b in zip(n50s, n50s[1:])), n50s
    fit = summary["fit"]
    assert fit is not None and fit["m"] == [1, 2, 3, 4]
    # the linear law: both the fit through the origin (its usual, uncentred R^2) and the affine
    # fit explain n50 vs m
    assert fit["r2_uncentred"] >= 0.95, fit
    assert fit["affine"]["r2"] >= 0.95, fit
    assert fit["c_emp_lower"] < fit["c_emp"] < fit["c_emp_upper"]
    # each n50 sits between the last length with accessibility >= 0.5 and the first below
    for m in (1, 2, 3, 4):
        c = summary["curves"][str(m)]
        acc = np.array(c["accessibility"])
        x = np.array(c["lengths"])
        lo = x[acc >= 0.5].max()
        hi = x[acc < 0.5].min()
        assert lo - 1 <= summary["n50"][str(m)]["n50"] <= hi + 1


def test_bound_from_hidden_state_support_exceeds_empirical_slope(tiny, sweep):
    from embgeom.adapters import sample_hidden_states
    from embgeom.bounds import precision_eps
    from embgeom.supports import fit_support

    summary, _ = sweep
    H, _ = sample_hidden_states(tiny, lengths=[4, 16], n_per_length=64, batch_size=64, seed=0,
                                progress=False)
    support = fit_support(H.astype(np.float64), "ball", center="origin")
    eps = precision_eps(float(np.abs(H).max()), 11)  # the paper's eps = r_inf 2^-11
    c_theory = theory_slope(support, eps, VOCAB)
    assert np.isfinite(c_theory)
    fit = fit_slope(summary["n50"], c_theory=c_theory)
    assert fit["c_theory"] >= fit["c_emp"], fit
    assert fit["ratio"] == pytest.approx(c_theory / fit["c_emp"])
    assert fit["ratio"] >= 1


def test_run_cram_files_and_resume(tiny, sweep, monkeypatch):
    summary, out = sweep
    lines = [json.loads(x) for x in (out / "cram.jsonl").read_text().splitlines()]
    trials = sum(sum(c["trials"]) for c in summary["curves"].values())
    assert len(lines) == trials
    assert {r["dtype"] for r in lines} == {"float32"}
    assert len({r["settings_hash"] for r in lines}) == 1
    assert summary["dtype"] == "float32"
    for name in ("accessibility.png", "n50_vs_m.png", "cram_summary.json", "cram_summary.md"):
        assert (out / name).stat().st_size > 0
    md = (out / "cram_summary.md").read_text()
    assert "## m = 4" in md and "C_emp" in md and "| length n |" in md
    assert summary["summary_lines"][0].startswith("# Cramming")
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    on_disk = json.loads((out / "cram_summary.json").read_text(), parse_constant=refuse)
    assert on_disk["fit"]["c_emp"] == pytest.approx(summary["fit"]["c_emp"])

    # a rerun with the same settings must not cram anything
    def refuse(*a, **k):
        raise AssertionError("rerun crammed a finished target")

    monkeypatch.setattr(cramming._curve, "cram", refuse)
    again = run_cram(tiny, [1, 2, 3, 4], out, lengths=[2, 4, 8, 16], n_targets=8, steps=STEPS,
                     lr=LR, seed=0, adaptive=True, max_length=64, n_boot=100, progress=False,
                     plot=False)
    assert again["curves"] == summary["curves"]
    assert len((out / "cram.jsonl").read_text().splitlines()) == trials
    # different settings are new work
    with pytest.raises(AssertionError, match="rerun crammed"):
        run_cram(tiny, [1], out, lengths=[2], n_targets=2, steps=STEPS + 1, lr=LR, seed=0,
                 adaptive=False, progress=False, plot=False)


# ------------------------------------------------------------------ cram itself


def test_batched_equals_one_at_a_time(tiny):
    T = sample_targets(tiny, 4, 6, seed=3)
    seeds = [100 + i for i in range(6)]
    rb = cram(tiny, T, 1, steps=STEPS, lr=LR, seed=seeds)
    singles = [cram(tiny, T[i : i + 1], 1, steps=STEPS, lr=LR, seed=[seeds[i]]) for i in range(6)]
    assert 0 < rb.success.sum() < 6  # a mix, so the comparison means something
    np.testing.assert_array_equal(rb.success_teacher_forced, [r.success_teacher_forced[0] for r in singles])
    np.testing.assert_array_equal(rb.success_generation, [r.success_generation[0] for r in singles])
    np.testing.assert_array_equal(rb.steps, [r.steps[0] for r in singles])
    for i, r in enumerate(singles):
        np.testing.assert_allclose(rb.memory[i], r.memory[0], rtol=1e-4, atol=1e-5)
    # an int seed means target i starts from default_rng([seed, i]) whatever the batch
    r0 = cram(tiny, T[2:3], 1, steps=5, lr=LR, seed=[[7, 2]])
    r1 = cram(tiny, T, 1, steps=5, lr=LR, seed=7)
    np.testing.assert_allclose(r0.memory[0], r1.memory[2], rtol=1e-4, atol=1e-5)


def test_result_fields_and_both_verdicts(tiny):
    T = sample_targets(tiny, 2, 4, seed=1)
    r = cram(tiny, T, 2, steps=STEPS, lr=LR, seed=0)
    assert r.memory.dtype == np.float32 and r.memory.shape == (4, 2, D)
    assert r.success.all()  # 2-token targets with two vectors: all crammable
    assert (r.steps < STEPS).all() and (r.accuracy == 1).all() and (r.best_accuracy == 1).all()
    # the reported accuracy is reproduced from the returned vectors
    np.testing.assert_allclose(teacher_forced_accuracy(tiny, r.memory, T), r.accuracy)
    # generation from the memory vectors alone reproduces the targets
    np.testing.assert_array_equal(greedy_generate(tiny, r.memory, 2), T)
    assert r.success_generation.all()
    # failures on 16-token targets keep the whole budget and report accuracy < 1
    T16 = sample_targets(tiny, 16, 2, seed=1)
    f = cram(tiny, T16, 1, steps=20, lr=LR, seed=0)
    assert not f.success.any() and (f.steps == 20).all() and (f.accuracy < 1).all()
    assert not f.success_generation.any()
    rec = f.to_dict()
    assert json.loads(json.dumps(rec))["targets"][0]["steps"] == 20


def test_adam_matches_torch_optim_adam(tiny):
    """cram's per-coordinate Adam is torch.optim.Adam on the sum of per-target mean
    cross-entropies (a second implementation, same init, 20 steps without early stop)."""
    T = sample_targets(tiny, 16, 2, seed=0)
    r0 = cram(tiny, T, 1, steps=0, seed=5, check_generation=False)
    r = cram(tiny, T, 1, steps=20, lr=LR, seed=5, check_generation=False)
    assert (r.steps == 20).all() and not r.success.any()
    assert (r.best_accuracy >= r.accuracy).all() and (r.best_accuracy <= 1).all()
    emb = tiny.get_input_embeddings()
    P = torch.tensor(r0.memory).requires_grad_(True)
    opt = torch.optim.Adam([P], lr=LR)
    Tt = torch.as_tensor(T)
    with torch.no_grad():
        bos, rest = emb(torch.full((2, 1), tiny.config.bos_token_id)), emb(Tt[:, :-1])
    for _ in range(20):
        logits = tiny(inputs_embeds=torch.cat([bos, P, rest], 1)).logits[:, -16:]
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), Tt, reduction="none")
        (P.grad,) = torch.autograd.grad(loss.mean(1).sum(), P)  # no .grad on the model
        opt.step()
    assert np.abs(r.memory - r0.memory).max() > 0.1  # the vectors moved
    np.testing.assert_allclose(P.detach().numpy(), r.memory, atol=1e-4)


def test_generation_with_cache_equals_recomputation(tiny):
    rng = np.random.default_rng(0)
    M = rng.standard_normal((3, 2, D)).astype(np.float32) * 0.3
    a = greedy_generate(tiny, M, 6, use_cache=True)
    b = greedy_generate(tiny, M, 6, use_cache=False)
    np.testing.assert_array_equal(a, b)
    # the first generated token is the argmax of the forward pass of [e(BOS), memory]: "auto"
    # takes the config's bos_token_id (1) when there is no tokenizer
    assert tiny.config.bos_token_id == 1
    with torch.no_grad():
        bos = tiny.get_input_embeddings()(torch.ones(3, 1, dtype=torch.long))
        x = torch.cat([bos, torch.as_tensor(M)], 1)
        first = tiny(inputs_embeds=x).logits[:, -1].argmax(-1).numpy()
    np.testing.assert_array_equal(a[:, 0], first)
    np.testing.assert_array_equal(greedy_generate(tiny, M, 6, start_token=1), a)
    # without a start token: the argmax of the memory-only forward pass
    c = greedy_generate(tiny, M, 6, start_token=None, use_cache=True)
    np.testing.assert_array_equal(c, greedy_generate(tiny, M, 6, start_token=None, use_cache=False))
    with torch.no_grad():
        first = tiny(inputs_embeds=torch.as_tensor(M)).logits[:, -1].argmax(-1).numpy()
    np.testing.assert_array_equal(c[:, 0], first)


@pytest.mark.parametrize("start_token", ["auto", None, 5])
def test_teacher_forced_layout(tiny, start_token):
    """cram's accuracy at step 0 is the argmax of [(e(s)), memory, e(x_1..x_{n-1})] by hand."""
    T = sample_targets(tiny, 6, 3, seed=2)
    r = cram(tiny, T, 2, steps=0, seed=0, start_token=start_token, check_generation=False)
    s = {"auto": 1, None: None, 5: 5}[start_token]
    assert r.start_token == s and r.to_dict()["start_token"] == s
    emb = tiny.get_input_embeddings()
    with torch.no_grad():
        parts = [torch.as_tensor(r.memory), emb(torch.as_tensor(T[:, :-1]))]
        if s is not None:
            parts.insert(0, emb(torch.full((3, 1), s)))
        logits = tiny(inputs_embeds=torch.cat(parts, 1)).logits[:, -6:]
    acc = (logits.argmax(-1).numpy() == T).mean(1)
    np.testing.assert_allclose(r.accuracy, acc)
    np.testing.assert_allclose(teacher_forced_accuracy(tiny, r.memory, T, start_token=start_token), acc)


def test_start_token_resolution(tiny):
    from transformers import LlamaConfig, LlamaForCausalLM

    from embgeom._hf import resolve_start_token as resolve

    assert resolve(tiny, None, "auto", VOCAB) == 1  # config.bos_token_id
    assert resolve(tiny, SimpleNamespace(bos_token_id=7), "auto", VOCAB) == 7  # tokenizer first
    assert resolve(tiny, SimpleNamespace(bos_token_id=None), "auto", VOCAB) == 1
    no_bos = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, bos_token_id=None))
    assert resolve(no_bos, None, "auto", VOCAB) is None
    assert resolve(tiny, None, None, VOCAB) is None and resolve(tiny, None, np.int64(3), VOCAB) == 3
    with pytest.raises(ValueError, match="start_token"):
        cram(tiny, [[1, 2]], 1, start_token=VOCAB)
    with pytest.raises(ValueError, match="start_token"):
        cram(tiny, [[1, 2]], 1, start_token="bos")
    with pytest.raises(TypeError, match="start_token"):
        cram(tiny, [[1, 2]], 1, start_token=1.0)
    with pytest.raises(TypeError, match="start_token"):
        greedy_generate(tiny, np.zeros((1, 1, D), np.float32), 2, start_token=True)


def test_frozen_weights_stay_bit_identical(tiny):
    before = {k: v.detach().clone() for k, v in tiny.state_dict().items()}
    flags = {k: p.requires_grad for k, p in tiny.named_parameters()}
    tiny.train()
    try:
        cram(tiny, sample_targets(tiny, 3, 2, seed=0), 2, steps=10, lr=LR)
        assert tiny.training  # mode restored
    finally:
        tiny.eval()
    for k, v in tiny.state_dict().items():
        assert torch.equal(v, before[k]), k
    for k, p in tiny.named_parameters():
        assert p.grad is None, k
        assert p.requires_grad == flags[k], k


def test_embedding_scale_inside_the_module_is_used(tiny):
    """A model whose embedding module multiplies by a constant (Gemma's sqrt(d)) gets memory
    vectors initialised at the scaled level."""
    class Scaled(torch.nn.Embedding):
        def forward(self, ids):
            return super().forward(ids) * 8.0

    base = _tiny_llama(seed=1)
    scaled = _tiny_llama(seed=1)
    emb = Scaled(VOCAB, D)
    emb.weight.data.copy_(base.get_input_embeddings().weight.data)
    scaled.set_input_embeddings(emb)
    T = sample_targets(base, 3, 2, seed=0)
    a = cram(base, T, 1, steps=0, check_generation=False, seed=0)
    b = cram(scaled, T, 1, steps=0, check_generation=False, seed=0)
    np.testing.assert_allclose(b.memory, 8.0 * a.memory, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ bad input


def test_bad_input(tiny):
    T = sample_targets(tiny, 3, 2, seed=0)
    with pytest.raises(ValueError, match="n_mem"):
        cram(tiny, T, 0)
    with pytest.raises(TypeError, match="n_mem"):
        cram(tiny, T, 1.5)
    with pytest.raises(ValueError, match="targets"):
        cram(tiny, np.zeros((0, 3), np.int64), 1)
    with pytest.raises(ValueError, match="targets: expected a non-empty"):
        cram(tiny, [], 1)
    with pytest.raises(ValueError, match="targets"):
        cram(tiny, np.zeros((2, 0), np.int64), 1)
    with pytest.raises(ValueError, match=r"targets: values must lie in \[0, 128\)"):
        cram(tiny, np.array([[1, VOCAB]]), 1)
    with pytest.raises(ValueError, match="targets"):
        cram(tiny, np.array([[-1, 2]]), 1)
    with pytest.raises(TypeError, match="targets"):
        cram(tiny, np.array([[1.0, 2.0]]), 1)
    with pytest.raises(ValueError, match="lr"):
        cram(tiny, T, 1, lr=-1e-3)
    with pytest.raises(ValueError, match="seed"):
        cram(tiny, T, 1, seed=[1, 2, 3])
    with pytest.raises(ValueError, match="input embeddings"):
        cram(torch.nn.Linear(4, 4), T, 1)

    class NoEmb(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2))

        def get_input_embeddings(self):
            return None

    with pytest.raises(ValueError, match="input embeddings"):
        cram(NoEmb(), T, 1)
    with pytest.raises(TypeError, match="model"):
        cram("not a model", T, 1)
    with pytest.raises(ValueError, match="lengths"):
        accessibility_curve(tiny, 1, None, 2, adaptive=False, progress=False)
    with pytest.raises(ValueError, match="device"):
        cram(tiny, T, 1, device="foo")
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="device"):
            check_device("mps")
    with pytest.raises(ValueError, match="target_source"):
        sample_targets(tiny, 3, 2, target_source="poems")
    with pytest.raises(ValueError, match="tokenizer"):
        sample_targets(tiny, 3, 2, target_source="words")


# ------------------------------------------------------------------ options checked at the door


@pytest.mark.parametrize("kw, exc, name", [
    ({"betas": (1.0, 0.999)}, ValueError, r"betas\[0\]"),  # used to blame `memory`, later
    ({"betas": (0.9, 1.0)}, ValueError, r"betas\[1\]"),  # used to return NaN silently
    ({"betas": (-0.1, 0.9)}, ValueError, r"betas\[0\]"),
    ({"betas": (0.9, float("nan"))}, ValueError, r"betas\[1\]"),
    ({"betas": 0.9}, TypeError, "betas"),
    ({"betas": (0.9, 0.99, 0.999)}, TypeError, "betas"),
    ({"betas": ("a", 0.9)}, TypeError, r"betas\[0\]"),
    ({"lr": -1e-3}, ValueError, "lr"),
    ({"lr": float("inf")}, ValueError, "lr"),
    ({"lr": "0.01"}, TypeError, "lr"),
    ({"adam_eps": -1e-8}, ValueError, "adam_eps"),
    ({"adam_eps": float("nan")}, ValueError, "adam_eps"),
    ({"weight_decay": -0.01}, ValueError, "weight_decay"),
    ({"weight_decay": float("inf")}, ValueError, "weight_decay"),
    ({"steps": -1}, ValueError, "steps"),
    ({"steps": 10.0}, TypeError, "steps"),
    ({"init_scale": 0.0}, ValueError, "init_scale"),
    ({"init_scale": float("inf")}, ValueError, "init_scale"),
    ({"patience": 0}, ValueError, "patience"),
    ({"patience": 2.5}, TypeError, "patience"),
    ({"precision": "bf16"}, ValueError, "precision"),
    ({"precision": "float16"}, ValueError, "precision"),
    ({"check_generation": "yes"}, TypeError, "check_generation"),
    ({"use_cache": 1}, TypeError, "use_cache"),
    ({"device": "foo"}, ValueError, "device"),
])
def test_options_are_checked_before_any_work(tiny, monkeypatch, kw, exc, name):
    """Issue 12, kind 5: every optimiser and numerical option is refused up front with the
    rules of torch.optim.Adam / AdamW, naming the argument, by cram, accessibility_curve and
    run_cram alike (nothing is crammed, no folder is created)."""
    def refuse(*a, **k):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr(cramming._optimise, "_init_memory", refuse)
    T = sample_targets(tiny, 3, 2, seed=0)
    with pytest.raises(exc, match=name):
        cram(tiny, T, 1, **kw)
    if kw.keys() & {"check_generation"}:
        return  # an accessibility_curve / run_cram argument of the same name is checked alike
    curve_kw = {k: v for k, v in kw.items() if k != "use_cache"} or kw
    with pytest.raises(exc, match=name):
        accessibility_curve(tiny, 1, [2], 2, progress=False, **curve_kw)


def test_run_cram_checks_options_before_loading(tmp_path, monkeypatch):
    from embgeom.cramming import _run

    monkeypatch.setattr(_run, "_load", lambda name: (_ for _ in ()).throw(
        AssertionError("the model was loaded before the options were checked")))
    for kw, name in [({"betas": (0.9, 1.0)}, r"betas\[1\]"), ({"n_targets": 0}, "n_targets"),
                     ({"batch_size": 0}, "batch_size"), ({"precision": "fp8"}, "precision"),
                     ({"patience": 0}, "patience"), ({"weight_decay": -1.0}, "weight_decay"),
                     ({"device": "nope"}, "device"), ({"mixed_batches": 2}, "lengths"),
                     ({"lengths": {1: [2]}, "mems": [1, 2]}, "lengths")]:
        kw = {"mems": [1], **kw}
        with pytest.raises((TypeError, ValueError), match=name):
            run_cram("tiny", kw.pop("mems"), tmp_path / "o", **kw)
    assert not (tmp_path / "o").exists()


def test_accessibility_curve_refuses_unknown_cram_options(tiny):
    with pytest.raises(TypeError, match="beta"):
        accessibility_curve(tiny, 1, [2], 2, progress=False, beta=(0.9, 0.9))


def test_run_cram_refuses_a_folder_it_cannot_write(read_only_folder, monkeypatch):
    """Issue 12, kind 6: a read-only output folder is refused before the model is loaded."""
    from embgeom.cramming import _run

    ro = read_only_folder
    monkeypatch.setattr(_run, "_load", lambda name: (_ for _ in ()).throw(
        AssertionError("the model was loaded before the folder was checked")))
    for out in (ro, ro / "new" / "sub"):
        with pytest.raises(PermissionError, match="out_dir: cannot write in"):
            run_cram("tiny", [1], out, lengths=[2], n_targets=1, steps=1, progress=False)
    assert list(ro.iterdir()) == []  # no probe file left behind


def test_lr_zero_leaves_the_memory_vectors_where_they_start(tiny):
    """lr = 0 is allowed (torch.optim.Adam allows it) and means no update at all."""
    T = sample_targets(tiny, 8, 2, seed=0)
    r0 = cram(tiny, T, 1, steps=0, seed=3, check_generation=False)
    r = cram(tiny, T, 1, steps=5, lr=0.0, seed=3, check_generation=False)
    np.testing.assert_array_equal(r.memory, r0.memory)
    assert (r.steps == 5).all() and list(r.stop_reason) == ["steps", "steps"]


# ------------------------------------------------------------------ AdamW, patience, precision


def test_weight_decay_matches_torch_optim_adamw(tiny):
    """weight_decay is AdamW's decoupled decay (P <- P (1 - lr wd) before the Adam update):
    20 steps against torch.optim.AdamW with the same betas, eps and decay."""
    T = sample_targets(tiny, 16, 2, seed=0)
    wd, betas = 0.5, (0.9, 0.9)
    r0 = cram(tiny, T, 1, steps=0, seed=5, check_generation=False)
    r = cram(tiny, T, 1, steps=20, lr=LR, seed=5, betas=betas, weight_decay=wd,
             check_generation=False)
    plain = cram(tiny, T, 1, steps=20, lr=LR, seed=5, betas=betas, check_generation=False)
    emb = tiny.get_input_embeddings()
    P = torch.tensor(r0.memory).requires_grad_(True)
    opt = torch.optim.AdamW([P], lr=LR, betas=betas, weight_decay=wd)
    Tt = torch.as_tensor(T)
    with torch.no_grad():
        bos, rest = emb(torch.full((2, 1), tiny.config.bos_token_id)), emb(Tt[:, :-1])
    for _ in range(20):
        logits = tiny(inputs_embeds=torch.cat([bos, P, rest], 1)).logits[:, -16:]
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), Tt, reduction="none")
        (P.grad,) = torch.autograd.grad(loss.mean(1).sum(), P)
        opt.step()
    np.testing.assert_allclose(P.detach().numpy(), r.memory, atol=1e-4)
    assert np.abs(r.memory - plain.memory).max() > 1e-3  # the decay did something


def test_patience_stops_a_row_whose_best_accuracy_stalls(tiny):
    """A row stops once its best teacher-forced accuracy has not risen for `patience` steps;
    the step and reason are recorded, and a row that reaches 100% first stops on accuracy."""
    T = sample_targets(tiny, 16, 3, seed=1)
    free = cram(tiny, T, 1, steps=60, lr=LR, seed=0, check_generation=False)
    assert not free.success.any()
    r = cram(tiny, T, 1, steps=60, lr=LR, seed=0, patience=7, check_generation=False)
    assert set(r.stop_reason) <= {"patience", "steps"} and "patience" in set(r.stop_reason)
    # replay the rule on the accuracy trajectory of each row (teacher_forced_accuracy of the
    # vectors after t steps, from the run without patience, is the same trajectory)
    for i in range(3):
        accs = [teacher_forced_accuracy(tiny, cram(tiny, T[i:i + 1], 1, steps=t, lr=LR,
                                                   seed=[[0, i]], check_generation=False).memory,
                                        T[i:i + 1])[0] for t in range(int(r.steps[i]) + 1)]
        best, rise = -1.0, 0
        stop = None
        for t, a in enumerate(accs):
            if a > best:
                best, rise = a, t
            if t - rise >= 7:
                stop = t
                break
        if r.stop_reason[i] == "patience":
            assert stop == r.steps[i], (i, accs)
        else:
            assert stop is None and r.steps[i] == 60
    ok = cram(tiny, sample_targets(tiny, 2, 2, seed=1), 2, steps=STEPS, lr=LR, seed=0,
              patience=50)
    assert ok.success.all() and list(ok.stop_reason) == ["accuracy", "accuracy"]


@pytest.mark.parametrize("precision", ["bf16-autocast", "bf16-linear"])
def test_bf16_stops_are_confirmed_in_float32(tiny, monkeypatch, precision):
    """Under a bf16 precision only the model forward runs in bf16; a row stops on accuracy only
    when a float32 forward confirms 100%; the recorded loss and accuracy are float32."""
    from embgeom.cramming import _optimise

    T = sample_targets(tiny, 4, 6, seed=3)
    seen = []
    real = _optimise._model_forward

    def spy(hf, x, keep, prec):
        seen.append(prec)
        out = real(hf, x, keep, prec)
        assert out.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
        assert all("forward" not in vars(m) for m in hf.modules())  # bf16-linear unpatched
        return out

    monkeypatch.setattr(_optimise, "_model_forward", spy)
    r = cram(tiny, T, 1, steps=STEPS, lr=LR, seed=0, precision=precision)
    assert r.precision == precision and r.to_records()[0]["precision"] == precision
    assert set(seen) == {precision, "float32"}  # optimisation in bf16, confirmations float32
    assert r.success.any()
    # every verdict and number is the float32 one of the returned vectors
    np.testing.assert_allclose(teacher_forced_accuracy(tiny, r.memory, T), r.accuracy)
    assert ((r.accuracy == 1) == r.success).all()
    assert (r.stop_reason[r.success] == "accuracy").all()

    # a row that bf16 puts at 100% but float32 does not keeps going: make every bf16 forward
    # claim 100% (the argmax equal to the targets) and check that nothing stops on that alone
    T16 = sample_targets(tiny, 16, 2, seed=1)

    def liar(hf, x, keep, prec):
        logits = real(hf, x, keep, "float32")
        if prec != "float32":
            fake = torch.nn.functional.one_hot(torch.as_tensor(T16), logits.shape[-1])
            return logits + 1e3 * fake.float()
        return logits

    monkeypatch.setattr(_optimise, "_model_forward", liar)
    f = cram(tiny, T16, 1, steps=15, lr=LR, seed=0, precision=precision,
             check_generation=False)
    assert not f.success.any() and (f.steps == 15).all() and (f.accuracy < 1).all()


def test_rows_of_different_m_and_n_in_one_batch_equal_their_own_runs(tiny):
    """Rows of different m and n crammed together: each row's verdict, steps and vectors are
    those of the row crammed alone (padding after a row changes nothing before it)."""
    rows = [sample_targets(tiny, n, 1, seed=4)[0] for n in (3, 6, 4, 8)]
    ms = [1, 2, 3, 1]
    seeds = [[9, i] for i in range(4)]
    mixed = cram(tiny, rows, ms, steps=STEPS, lr=LR, seed=seeds)
    assert mixed.memory.shape == (4, 3, D) and mixed.n_mem == 3 and mixed.length == 8
    assert mixed.n_mems.tolist() == ms and mixed.lengths.tolist() == [3, 6, 4, 8]
    assert 0 < mixed.success.sum() < 4
    for i, (t, m) in enumerate(zip(rows, ms)):
        alone = cram(tiny, t, m, steps=STEPS, lr=LR, seed=[seeds[i]])
        assert alone.success[0] == mixed.success[i] and alone.steps[0] == mixed.steps[i]
        assert alone.success_generation[0] == mixed.success_generation[i]
        np.testing.assert_allclose(mixed.memory[i, :m], alone.memory[0], rtol=1e-3, atol=1e-3)
        assert (mixed.memory[i, m:] == 0).all()
        assert mixed.accuracy[i] == pytest.approx(alone.accuracy[0])
        assert mixed.loss[i] == pytest.approx(alone.loss[0], rel=1e-3, abs=1e-4)
    with pytest.raises(ValueError, match="n_mem"):
        cram(tiny, rows, [1, 2], steps=1)


def test_mixed_curves_equal_per_length_curves_and_resume_them(tiny, tmp_path, monkeypatch):
    """mixed_curves crams the same targets from the same starts under the same settings hash
    as accessibility_curve; a rerun of either finds the other's records."""
    from embgeom.cramming import _curve

    J = tmp_path / "c.jsonl"
    lengths = {1: [2, 4], 2: [4, 6]}
    mixed = _curve.mixed_curves(tiny, lengths, 3, n_batches=2, jsonl=J, steps=40, lr=LR,
                                progress=False)
    recs = [json.loads(x) for x in J.read_text().splitlines()]
    assert len(recs) == 12 and len({r["settings_hash"] for r in recs}) == 1
    per = {m: accessibility_curve(tiny, m, ns, 3, steps=40, lr=LR, progress=False)
           for m, ns in lengths.items()}
    for m in lengths:
        assert mixed[m].successes.tolist() == per[m].successes.tolist()
        assert mixed[m].settings["settings_hash"] == per[m].settings["settings_hash"]

    def refuse(*a, **k):
        raise AssertionError("crammed a finished target")

    monkeypatch.setattr(_curve, "cram", refuse)
    for m, ns in lengths.items():
        again = accessibility_curve(tiny, m, ns, 3, jsonl=J, steps=40, lr=LR, progress=False)
        assert again.successes.tolist() == mixed[m].successes.tolist()


def test_defaults_keep_the_settings_hash_and_new_options_change_it():
    """precision, weight_decay and patience enter the hashed settings only when they are not
    the defaults: a float32 run keeps today's hash (pinned below), so a running job resumes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from embgeom.cramming._curve import _curve_settings, _settings_hash

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2))
    kw = dict(start=1, steps=1000, lr=0.01, seed=0, target_source="random-tokens",
              check_generation=True, cram_kwargs={})
    base = _curve_settings(model, "m", torch.float32, **kw)
    same = _curve_settings(model, "m", torch.float32, precision="float32", weight_decay=0.0,
                           patience=None, **kw)
    assert same == base and "precision" not in base and _settings_hash(same) == _settings_hash(base)
    hashes = {_settings_hash(base)}
    for extra in ({"precision": "bf16-autocast"}, {"weight_decay": 0.01}, {"patience": 2000}):
        s = _curve_settings(model, "m", torch.float32, **extra, **kw)
        assert s[next(iter(extra))] == next(iter(extra.values()))
        hashes.add(_settings_hash(s))
    assert len(hashes) == 4


# ------------------------------------------------------------------ targets


class _FakeTokenizer:
    """Just enough of a tokenizer: GPT-2-style pieces, two special tokens."""

    all_special_ids = [0, 1]

    def __init__(self, n):
        words = ["\u0120cat", "\u0120dog", "\u0120tree", "\u2581sun", "\u0120x1", "ing", "\u0120a"]
        self.pieces = [words[i % len(words)] + ("" if i < len(words) else chr(97 + i % 26) * (i // 26 + 1))
                       for i in range(n)]

    def __len__(self):
        return len(self.pieces)

    def convert_ids_to_tokens(self, ids):
        return [self.pieces[i] for i in ids]

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2 + (ord(ch) % 100) for ch in text if ch != " "]}


def test_sample_targets_random_tokens(tiny):
    loaded = SimpleNamespace(model=tiny, tokenizer=_FakeTokenizer(VOCAB), name="tiny")
    long = sample_targets(loaded, 150, 5, seed=4)
    short = sample_targets(loaded, 70, 5, seed=4)
    assert long.dtype == np.int64 and long.shape == (5, 150)
    np.testing.assert_array_equal(long[:, :70], short)  # prefixes
    assert long.min() >= 2 and long.max() < VOCAB  # special tokens 0, 1 never drawn
    np.testing.assert_array_equal(sample_targets(loaded, 150, 2, seed=4, start=3), long[3:5])
    assert not np.array_equal(sample_targets(loaded, 150, 5, seed=5), long)
    # uniform over the pool: chi-square on the counts of many draws
    many = sample_targets(tiny, 64, 200, seed=0).ravel()
    counts = np.bincount(many, minlength=VOCAB)
    # without a tokenizer the special tokens are the config's bos (1) and eos (2): never drawn
    assert (tiny.config.bos_token_id, tiny.config.eos_token_id) == (1, 2)
    assert counts[1] == counts[2] == 0
    pool = np.setdiff1d(np.arange(VOCAB), [1, 2])
    assert stats.chisquare(counts[pool]).pvalue > 1e-4


def test_sample_targets_words_and_texts(tiny):
    tok = _FakeTokenizer(VOCAB)
    loaded = SimpleNamespace(model=tiny, tokenizer=tok, name="tiny")
    W = sample_targets(loaded, 40, 4, target_source="words", seed=0)
    pieces = tok.convert_ids_to_tokens(W.ravel().tolist())
    assert all(p[0] in ("\u0120", "\u2581") and p[1:].isalpha() and len(p) >= 3 for p in pieces)
    assert not (np.isin(W, [0, 1])).any()
    texts = ["abc", "de"]
    X = sample_targets(loaded, 7, 3, target_source=texts, seed=0)
    stream = [2 + ord(c) % 100 for c in "abcde"]
    np.testing.assert_array_equal(X[0], [stream[i % 5] for i in range(7)])
    np.testing.assert_array_equal(X[1], [stream[(3 + i) % 5] for i in range(7)])
    np.testing.assert_array_equal(X[2], X[0])  # text j mod len(texts)


# ------------------------------------------------------------------ adaptive mode (fake cram)


def _threshold_cram(threshold):
    def fake(model, targets, n_mem, **kw):
        B, n = np.asarray(targets).shape
        ok = np.full(B, n <= threshold * n_mem)
        return cramming.CramResult(
            success_teacher_forced=ok, success_generation=ok, steps=np.zeros(B, np.int64),
            loss=np.zeros(B), accuracy=ok.astype(float), memory=np.zeros((B, n_mem, D), np.float32),
            n_mem=n_mem, length=n, dtype="float32", device="cpu", wall_s=0.0,
        )

    return fake


def test_jsonl_line_cut_short_is_redone_once(tiny, monkeypatch, tmp_path):
    """An interrupted write leaves a fragment without a newline: the rerun redoes that target
    *with its original batch partners* (batched float32 is not exactly batch-independent, so
    alone it could get another verdict; issue 21), removes the fragment without a warning,
    writes only its record, and a third run finds everything done (and warns of nothing)."""
    calls = []

    def counting(model, targets, n_mem, **kw):
        calls.append(len(targets))
        return _threshold_cram(5)(model, targets, n_mem, **kw)

    monkeypatch.setattr(cramming._curve, "cram", counting)
    J = tmp_path / "c.jsonl"
    accessibility_curve(tiny, 1, [4], 3, jsonl=J, progress=False)
    text = J.read_text()
    J.write_text(text[: text.rstrip("\n").rfind("\n") + 41])  # last line cut to 40 chars
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the torn last line is the expected case
        c = accessibility_curve(tiny, 1, [4], 3, jsonl=J, progress=False)
        assert calls == [3, 3] and c.successes.tolist() == [3]
        lines = J.read_text().splitlines()
        assert len(lines) == 3 and [json.loads(x)["target_index"] for x in lines] == [0, 1, 2]
        accessibility_curve(tiny, 1, [4], 3, jsonl=J, progress=False)
    assert calls == [3, 3]


def test_adaptive_doubles_then_bisects(tiny, monkeypatch):
    monkeypatch.setattr(cramming._curve, "cram", _threshold_cram(5))
    c = accessibility_curve(tiny, 1, None, 3, adaptive=True, max_length=64, progress=False)
    # 1, 2, 4 pass, 8 fails; bisection 6 (fails), 5 (passes); stop: 5 and 6 adjacent
    assert c.lengths.tolist() == [1, 2, 4, 5, 6, 8]
    assert c.accessibility.tolist() == [1, 1, 1, 1, 0, 0]
    c2 = accessibility_curve(tiny, 2, [3, 6, 12, 24], 3, adaptive=True, progress=False)
    assert c2.lengths.tolist() == [3, 6, 9, 10, 11, 12]
    r = n50(c2, n_boot=100)
    assert 10 < r["n50"] < 11  # separated data: the midpoint of the gap
    c3 = accessibility_curve(tiny, 1, [20, 40], 3, adaptive=True, progress=False)
    assert c3.lengths.tolist() == [5, 6, 7, 10, 20]  # fails at once: bisect down from 0
    full = accessibility_curve(tiny, 1, [2, 64], 2, adaptive=True, max_length=32, progress=False)
    assert full.lengths.tolist() == [2]  # max_length removes 64; never crosses: censored
    assert n50(full)["censored"] == "above" and math.isnan(n50(full)["n50"])


# ------------------------------------------------------------------ statistics


def test_wilson_interval_closed_forms():
    z = stats.norm.ppf(0.975)
    lo, hi = wilson_interval([0, 10, 5], [10, 10, 10])
    assert lo[0] == 0 and hi[0] == pytest.approx(z * z / (10 + z * z))
    assert hi[1] == 1 and lo[1] == pytest.approx(10 / (10 + z * z))
    # symmetric around 1/2 at k = N/2
    assert lo[2] + hi[2] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        wilson_interval([3], [2])


def test_n50_recovers_a_known_logistic():
    x = np.arange(2, 41, 2)
    true_n50, s = 17.3, 2.5
    N = np.full(x.size, 4000)
    k = np.round(N / (1 + np.exp((x - true_n50) / s))).astype(int)
    curve = AccessibilityCurve(n_mem=1, lengths=x, successes=k, successes_generation=k, trials=N)
    r = n50(curve, n_boot=100, seed=0)
    assert r["n50"] == pytest.approx(true_n50, abs=0.05)
    assert r["scale"] == pytest.approx(s, rel=0.05)
    assert r["lower"] < r["n50"] < r["upper"] and r["upper"] - r["lower"] < 1
    assert n50(curve.to_dict(), n_boot=100, seed=0) == r  # dict form, seeded
    # few trials: wider interval
    k8 = np.round(8 / (1 + np.exp((x - true_n50) / s))).astype(int)
    r8 = n50({"lengths": x, "successes": k8, "trials": np.full(x.size, 8)}, n_boot=100)
    assert r8["upper"] - r8["lower"] > r["upper"] - r["lower"]
    below = n50({"lengths": [4, 8], "successes": [1, 0], "trials": [4, 4]})
    assert below["censored"] == "below"
    # perfectly separated data: the crossing is anywhere in the gap, and the interval says so
    sep = n50({"lengths": [8, 16, 32], "successes": [1, 1, 0], "trials": [1, 1, 1]})
    assert (sep["n50"], sep["lower"], sep["upper"], sep["separated"]) == (24.0, 16.0, 32.0, True)
    assert r["separated"] is False
    with pytest.raises(ValueError, match="curve"):
        n50({"lengths": [4, 8], "successes": [5, 0], "trials": [4, 4]})
    with pytest.raises(ValueError, match="curve: .* finite"):
        n50({"lengths": [4, 8], "successes": [1, float("nan")], "trials": [2, 2]})
    with pytest.raises(ValueError, match="curve: .* finite"):
        n50({"lengths": [4, float("inf")], "successes": [1, 0], "trials": [2, 2]})
    with pytest.raises(TypeError, match="curve"):
        n50([1, 2, 3])


def test_fit_slope_against_numpy():
    exact = fit_slope({1: 3.0, 2: 6.0, 4: 12.0})
    assert exact["c_emp"] == pytest.approx(3.0) and exact["r2"] == pytest.approx(1.0)
    assert exact["affine"]["intercept"] == pytest.approx(0.0, abs=1e-12)
    rng = np.random.default_rng(0)
    m = np.arange(1, 7)
    y = 4.0 * m + 1.5 + rng.normal(0, 0.5, m.size)
    f = fit_slope({int(a): {"n50": float(b)} for a, b in zip(m, y)}, c_theory=40.0)
    c, res, *_ = np.linalg.lstsq(m[:, None].astype(float), y, rcond=None)
    assert f["c_emp"] == pytest.approx(float(c[0]))
    assert f["r2_uncentred"] == pytest.approx(1 - float(res[0]) / float(y @ y))
    assert f["r2"] == pytest.approx(1 - float(res[0]) / float(((y - y.mean()) ** 2).sum()))
    slope, icpt = np.polyfit(m, y, 1)
    assert f["affine"]["slope"] == pytest.approx(slope) and f["affine"]["intercept"] == pytest.approx(icpt)
    assert f["affine"]["slope_lower"] < slope < f["affine"]["slope_upper"]
    assert f["ratio"] == pytest.approx(40.0 / f["c_emp"])
    assert f["ratio_lower"] < f["ratio"] < f["ratio_upper"]
    with pytest.raises(ValueError, match="at least two"):
        fit_slope({1: 3.0})
    with pytest.raises(ValueError, match="m=2"):
        fit_slope({1: 3.0, 2: float("nan")})
    with pytest.raises(TypeError):
        fit_slope([3.0, 6.0])
    with pytest.raises(ValueError, match="twice"):
        fit_slope({1: 3.0, "1": 5.0, 2: 4.0})
    with pytest.raises(TypeError, match="'n50'"):
        fit_slope({1: {"x": 1.0}, 2: 4.0})
    with pytest.raises(ValueError, match="> 0"):
        fit_slope({1: -2.0, 2: -4.0})
    with pytest.raises(TypeError, match="number"):
        fit_slope({1: "3", 2: 6.0})


# ------------------------------------------------------------------ the real model (small)


@pytest.mark.realmodel
def test_smollm2_cram_runs_and_learns(smollm2):
    """40 Adam steps on SmolLM2 (tied embedding, SDPA, KV-cache generation): the memory
    vectors start at the embedding scale, the loss falls, the verdicts are consistent."""
    hf = smollm2.model
    old = torch.get_num_threads()
    torch.set_num_threads(2)  # a real model's step is compute-bound
    try:
        T = sample_targets(smollm2, 4, 2, seed=0)
        start = cram(smollm2, T, 1, steps=0, seed=0, check_generation=False)
        r = cram(smollm2, T, 1, steps=40, lr=1e-2, seed=0)
    finally:
        torch.set_num_threads(old)
    with torch.no_grad():
        rows = hf.get_input_embeddings()(torch.arange(0, 49152, 97)).norm(dim=-1)
    ratio = np.linalg.norm(start.memory, axis=-1) / float(rows.mean())
    assert ((ratio > 0.5) & (ratio < 2)).all(), ratio  # initialised at the input-embedding scale
    assert r.dtype == "float32" and r.memory.shape == (2, 1, 576)
    assert (r.loss < start.loss - 1).all(), (start.loss, r.loss)  # nats/token
    np.testing.assert_allclose(teacher_forced_accuracy(smollm2, r.memory, T), r.accuracy)
    gen = greedy_generate(smollm2, r.memory, 4)
    np.testing.assert_array_equal(r.success_generation, (gen == T).all(1))
    assert (r.success_generation | ~r.success_teacher_forced).all()  # TF success => generation
    assert all(p.grad is None for p in hf.parameters())


def test_run_cram_refuses_a_file_as_out_dir(tiny, tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    for out in (f, f / "sub"):
        with pytest.raises(ValueError, match="out_dir"):
            run_cram(tiny, [1], out, lengths=[2], n_targets=1, steps=1, progress=False)


# ------------------------------------------------------------------ resume key (pinned)


def test_settings_hash_and_fingerprint_are_pinned():
    """A run writing cram.jsonl must resume after an upgrade: the settings hash and the model
    fingerprint are pinned to the values the code before the cramming/ split computed (on these
    exact inputs); a change here orphans every finished target of a running job."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from embgeom.cramming._curve import _curve_settings, _model_fingerprint, _settings_hash
    from embgeom.cramming._targets import source_descriptor

    settings = {
        "model": {"name": "smollm2-135m", "class": "LlamaForCausalLM", "n_params": 134515008,
                  "embedding_digest": "0123456789abcdef"},
        "dtype": "float32", "start_token": 1, "steps": 1000, "lr": 0.01, "seed": 0,
        "target_source": "random-tokens", "check_generation": True, "cram_kwargs": {},
    }
    assert _settings_hash(settings) == "0c0a7e56f58c80e3"

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) / (1000.0 + i))
    fp = {"name": "tiny-arange", "class": "LlamaForCausalLM", "n_params": 4656,
          "embedding_digest": "dbc1808414236bd7"}
    assert _model_fingerprint(model, "tiny-arange") == fp
    # the settings accessibility_curve builds, on a bare model (its name: the class name)
    built = _curve_settings(model, "tiny-arange", torch.float32, start=None, steps=1000, lr=0.01,
                            seed=0, target_source=["a b", "c"], check_generation=True,
                            cram_kwargs={"init_scale": 0.5, "betas": (0.9, 0.99)})
    assert source_descriptor(["a b", "c"]) == "texts:2:0de7f58388266e3b"
    assert _settings_hash(built) == "81ba30bceb958bbe"
    from embgeom._hf import unwrap

    assert unwrap(model)[2] == "LlamaForCausalLM"


def test_jsonl_records_are_strict_json_and_keep_their_format(tiny, tmp_path):
    """Each cram.jsonl line is strict JSON with the keys a rerun reads, in the order of the
    format before the split."""
    J = tmp_path / "c.jsonl"
    accessibility_curve(tiny, 1, [2], 2, jsonl=J, steps=3, lr=LR, progress=False)

    def refuse(c):
        raise ValueError(f"non-strict JSON constant {c}")

    recs = [json.loads(line, parse_constant=refuse) for line in J.read_text().splitlines()]
    assert [list(r)[:4] for r in recs] == [["settings_hash", "n_mem", "length", "target_index"]] * 2
    # the keys of the first format, in its order, then the later ones
    assert list(recs[0])[4:] == [
        "success_teacher_forced", "success_generation", "steps", "loss", "accuracy",
        "best_accuracy", "memory_norm", "dtype", "device", "batch_wall_s", "settings",
        "stop_reason", "precision"]
    assert recs[0]["precision"] == "float32" and recs[0]["stop_reason"] in ("accuracy", "steps")
    assert [r["target_index"] for r in recs] == [0, 1]


def test_adaptive_search_alone():
    """The search as a function of an accessibility oracle: doubling, then bisection."""
    from embgeom.cramming._curve import _adaptive_search

    seen = []

    def oracle(n):
        seen.append(n)
        return 1.0 if n <= 37 else 0.0

    _adaptive_search([1, 2, 4, 8, 16, 32, 64, 128], oracle)
    assert seen[:7] == [1, 2, 4, 8, 16, 32, 64] and seen[7:] == [48, 40, 36, 38, 37]
    seen.clear()
    _adaptive_search([8, 16], lambda n: seen.append(n) or 0.0)
    assert seen == [8, 4, 2, 1]  # fails at once: bisect down from 0
    seen.clear()
    _adaptive_search([2, 4], lambda n: seen.append(n) or 1.0)
    assert seen == [2, 4]  # never crosses: nothing more


def test_analysis_imports_without_torch():
    import subprocess
    import sys

    code = ("import sys; import embgeom.cramming.analysis as a; "
            "print('torch' in sys.modules, a.fit_slope({1: 2.0, 2: 4.0})['c_emp'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "2.0"]


@torch.no_grad()
def test_bf16_linears_round_every_product_and_only_during_the_block(tiny):
    """``"bf16-linear"``: every nn.Linear multiplies bf16-rounded inputs and weights (its output
    equals the float32 product of the rounded operands up to float32 summation error), the
    rest stays float32, the modules are restored after the block, and a changed weight is cast
    again (the cache follows the weight's version)."""
    from embgeom._hf import last_logits
    from embgeom.cramming._optimise import _BF16_LINEARS, _bf16_linears

    hf = tiny
    lin = next(m for m in hf.modules() if type(m) is torch.nn.Linear)
    x = torch.randn(3, lin.in_features)
    want = torch.nn.functional.linear(x.bfloat16().float(), lin.weight.bfloat16().float(),
                                      None if lin.bias is None else lin.bias.bfloat16().float())
    with _bf16_linears(hf):
        got = lin(x)
        assert "forward" in vars(lin)
    assert "forward" not in vars(lin) and got.dtype == torch.float32
    # bf16 product of the rounded operands: within bf16 output rounding of the exact one
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=2**-7, atol=1e-6 * float(want.abs().max()))
    assert not torch.equal(got, lin(x))  # and not the float32 product
    e = torch.randn(2, 5, hf.get_input_embeddings().weight.shape[1])
    with torch.no_grad():
        ref = last_logits(hf, e, 3)[0]
        with _bf16_linears(hf):
            low = last_logits(hf, e, 3)[0]
    assert low.dtype == torch.float32 and not torch.equal(low, ref)
    assert float((low - ref).abs().max()) < 0.1 * float(ref.abs().max())
    # a changed weight is cast again, not served from the cache
    with torch.no_grad():
        lin.weight.mul_(2.0)
    try:
        with _bf16_linears(hf):
            got2 = lin(x)
        np.testing.assert_allclose(got2.numpy(), 2 * got.numpy() - (lin.bias.numpy() if lin.bias is not None else 0),
                                   rtol=2**-6, atol=1e-5 * float(got.abs().max()))
    finally:
        with torch.no_grad():
            lin.weight.div_(2.0)
    assert hf in _BF16_LINEARS
