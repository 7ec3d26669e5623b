"""A grid of cells run in parallel processes into one results folder, resumable.

Layout: ``<root>/<cell.key>/`` per cell (``requests.csv``, ``load.csv``, ``summary.json``)
and ``<root>/index.csv``, one row per complete cell folder under the root: its cell's
fields, then its summary (whose ``requests`` is the count simulated). Resume rule: a
cell whose ``summary.json`` parses (:func:`done_summary`; the simulator writes it last),
whose ``requests.csv`` holds that many rows, and which records the settings this code
gives the cell (:func:`recorded_config`) is not run again; a folder made under other
defaults, or whose records were cut short (a partial copy), is run again, and said so.
Changes that no setting records (the routing core's, a workload generator's or the
simulator's code) are not rerun but named: each ``summary.json`` records the code's fingerprint
(:func:`~kvcompass.loadgen.sim.fingerprint.code_fingerprint`), and a grid resumed over
cells another version made says how many; to regenerate them, use a new ``--out``.
``kvcompass sim sweep`` and every simulator-based report run their cells through
:func:`run_grid`.
"""

from __future__ import annotations

import csv
import ctypes
import ctypes.util
import dataclasses
import fcntl
import gc
import json
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kvcompass.loadgen.sim.cell import Cell, recorded_config, write_cell
from kvcompass.loadgen.sim.fingerprint import code_fingerprint
from kvcompass.loadgen.sim.records import LoadSample

__all__ = ["CellRunner", "done_summary", "product", "run_grid"]

#: Runs one cell and writes its folder (a module-level function, to pickle to workers).
CellRunner = Callable[[Cell, Path], None]

#: What :func:`_stale` shows for a setting one side does not record.
_ABSENT = "(absent)"


def product(
    base: Cell, policies: Iterable[str], rates: Iterable[float], seeds: Iterable[int]
) -> list[Cell]:
    """The base cell at every policy × rate × seed."""
    return [
        dataclasses.replace(base, policy=p, rate=r, seed=s)
        for p in policies
        for r in rates
        for s in seeds
    ]


def done_summary(folder: Path, cell: Cell | None = None) -> dict[str, Any] | None:
    """The cell's summary if its run completed (summary.json is written last) and, given
    the cell, was made with the settings this code gives it."""
    record = _record(folder)
    if record is None or _damage(folder, record) is not None:
        return None
    if cell is not None and _stale(record, cell) is not None:
        return None
    summary: dict[str, Any] = record["summary"]
    return summary


def _stale(record: dict[str, Any], cell: Cell) -> str | None:
    """The first setting in which a finished run's record differs from what this code
    gives ``cell`` (``"config.routing.remote_margin_rtt: 0.0 → 1.0"``), or None."""
    return _difference(record.get("config"), recorded_config(cell), "config")


def _record(folder: Path) -> dict[str, Any] | None:
    """A complete ``summary.json`` (its summary and the config it ran with), or None."""
    try:
        record = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("summary"), dict) else None


#: load.csv's first line, as ``SimResult.write`` writes it.
_LOAD_HEADER = ",".join(f.name for f in dataclasses.fields(LoadSample)).encode()


def _damage(folder: Path, record: dict[str, Any]) -> str | None:
    """What is wrong with a finished cell's records (cut short or gone, e.g. by a partial
    copy of the results), or None: ``requests.csv`` has one row per request its summary
    counts; ``load.csv`` (no count to check) has its header and ends with a whole line."""
    try:
        with open(folder / "requests.csv", "rb") as f:
            lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        return "no requests.csv"
    rows, expected = lines - 1, record["summary"].get("requests")
    if rows != expected:
        return f"requests.csv holds {rows} of {expected} rows"
    try:
        with open(folder / "load.csv", "rb") as f:
            header = f.readline().rstrip(b"\r\n")
            f.seek(-1, os.SEEK_END)  # the header's newline at least is there
            last = f.read(1)
    except OSError:
        return "no load.csv, or an empty one"
    if header != _LOAD_HEADER:
        return f"load.csv starts {header[:40]!r}, not its header"
    return None if last == b"\n" else "load.csv ends mid-line"


def _difference(recorded: Any, expected: Any, where: str) -> str | None:
    if isinstance(recorded, dict) and isinstance(expected, dict):
        for key in sorted(recorded.keys() | expected.keys()):
            found = _difference(
                recorded.get(key, _ABSENT), expected.get(key, _ABSENT), f"{where}.{key}"
            )
            if found is not None:
                return found
        return None
    return None if recorded == expected else f"{where}: {recorded!r} → {expected!r}"


def run_grid(
    cells: Sequence[Cell],
    root: Path,
    *,
    jobs: int = 1,
    runner: CellRunner = write_cell,
    progress: bool = False,
    on_done: Callable[[Cell, bool], None] | None = None,
) -> dict[Cell, Path]:
    """Run every cell not done yet (in this process with ``jobs`` 1, else in ``jobs``
    processes), write ``index.csv`` and return each cell's folder. ``on_done(cell,
    skipped)`` after each cell; a failed cell stops the grid, finished cells stay done.
    One grid at a time per ``root``: another waits for it, then resumes over its cells."""
    root.mkdir(parents=True, exist_ok=True)
    with _one_grid_at_a_time(root):
        return _run_grid(cells, root, jobs, runner, progress, on_done)


@contextmanager
def _one_grid_at_a_time(root: Path) -> Iterator[None]:
    """An exclusive lock on ``root``. Two reports sharing an ``--out`` (fig12 and fig13
    both need fig12's focus-rate cells) would otherwise run and write the same cell
    folders at once; the second now says whom it waits for, and then finds them done."""
    with open(root / ".grid.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another run"
            tqdm.write(f"waiting for {holder}, which runs a grid under {root}", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}")
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run_grid(
    cells: Sequence[Cell],
    root: Path,
    jobs: int,
    runner: CellRunner,
    progress: bool,
    on_done: Callable[[Cell, bool], None] | None,
) -> dict[Cell, Path]:
    folders = {cell: root / cell.key for cell in cells}
    todo, damaged, stale, other_code = [], [], [], []
    code = code_fingerprint()
    for cell, folder in folders.items():
        record = _record(folder)
        if record is None:
            todo.append(cell)
        elif (damage := _damage(folder, record)) is not None:
            (folder / "summary.json").unlink()  # as for a stale cell, below
            todo.append(cell)
            damaged.append(f"{folder.name} ({damage})")
        elif (setting := _stale(record, cell)) is not None:
            # Gone before the rerun starts, so an interrupted rerun is not taken as done.
            (folder / "summary.json").unlink()
            todo.append(cell)
            stale.append(f"{folder.name} ({setting.removeprefix('config.')})")
        else:
            if record.get("code") != code:
                other_code.append(f"{folder.name} ({record.get('code', _ABSENT)} → {code})")
            if on_done is not None:
                on_done(cell, True)
    if damaged:
        tqdm.write(
            f"running {len(damaged)} finished cell(s) under {root} again: their records are "
            f"damaged, e.g. {damaged[0]}",
            file=sys.stderr,
        )
    if stale:
        tqdm.write(
            f"running {len(stale)} finished cell(s) under {root} again: made with other "
            f"settings than this code gives them, e.g. {stale[0]}",
            file=sys.stderr,
        )
    if other_code:
        tqdm.write(
            f"keeping {len(other_code)} finished cell(s) under {root} that other code "
            f"made (its fingerprint differs, e.g. {other_code[0]}); their results may "
            "differ from this code's: use a new --out to regenerate them",
            file=sys.stderr,
        )
    with tqdm(total=len(todo), desc="simulations", unit="run", disable=not progress) as bar:
        for cell in _finished(todo, folders, jobs, runner):
            bar.update()
            if on_done is not None:
                on_done(cell, False)
    _write_index(root)
    return folders


def _finished(
    todo: Sequence[Cell], folders: dict[Cell, Path], jobs: int, runner: CellRunner
) -> Iterator[Cell]:
    """Run the cells, yielding each as it finishes."""
    if jobs <= 1:
        for cell in todo:
            _run_one((runner, cell, folders[cell]))
            yield cell
    elif todo:
        # Leaving the pool terminates its workers: on Ctrl-C or a failed cell the grid
        # stops now, rather than waiting for every queued cell (a ProcessPoolExecutor's
        # shutdown did, and hung after Ctrl-C). A killed cell has no summary.json yet,
        # so a resumed grid runs it again.
        with multiprocessing.Pool(min(jobs, len(todo)), initializer=_worker_signals) as pool:
            work = [(runner, cell, folders[cell]) for cell in todo]
            yield from pool.imap_unordered(_run_one, work)


def _worker_signals() -> None:
    """In a worker: Ctrl-C is the parent's to handle, and the parent's SIGTERM (its
    ``terminate``) ends the worker silently, whatever handler the fork inherited."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run_one(work: tuple[CellRunner, Cell, Path]) -> Cell:
    runner, cell, folder = work
    try:
        runner(cell, folder)
    finally:
        _give_back_memory()
    return cell


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    return trim


_MALLOC_TRIM = _malloc_trim()


def _give_back_memory() -> None:
    """Return to the OS what a finished cell freed. glibc keeps freed heap pages for
    reuse, so a process running cell after cell grew to several times one cell's peak
    (three 60,000-request cells at 2 lambda0 in one process: 1.23, 2.20, 2.83 GB; trimmed
    after each, 1.23, 1.33, 1.33 GB)."""
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _write_index(root: Path) -> Path:
    """``index.csv``: every complete cell folder under ``root``, by folder name."""
    rows = []
    for summary_path in sorted(root.glob("*/summary.json")):
        try:
            data = json.loads(summary_path.read_text())
            summary, cell = data["summary"], data.get("config", {}).get("cell", {})
        except (OSError, ValueError, KeyError, TypeError):
            continue  # an interrupted cell
        rows.append({"folder": summary_path.parent.name} | cell | summary)
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    path = root / "index.csv"
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, list(names))
        writer.writeheader()
        writer.writerows(rows)
    return path
