"""The Cython modules (``shared/kvcompass/**/*.pyx``) run compiled, and from their source.

An edited .pyx whose module was not built again would run the old code in every test;
scripts/_env.sh rebuilds it, and this fails with the command when it did not run.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
SOURCES = sorted(SHARED.rglob("*.pyx"))


def _module_name(source: Path) -> str:
    return ".".join(source.relative_to(SHARED).with_suffix("").parts)


def test_there_are_compiled_modules() -> None:
    assert SOURCES, f"no .pyx under {SHARED}"


@pytest.mark.parametrize("source", SOURCES, ids=_module_name)
def test_module_is_compiled_from_its_current_source(source: Path) -> None:
    module = importlib.import_module(_module_name(source))
    built = Path(module.__file__ or "")
    assert built.suffix == ".so", f"{module.__name__} was imported from {built}, not compiled"
    assert built.stat().st_mtime >= source.stat().st_mtime, (
        f"{built.name} is older than {source.name}: build it again (scripts/test does, or "
        "pip install --no-deps -e .)"
    )


@pytest.mark.parametrize("source", SOURCES, ids=_module_name)
def test_module_has_its_types_beside_it(source: Path) -> None:
    assert source.with_suffix(".pyi").is_file(), f"{source.name} has no .pyi for mypy"
