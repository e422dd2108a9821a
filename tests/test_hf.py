"""embgeom._hf, the one home of the Hugging Face plumbing: the greedy decoder against a hand
forward loop, model access, special tokens, the start token; and a check that no second copy of
that plumbing (or of the JSON converter, or a backend switch) is left in the tree."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from embgeom import _hf  # noqa: E402

VOCAB, D = 64, 16
ROOT = Path(__file__).resolve().parents[1]


def _tiny(seed=0, initializer_range=0.3):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=2 * D,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=128, initializer_range=initializer_range,
                      tie_word_embeddings=False, attn_implementation="eager")
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def tricky():
    """A tiny model whose shipped generation config would change greedy tokens (a repetition
    penalty, banned bigrams) and whose end-of-sequence token (2) is often the argmax."""
    m = _tiny()
    m.generation_config.repetition_penalty = 1.5
    m.generation_config.no_repeat_ngram_size = 2
    with torch.no_grad():
        m.lm_head.weight[2] *= 3.0
    return m


def _hand_loop(m, x, n):
    """argmax(logits[:, -1]) of full forward passes, each token fed back (no cache)."""
    emb = m.get_input_embeddings()
    toks = []
    with torch.no_grad():
        for _ in range(n):
            t = m(inputs_embeds=x, use_cache=False).logits[:, -1].float().argmax(-1)
            toks.append(t)
            x = torch.cat([x, emb(t)[:, None]], 1)
    return torch.stack(toks, 1)


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_decode_equals_hand_loop_from_embeddings(tricky, use_cache):
    x = torch.as_tensor(np.random.default_rng(0).standard_normal((24, 3, D)).astype(np.float32))
    hand = _hand_loop(tricky, x, 10)
    assert (hand == 2).any(1).sum() >= 3  # eos is often the argmax: a stop would show
    got = _hf.greedy_decode(tricky, 10, inputs_embeds=x, use_cache=use_cache)
    assert got.shape == (24, 10) and got.dtype == torch.long
    torch.testing.assert_close(got, hand, rtol=0, atol=0)
    assert tricky.generation_config.repetition_penalty == 1.5  # the model's config restored


def test_greedy_decode_equals_hand_loop_from_ids(tricky):
    ids = torch.as_tensor(np.random.default_rng(1).integers(3, VOCAB, (16, 5)))
    emb = tricky.get_input_embeddings()
    with torch.no_grad():
        hand = _hand_loop(tricky, emb(ids), 8)
    got = _hf.greedy_decode(tricky, 8, input_ids=ids)
    torch.testing.assert_close(got, hand, rtol=0, atol=0)


def test_greedy_decode_bad_input(tricky):
    x = torch.zeros(2, 3, D)
    with pytest.raises(TypeError, match="exactly one"):
        _hf.greedy_decode(tricky, 2)
    with pytest.raises(TypeError, match="exactly one"):
        _hf.greedy_decode(tricky, 2, inputs_embeds=x, input_ids=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="n_new"):
        _hf.greedy_decode(tricky, 0, inputs_embeds=x)
    with pytest.raises(TypeError, match="generate"):
        _hf.greedy_decode(torch.nn.Linear(2, 2), 2, inputs_embeds=x)


def test_unwrap_and_parts():
    m = _tiny()
    hf, tok, name, src = _hf.unwrap(m)
    assert hf is m and tok is None and name == "LlamaForCausalLM" and src is None
    wrapped = SimpleNamespace(model=m, tokenizer="T", name="tiny", source_dtype="float32")
    assert _hf.unwrap(wrapped) == (m, "T", "tiny", "float32")
    with pytest.raises(TypeError, match="LoadedModel"):
        _hf.unwrap(np.zeros(3))
    with pytest.raises(TypeError, match="torch module"):
        _hf.unwrap(SimpleNamespace(model="x", tokenizer=None))
    assert _hf.vocab_rows(m) == VOCAB and _hf.config_vocab(m) == VOCAB
    # the missing-part error is both a TypeError and a ValueError
    for exc in (TypeError, ValueError):
        with pytest.raises(exc, match="input embeddings"):
            _hf.input_embeddings(torch.nn.Linear(2, 2))
        with pytest.raises(exc, match="unembedding"):
            _hf.output_embeddings(m.model)


def test_special_tokens_one_rule():
    m = _tiny()
    # no tokenizer: the config's bos (1), eos (2), pad (None)
    assert _hf.special_token_ids(m, None) == {1, 2}
    tok = SimpleNamespace(all_special_ids=[0, 5, None])
    assert _hf.special_token_ids(m, tok) == {0, 5}
    np.testing.assert_array_equal(_hf.allowed_token_ids(m, tok, 8), [1, 2, 3, 4, 6, 7])
    with pytest.raises(ValueError, match="no non-special"):
        _hf.allowed_token_ids(m, SimpleNamespace(all_special_ids=[0, 1]), 2)


def test_embed_rows_includes_a_scale_inside_the_module():
    m = _tiny()

    class Scaled(torch.nn.Embedding):
        def forward(self, ids):
            return super().forward(ids) * 4.0

    e = Scaled(VOCAB, D)
    e.weight.data.copy_(m.get_input_embeddings().weight.data)
    ids = torch.arange(VOCAB)
    plain = _hf.embed_rows(m.get_input_embeddings(), ids)
    torch.testing.assert_close(_hf.embed_rows(e, ids, chunk=7), 4.0 * plain)


def test_prefix_and_start_token():
    m = _tiny()
    emb = m.get_input_embeddings()
    M = torch.randn(2, 3, D)
    x = _hf.prefix(M, emb, 1, torch.float32)
    assert x.shape == (2, 4, D)
    torch.testing.assert_close(x[:, 0], emb(torch.ones(2, dtype=torch.long)).detach())
    assert _hf.prefix(M, emb, None, torch.float32).shape == (2, 3, D)
    assert _hf.resolve_start_token(m, None, "auto", VOCAB) == 1
    assert _hf.resolve_start_token(m, SimpleNamespace(bos_token_id=7), "auto", VOCAB) == 7
    with pytest.raises(ValueError, match="start_token"):
        _hf.resolve_start_token(m, None, VOCAB, VOCAB)


def test_frozen_restores_flags_and_mode():
    m = _tiny()
    m.train()
    with _hf.frozen(m):
        assert not m.training and not any(p.requires_grad for p in m.parameters())
    assert m.training and all(p.requires_grad for p in m.parameters())


# ------------------------------------------------------------------ one home per job


def _library_sources():
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in (ROOT / "embgeom").rglob("*.py")}


@pytest.mark.parametrize("pattern, home", [
    (r"def _?cache_kwarg\b", None),          # generate() chooses the cache argument itself
    (r"\.generate\(", "embgeom/_hf.py"),
    (r"def _?(unwrap|resolve_model)\b", "embgeom/_hf.py"),
    (r"def _?(resolve_start_token)\b", "embgeom/_hf.py"),
    (r"def _?prefix\b", "embgeom/_hf.py"),
    (r"all_special_ids", "embgeom/_hf.py"),
    (r"get_(input|output)_embeddings\(\)\.weight", None),  # through _hf's checked getters
    (r"def _?(jsonable|json_default)\b", None),
    (r"def to_jsonable\b", "embgeom/_json.py"),
])
def test_one_home(pattern, home):
    hits = sorted(f for f, text in _library_sources().items() if re.search(pattern, text))
    assert hits == ([] if home is None else [home]), hits


@pytest.mark.parametrize("path", [
    "embgeom/_hf.py", *(f"embgeom/adapters/{p.name}" for p in sorted((ROOT / "embgeom" / "adapters").glob("*.py"))),
    "embgeom/copying/plots.py", "embgeom/copying/_run.py", "embgeom/report/_build.py",
    "embgeom/report/figures.py", "embgeom/volumes.py", "embgeom/cli.py",
    "embgeom/cramming/plots.py", "embgeom/cramming/_run.py",
])
def test_no_backend_switch_or_environment_change(path):
    text = (ROOT / path).read_text()
    assert "matplotlib.use(" not in text and "import matplotlib.pyplot" not in text
    if path != "embgeom/cli.py":  # the application entry point may set its own environment
        assert "os.environ" not in text


def test_json_writers_use_the_one_converter():
    """Every json.dump(s) that writes a file or a line goes through embgeom._json; the two
    digests (settings hash, hidden-state cache key) hash json text and are not writers."""
    allowed = {"embgeom/_json.py", "embgeom/cramming/_curve.py", "embgeom/adapters/_sample.py"}
    mine = ["embgeom/_hf.py", *(f"embgeom/adapters/{p.name}" for p in sorted((ROOT / "embgeom" / "adapters").glob("*.py"))),
            *(f"embgeom/copying/{p.name}" for p in (ROOT / "embgeom" / "copying").glob("*.py")),
            *(f"embgeom/report/{p.name}" for p in (ROOT / "embgeom" / "report").glob("*.py")),
            "embgeom/cli.py", *(f"embgeom/cramming/{p.name}" for p in
                               (ROOT / "embgeom" / "cramming").glob("*.py"))]
    for f in mine:
        text = (ROOT / f).read_text()
        if f not in allowed:
            assert not re.search(r"(?<!_)json\.dump", text), f
    assert "hashlib.sha256(json.dumps(settings, sort_keys=True)" in (
        ROOT / "embgeom/cramming/_curve.py").read_text()


# ------------------------------------------------------------------ the caller's torch state


def _dropout_tiny():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                     resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, bos_token_id=0,
                     eos_token_id=0)
    return GPT2LMHeadModel(cfg).train()


def test_frozen_restores_a_mixed_mode():
    m = _tiny().train()
    m.model.layers[1].eval()
    modes = [x.training for x in m.modules()]
    with pytest.raises(RuntimeError):
        with _hf.frozen(m):
            assert not any(x.training for x in m.modules())
            raise RuntimeError("body fails")
    assert [x.training for x in m.modules()] == modes
    assert all(p.requires_grad for p in m.parameters())


def test_measuring_sets_and_restores_the_state():
    """Inside: eval, no grad, no autocast, float32 default dtype; after: the caller's, also when
    the body raises."""
    m = _dropout_tiny()
    m.transformer.h[0].eval()
    modes = [x.training for x in m.modules()]
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(KeyError):
            with _hf.measuring(m):
                assert not any(x.training for x in m.modules())
                assert not torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
                assert torch.get_default_dtype() == torch.float32
                raise KeyError("body fails")
        assert torch.get_default_dtype() == torch.float64 and torch.is_grad_enabled()
        with _hf.measuring(m, grad=True):
            assert torch.is_grad_enabled()
    finally:
        torch.set_default_dtype(old)
    assert [x.training for x in m.modules()] == modes


def test_greedy_decode_ignores_train_mode_and_autocast():
    """A model left in train mode (dropout 0.1) decodes as in eval mode, inside an enclosing
    bf16 autocast too, and stays in train mode; the reference is a hand loop in eval mode."""
    m = _dropout_tiny()
    prompts = torch.randint(0, VOCAB, (6, 4), generator=torch.Generator().manual_seed(1))
    m.eval()
    with torch.no_grad():
        x, hand = prompts, []
        for _ in range(8):
            t = m(input_ids=x, use_cache=False).logits[:, -1].argmax(-1)
            hand.append(t)
            x = torch.cat([x, t[:, None]], 1)
    hand = torch.stack(hand, 1)
    m.train()
    assert torch.equal(_hf.greedy_decode(m, 8, input_ids=prompts, use_cache=False), hand)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(_hf.greedy_decode(m, 8, input_ids=prompts), hand)
    assert m.training and all(x.training for x in m.modules())


def test_embed_rows_under_the_callers_autocast_and_default_dtype():
    m = _tiny()
    emb = m.get_input_embeddings()
    ref = emb.weight.detach()[:5].clone()
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = _hf.embed_rows(emb, range(5))
    finally:
        torch.set_default_dtype(old)
    assert got.dtype == torch.float32 and torch.equal(got, ref)


def test_check_positions_names_the_argument():
    m = _tiny()  # max_position_embeddings 128
    _hf.check_positions(m, 128, "lengths")
    with pytest.raises(ValueError, match=r"^lengths: 129 positions \(1 start token \+ 128\) exceed "
                       r"the model's maximum position \(128 tokens\)"):
        _hf.check_positions(m, 129, "lengths", "1 start token + 128")
    no_max = SimpleNamespace(config=SimpleNamespace(vocab_size=VOCAB))
    _hf.check_positions(no_max, 10**6, "lengths")  # no maximum known: nothing to check
