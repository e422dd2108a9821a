"""The hidden-state cache of ``sample_hidden_states``: keyed by the weights, robust to bad files.

Issue 12, kind 4: two tiny Qwen2 models with the same config and different weights (or two
fine-tuning runs' ``checkpoint-500`` folders) must never share a cache entry; a corrupt or
truncated cache file is recomputed with a warning naming it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embgeom import adapters
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
    assert len(list(tmp_path.glob("*.npz"))) == 2
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


def _rewrite(path, H, key=None):
    """Overwrite a cache file with ``H`` under its own stored key (or ``key``)."""
    with np.load(path) as f:
        stored = str(f["key"][()]) if key is None else key
    with open(path, "wb") as fh:
        np.savez(fh, H=H, key=np.array(stored))


@pytest.mark.parametrize("damage", ["truncate", "garbage", "wrong_shape", "nan", "other_key",
                                    "plain_npy", "missing_key"])
def test_corrupt_or_mismatched_cache_file_is_recomputed_with_a_warning(tmp_path, damage):
    model = _qwen2(0)
    H, _ = sample_hidden_states(model, cache_dir=tmp_path, **ARGS)
    (path,) = tmp_path.glob("*.npz")
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
        path.write_bytes(b"not a numpy file at all")
    elif damage == "wrong_shape":
        _rewrite(path, np.zeros((3, D), dtype=np.float32))
    elif damage == "nan":
        bad = H.copy()
        bad[1, 2] = np.nan
        _rewrite(path, bad)
    elif damage == "other_key":  # e.g. another model's file renamed or copied onto this name
        _rewrite(path, H + 1, key='{"version": 4, "weights": "someone else"}')
    elif damage == "plain_npy":  # the format of version 3, or any .npy
        with open(path, "wb") as fh:
            np.save(fh, H)
    else:
        with open(path, "wb") as fh:
            np.savez(fh, H=H)
    with pytest.warns(RuntimeWarning, match=f"cache file {path}.*recomputing"):
        H2, _ = sample_hidden_states(model, cache_dir=tmp_path, **ARGS)
    np.testing.assert_array_equal(H2, H)
    with np.load(path) as f:  # rewritten whole, with its key
        np.testing.assert_array_equal(f["H"], H)
    sample_hidden_states(model, cache_dir=tmp_path, **ARGS)  # now trusted: no warning


def test_unwritable_cache_folder_warns_and_returns_the_result(tmp_path):
    model = _qwen2(0)
    blocker = tmp_path / "a-file"
    blocker.write_text("no folder can be made below a file\n")
    with pytest.warns(RuntimeWarning, match="cannot write cache file"):
        H, _ = sample_hidden_states(model, cache_dir=blocker / "cache", **ARGS)
    np.testing.assert_array_equal(H, sample_hidden_states(model, **ARGS)[0])


# ------------------------------------------------------------------ the default folder, the key


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    root = tmp_path / "embgeom-cache"
    monkeypatch.setenv("EMBGEOM_CACHE", str(root))
    return root


def test_default_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBGEOM_CACHE", str(tmp_path / "e"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert adapters.default_cache_dir() == tmp_path / "e" / "hidden_states"
    monkeypatch.setenv("EMBGEOM_CACHE", "")  # empty counts as unset, as for XDG variables
    assert adapters.default_cache_dir() == tmp_path / "x" / "embgeom" / "hidden_states"
    monkeypatch.delenv("EMBGEOM_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert adapters.default_cache_dir() == tmp_path / "home" / ".cache" / "embgeom" / "hidden_states"


def test_auto_caches_in_the_default_folder_and_a_second_call_skips_the_model(cache_env, monkeypatch):
    model = _qwen2(0)
    H, _ = sample_hidden_states(model, cache_dir="auto", **ARGS)
    (path,) = (cache_env / "hidden_states").glob("hidden_*.npz")
    _no_model_run(monkeypatch)
    np.testing.assert_array_equal(sample_hidden_states(model, cache_dir="auto", **ARGS)[0], H)


def test_the_session_never_writes_the_real_home_cache():
    """conftest points EMBGEOM_CACHE at a temporary folder for the whole session."""
    import os
    import tempfile
    from pathlib import Path

    root = Path(os.environ["EMBGEOM_CACHE"])
    assert root.name.startswith("embgeom-test-cache-") and root.parent == Path(tempfile.gettempdir())
    assert adapters.default_cache_dir().parent == root


def test_cache_dir_of_the_wrong_type_is_refused():
    with pytest.raises(TypeError, match="^cache_dir: expected None, 'auto' or a folder path"):
        sample_hidden_states(_qwen2(0), cache_dir=3, **ARGS)


def _key(model, **over):
    args = {"lengths": [3, 5], "n": 4, "seed": 0, **over}
    allowed = np.arange(2, VOCAB, dtype=np.int64)
    return _sample._cache_key(model, allowed, args["lengths"], args["n"], args["seed"])


def test_the_key_covers_what_changes_the_states_and_nothing_else():
    base = _key(_qwen2(0))
    # what changes the states: each changes the key
    assert _key(_qwen2(0), seed=1) != base
    assert _key(_qwen2(0), n=5) != base
    assert _key(_qwen2(0), lengths=[3, 6]) != base
    assert _key(_qwen2(0).to(torch.float64)) != base  # precision of the weights
    assert _key(_qwen2(0).to(torch.bfloat16)) != base
    eager = _qwen2(0)
    eager.config._attn_implementation = "eager"
    assert _key(eager) != base
    allowed = np.arange(3, VOCAB, dtype=np.int64)  # another text source: other token ids
    assert _sample._cache_key(_qwen2(0), allowed, [3, 5], 4, 0) != base
    # what does not: the mode, requires_grad, the name, dropout settings
    m = _qwen2(0).train()
    for p in m.parameters():
        p.requires_grad_(False)
    m.config._name_or_path = "elsewhere/checkpoint-500"
    m.config.attention_dropout = 0.1
    assert _key(m) == base
    assert {"torch", "transformers", "version", "text"} <= set(base)
