"""Each package's docstring names every module and subpackage it holds, so the first file a newcomer
opens in a folder tells what is there (as the options table is kept true by tools/docs_options.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import wdsprep

ROOT = Path(wdsprep.__file__).parent
PACKAGES = sorted(p.parent for p in ROOT.rglob("__init__.py") if "__pycache__" not in p.parts)


def _held(package: Path) -> set[str]:
    """The modules (without ``.py``) and subpackages of ``package``, private ones and ``__main__`` aside."""
    modules = {p.stem for p in package.glob("*.py") if not p.stem.startswith("_")}
    subpackages = {p.parent.name for p in package.glob("*/__init__.py")}
    return modules | subpackages


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_the_package_docstring_names_what_the_package_holds(package):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    named = set(re.findall(r"``([A-Za-z_][\w]*)(?:\.py|/)?``", doc)) | set(re.findall(r"`([A-Za-z_]\w*)(?:\.py|/)`",
                                                                                       doc))
    missing = sorted(_held(package) - named)
    assert not missing, f"{package.relative_to(ROOT.parent)}/__init__.py does not name {missing}"
    gone = sorted(n for n in set(re.findall(r"``([a-z_][\w]*)\.py``", doc)) if n not in _held(package))
    assert not gone, f"{package.relative_to(ROOT.parent)}/__init__.py names modules it does not hold: {gone}"
