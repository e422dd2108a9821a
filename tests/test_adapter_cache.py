"""The hidden-state cache of ``sample_hidden_states``: keyed by the weights, robust to bad files.

Issue 12, kind 4: two tiny Qwen2 models with the same config and different weights (or two
fine-tuning runs' ``checkpoint-500`` folders) must never share a cache entry; a corrupt or
truncated cache file is recomputed with a warning naming it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embgeom.adapters import _sample
from embgeom.adapters import load_model, sample_hidden_states

transformers = pytest.importorskip("transformers")

VOCAB, D = 64, 16
ARGS = dict(lengths=[3, 5], n_per_length=4, seed=0, progress=False)


def _qwen2(seed: int):
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1,
                                   intermediate_size=32, max_position_embeddings=32,
                                   initializer_range=0.3, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(cfg).eval()


def _no_model_run(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the model ran although the result was cached")

    monkeypatch.setattr(_sample, "_hidden", boom)


def test_same_config_different_weights_never_share_an_entry(tmp_path):
    a, b = _qwen2(0), _qwen2(1)
    assert a.config.to_dict() == b.config.to_dict()
    Ha, _ = sample_hidden_states(a, cache_dir=tmp_path, **ARGS)
    Hb, _ = sample_hidden_states(b, cache_dir=tmp_path, **ARGS)
    assert len(list(tmp_path.glob("*.npy"))) == 2
    np.testing.assert_array_equal(Hb, sample_hidden_states(b, **ARGS)[0])  # b's own states
    assert np.abs(Ha - Hb).max() > 0.1


def test_two_checkpoint_500_folders(tmp_path, monkeypatch):
    """Two runs' folders with the same name and config: each gets its own hidden states, and a
    second call on either loads its own entry without running the model."""
    loaded = []
    for run, seed in (("run-a", 0), ("run-b", 1)):
        folder = tmp_path / run / "checkpoint-500"
        _qwen2(seed).save_pretrained(folder)
        loaded.append(load_model(folder, progress=False))
    assert loaded[0].name == loaded[1].name == "checkpoint-500"
    cache = tmp_path / "cache"
    fresh = [sample_hidden_states(lm, cache_dir=cache, **ARGS)[0] for lm in loaded]
    assert np.abs(fresh[0] - fresh[1]).max() > 0.1
    _no_model_run(monkeypatch)
    for lm, want in zip(loaded, fresh):
        np.testing.assert_array_equal(sample_hidden_states(lm, cache_dir=cache, **ARGS)[0], want)


def test_fingerprint_sees_one_changed_weight_and_ignores_the_name():
    model = _qwen2(0)
    before = _sample._weights_fingerprint(model)
    model.config._name_or_path = "somewhere/else"
    assert _sample._weights_fingerprint(model) == before
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[3, 5] += 1e-6  # one element of one matrix
    assert _sample._weights_fingerprint(model) != before


@pytest.mark.parametrize("damage", ["truncate", "garbage", "wrong_shape", "nan"])
def test_corrupt_cache_file_is_recomputed_with_a_warning(tmp_path, damage):
    model = _qwen2(0)
    H, _ = sample_hidden_states(model, cache_dir=tmp_path, **ARGS)
    (path,) = tmp_path.glob("*.npy")
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
        path.write_bytes(b"not a numpy file at all")
    elif damage == "wrong_shape":
        np.save(path, np.zeros((3, D), dtype=np.float32))
    else:
        bad = H.copy()
        bad[1, 2] = np.nan
        np.save(path, bad)
    with pytest.warns(RuntimeWarning, match=f"cache file {path}.*recomputing"):
        H2, _ = sample_hidden_states(model, cache_dir=tmp_path, **ARGS)
    np.testing.assert_array_equal(H2, H)
    np.testing.assert_array_equal(np.load(path), H)  # rewritten whole


def test_unwritable_cache_folder_warns_and_returns_the_result(tmp_path):
    model = _qwen2(0)
    blocker = tmp_path / "a-file"
    blocker.write_text("no folder can be made below a file\n")
    with pytest.warns(RuntimeWarning, match="cannot write cache file"):
        H, _ = sample_hidden_states(model, cache_dir=blocker / "cache", **ARGS)
    np.testing.assert_array_equal(H, sample_hidden_states(model, **ARGS)[0])
