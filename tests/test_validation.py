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
