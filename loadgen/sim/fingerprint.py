"""Which code a simulation ran: a fingerprint of the sources that decide its results.

Every ``summary.json`` records it, so that a results folder kept across code changes
says which of its cells another version made (:func:`kvcompass.loadgen.sim.grid.run_grid`
names them). The settings a cell runs with are recorded apart (``config``); this covers
what no setting records: the routing core, the index, the worker model, the workload
generators and the simulator itself.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path

import kvcompass

__all__ = ["code_fingerprint", "fingerprint_of"]

_SUFFIXES = (".py", ".toml")


def fingerprint_of(roots: Sequence[Path]) -> str:
    """16 hex digits of SHA-256 over every source file (``.py``, ``.toml``) under
    ``roots``, with its path relative to its root, in a fixed order; caches and compiled
    files do not count."""
    digest = hashlib.sha256()
    for i, root in enumerate(roots):
        files = sorted(p for p in root.rglob("*") if p.suffix in _SUFFIXES and p.is_file())
        for path in files:
            digest.update(f"{i}:{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def code_fingerprint() -> str:
    """The fingerprint of this installation's core library, simulator and workloads."""
    simulator = Path(__file__).parent  # kvcompass.loadgen.sim, beside .workloads
    return fingerprint_of(
        [Path(kvcompass.__file__).parent, simulator, simulator.parent / "workloads"]
    )
