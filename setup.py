"""Build hook for the compiled modules.

- Every ``shared/kvcompass/**/*.pyx``, by Cython. Each .pyx names its compiler flags and
  Cython directives in its own header, so this build and ``cythonize -i`` agree, given
  numpy's include directory (``CFLAGS=-I$(python -c 'import numpy; print(numpy.get_include())')``).
- The plain typed Python that pyproject's ``[tool.kvcompass] mypyc`` lists (the
  simulator's loop, pool and index plane, the KVCompass policy, the event publisher, the
  maintenance writer), by mypyc: the glue between the compiled parts that every
  simulated request runs through, 1.3x faster compiled (loadgen/sim/README.md). Their
  source stays the reference: imported without this build, they run as they are.

Everything else is configured in pyproject.toml. ``python setup.py build_ext --inplace``
builds both in place, as ``pip install -e .`` does (bench/sim_ab.py builds a revision so).
"""

import os
import tomllib
from pathlib import Path

import numpy
from Cython.Build import cythonize
from mypyc.build import mypycify
from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent


def cython_extensions() -> list[Extension]:
    # Relative paths: shared/ holds no __init__.py, so kvcompass/routing/score.pyx is the
    # module kvcompass.routing.score.
    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "shared").rglob("*.pyx"))
    extensions = cythonize(sources, quiet=True)
    for extension in extensions:
        # kvcompass.ndarrays makes arrays through numpy's C API (its headers); the others
        # cimport only its function, but one include path for all is simpler.
        extension.include_dirs.append(numpy.get_include())
    return extensions


def mypyc_extensions() -> list[Extension]:
    # mypyc type-checks what it compiles, here with what the build has installed: no
    # config file (pyproject's strict flags are for the full environment), imports it
    # cannot find typed as Any, and errors reported for the compiled modules alone.
    os.environ["MYPYPATH"] = os.pathsep.join(("shared", "typecheck"))
    options = [
        "--config-file=",
        "--python-version=3.11",
        "--explicit-package-bases",
        "--ignore-missing-imports",
        "--follow-imports=silent",
    ]
    with open(ROOT / "pyproject.toml", "rb") as f:
        sources = tomllib.load(f)["tool"]["kvcompass"]["mypyc"]
    # shared/ holds the kvcompass package; the others are named through typecheck/,
    # whose symlinks map loadgen/ to kvcompass/loadgen as package-dir does. One group,
    # so their calls to each other stay native; its library is kvcompass.compiled__mypyc
    # (below a package whose import imports nothing else).
    paths = [s if s.startswith("shared/") else f"typecheck/kvcompass/{s}" for s in sources]
    return mypycify([*options, *paths], opt_level="3", group_name="kvcompass.compiled")


os.chdir(ROOT)  # every path above is relative to the project
setup(ext_modules=[*cython_extensions(), *mypyc_extensions()])
