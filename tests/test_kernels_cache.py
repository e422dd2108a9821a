"""``import embgeom`` (every module of it) where numba has no writable cache location.

numba's ``cache=True`` raises "cannot cache function ...: no locator available" at decoration
time when none of its cache locations can be written: ``NUMBA_CACHE_DIR``, the ``__pycache__``
folder next to the source, the user cache folder (``$XDG_CACHE_HOME/numba``). A read-only
install on a machine without a writable home is such a place. The tests copy the package to a
temporary folder and block every location with a regular file where numba needs a folder
(the tests may run as root, for whom read-only permissions block nothing), then import the copy
in a fresh interpreter, import every module of it and use kernels of both kernel modules
(one compile policy, :mod:`embgeom._numba`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import embgeom

# Uses two kernels (running argmax via Decoder.assign, count_tokens via token counts) and checks
# the answer against a brute-force argmax.
_SCRIPT = """
import warnings
warnings.simplefilter("always")
import numpy as np
import embgeom
from embgeom import _kernels
from embgeom.cells import Decoder
assert embgeom.__file__.startswith({root!r}), embgeom.__file__
rng = np.random.default_rng(0)
W = rng.standard_normal((50, 8)).astype(np.float32)
H = rng.standard_normal((200, 8)).astype(np.float32)
got = Decoder(W).assign(H)
want = (H.astype(np.float64) @ W.T.astype(np.float64)).argmax(1)
assert np.array_equal(np.asarray(got), want), "wrong argmax"
counts = _kernels.count_tokens(np.asarray(want, dtype=np.int64), 50)
assert counts.sum() == 200 and np.array_equal(counts, np.bincount(want, minlength=50))
# every module of the package imports (the rare-event kernels crashed the import of
# embgeom.volumes here while they had a compile policy of their own)
import importlib, pkgutil
names = [m.name for m in pkgutil.walk_packages(embgeom.__path__, "embgeom.")
         if m.name != "embgeom.__main__"]  # __main__ runs the command line
for name in names:
    importlib.import_module(name)
assert {{"embgeom.volumes", "embgeom._rare_kernels", "embgeom._kernels"}} <= set(names)
from embgeom._rare_event import log_cone_gaussian_measure
W0 = np.vstack([np.zeros(3), -np.eye(3)])  # token 0's cell: the positive orthant, share 1/8
r = log_cone_gaussian_measure(W0, [0], n_chains=64, seed=1)
assert abs(r.log_share[0] - 3 * np.log(0.5)) < 1.0, r.log_share
print(f"imported {{len(names)}} modules")
print("OK")
"""


def _copy_package(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    src = Path(embgeom.__file__).resolve().parent
    shutil.copytree(src, root / "embgeom", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # a regular file where numba (and Python) would create the package's __pycache__ folder
    (root / "embgeom" / "__pycache__").write_text("not a folder\n")
    return root


def _run(root: Path, env_extra: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(env_extra)
    env["PYTHONPATH"] = str(root)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(root))], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)


def test_import_works_without_a_writable_cache_location(tmp_path):
    root = _copy_package(tmp_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, so no folder can be made below it\n")
    unwritable = str(blocker / "cache")
    out = _run(root, {"NUMBA_CACHE_DIR": unwritable, "XDG_CACHE_HOME": unwritable,
                      "HOME": unwritable})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("OK")
    # one warning that names the cause, not one per kernel
    assert out.stderr.count("numba found no writable cache location") == 1, out.stderr[-3000:]
    assert "cannot cache function" in out.stderr


def test_writable_cache_location_is_used_without_warning(tmp_path):
    root = _copy_package(tmp_path)
    cache = tmp_path / "numba-cache"
    out = _run(root, {"NUMBA_CACHE_DIR": str(cache)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("OK")
    assert "no writable cache location" not in out.stderr
    # the kernels were cached where NUMBA_CACHE_DIR points
    assert list(cache.rglob("*.nbi")), "numba wrote no cache index"


def test_other_numba_errors_are_not_swallowed(monkeypatch):
    from embgeom import _numba

    def broken(*args, **kwargs):
        raise RuntimeError("some other numba failure")

    monkeypatch.setattr(_numba.numba, "njit", broken)
    with pytest.raises(RuntimeError, match="some other numba failure"):
        _numba.njit("int64(int64)")(lambda x: x)


def test_one_compile_policy():
    # both kernel modules decorate with embgeom._numba.njit, which sets the cache itself
    from embgeom import _kernels, _numba, _rare_kernels

    assert _kernels.njit is _numba.njit and _rare_kernels.njit is _numba.njit
    with pytest.raises(TypeError, match="cache"):
        _numba.njit("int64(int64)", cache=False)
