"""Package-level facts: the public API is re-exported, and the geometry never imports torch."""

from __future__ import annotations

import subprocess
import sys

import embgeom


def test_geometry_does_not_import_torch():
    code = (
        "import sys, embgeom\n"
        "import embgeom.cells, embgeom.volumes, embgeom.supports, embgeom.bounds\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_public_api_reexported():
    for name in embgeom.__all__:
        assert getattr(embgeom, name) is not None, name
    assert embgeom.fit_support is embgeom.supports.fit_support
    assert embgeom.adapters.load_model.__module__.startswith("embgeom.adapters.")


def test_every_public_callable_has_a_docstring():
    import inspect

    missing = []
    for modname in ("cells", "volumes", "supports", "bounds", "adapters", "cramming", "copying",
                    "report"):
        mod = getattr(embgeom, modname)
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if callable(obj) and not (inspect.getdoc(obj) or "").strip():
                missing.append(f"{modname}.{name}")
    assert not missing, missing


def test_package_metadata_follows_current_packaging():
    """SPDX license expression with a LICENSE file (PEP 639), classifiers, URLs, py.typed."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    meta = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "MIT"
    assert (root / "LICENSE").read_text().startswith("MIT License")
    assert "Typing :: Typed" in meta["classifiers"]
    assert meta["urls"]["Paper"].startswith("https://arxiv.org/")
    assert (root / "embgeom" / "py.typed").exists()


def test_light_imports():
    """``import embgeom`` and ``embgeom.bounds`` stay light: no torch, scipy.signal, scipy.stats or
    scikit-learn at import time (the supports, scikit-learn estimators, load on first use)."""
    code = (
        "import sys, embgeom, embgeom.bounds\n"
        "heavy = ('torch', 'scipy.signal', 'scipy.stats', 'sklearn', 'matplotlib')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "embgeom.Ball\n"
        "print('sklearn' in sys.modules, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True False"], out.stdout
