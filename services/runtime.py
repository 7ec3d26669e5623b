"""The process shell every long-running service runs in.

``sys.exit(run_service(spec))`` from a service's ``__main__`` does, in order: read one
frozen settings object from ``KVC_*`` variables, configure logging (every line names the
service and pid), bind the status endpoint (``/metrics``, ``/healthz``, ``/readyz`` on
``KVC_METRICS_PORT``), load the topology, check the broker, the topics and Redis within
``KVC_START_TIMEOUT_S``, take over SIGTERM / SIGINT, then enter the service (a context
manager that opens and closes its clients) and run it until a signal sets ``stop``.

Signals: the first SIGTERM / SIGINT sets ``stop`` and the service drains; the whole
drain, counted from that signal, has ``KVC_DRAIN_TIMEOUT_S``. A second signal exits at
once. A thread of the shell takes the signals (through Python's wakeup pipe), so a main
thread blocked in a client call delays neither.

Exit statuses (:class:`ExitStatus`):

- 0: stopped cleanly.
- 2: a setting is wrong or start was refused (one log line names the setting and value).
- 3: a dependency (broker, Redis) stayed lost past its deadline, or the drain overran.
- 70: internal error or broken invariant (the service persists nothing on such an exit).
- 128 + N: a second signal N arrived during the drain.

A fatal error is one JSON log line (``start_refused`` or ``fatal``) whose fields hold the
error, its type, the exit status and, for unexpected errors, the traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Generic, Protocol, TypeVar

import structlog
from prometheus_client import CollectorRegistry

from kvcompass import log as kvc_log
from kvcompass.errors import ConfigError, InvariantBroken, KVCError, Transient
from kvcompass.services.health import Health
from kvcompass.services.infra import InfraError, InfraSettings
from kvcompass.services.infra.state import read_state
from kvcompass.services.known_settings import warn_unread_variables
from kvcompass.services.preflight import Address, check_kafka, check_redis
from kvcompass.services.settings import PipelineSettings
from kvcompass.services.status_server import StatusServer
from kvcompass.topology import Topology, builtin_names, load_builtin, load_topology

__all__ = [
    "ExitStatus",
    "Service",
    "ServiceFactory",
    "ServiceSpec",
    "load_any_topology",
    "run_service",
    "usage",
]

S = TypeVar("S", bound=PipelineSettings)
S_contra = TypeVar("S_contra", bound=PipelineSettings, contravariant=True)

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_CLOSE = 0  # written to the wakeup pipe to end the watcher (no signal has number 0)


class ExitStatus(IntEnum):
    OK = 0
    CONFIG = 2
    DEPENDENCY_LOST = 3
    INTERNAL = 70


class Service(Protocol):
    """What a service object offers once entered."""

    def run(self, stop: threading.Event) -> None:
        """Work until ``stop`` is set, then drain and return."""


class ServiceFactory(Protocol[S_contra]):
    """A service class (or a function) that builds the service's context manager."""

    def __call__(
        self,
        settings: S_contra,
        topology: Topology,
        *,
        kafka_bootstrap: str,
        redis_url: str,
        health: Health,
        registry: CollectorRegistry,
    ) -> AbstractContextManager[Service]: ...


@dataclass(frozen=True)
class ServiceSpec(Generic[S]):
    """What the shell needs to know about one service."""

    name: str  # ``service=`` of every log line; ``kvcompass <name>``
    summary: str  # one paragraph for ``--help``
    settings: type[S]
    topic_fields: tuple[str, ...]  # settings fields naming the topics it reads or writes
    factory: ServiceFactory[S]


def usage(spec: ServiceSpec[Any]) -> str:
    """``--help``: what the service does, its settings table and its exit statuses."""
    lines = [
        f"Usage: kvcompass {spec.name}   (no arguments: settings come from KVC_* variables)",
        "",
        *textwrap.wrap(spec.summary, 88),
        "",
        "Settings (environment variable, type, default):",
    ]
    for row in spec.settings.describe():
        default = f", default {row.default}" if row.default else ""
        lines.append(f"  {row.env} ({row.type}{default})")
        lines.extend(textwrap.wrap(row.doc, 88, initial_indent=" " * 6, subsequent_indent=" " * 6))
    lines += [
        "",
        "Exit statuses: 0 stopped cleanly; 2 bad setting or start refused; 3 dependency lost",
        "past its deadline or drain overran; 70 internal error or broken invariant;",
        "128+N a second signal N during the drain.",
    ]
    return "\n".join(lines)


def run_service(spec: ServiceSpec[Any], argv: Sequence[str] | None = None) -> int:
    """Run ``spec``'s service in this process; returns the exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["-h"], ["--help"]):
        print(usage(spec))
        return ExitStatus.OK
    if args:
        print(f"kvcompass {spec.name}: takes no arguments (see --help)", file=sys.stderr)
        return ExitStatus.CONFIG
    # Until the settings are read, log with the defaults: a settings error is logged too.
    kvc_log.configure(json=not sys.stderr.isatty(), service=spec.name)
    shell = _Shell(spec)
    threading.excepthook = shell.thread_failed
    try:
        shell.run()
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one line + a status
        return shell.fail(exc)
    shell.log.info("stopped", exit_status=int(ExitStatus.OK))
    return ExitStatus.OK


def load_any_topology(name_or_path: str) -> Topology:
    """A built-in topology by name, else a TOML file path."""
    if name_or_path in builtin_names():
        return load_builtin(name_or_path)
    return load_topology(Path(name_or_path))


class _Shell:
    """One run of one service: the phases and what each failure means."""

    def __init__(self, spec: ServiceSpec[Any]) -> None:
        self.spec = spec
        self.log = structlog.get_logger(f"kvcompass.{spec.name}")
        self.phase = "starting"
        self.health = Health()
        self.health.set("running", False, "starting")

    def run(self) -> None:
        spec = self.spec
        settings = spec.settings.from_env()
        kvc_log.configure(
            settings.log_level,
            json=settings.log_json if settings.log_json is not None else not sys.stderr.isatty(),
            service=spec.name,
        )
        warn_unread_variables(self.log)
        deadline = time.monotonic() + settings.start_timeout_s
        registry = CollectorRegistry()
        stop = threading.Event()
        with contextlib.ExitStack() as stack:
            stack.enter_context(_Signals(stop, settings.drain_timeout_s, self))
            if settings.metrics_port:
                stack.enter_context(self._status_server(settings, registry))
            topology = _topology(settings)
            bootstrap, redis_url = _addresses(settings)
            check_kafka(settings, bootstrap, spec.topic_fields, deadline, self.health)
            check_redis(settings, redis_url, deadline, self.health)
            self.log.info(
                "settings",
                **{**settings.as_dict(), "kafka_bootstrap": str(bootstrap),
                   "redis_url": str(redis_url)},
            )  # fmt: skip
            service = stack.enter_context(
                spec.factory(
                    settings,
                    topology,
                    kafka_bootstrap=bootstrap.value,
                    redis_url=redis_url.value,
                    health=self.health,
                    registry=registry,
                )
            )
            if not stop.is_set():
                self.phase = "running"
                self.health.set("running", True)
                self.log.info("running")
            service.run(stop)

    def thread_failed(self, args: threading.ExceptHookArgs) -> None:
        """An exception that ended a thread: one log line, not a traceback on stderr."""
        thread = args.thread.name if args.thread is not None else None
        self.log.error(
            "thread_failed", thread=thread, error=str(args.exc_value),
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )  # fmt: skip

    def draining(self) -> None:
        self.phase = "draining"
        self.health.set("running", False, "draining")

    def fail(self, exc: BaseException) -> int:
        """Log ``exc`` as one line and return the exit status it means."""
        status = _status_of(exc, starting=self.phase == "starting")
        if status == ExitStatus.CONFIG and isinstance(exc, KVCError):
            # An expected refusal: the message names the setting; a traceback adds nothing.
            self.log.error(
                "start_refused", error=str(exc), error_type=type(exc).__name__,
                exit_status=int(status),
            )  # fmt: skip
        else:
            self.log.critical(
                "fatal", error=str(exc), error_type=type(exc).__name__,
                exit_status=int(status), phase=self.phase, exc_info=exc,
            )  # fmt: skip
        return status

    def _status_server(
        self, settings: PipelineSettings, registry: CollectorRegistry
    ) -> StatusServer:
        try:
            return StatusServer(
                settings.metrics_host,
                settings.metrics_port,
                service=self.spec.name,
                registry=registry,
                health=self.health,
                phase=lambda: self.phase,
            )
        except OSError as exc:
            raise ConfigError(
                f"{settings.env_name('metrics_port')}={settings.metrics_port}: cannot listen "
                f"on {settings.metrics_host}:{settings.metrics_port} ({exc.strerror})"
            ) from None


def _status_of(exc: BaseException, *, starting: bool) -> ExitStatus:
    if isinstance(exc, InvariantBroken):
        return ExitStatus.INTERNAL
    if isinstance(exc, ConfigError) or (starting and isinstance(exc, KVCError)):
        return ExitStatus.CONFIG
    if isinstance(exc, Transient):
        return ExitStatus.DEPENDENCY_LOST
    return ExitStatus.INTERNAL


def _topology(settings: PipelineSettings) -> Topology:
    try:
        return load_any_topology(settings.topology)
    except (KVCError, ValueError, OSError) as exc:
        raise ConfigError(f"{settings.env_name('topology')}={settings.topology!r}: {exc}") from None


def _addresses(settings: PipelineSettings) -> tuple[Address, Address]:
    """The broker and Redis: from the settings, else from ``kvcompass infra up``'s state."""
    kafka_var, redis_var = settings.env_name("kafka_bootstrap"), settings.env_name("redis_url")
    if settings.kafka_bootstrap is not None and settings.redis_url is not None:
        return Address(settings.kafka_bootstrap, kafka_var), Address(settings.redis_url, redis_var)
    infra = InfraSettings.from_env()
    try:
        state = read_state(infra.state_file)
    except InfraError as exc:
        raise ConfigError(f"{infra.env_name('run_dir')}={str(infra.run_dir)!r}: {exc}") from None
    if state is None:
        raise ConfigError(
            f"{kafka_var} / {redis_var} are not set and {infra.state_file} records no "
            f"servers ({infra.env_name('run_dir')}={str(infra.run_dir)!r}): set them, or "
            "start the embedded servers with `kvcompass infra up`"
        )
    recorded = f"(unset; recorded in {infra.state_file})"
    kafka = (
        Address(settings.kafka_bootstrap, kafka_var)
        if settings.kafka_bootstrap is not None
        else Address(state.kafka_bootstrap, f"{kafka_var} {recorded}")
    )
    redis_url = (
        Address(settings.redis_url, redis_var)
        if settings.redis_url is not None
        else Address(state.redis_url, f"{redis_var} {recorded}")
    )
    return kafka, redis_url


class _Signals:
    """SIGTERM / SIGINT: the first sets ``stop`` and arms the drain deadline; a second
    one, or the deadline, ends the process at once.

    Python runs signal handlers in the main thread only, and only once it runs Python
    code again: a main thread blocked in a client call, or a signal the kernel handed to
    one of numpy's BLAS threads, would delay them without bound. The C-level handler
    writes every signal to a wakeup pipe from whichever thread received it, so a thread
    of our own reading that pipe acts at once.
    """

    def __init__(self, stop: threading.Event, drain_timeout_s: float, shell: _Shell) -> None:
        self._stop = stop
        self._drain_timeout_s = drain_timeout_s
        self._shell = shell
        self._deadline: threading.Timer | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # the C handler must never block
        self._thread = threading.Thread(target=self._watch, name="signals", daemon=True)
        self._previous_wakeup_fd = -1

    def __enter__(self) -> _Signals:
        for signum in _SIGNALS:
            # A Python handler (not the default action) so the C handler runs; the
            # work happens in _watch.
            self._previous[signum] = signal.signal(signum, _noop)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        signal.set_wakeup_fd(self._previous_wakeup_fd)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        os.write(self._write_fd, bytes([_CLOSE]))
        self._thread.join()
        os.close(self._read_fd)
        os.close(self._write_fd)
        if self._deadline is not None:
            self._deadline.cancel()

    def _watch(self) -> None:
        while (signum := os.read(self._read_fd, 1)[0]) != _CLOSE:
            name = signal.Signals(signum).name
            if self._stop.is_set():
                status = 128 + signum
                self._shell.log.warning("stopping_now", signal=name, exit_status=status)
                os._exit(status)
            self._shell.log.info("stopping", signal=name, drain_timeout_s=self._drain_timeout_s)
            self._shell.draining()
            self._stop.set()
            self._deadline = threading.Timer(self._drain_timeout_s, self._overrun)
            self._deadline.daemon = True
            self._deadline.start()

    def _overrun(self) -> None:
        status = int(ExitStatus.DEPENDENCY_LOST)
        self._shell.log.error(
            "drain_timeout", drain_timeout_s=self._drain_timeout_s, exit_status=status
        )
        os._exit(status)


def _noop(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler; _Signals._watch does the work."""
