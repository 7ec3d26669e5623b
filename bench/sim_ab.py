"""Paired comparison of two simulators: CPU seconds of ``Simulation.run``, same records?

Usage: python bench/sim_ab.py [--against REV] [--against-python PY] [--pairs P]
                              [--workload short|mixed|long ...] [--requests N] [--seed S]

The working tree's simulator and git revision ``--against``'s (default ``HEAD``, taken
with ``git archive`` and kept by commit in ``--cache``; ``worktree``: the working tree
itself) run the same workload in processes of their own, alternating which goes first,
``--pairs`` times, so that the drift of a shared machine hurts both alike. A run times
the CPU of ``Simulation.run`` alone (the workload and the compiled kernels are made
before the clock starts) and hashes its records. Per workload: each side's CPU seconds,
``ratio`` (the median over pairs of old ÷ new: above 1, the working tree is faster) and
``identical`` (every run of both sides produced the same records). ``--against-python``
runs the old side with another interpreter, whose environment must hold the project's
dependencies; with ``--against worktree`` that compares interpreters on the same code.

Workloads as ``bench/sim.py`` runs them: ``short`` and ``mixed`` at 500 arrivals per
second with resync, ``long`` Mixed at 1.5 λ0 without resync (give it ``--requests
20000`` to fill caches). A revision's kernels are compiled on its first run (numba caches
them beside its kept source, so only once per commit), outside the clock. Prints one JSON
object; a progress bar on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("short", "mixed", "long")
#: Where revisions are kept, by commit, compiled (this and bench/worker_cache.py).
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvcompass-sim-ab"


def package_root(source: Path, into: Path) -> Path:
    """A folder whose ``kvcompass`` package is ``source``'s, mounted by symlinks as
    pyproject's package-dir maps it: shared/kvcompass, with loadgen and services in it."""
    package = into / "kvcompass"
    package.mkdir(parents=True)
    for entry in (source / "shared" / "kvcompass").iterdir():
        if entry.name not in ("loadgen", "services"):
            (package / entry.name).symlink_to(entry)
    (package / "loadgen").symlink_to(source / "loadgen")
    (package / "services").symlink_to(source / "services")
    return into


def export(rev: str, cache: Path) -> Path:
    """The source folders of git revision ``rev``, kept below ``cache`` by commit: the
    compiled kernels numba caches beside them are reused by the next comparison."""
    resolved = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if resolved.returncode:
        sys.exit(f"cannot take revision {rev!r}: not a commit of {ROOT}")
    commit = resolved.stdout.strip()
    into = cache / commit
    if into.is_dir():
        return into
    listed = subprocess.run(
        ["git", "ls-tree", "--name-only", commit],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    # The packages, and what builds them (setup.py reads pyproject's package-dir and
    # readme, and names mypyc's modules through typecheck/).
    wanted = ("shared", "loadgen", "services", "setup.py", "pyproject.toml", "README.md")
    archive = subprocess.run(
        [
            "git",
            "archive",
            "--format=tar",
            commit,
            *(e for e in (*wanted, "typecheck") if e in listed),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    cache.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=cache))
    try:
        subprocess.run(["tar", "-x", "-C", str(partial)], input=archive.stdout, check=True)
        if mypyc_sources(partial):
            build_in_place(partial)
        else:
            build_compiled(partial / "shared")
        partial.rename(into)  # whole or not at all
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return into


def build_compiled(shared: Path) -> None:
    """Compile a revision's Cython modules in place, as its install would (each .pyx
    names its flags in its header, so ``cythonize -i`` builds it alike)."""
    sources = sorted(str(p.relative_to(shared)) for p in shared.rglob("*.pyx"))
    if sources:
        command = [sys.executable, "-m", "Cython.Build.Cythonize", "-i", "-q", *sources]
        # numpy's headers, as setup.py adds them (kvcompass.ndarrays uses its C API).
        flags = f"{os.environ.get('CFLAGS', '')} -I{numpy.get_include()}".strip()
        env = {**os.environ, "CFLAGS": flags}
        subprocess.run(command, cwd=shared, check=True, capture_output=True, env=env)


def mypyc_sources(root: Path) -> list[str]:
    """The modules a revision's install compiles with mypyc (none before they existed)."""
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return []
    with open(pyproject, "rb") as f:
        sources: list[str] = tomllib.load(f).get("tool", {}).get("kvcompass", {}).get("mypyc", [])
    return sources


def build_in_place(root: Path) -> None:
    """Build a revision's compiled modules, Cython and mypyc, in place with its own
    setup.py, as its install would."""
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        sys.exit(f"building {root} failed:\n{done.stderr[-3000:]}")


def child(kind: str, count: int, seed: int) -> None:
    """One timed run in this process (whose kvcompass is the side's): prints its JSON."""
    from kvcompass.loadgen.reports.cells import no_reuse_capacity
    from kvcompass.loadgen.sim import SimConfig, Simulation
    from sim import TOPOLOGY, workload  # bench/sim.py's workloads, on this side's package

    long = kind == "long"
    rate = 1.5 * no_reuse_capacity(TOPOLOGY.name) if long else 500.0
    requests = workload("mixed" if long else kind, rate, count, seed)
    # Load (or compile) the kernels before the clock starts, as bench/sim.py does.
    Simulation(SimConfig(TOPOLOGY, seed=seed)).run(workload("short", 50.0, 50, seed))
    sim = Simulation(SimConfig(TOPOLOGY, seed=seed, resync=not long))
    gc.collect()
    started = time.process_time()
    result = sim.run(requests)
    cpu_s = time.process_time() - started
    digest = hashlib.sha256()
    for record in result.records:
        digest.update(repr(dataclasses.astuple(record)).encode())
    print(json.dumps({"cpu_s": cpu_s, "records": digest.hexdigest()}))


def timed_run(python: str, root: Path, kind: str, count: int, seed: int) -> dict[str, Any]:
    return child_run(python, root, __file__, [kind, str(count), str(seed)])


def child_run(python: str, root: Path, script: str, args: list[str]) -> dict[str, Any]:
    """``script --child *args`` in a process whose ``kvcompass`` is the package under
    ``root``: the JSON object its last line prints."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [python, script, "--child", *args], env=env, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"{script} {args} on {root} with {python} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def compare(
    sides: dict[str, tuple[str, Path]], kind: str, count: int, seed: int, pairs: int, bar: Any
) -> dict[str, Any]:
    """``pairs`` runs of each side on one workload, alternating which goes first."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    order = list(sides)
    for pair in range(pairs):
        for name in order if pair % 2 == 0 else reversed(order):
            python, root = sides[name]
            runs[name].append(timed_run(python, root, kind, count, seed))
            bar.update(1)
    return {"requests": count, **summary(runs["old"], runs["new"])}


def summary(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> dict[str, Any]:
    """Each side's CPU seconds in run order, the median of the pairs' old ÷ new, and
    whether every run of both sides produced the same records."""
    ratios = [o["cpu_s"] / n["cpu_s"] for o, n in zip(old, new, strict=True)]
    return {
        "old_cpu_s": [round(r["cpu_s"], 3) for r in old],
        "new_cpu_s": [round(r["cpu_s"], 3) for r in new],
        "ratio": round(statistics.median(ratios), 3),
        "identical": len({r["records"] for r in old + new}) == 1,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", default="HEAD", help="git revision of the old side, or worktree")
    p.add_argument("--against-python", default=sys.executable, help="the old side's python")
    p.add_argument("--pairs", type=int, default=3, help="alternating runs of each side")
    p.add_argument("--workload", choices=WORKLOADS, action="append", help="default: short, mixed")
    p.add_argument("--requests", type=int, default=5000, help="requests per run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cache",
        type=Path,
        default=CACHE,
        help="where revisions are kept, by commit, with their compiled kernels",
    )
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        kind, count, seed = args.child
        child(kind, int(count), int(seed))
        return
    if args.pairs < 1 or args.requests < 1:
        p.error("--pairs and --requests must be at least 1")
    kinds = args.workload or ["short", "mixed"]
    with tempfile.TemporaryDirectory(prefix="kvc-sim-ab-") as tmp:
        work = Path(tmp)
        old_source = ROOT if args.against == "worktree" else export(args.against, args.cache)
        sides = {
            "old": (args.against_python, package_root(old_source, work / "old")),
            "new": (sys.executable, package_root(ROOT, work / "new")),
        }
        report: dict[str, Any] = {
            "against": args.against,
            "against_python": args.against_python,
            "python": sys.executable,
            "pairs": args.pairs,
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
        with tqdm(total=2 * args.pairs * len(kinds), unit="run", file=sys.stderr) as bar:
            for kind in kinds:
                report[kind] = compare(sides, kind, args.requests, args.seed, args.pairs, bar)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
