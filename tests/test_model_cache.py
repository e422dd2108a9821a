"""The converted-GGUF model cache of ``load_model``.

A GGUF file is dequantised once and kept as a float32 safetensors folder under
``<cache root>/models``; later loads read that folder. What can be wrong: another model than the
GGUF one (weights, tie, tokenizer, logits), a hidden-state cache key that changes between the two
loads (a second ``make run`` would recompute its states), a damaged entry that crashes instead of
converting again, a failed write that breaks the load, an entry that another file or converter
could read.
"""

from __future__ import annotations

import logging

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


def _fake_gguf(tmp_path, monkeypatch):
    """A .gguf path whose loads are recorded instead of done: (path, calls)."""
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF fake")
    calls = []
    model, _ = _tiny("qwen2")

    def fake_from_pretrained(p, folder, kw, progress):
        calls.append((str(p), dict(kw)))
        if kw.get("gguf_file"):
            return model, None
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
    assert "does not load" in caplog.text and "converting" in caplog.text
    assert calls[-1] == (str(path), {"gguf_file": "m.gguf"})
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(4))
    np.testing.assert_array_equal(logits(again, ids), logits(first, ids))


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
