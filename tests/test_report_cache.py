"""The report caches its hidden states by default (issue 22, item 4): a second run skips them.

``build_report(cache_dir="auto")`` and ``embgeom report`` (without ``--no-cache``) store the
sampled hidden states in the user's cache folder, ``$EMBGEOM_CACHE`` here (conftest points it
at a temporary folder for the session; each test below points it at its own).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

from embgeom.adapters import _sample  # noqa: E402

SIZES = dict(lengths=[2, 4], n_per_length=20, heldout_lengths=[3], n_heldout_per_length=40,
             n_calibration_per_length=0, n_cell_samples=1000, cram_summary=None, seed=0,
             progress=False, quick=True)


@pytest.fixture(scope="module")
def tiny():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from embgeom.adapters import LoadedModel

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      initializer_range=0.3, tie_word_embeddings=False, attn_implementation="eager")
    return LoadedModel(model=LlamaForCausalLM(cfg).eval(), tokenizer=None, name="tiny-llama",
                       source=Path("tiny"), source_dtype="float32 (random init)")


def _no_sampling(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("hidden states were computed although they were cached")

    monkeypatch.setattr(_sample, "_hidden", boom)


class _Stop(Exception):
    pass


def _samples_of_a_report(tiny, out, monkeypatch):
    """Run build_report up to its sampling phase and return the samples it got (the phases
    after it cost seconds and do not touch the cache)."""
    from embgeom.report import _build, build_report

    def stop(samples, *a, **k):
        raise _Stop(samples)

    monkeypatch.setattr(_build, "_hidden_phase", stop)
    with pytest.raises(_Stop) as info:
        build_report(tiny, out, **SIZES)
    return info.value.args[0]


def test_second_report_skips_the_hidden_states(tiny, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("EMBGEOM_CACHE", str(cache))
    first = _samples_of_a_report(tiny, tmp_path / "r1", monkeypatch)
    files = sorted((cache / "hidden_states").glob("hidden_tiny-llama_*.npz"))
    assert len(files) == 2  # the fit sample and the fresh sample (seed + 1)
    _no_sampling(monkeypatch)
    second = _samples_of_a_report(tiny, tmp_path / "r2", monkeypatch)
    for name in ("H", "lengths", "fresh"):
        np.testing.assert_array_equal(second[name], first[name])


def test_report_records_where_its_hidden_states_came_from(tiny, tmp_path, monkeypatch):
    """hidden_states.sources says, per sample, cache hit / written / rebuilt / off, with the
    file; a user reading report.json can tell a cached run from a fresh one."""
    import warnings

    from embgeom.report._hidden import _sources_line

    cache = tmp_path / "cache"
    monkeypatch.setenv("EMBGEOM_CACHE", str(cache))
    first = _samples_of_a_report(tiny, tmp_path / "r1", monkeypatch)["sources"]
    assert set(first) == {"fit", "heldout"}
    assert [first[k]["cache"] for k in ("fit", "heldout")] == ["written", "written"]
    assert (first["fit"]["seed"], first["heldout"]["seed"]) == (0, 1)
    assert first["fit"]["lengths"] == [2, 4] and first["heldout"]["lengths"] == [3]
    assert Path(first["fit"]["path"]).is_file() and first["fit"]["path"] != first["heldout"]["path"]
    second = _samples_of_a_report(tiny, tmp_path / "r2", monkeypatch)["sources"]
    assert [second[k]["cache"] for k in ("fit", "heldout")] == ["hit", "hit"]
    Path(first["fit"]["path"]).write_bytes(b"garbage")  # a corrupt entry
    with pytest.warns(RuntimeWarning, match="not trusted"):
        third = _samples_of_a_report(tiny, tmp_path / "r3", monkeypatch)["sources"]
    assert third["fit"]["cache"] == "rebuilt" and "unreadable" in third["fit"]["why"]
    assert third["heldout"]["cache"] == "hit"
    line = _sources_line(third)
    assert "fit (seed 0): recomputed" in line and "heldout (seed 1): from the cache" in line
    from embgeom.report import _build, build_report

    def stop(samples, *a, **k):
        raise _Stop(samples)

    monkeypatch.setattr(_build, "_hidden_phase", stop)
    with warnings.catch_warnings(), pytest.raises(_Stop) as info:
        warnings.simplefilter("error")
        build_report(tiny, tmp_path / "r4", cache_dir=None, **SIZES)
    off = info.value.args[0]["sources"]
    assert off["fit"] == {"lengths": [2, 4], "n_per_length": 20, "seed": 0, "cache": "off",
                          "path": None, "why": ""}


@pytest.mark.parametrize("cache_dir", [None, "auto"])
def test_build_report_hands_its_cache_dir_to_the_sampler(tiny, tmp_path, monkeypatch, cache_dir):
    from embgeom.report import build_report

    def spy(model, lengths, n_per_length, batch_size, seed, cache_dir, progress):
        raise _Stop(cache_dir)

    monkeypatch.setattr(_sample, "_sample_with_provenance", spy)
    kw = {} if cache_dir == "auto" else {"cache_dir": cache_dir}  # "auto" is the default
    with pytest.raises(_Stop) as info:
        build_report(tiny, tmp_path / "r", **kw, **SIZES)
    assert info.value.args[0] == cache_dir


@pytest.mark.parametrize("argv, want", [
    ([], "auto"),
    (["--no-cache"], None),
    (["--cache-dir", "{tmp}/mine"], "{tmp}/mine"),
])
def test_cli_cache_flags(argv, want, tmp_path, monkeypatch):
    import embgeom.report
    from embgeom.cli import main

    seen = {}

    def fake(model, out, **kw):
        seen.update(kw)
        return {"summary_lines": ["ok"]}

    monkeypatch.setattr(embgeom.report, "build_report", fake)
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(["report", "--quick", "--out", str(tmp_path / "out"), *argv]) == 0
    want = want if want in (None, "auto") else Path(want.format(tmp=tmp_path))
    assert seen["cache_dir"] == want


def test_cli_cache_dir_and_no_cache_exclude_each_other(tmp_path, capsys):
    from embgeom.cli import main

    with pytest.raises(SystemExit) as info:
        main(["report", "--out", str(tmp_path), "--no-cache", "--cache-dir", str(tmp_path / "c")])
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_default_cache_is_keyed_so_other_sizes_recompute(tiny, tmp_path, monkeypatch):
    """Another seed or size is another entry: nothing stale is reused."""
    monkeypatch.setenv("EMBGEOM_CACHE", str(tmp_path / "cache"))
    H0, _ = _sample.sample_hidden_states(tiny, [2], 5, seed=0, cache_dir="auto", progress=False)
    H1, _ = _sample.sample_hidden_states(tiny, [2], 5, seed=1, cache_dir="auto", progress=False)
    assert not np.array_equal(H0, H1)
    assert len(list((tmp_path / "cache" / "hidden_states").glob("*.npz"))) == 2
