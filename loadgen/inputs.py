"""What a command was told to read, checked before any work starts.

A missing or unreadable input file would otherwise surface as ``[Errno 2] No such file
or directory`` from deep in a reader, naming neither the flag nor what was expected.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["input_file"]


def input_file(path: Path, flag: str) -> Path:
    """``path`` as an existing, readable file; ValueError naming ``flag`` otherwise."""
    if not path.exists():
        raise ValueError(f"{flag} {path}: no such file")
    if path.is_dir():
        raise ValueError(f"{flag} {path}: is a folder, not a file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{flag} {path}: the file is not readable")
    return path
