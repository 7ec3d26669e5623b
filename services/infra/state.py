"""The run directory's state file: what ``up`` started and where it listens."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvcompass.services.infra.errors import StateFileError
from kvcompass.services.infra.processes import ServerProcess

__all__ = ["STATE_VERSION", "InfraState", "locked", "read_state", "remove_state", "write_state"]

STATE_VERSION = 1


@dataclass(frozen=True)
class InfraState:
    """Addresses and the processes started; ``processes`` is empty for external servers."""

    kafka_bootstrap: str
    redis_url: str
    processes: tuple[ServerProcess, ...]
    created_at: str
    owner_pid: int
    topics: dict[str, int] = field(default_factory=dict)
    startup_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (also the ``--json`` output of ``up``)."""
        return {"version": STATE_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: Any) -> InfraState:
        """Parse :meth:`to_json` output; raise StateFileError on any other shape."""
        try:
            if data["version"] != STATE_VERSION:
                raise StateFileError(f"state file version {data['version']!r} is not supported")
            procs = tuple(
                ServerProcess(
                    name=str(p["name"]),
                    pid=int(p["pid"]),
                    port=int(p["port"]),
                    start_ticks=None if p["start_ticks"] is None else int(p["start_ticks"]),
                    log=str(p["log"]),
                    argv=tuple(str(a) for a in p["argv"]),
                )
                for p in data["processes"]
            )
            return cls(
                kafka_bootstrap=str(data["kafka_bootstrap"]),
                redis_url=str(data["redis_url"]),
                processes=procs,
                created_at=str(data["created_at"]),
                owner_pid=int(data["owner_pid"]),
                topics={str(k): int(v) for k, v in data["topics"].items()},
                startup_ms=None if data["startup_ms"] is None else float(data["startup_ms"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateFileError(f"malformed state file: {exc!r}") from exc


def read_state(path: Path) -> InfraState | None:
    """The state in ``path``, None if there is none; StateFileError if unreadable."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StateFileError(f"{path} is not JSON: {exc}") from exc
    try:
        return InfraState.from_json(data)
    except StateFileError as exc:
        raise StateFileError(f"{path}: {exc}") from exc


def write_state(path: Path, state: InfraState) -> None:
    """Replace ``path`` atomically (write a sibling, then rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
    os.replace(tmp, path)


def remove_state(path: Path) -> None:
    """Delete ``path`` if it exists."""
    path.unlink(missing_ok=True)


@contextlib.contextmanager
def locked(run_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``run_dir`` (one ``up``/``down`` at a time)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
