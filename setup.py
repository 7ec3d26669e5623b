"""Build hook for the compiled modules: every ``shared/kvcompass/**/*.pyx``, by Cython.

Everything else is configured in pyproject.toml. Each .pyx names its compiler flags and
Cython directives in its own header, so this build and ``cythonize -i`` agree.
"""

from pathlib import Path

from Cython.Build import cythonize
from setuptools import setup

ROOT = Path(__file__).parent
# Relative paths: shared/ holds no __init__.py, so kvcompass/routing/score.pyx is the
# module kvcompass.routing.score.
sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "shared").rglob("*.pyx"))
setup(ext_modules=cythonize(sources, quiet=True))
