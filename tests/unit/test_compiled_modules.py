"""The compiled modules run compiled, and from their source: the Cython modules
(``shared/kvcompass/**/*.pyx``) and the Python that mypyc compiles (pyproject's
``[tool.kvcompass] mypyc``).

An edited source whose module was not built again would run the old code in every test;
scripts/_env.sh rebuilds it, and this fails with the command when it did not run.
"""

from __future__ import annotations

import importlib
import tomllib
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "shared"
SOURCES = sorted(SHARED.rglob("*.pyx"))
with open(ROOT / "pyproject.toml", "rb") as f:
    MYPYC_SOURCES = [ROOT / s for s in tomllib.load(f)["tool"]["kvcompass"]["mypyc"]]


def _module_name(source: Path) -> str:
    return ".".join(source.relative_to(SHARED).with_suffix("").parts)


def _mypyc_module_name(source: Path) -> str:
    if source.is_relative_to(SHARED):
        return _module_name(source)
    # pyproject's package-dir maps loadgen/ to kvcompass.loadgen
    return ".".join(("kvcompass", *source.relative_to(ROOT).with_suffix("").parts))


COMPILED = [(_module_name(s), s) for s in SOURCES] + [
    (_mypyc_module_name(s), s) for s in MYPYC_SOURCES
]


def test_there_are_compiled_modules() -> None:
    assert SOURCES, f"no .pyx under {SHARED}"
    assert MYPYC_SOURCES, "pyproject names no module for mypyc"
    assert all(s.is_file() for s in MYPYC_SOURCES), MYPYC_SOURCES


@pytest.mark.parametrize(("module_name", "source"), COMPILED, ids=[name for name, _ in COMPILED])
def test_module_is_compiled_from_its_current_source(module_name: str, source: Path) -> None:
    module = importlib.import_module(module_name)
    assert isinstance(module.__loader__, ExtensionFileLoader), (
        f"{module_name} was imported from {module.__file__}, not compiled"
    )
    # Found beside the source: a mypyc module's __file__ names a path below its group's
    # library instead.
    built = [
        path
        for path in (source.with_suffix(suffix) for suffix in EXTENSION_SUFFIXES)
        if path.is_file()
    ]
    assert built, f"no compiled {module_name} beside {source}"
    assert built[0].stat().st_mtime >= source.stat().st_mtime, (
        f"{built[0].name} is older than {source.name}: build it again (scripts/test does, "
        "or pip install --no-deps -e .)"
    )


@pytest.mark.parametrize("source", SOURCES, ids=_module_name)
def test_module_has_its_types_beside_it(source: Path) -> None:
    assert source.with_suffix(".pyi").is_file(), f"{source.name} has no .pyi for mypy"
