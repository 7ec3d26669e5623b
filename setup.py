"""Build hook for the compiled modules: every ``shared/kvcompass/**/*.pyx``, by Cython.

Everything else is configured in pyproject.toml. Each .pyx names its compiler flags and
Cython directives in its own header, so this build and ``cythonize -i`` agree, given
numpy's include directory (``CFLAGS=-I$(python -c 'import numpy; print(numpy.get_include())')``,
as bench/sim_ab.py passes it).
"""

from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import setup

ROOT = Path(__file__).parent
# Relative paths: shared/ holds no __init__.py, so kvcompass/routing/score.pyx is the
# module kvcompass.routing.score.
sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "shared").rglob("*.pyx"))
extensions = cythonize(sources, quiet=True)
for extension in extensions:
    # kvcompass.ndarrays makes arrays through numpy's C API (its headers); the others
    # cimport only its function, but one include path for all is simpler.
    extension.include_dirs.append(numpy.get_include())
setup(ext_modules=extensions)
