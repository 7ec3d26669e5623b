"""The extra processes of a router group (``KVC_ROUTER_PROCESSES=N``) and the metrics
directory they share with the primary.

The primary starts N-1 ``kvcompass router`` processes with the same settings (one
process each, no status endpoint), restarts one that exits while the group runs, and
stops them on exit. The directory is new for every run of the group and removed at its
end: a restarted group never adds a previous run's files to its counts. Each extra is
told the primary's pid and exits when it is gone (:func:`primary_gone`): a SIGKILLed
primary runs no exit code, and extras left behind would keep the port serving with
nobody supervising them or merging their metrics (the directory then stays behind).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from types import TracebackType

import structlog

from kvcompass.services.router.group_metrics import MULTIPROC_ENV, forget_process
from kvcompass.services.router.settings import RouterSettings

__all__ = ["RouterGroup", "primary_gone"]

_CHECK_S = 0.5  # also the pause between two restarts: a crashing extra cannot spin


class RouterGroup:
    """Created by the primary before its metrics exist (they go to :attr:`metrics_dir`);
    ``__enter__`` starts the extras, :meth:`supervise` restarts them until the service
    stops, ``__exit__`` stops them and removes the directory."""

    def __init__(self, extras: int) -> None:
        self.metrics_dir = tempfile.mkdtemp(prefix=f"kvc-router-{os.getpid()}-")
        self._extras = extras
        self._children: list[subprocess.Popen[bytes]] = []
        self._closing = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._log = structlog.get_logger("kvcompass.router")

    def __enter__(self) -> RouterGroup:
        self._children = [self._spawn() for _ in range(self._extras)]
        return self

    def supervise(self, stop: threading.Event) -> None:
        """Restart an extra that exits, from a thread, until ``stop`` (a drain ends
        them on purpose)."""
        self._supervisor = threading.Thread(
            target=self._supervise, args=(stop,), name="router-group"
        )
        self._supervisor.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closing.set()
        if self._supervisor is not None:
            self._supervisor.join()
        for child in self._children:
            if child.poll() is None:
                child.terminate()
        for child in self._children:
            child.wait()
        self.remove()

    def remove(self) -> None:
        shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "KVC_ROUTER_PROCESSES": "1",
            "KVC_METRICS_PORT": "0",
            MULTIPROC_ENV: self.metrics_dir,
            RouterSettings.env_name("router_group_parent"): str(os.getpid()),
        }
        return subprocess.Popen([sys.executable, "-m", "kvcompass.services.router"], env=env)

    def _supervise(self, stop: threading.Event) -> None:
        while not (stop.wait(_CHECK_S) or self._closing.is_set()):
            for i, child in enumerate(self._children):
                status = child.poll()
                if status is None or stop.is_set():
                    continue
                forget_process(self.metrics_dir, child.pid)
                self._children[i] = self._spawn()
                self._log.warning(
                    "router_process_restarted",
                    pid=child.pid,
                    exit_status=status,
                    new_pid=self._children[i].pid,
                )


def primary_gone(parent: int) -> bool:
    """An extra started by the primary ``parent`` (0: not an extra) has lost it: the
    kernel gave the orphan a new parent (init, or a container's subreaper)."""
    return parent != 0 and os.getppid() != parent
