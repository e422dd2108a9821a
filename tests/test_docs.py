"""The documentation: the site builds without a warning, every public name has an API entry,
the docstrings' references to docs/theory.md land on real sections, the quickstart is short."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ("cells", "volumes", "supports", "bounds", "adapters", "cramming", "copying", "report",
          "parallel")
HAVE_MKDOCS = all(importlib.util.find_spec(m) is not None
                  for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built with ``mkdocs build --strict`` (any warning fails the build)."""
    if not HAVE_MKDOCS:
        pytest.skip("needs the docs extra: pip install -e '.[docs]' (the Makefile installs it)")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                          "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def test_site_builds_strict(site):
    for page in ("index.html", "theory.html", "paper.html", "api/index.html"):
        assert (site / page).exists(), page


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_name_has_an_api_entry(site, module):
    """Each name of a module's __all__ has its own anchor on the module's API page, rendered from
    the numpydoc docstring (a "Parameters" or "Returns" table where the docstring has one)."""
    html = (site / "api" / f"{module}.html").read_text()
    mod = importlib.import_module(f"embgeom.{module}")
    missing = [n for n in mod.__all__ if not re.search(rf'id="embgeom\.[\w.]*\b{n}"', html)]
    assert not missing, f"embgeom.{module}: no API entry for {missing}"
    assert "Parameters:" in html or "Returns:" in html


def test_no_reference_to_a_missing_theory_file():
    hits = [str(p.relative_to(ROOT)) for p in (ROOT / "embgeom").rglob("*.py")
            if "THEORY.md" in p.read_text()]
    assert not hits, hits


def test_theory_section_references_exist():
    """``docs/theory.md, section N "Title"`` in a docstring names a heading that exists."""
    theory = (ROOT / "docs" / "theory.md").read_text()
    headings = {m.group(1): m.group(2).strip()
                for m in re.finditer(r"^#{2,3} (\d+(?:\.\d+)?)\.? (.+)$", theory, re.M)}
    refs = []
    for p in list((ROOT / "embgeom").rglob("*.py")) + list((ROOT / "benchmarks").glob("*.py")):
        text = " ".join(p.read_text().split())
        for m in re.finditer(r'docs/theory\.md,? (?:sections? |)(\d+(?:\.\d+)?)(?: "([^"]+)")?', text):
            refs.append((p.name, m.group(1), m.group(2)))
        for m in re.finditer(r'docs/theory\.md,? sections [\d.]+ "[^"]+" and (\d+(?:\.\d+)?) "([^"]+)"', text):
            refs.append((p.name, m.group(1), m.group(2)))
    assert len(refs) >= 10
    for name, num, title in refs:
        assert num in headings, (name, num)
        if title:
            assert headings[num].startswith(title), (name, num, title, headings[num])


def _quickstart(path: Path) -> str:
    text = path.read_text()
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def test_quickstarts_print_no_array():
    """The README's and docs/index.md's first Python block print short lines, never a
    support's ``to_dict()`` or a hidden state (576 floats)."""
    for path in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        code = _quickstart(path)
        for line in code.splitlines():
            if "print(" in line:
                assert "to_dict" not in line and "H)" not in line and "H[" not in line, line


@pytest.mark.realmodel
def test_index_quickstart_runs_and_prints_one_short_line(smollm2, monkeypatch, capsys):
    from embgeom import adapters

    monkeypatch.setattr(adapters, "load_model", lambda *a, **k: smollm2)
    exec(compile(_quickstart(ROOT / "docs" / "index.md"), "docs/index.md", "exec"), {})
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and len(out[0]) < 120 and out[0].startswith("ball: radius "), out
