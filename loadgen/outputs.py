"""Where a command was told to write, checked before any work starts.

A run of minutes that fails only when it writes its results loses them, and a bad path
would surface as a traceback: every command that takes ``--out`` (or ``--figures``,
``--summary-json``) checks it first, and a path it cannot use becomes one ValueError
naming the flag, which the command prints as one line and exits 2.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["output_file", "output_folder"]


def output_folder(path: Path, flag: str = "--out") -> Path:
    """``path`` as an existing, writable folder (made with its parents if missing)."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path}: is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot make the folder ({exc.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: the folder is not writable")
    return path


def output_file(path: Path, flag: str) -> Path:
    """``path`` as a file that can be written (its folder made if missing); the file
    itself is left as it is until the command writes it."""
    if path.is_dir():
        raise ValueError(f"{flag} {path}: is a folder, not a file")
    output_folder(path.parent, flag=f"{flag}'s folder")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{flag} {path}: the file is not writable")
    return path
