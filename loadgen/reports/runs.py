"""Simulator outputs read back from a run folder (``SimResult.write``'s layout).

Reports read folders rather than live objects so a grid can be plotted again, or
resumed, without re-simulating: ``requests.csv`` and ``load.csv`` become numpy columns.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["Run", "load_run"]

_TEXT = {"request_id", "session", "tenant", "origin", "policy", "worker", "worker_region", "reason"}


@dataclass(frozen=True)
class Run:
    """One simulation: its summary and config, request columns and load-sample columns."""

    summary: Mapping[str, Any]
    config: Mapping[str, Any]
    requests: Mapping[str, NDArray[Any]]
    load: Mapping[str, NDArray[Any]]

    @property
    def size(self) -> int:
        return len(self.requests.get("ttft_ms", ()))


def _columns(path: Path) -> dict[str, NDArray[Any]]:
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = list(reader)
    cols: dict[str, NDArray[Any]] = {}
    for i, name in enumerate(header):
        raw = [row[i] for row in rows]
        cols[name] = np.array(raw, dtype=object if name in _TEXT else np.float64)
    return cols


def load_run(folder: Path) -> Run:
    data = json.loads((folder / "summary.json").read_text())
    return Run(
        summary=data["summary"],
        config=data.get("config", {}),
        requests=_columns(folder / "requests.csv"),
        load=_columns(folder / "load.csv"),
    )
