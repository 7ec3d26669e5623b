"""What every report shares: where outputs go, CSV/JSON writers, a stdout table, figures.

Each artefact writes ``<name>.png`` with ``<name>.csv`` (one row per plotted point) and
``<name>.json`` (the run's parameters and headline numbers) into one output folder.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only

from matplotlib.figure import Figure

__all__ = [
    "Artefact",
    "load_label",
    "render_table",
    "repo_root",
    "save_figure",
    "write_csv",
    "write_json",
]

Row = Mapping[str, Any]


@dataclass
class Artefact:
    """One report's outputs: rows (the CSV and the stdout table), notes and extra JSON."""

    name: str
    columns: Sequence[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def write(self, out: Path, figure: Figure | None) -> list[Path]:
        """Write CSV, JSON and (if given) the PNG into ``out``; return the paths."""
        out.mkdir(parents=True, exist_ok=True)
        paths = [
            write_csv(out / f"{self.name}.csv", self.columns, self.rows),
            write_json(out / f"{self.name}.json", {"artefact": self.name, **self.meta}),
        ]
        if figure is not None:
            paths.append(save_figure(figure, out / f"{self.name}.png"))
        return paths

    def table(self) -> str:
        return render_table(self.columns, self.rows)


def write_csv(path: Path, columns: Sequence[str], rows: Sequence[Row]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_json(path: Path, data: Mapping[str, Any]) -> Path:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    return path


def load_label(load: float, rate: float) -> str:
    """A load as figure titles name it: ``1.5 λ0 (237.1 req/s)``, ``λ0 (158.1 req/s)``."""
    return f"{'' if load == 1 else f'{load:g} '}λ0 ({rate:g} req/s)"


def save_figure(fig: Figure, path: Path) -> Path:
    import matplotlib.pyplot as plt

    if fig.get_layout_engine() is None:  # figures with a colorbar choose their own
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_table(columns: Sequence[str], rows: Sequence[Row]) -> str:
    """A plain fixed-width table (what the command prints)."""
    cells = [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    line = "  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))
    rule = "-" * len(line)
    body = ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join([rule, line, rule, *body, rule])


def repo_root() -> Path:
    """The checkout this package runs from (loadgen/reports/ → repo)."""
    return Path(__file__).resolve().parents[2]
