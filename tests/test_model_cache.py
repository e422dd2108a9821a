"""The converted-GGUF model cache of ``load_model``.

A GGUF file is dequantised once and kept as a float32 safetensors folder under
``<cache root>/models``; later loads read that folder. What can be wrong: another model than the
GGUF one (weights, tie, tokenizer, logits), a hidden-state cache key that changes between the two
loads (a second ``make run`` would recompute its states), a damaged entry that crashes instead of
converting again, a failed write that breaks the load, an entry that another file or converter
could read.
"""

from __future__ import annotations

import json
import logging
import os
import stat

import numpy as np
import pytest
import torch

from embgeom.adapters import _load, _sample, load_model, logits, unembedding

from test_adapters import VOCAB, _tiny

transformers = pytest.importorskip("transformers")


def test_the_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBGEOM_CACHE", str(tmp_path / "root"))
    monkeypatch.delenv("EMBGEOM_MODEL_CACHE", raising=False)
    assert _load._converted_root() == tmp_path / "root" / "models"
    monkeypatch.setenv("EMBGEOM_MODEL_CACHE", "0")
    assert _load._converted_root() is None
    monkeypatch.setenv("EMBGEOM_MODEL_CACHE", "1")
    monkeypatch.delenv("EMBGEOM_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _load._converted_root() == tmp_path / "xdg" / "embgeom" / "models"
    # an EMBGEOM_CACHE that is a file is refused as the hidden-state cache refuses it
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("EMBGEOM_CACHE", str(tmp_path / "file"))
    with pytest.raises(ValueError, match="EMBGEOM_CACHE"):
        _load._converted_root()


def test_the_entry_is_keyed_on_the_bytes_of_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBGEOM_CACHE", str(tmp_path / "c"))
    a, b, c = tmp_path / "m.gguf", tmp_path / "copy" / "m.gguf", tmp_path / "n.gguf"
    b.parent.mkdir()
    a.write_bytes(b"GGUF" + bytes(range(200)))
    b.write_bytes(a.read_bytes())
    c.write_bytes(b"GGUF" + bytes(range(199)) + b"\1")  # one byte differs
    fa, fb, fc = (_load._converted_folder(p) for p in (a, b, c))
    assert fa == fb and fa != tmp_path / "c" / "models" and fa.parent == tmp_path / "c" / "models"
    assert fc != fa and fc.name.startswith("n-")
    assert f"tf{transformers.__version__}" in fa.name and fa.name.endswith(
        f"-v{_load._CONVERTED_FORMAT}")


def test_a_converted_folder_round_trips_the_model(tmp_path):
    """_save_converted on a tiny tied model: the folder loads with the same weights, the same
    logits, the tie kept, and the same hidden-state key (config and weights)."""
    model, _ = _tiny("qwen2")
    model.config.tie_word_embeddings = True
    model.tie_weights()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    # what a GGUF load carries in its config, and the cache must drop
    model.config.quantization_config = {"quant_method": "gguf", "gguf_file": "m.gguf",
                                        "dequantize": False}
    folder = tmp_path / "entry"
    _load._save_converted(model, None, folder)
    assert (folder / "embgeom_complete").is_file() and (folder / "model.safetensors").is_file()
    assert not list(tmp_path.glob("entry.*"))  # no temporary sibling left
    back, tok = _load._from_pretrained(folder, str(folder), {}, False)
    assert tok is None
    assert back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()
    assert getattr(back.config, "quantization_config", None) is None
    sa, sb = model.state_dict(), back.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    np.testing.assert_array_equal(logits(back, ids), logits(model.eval(), ids))
    assert _sample._weights_fingerprint(back) == _sample._weights_fingerprint(model)


def test_another_quantisation_config_stays_in_the_key():
    cfg = {"hidden_size": 8, "quantization_config": {"quant_method": "bitsandbytes", "bits": 4}}
    assert "quantization_config" in _sample._result_config(cfg)
    cfg["quantization_config"] = {"quant_method": "gguf", "gguf_file": "x.gguf"}
    assert "quantization_config" not in _sample._result_config(cfg)


def test_a_failed_write_warns_and_leaves_nothing(tmp_path, caplog):
    model, _ = _tiny("qwen2")
    (tmp_path / "file").write_text("not a folder")
    with caplog.at_level("WARNING", logger="embgeom.adapters"):
        _load._save_converted(model, None, tmp_path / "file" / "entry")
    assert "could not cache the converted model" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_complete_entry_written_meanwhile_is_no_warning(tmp_path, caplog):
    """Two processes converting the same file: the second rename fails on the first one's
    complete folder, which is what was wanted (the capacity runs start two at once)."""
    model, _ = _tiny("qwen2")
    _load._save_converted(model, None, tmp_path / "entry")
    with caplog.at_level("WARNING", logger="embgeom.adapters"):
        _load._save_converted(model, None, tmp_path / "entry")
    assert caplog.text == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def _word_tokenizer():
    """A tiny word-level fast tokenizer over VOCAB ids, built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def _fake_gguf(tmp_path, monkeypatch, *, tokenizer=None, family="qwen2"):
    """A .gguf path whose loads are recorded instead of done: (path, calls)."""
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF fake")
    calls = []
    model, _ = _tiny(family)

    def fake_from_pretrained(p, folder, kw, progress):
        calls.append((str(p), dict(kw)))
        if kw.get("gguf_file"):
            return model, tokenizer
        return _real_from_pretrained(p, folder, kw, progress)

    monkeypatch.setenv("EMBGEOM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_load, "_gguf_source_dtype", lambda p: "gguf Q8_0")
    monkeypatch.setattr(_load, "_from_pretrained", fake_from_pretrained)
    return path, calls


_real_from_pretrained = _load._from_pretrained


def test_the_second_load_reads_the_entry_and_a_damaged_one_converts_again(
        tmp_path, monkeypatch, caplog):
    path, calls = _fake_gguf(tmp_path, monkeypatch)
    first = load_model(path, progress=False)
    entry = _load._converted_folder(path)
    assert calls == [(str(path), {"gguf_file": "m.gguf"})] and (entry / "embgeom_complete").is_file()
    second = load_model(path, progress=False)
    assert calls[1] == (str(entry), {}) and len(calls) == 2
    assert second.source == path and second.source_dtype == first.source_dtype == "gguf Q8_0"
    assert second.name == first.name == "m"
    # an entry without its completion marker is never read
    (entry / "embgeom_complete").unlink()
    load_model(path, progress=False)
    assert calls[2] == (str(path), {"gguf_file": "m.gguf"})
    # a damaged entry (truncated weights) warns and converts again
    assert (entry / "embgeom_complete").is_file()
    w = entry / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    caplog.clear()
    with caplog.at_level("WARNING", logger="embgeom.adapters"):
        again = load_model(path, progress=False)
    assert "cannot be used" in caplog.text and "model.safetensors changed" in caplog.text
    assert "converting" in caplog.text and "pass a Hugging Face folder" not in caplog.text
    assert calls[-1] == (str(path), {"gguf_file": "m.gguf"})
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(4))
    np.testing.assert_array_equal(logits(again, ids), logits(first, ids))


def _damage_tensor(entry):
    """Drop one tensor from the entry's safetensors file (a valid, readable file)."""
    from safetensors.torch import load_file, save_file

    w = entry / "model.safetensors"
    tensors = load_file(str(w))
    dropped = next(k for k in sorted(tensors) if "layers.1.mlp" in k)
    del tensors[dropped]
    save_file(tensors, str(w), metadata={"format": "pt"})


def _damage_config(entry):
    """A valid config.json with one layer fewer."""
    import json

    cfg = json.loads((entry / "config.json").read_text())
    cfg["num_hidden_layers"] -= 1
    if "layer_types" in cfg:  # Qwen2 checks its per-layer list against the count
        cfg["layer_types"] = cfg["layer_types"][:-1]
    (entry / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("damage", [_damage_tensor, _damage_config], ids=["tensor", "config"])
def test_a_readable_but_changed_entry_is_never_the_model(tmp_path, monkeypatch, caplog, damage):
    """transformers loads both damaged folders without an error (random weights for the missing
    tensor, a shallower model for the config), so only the manifest can tell: the load warns,
    converts again from the GGUF file, gives the GGUF model's logits, and rewrites the entry."""
    path, calls = _fake_gguf(tmp_path, monkeypatch)
    first = load_model(path, progress=False)
    entry = _load._converted_folder(path)
    damage(entry)
    # the damaged folder does load, into another model: what a silent wrong number would be
    wrong, _ = _real_from_pretrained(entry, str(entry), {}, False)
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(4))
    assert not np.array_equal(logits(wrong, ids), logits(first, ids))
    caplog.clear()
    with caplog.at_level("WARNING", logger="embgeom.adapters"):
        again = load_model(path, progress=False)
    assert "cannot be used" in caplog.text and "changed after it was written" in caplog.text
    assert calls[-1] == (str(path), {"gguf_file": "m.gguf"})
    np.testing.assert_array_equal(logits(again, ids), logits(first, ids))
    assert _load._entry_problem(entry)[0] is None  # rewritten
    third = load_model(path, progress=False)
    assert calls[-1] == (str(entry), {})
    np.testing.assert_array_equal(logits(third, ids), logits(first, ids))


def test_an_entry_with_extra_or_missing_files_or_an_old_marker_converts_again(tmp_path,
                                                                              monkeypatch, caplog):
    path, calls = _fake_gguf(tmp_path, monkeypatch)
    load_model(path, progress=False)
    entry = _load._converted_folder(path)
    assert _load._entry_problem(entry)[0] is None
    # a second weights index would change what transformers reads
    (entry / "model.safetensors.index.json").write_text("{}")
    assert "not in it ['model.safetensors.index.json']" in _load._entry_problem(entry)[0]
    load_model(path, progress=False)
    assert calls[-1][1] == {"gguf_file": "m.gguf"} and _load._entry_problem(entry)[0] is None
    (entry / "generation_config.json").unlink()
    assert "missing ['generation_config.json']" in _load._entry_problem(entry)[0]
    (entry / _load._MARKER).write_text("{ not json")
    assert "manifest is unreadable (JSONDecodeError" in _load._entry_problem(entry)[0]
    (entry / _load._MARKER).write_text('{"format": 1, "files": 3}')
    assert "not a manifest of this cache layout" in _load._entry_problem(entry)[0]
    load_model(path, progress=False)
    # the bare "1" that entries held before manifests: converted again without a warning
    (entry / _load._MARKER).write_text("1\n")
    assert _load._entry_problem(entry)[0] == _load._NO_MANIFEST
    n = len(calls)
    caplog.clear()
    with caplog.at_level("INFO", logger="embgeom.adapters"):
        load_model(path, progress=False)
    assert "predates the cache's manifests" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert calls[n][1] == {"gguf_file": "m.gguf"} and _load._entry_problem(entry)[0] is None


def test_a_saved_tokenizer_that_no_longer_loads_converts_again(tmp_path, monkeypatch, caplog):
    tok = _word_tokenizer()
    path, calls = _fake_gguf(tmp_path, monkeypatch, tokenizer=tok, family="llama")
    load_model(path, progress=False)
    entry = _load._converted_folder(path)
    manifest = _load._entry_problem(entry)[1]
    assert manifest["has_tokenizer"] is True and "tokenizer.json" in manifest["files"]
    second = load_model(path, progress=False)
    assert calls[-1] == (str(entry), {}) and second.tokenizer("w3 w5").input_ids == [3, 5]
    # garbage in tokenizer.json, with the manifest rewritten to match it: the hashes pass,
    # the tokenizer does not load, and an entry saved with a tokenizer must give one
    (entry / "tokenizer.json").write_text("{ not json")
    (entry / _load._MARKER).write_text(json.dumps(_load._manifest(entry, has_tokenizer=True)))
    caplog.clear()
    with caplog.at_level("WARNING", logger="embgeom.adapters"):
        third = load_model(path, progress=False)
    assert "its tokenizer does not load" in caplog.text
    assert calls[-1] == (str(path), {"gguf_file": "m.gguf"})
    assert third.tokenizer("w3 w5").input_ids == [3, 5]
    assert _load._entry_problem(entry)[0] is None


def test_a_tokenizer_that_would_load_back_as_another_is_not_cached(tmp_path, monkeypatch,
                                                                     caplog):
    """transformers 5 loads a generic fast tokenizer saved beside a qwen2 config as an empty
    Qwen2Tokenizer (every text gives no ids): such an entry would be a silently wrong model, so
    none is written, with a warning, and every load converts the GGUF file."""
    tok = _word_tokenizer()
    path, calls = _fake_gguf(tmp_path, monkeypatch, tokenizer=tok, family="qwen2")
    with caplog.at_level("WARNING", logger="embgeom.adapters"):
        first = load_model(path, progress=False)
    assert "does not load back the same" in caplog.text and "Qwen2Tokenizer" in caplog.text
    entry = _load._converted_folder(path)
    assert not entry.exists() and not list(entry.parent.iterdir())  # no temporary left
    assert first.tokenizer("w3 w5").input_ids == [3, 5]
    load_model(path, progress=False)
    assert [kw for _, kw in calls] == [{"gguf_file": "m.gguf"}] * 2


def test_the_log_says_where_the_model_came_from(tmp_path, monkeypatch, caplog):
    path, _ = _fake_gguf(tmp_path, monkeypatch)
    entry = _load._converted_folder(path)
    with caplog.at_level("INFO", logger="embgeom.adapters"):
        load_model(path, progress=False)
        assert f"cached in {entry}" in caplog.text
        caplog.clear()
        load_model(path, progress=False)
    assert f"model from the converted cache {entry}" in caplog.text


def test_an_entry_has_the_umask_permissions_of_a_new_folder(tmp_path):
    model, _ = _tiny("qwen2")
    old = os.umask(0o022)
    try:
        _load._save_converted(model, None, tmp_path / "entry")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "entry").stat().st_mode) == 0o755


def test_no_cache_when_switched_off(tmp_path, monkeypatch):
    path, calls = _fake_gguf(tmp_path, monkeypatch)
    monkeypatch.setenv("EMBGEOM_MODEL_CACHE", "0")
    load_model(path, progress=False)
    load_model(path, progress=False)
    assert [kw for _, kw in calls] == [{"gguf_file": "m.gguf"}] * 2
    assert not (tmp_path / "cache").exists()


def test_smollm2_from_the_cache_is_the_gguf_model(smollm2, caplog):
    """The session fixture converted SmolLM2's GGUF into the tests' temporary cache; a second
    load reads that folder and gives the same model: every tensor bit for bit, the tie, the
    tokenizer's ids, the logits, the unembedding's facts and the hidden-state cache key."""
    entry = _load._converted_folder(smollm2.source)
    assert (entry / "embgeom_complete").is_file()
    lm = load_model("smollm2-135m", progress=False)
    assert lm.model.config._name_or_path == str(entry)
    assert lm.source == smollm2.source and lm.source_dtype == smollm2.source_dtype
    sa, sb = smollm2.model.state_dict(), lm.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert _sample._weights_fingerprint(lm.model) == _sample._weights_fingerprint(smollm2.model)
    text = "The decoder's cells partition the hidden-state space. 12345 ünïcødé"
    assert lm.tokenizer(text).input_ids == smollm2.tokenizer(text).input_ids
    assert lm.tokenizer.eos_token_id == smollm2.tokenizer.eos_token_id
    ua, ub = unembedding(smollm2), unembedding(lm)
    assert ub.tied is True and ua.to_dict() == ub.to_dict()
    ids = torch.randint(0, 49152, (2, 12), generator=torch.Generator().manual_seed(7))
    np.testing.assert_array_equal(logits(lm, ids), logits(smollm2, ids))
