"""The Azure LLM inference traces (``../shared/traces/README.md``: azure2023_code and
azure2023_conv, Patel et al., Splitwise, ISCA 2024): arrival times and input / output
lengths, no prefixes or sessions. The generators take their arrival times from one of
them (scaled by a speed factor) and, optionally, their lengths."""

from __future__ import annotations

import csv
import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

__all__ = ["AzureTrace", "read_azure"]


@dataclass(frozen=True)
class AzureTrace:
    """Arrivals in file order (sorted by time): seconds from the first one, and the
    prompt and generated token counts."""

    times_s: NDArray[np.float64]
    input_tokens: NDArray[np.int64]
    output_tokens: NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.times_s)

    def arrivals(self, speed: float) -> Iterator[tuple[float, int, int]]:
        """(arrival s, input tokens, output tokens), trace time divided by ``speed``."""
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        times = (self.times_s / speed).tolist()
        yield from zip(times, self.input_tokens.tolist(), self.output_tokens.tolist(), strict=True)


def read_azure(path: str | Path, limit: int | None = None) -> AzureTrace:
    """An Azure trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``; plain or .gz)."""
    path = Path(path)
    stamps: list[str] = []
    inputs: list[int] = []
    outputs: list[int] = []
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as stream:
        reader = csv.DictReader(stream)
        missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(
                f"{path}: not an Azure trace CSV: no column {', '.join(sorted(missing))} "
                "(needs TIMESTAMP,ContextTokens,GeneratedTokens)"
            )
        for row in reader:
            if limit is not None and len(stamps) >= limit:
                break
            try:
                stamps.append(row["TIMESTAMP"])
                inputs.append(int(row["ContextTokens"]))
                outputs.append(int(row["GeneratedTokens"]))
            except (ValueError, TypeError) as exc:  # TypeError: a short row's None
                raise ValueError(f"{path}:{reader.line_num}: {exc}") from None
    if not stamps:
        raise ValueError(f"{path}: no arrivals")
    try:
        ns = np.array(stamps, dtype="datetime64[ns]").astype(np.int64)
    except ValueError as exc:
        raise ValueError(f"{path}: a TIMESTAMP is not a date and time ({exc})") from None
    if np.any(np.diff(ns) < 0):
        raise ValueError(f"{path}: timestamps are not sorted")
    return AzureTrace((ns - ns[0]) / 1e9, np.array(inputs), np.array(outputs))
