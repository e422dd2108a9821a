"""The one seed rule, the one integer-array check (embgeom._validation) and the one JSON
converter (embgeom._json)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from embgeom import _json
from embgeom._validation import check_int_array, check_seed, seed_sequence


def _strict(text):
    def refuse(c):
        raise ValueError(f"non-strict JSON constant {c}")

    return json.loads(text, parse_constant=refuse)


# ------------------------------------------------------------------ seeds


def _default_rng_inputs():
    return [None, 0, 7, np.int64(7), np.uint8(3), [1, 2, 3], np.array([4, 5]),
            np.random.SeedSequence(11), np.random.PCG64(12), np.random.Philox(13),
            np.random.default_rng(14)]


@pytest.mark.parametrize("seed", _default_rng_inputs(), ids=lambda s: type(s).__name__)
def test_check_seed_accepts_every_default_rng_input(seed):
    g = check_seed(seed)
    assert isinstance(g, np.random.Generator)
    if seed is not None and not isinstance(seed, (np.random.BitGenerator, np.random.Generator)):
        # the same stream numpy gives for the same input
        np.testing.assert_array_equal(g.random(4), np.random.default_rng(seed).random(4))


def test_check_seed_returns_a_generator_unchanged():
    g = np.random.default_rng(0)
    assert check_seed(g) is g


@pytest.mark.parametrize("bad, exc", [(True, TypeError), (1.0, TypeError), ("3", TypeError),
                                      ([1.5], TypeError), (-1, ValueError), ([1, -2], ValueError),
                                      ({"a": 1}, TypeError)])
def test_check_seed_refuses(bad, exc):
    with pytest.raises(exc, match="seed"):
        check_seed(bad)


def test_seed_sequence_int_keys_equal_entropy_lists():
    """For an int, keys append to the entropy: the streams of default_rng([seed, *keys])."""
    for seed, keys in [(0, ()), (3, (1, 2)), (2**40, (5,))]:
        a = np.random.default_rng(seed_sequence(seed, *keys)).random(3)
        b = np.random.default_rng([seed, *keys]).random(3)
        np.testing.assert_array_equal(a, b)
    assert seed_sequence(5).generate_state(2).tolist() == \
        np.random.SeedSequence(5).generate_state(2).tolist()


def test_seed_sequence_for_spawning():
    root = np.random.SeedSequence(9)
    assert seed_sequence(root) is root
    child = seed_sequence(root, 4)
    assert child.entropy == root.entropy and child.spawn_key == (4,)
    # two calls on one Generator: two independent children; the same seed: the same children
    g1, g2 = np.random.default_rng(1), np.random.default_rng(1)
    a, b = seed_sequence(g1), seed_sequence(g1)
    assert a.spawn_key != b.spawn_key
    assert seed_sequence(g2).spawn_key == a.spawn_key
    # chunked streams as in cell_volumes: spawn from the root
    kids = seed_sequence(3).spawn(2)
    assert [k.spawn_key for k in kids] == [(0,), (1,)]
    with pytest.raises(ValueError, match="keys"):
        seed_sequence(1, -1)
    with pytest.raises(TypeError, match="seed"):
        seed_sequence(1.5)


# ------------------------------------------------------------------ integer arrays


def test_check_int_array():
    out = check_int_array([[1, 2], [3, 4]], "ids", ndim=2, low=0, high=5)
    assert out.dtype == np.int64 and out.flags.c_contiguous and out.tolist() == [[1, 2], [3, 4]]
    assert check_int_array(np.array([7], np.uint16), "x").dtype == np.int64
    torch = pytest.importorskip("torch")
    assert check_int_array(torch.tensor([3, 4]), "x").tolist() == [3, 4]
    with pytest.raises(TypeError, match="ids: expected integers"):
        check_int_array([1.0, 2.0], "ids")  # whole floats are not ids
    with pytest.raises(TypeError, match="ids"):
        check_int_array([True, False], "ids")
    with pytest.raises(TypeError, match="ids"):
        check_int_array(None, "ids")
    with pytest.raises(ValueError, match="non-empty"):
        check_int_array([], "ids")
    assert check_int_array([], "ids", allow_empty=True).dtype == np.int64
    with pytest.raises(ValueError, match=r"ids: values must lie in \[0, 5\), got range \[0, 5\]"):
        check_int_array([0, 5], "ids", low=0, high=5)
    with pytest.raises(ValueError, match=r"\[1, inf\)"):
        check_int_array([0], "lengths", low=1)
    with pytest.raises(ValueError, match="ndim"):
        check_int_array([[1]], "ids", ndim=1)
    with pytest.raises(ValueError, match="shape"):
        check_int_array([[1, 2]], "ids", shape=(None, 3))
    with pytest.raises(ValueError, match="int64"):
        check_int_array(np.array([2**64 - 1], np.uint64), "ids")


# ------------------------------------------------------------------ JSON


@dataclass
class _Point:
    x: float
    y: int


def test_to_jsonable_one_rule():
    obj = {
        1: np.float32(0.5), "nan": float("nan"), "inf": np.inf, "ninf": -np.float64("inf"),
        "arr": np.array([[1.0, np.nan], [np.inf, 2.0]]), "i": np.int64(3), "b": np.bool_(True),
        "t": (1, 2), "p": Path("a/b"), "s": {2, 1}, "d": _Point(float("nan"), 4),
        "none": None, "str": "x",
    }
    got = _json.to_jsonable(obj)
    assert got == {"1": 0.5, "nan": None, "inf": None, "ninf": None,
                   "arr": [[1.0, None], [None, 2.0]], "i": 3, "b": True, "t": [1, 2],
                   "p": "a/b", "s": [1, 2], "d": {"x": None, "y": 4}, "none": None, "str": "x"}
    assert type(got["i"]) is int and type(got["b"]) is bool and type(got["1"]) is float
    text = _json.dumps(obj)
    assert _strict(text) == got
    # finite floats keep their exact value through the text
    assert _strict(_json.dumps({"v": 0.1 + 0.2}))["v"] == 0.1 + 0.2
    with pytest.raises(TypeError, match=r"\$\.f"):
        _json.to_jsonable({"f": object()})


def test_dump_writes_strict_json(tmp_path):
    p = _json.dump({"a": [math.nan, 1.0]}, tmp_path / "x.json")
    assert _strict(p.read_text()) == {"a": [None, 1.0]}
    # the standard library alone would write NaN, which a strict parser refuses
    with pytest.raises(ValueError, match="non-strict"):
        _strict(json.dumps({"a": math.nan}))


# ---------------------------------------------------------------------------------------------
# The one door for arrays: torch half precision and pandas nullable dtypes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, bits", [("bfloat16", 8), ("float16", 11)])
def test_check_array_refuses_torch_half_by_name(dtype, bits):
    """Half-precision tensors follow numpy float16's rule: refused, naming argument and dtype
    (never torch's "unsupported ScalarType BFloat16")."""
    torch = pytest.importorskip("torch")
    from embgeom._validation import check_array

    t = torch.ones(3, 4, dtype=getattr(torch, dtype))
    with pytest.raises(TypeError, match=rf"^H: torch.{dtype} input is refused \({bits} significant"):
        check_array(t, "H")
    with pytest.raises(TypeError, match=rf"^ids: expected integers, got dtype torch.{dtype}"):
        check_int_array(t, "ids")
    # the cast the message asks for is accepted, exactly
    np.testing.assert_array_equal(check_array(t.float(), "H"), np.ones((3, 4)))


def test_public_entry_points_refuse_torch_bfloat16_by_name():
    torch = pytest.importorskip("torch")
    from embgeom import Ball, Decoder

    rng = np.random.default_rng(0)
    W = rng.standard_normal((10, 4)).astype(np.float32)
    H = torch.from_numpy(rng.standard_normal((20, 4)).astype(np.float32)).to(torch.bfloat16)
    with pytest.raises(TypeError, match="torch.bfloat16"):
        Decoder(W).assign(H)
    with pytest.raises(TypeError, match="^X: torch.bfloat16"):
        Ball().fit(H)


def test_pandas_nullable_floats_accepted_without_na():
    pd = pytest.importorskip("pandas", reason="pandas is a dev dependency (pip install -e .[dev])")
    from embgeom import Ball
    from embgeom._validation import check_array

    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 3))
    df = pd.DataFrame(X, columns=list("abc")).astype("Float64")
    out = check_array(df, "X", ndim=2)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, X)
    np.testing.assert_array_equal(check_array(df["a"], "x", dtype=None), X[:, 0])
    assert check_array(df.astype("Float32"), "X", dtype=None).dtype == np.float32
    mixed = df.copy()
    mixed["b"] = mixed["b"].astype(np.float64)  # a plain column beside nullable ones
    np.testing.assert_array_equal(check_array(mixed, "X"), X)
    # through a public fit: the same ball as from the numpy array
    assert Ball().fit(df).radius_ == pytest.approx(Ball().fit(X).radius_, rel=1e-12)


def test_pandas_na_refused_as_nan_by_name():
    pd = pytest.importorskip("pandas", reason="pandas is a dev dependency (pip install -e .[dev])")
    from embgeom._validation import check_array

    s = pd.Series([1.0, None, 3.0], dtype="Float64")
    with pytest.raises(ValueError, match=r"^h: contains 1 NaN"):
        check_array(s, "h")
    # with finite=False the NA is a NaN, as documented
    assert np.isnan(check_array(s, "h", finite=False)[1])


def test_pandas_nullable_ints():
    pd = pytest.importorskip("pandas", reason="pandas is a dev dependency (pip install -e .[dev])")
    from embgeom._validation import check_array

    ids = pd.Series([3, 1, 2], dtype="Int64")
    out = check_int_array(ids, "tokens")
    assert out.dtype == np.int64 and out.tolist() == [3, 1, 2]
    with pytest.raises(ValueError, match=r"^tokens: contains 1 missing value\(s\) \(pandas NA\)"):
        check_int_array(pd.Series([3, None], dtype="Int64"), "tokens")
    with pytest.raises(TypeError, match="^tokens: expected integer columns, got pandas dtype"):
        check_int_array(pd.Series([1.0], dtype="Float64"), "tokens")
    # an integer column is not floats, as for numpy integers
    with pytest.raises(TypeError, match="^H: expected real floating-point columns, got pandas dtype.* Int64"):
        check_array(ids, "H")
    with pytest.raises(TypeError, match="string"):
        check_array(pd.Series(["a"], dtype="string"), "H")


def test_support_sample_takes_a_seed_sequence():
    from embgeom import Ball, Box, Cone, Ellipsoid

    rng = np.random.default_rng(1)
    H = rng.standard_normal((60, 3)) + np.array([4.0, 0.0, 0.0])  # in a half-space: a real cone
    for S in (Ball(), Box(), Cone(), Ellipsoid()):
        S.fit(H)
        a = S.sample(5, seed=np.random.SeedSequence(7))
        np.testing.assert_array_equal(a, S.sample(5, seed=7))
        assert S.contains(a).all()
