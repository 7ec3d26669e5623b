"""Server child processes: free ports, spawning, readiness, identity and termination.

A process is identified by its PID *and* its start time from ``/proc/<pid>/stat``, so a
stale state file never makes us signal an unrelated process that reused the PID. A
zombie (exited, not yet reaped by its parent) counts as not running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvcompass.services.infra.errors import InfraError, ServerStartError

__all__ = [
    "ServerProcess",
    "StopOutcome",
    "free_port",
    "is_running",
    "log_tail",
    "port_answers",
    "spawn",
    "start_ticks",
    "terminate",
    "wait_ready",
]

StopOutcome = Literal["stopped", "killed", "not running"]
_POLL_S = 0.01


@dataclass(frozen=True)
class ServerProcess:
    """A server the launcher started, as recorded in the state file."""

    name: str
    pid: int
    port: int
    start_ticks: int | None
    log: str
    argv: tuple[str, ...]


def free_port(host: str) -> int:
    """A port on ``host`` that was free a moment ago (the caller retries on a clash)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_answers(host: str, port: int, timeout: float = 0.2) -> bool:
    """True when a TCP connection to ``host:port`` is accepted."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (after the command name), or None if absent."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process start time in clock ticks since boot (None off Linux or if gone)."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields else None


def is_running(pid: int, ticks: int | None = None) -> bool:
    """True while ``pid`` runs (not a zombie) and, if given, started at ``ticks``."""
    if Path("/proc/self/stat").exists():
        fields = _proc_stat(pid)
        if fields is None or fields[0] in ("Z", "X"):
            return False
        return ticks is None or int(fields[19]) == ticks
    try:  # not Linux: the PID alone has to do
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def spawn(argv: Sequence[str], log_path: Path, *, detach: bool) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdout and stderr appended to ``log_path``.

    ``detach`` puts the child in its own session so it outlives the calling command and
    ignores the terminal's Ctrl-C (``kvcompass infra up``).
    """
    with log_path.open("ab") as log:
        try:
            return subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=detach,
            )
        except OSError as exc:
            raise ServerStartError(f"cannot run {argv[0]}: {exc}") from exc


def wait_ready(
    proc: subprocess.Popen[bytes], name: str, host: str, port: int, timeout: float, log_path: Path
) -> None:
    """Poll until ``host:port`` answers; raise if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while not port_answers(host, port):
        code = proc.poll()
        if code is not None:
            raise ServerStartError(
                f"{name} exited with code {code} before port {port} answered; "
                f"last lines of {log_path}:\n{log_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            raise ServerStartError(
                f"port {host}:{port} did not answer within {timeout:g} s; "
                f"last lines of {log_path}:\n{log_tail(log_path)}"
            )
        time.sleep(_POLL_S)
    if proc.poll() is not None:  # someone else took the port between bind and listen
        raise ServerStartError(f"port {port} answered but {name} exited: port clash")


def terminate(
    pid: int,
    ticks: int | None,
    timeout: float,
    popen: subprocess.Popen[bytes] | None = None,
) -> StopOutcome:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; reap ``popen`` if ours."""
    if not is_running(pid, ticks):
        _reap(popen)
        return "not running"
    outcome: StopOutcome = "stopped"
    for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        if _wait_gone(pid, ticks, wait_s, popen):
            break
        outcome = "killed"
    else:
        raise InfraError(f"process {pid} survived SIGKILL for 5 s")
    _reap(popen)
    return outcome


def _wait_gone(
    pid: int, ticks: int | None, timeout: float, popen: subprocess.Popen[bytes] | None
) -> bool:
    if popen is not None:
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = time.monotonic() + timeout
    while is_running(pid, ticks):
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _reap(popen: subprocess.Popen[bytes] | None) -> None:
    if popen is not None and popen.returncode is None:
        popen.wait(5.0)


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a server log (for error messages)."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"
