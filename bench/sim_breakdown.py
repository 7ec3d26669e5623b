"""bench/sim.py's per-component times, in a process of its own (bench/sim.py starts it).

Usage: python bench/sim_breakdown.py KIND RATE COUNT SEED RESYNC

The modules mypyc compiles (pyproject's ``[tool.kvcompass] mypyc``) are imported from
their source here, so that the timers can wrap their objects' methods (a compiled
object's cannot be replaced). Everything else, the Cython modules and the numba kernels
included, runs as in the headline. The components are the same code either way; the
Python around them runs interpreted, so ``total`` is this run's, above the headline's.
Prints one JSON object: :func:`sim.run`'s, with ``us_per_request`` and ``us_per_call``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def module_name(source: str) -> str:
    """The module a listed source is: shared/ holds the kvcompass package, and
    pyproject's package-dir maps loadgen/ and services/ into it."""
    path = Path(source).with_suffix("")
    if path.parts[0] == "shared":
        return ".".join(path.parts[1:])
    return ".".join(("kvcompass", *path.parts))


class FromSource(importlib.abc.MetaPathFinder):
    """Finds the listed modules' source before any compiled build of them."""

    def __init__(self, sources: dict[str, Path]) -> None:
        self.sources = sources

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(name)
        return None if source is None else importlib.util.spec_from_file_location(name, source)


def main() -> None:
    if len(sys.argv) != 6:
        sys.exit(__doc__.splitlines()[2])
    kind, rate, count, seed, resync = sys.argv[1:]
    sys.path.insert(0, str(ROOT / "bench"))
    from sim_ab import mypyc_sources  # imports no kvcompass module

    listed = mypyc_sources(ROOT)
    sys.meta_path.insert(0, FromSource({module_name(s): ROOT / s for s in listed}))
    import sim  # bench/sim.py, over the interpreted modules

    requests = sim.workload(kind, float(rate), int(count), int(seed))
    # Load the kernels before the clock starts, as bench/sim.py does.
    sim.run("kvcompass", sim.workload("short", 50.0, 50, int(seed)), int(seed), timed=False)
    timed = sim.run("kvcompass", requests, int(seed), timed=True, resync=resync == "True")
    print(json.dumps(timed))


if __name__ == "__main__":
    main()
