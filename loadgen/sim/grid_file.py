"""A ``kvcompass sim sweep --grid`` TOML file, checked before any cell runs.

``policies``, ``rates`` and ``seeds`` are lists; every other key is a ``Cell`` option of
its type (a Path is a string, a tuple a list, a float may be written as an integer, and
a bool is no number). A wrong key or type is one ValueError naming the file, instead of
a TypeError from deep in a cell.
"""

from __future__ import annotations

import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from kvcompass.loadgen.sim.cell import Cell

__all__ = ["read_grid_file"]

#: The cell fields the grid's own lists set.
_AXES = ("policy", "rate", "seed")


def read_grid_file(
    path: Path, policies: list[str], rates: list[float], seeds: list[int]
) -> tuple[list[str], list[float], list[int], dict[str, Any]]:
    """The grid's policies, rates and seeds (each defaulting to the given one) and its
    other cell options."""
    try:
        spec = tomllib.loads(path.read_text())
        policies = _listed(spec.pop("policies", policies), str, "policies", "names")
        rates = spec.pop("rates", rates)
        rates = [float(r) for r in _listed(rates, (int, float), "rates", "numbers")]
        seeds = _listed(spec.pop("seeds", seeds), int, "seeds", "whole numbers")
        return policies, rates, seeds, _cell_options(spec)
    except ValueError as exc:  # tomllib.TOMLDecodeError included
        raise ValueError(f"{path}: {exc}") from None


def _listed(value: Any, kind: type | tuple[type, ...], name: str, items: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{name} must be a list, e.g. {name} = [...], got {value!r}")
    for v in value:
        if not isinstance(v, kind) or isinstance(v, bool):
            raise ValueError(f"{name} must be a list of {items}, got {v!r} in {value!r}")
    return value


def _cell_options(spec: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(Cell)
    for name, value in spec.items():
        if name not in hints or name in _AXES:
            known = sorted(set(hints) - set(_AXES))
            raise ValueError(f"unknown option {name!r}; known: {', '.join(known)}")
        hint = hints[name]
        if not _fits(value, hint):
            shown = hint.__name__ if isinstance(hint, type) else str(hint)
            raise ValueError(f"{name} must be {shown}, got {value!r}")
    return spec


def _fits(value: Any, hint: Any) -> bool:
    options = typing.get_args(hint) if typing.get_origin(hint) is types.UnionType else (hint,)
    return any(_fits_one(value, option) for option in options)


def _fits_one(value: Any, option: Any) -> bool:
    if typing.get_origin(option) is tuple:
        item = typing.get_args(option)[0]
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if isinstance(value, bool):
        return option is bool
    if option is float:
        return isinstance(value, int | float)
    if option is Path:
        return isinstance(value, str)
    return isinstance(option, type) and isinstance(value, option)
