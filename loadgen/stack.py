"""A whole KVCompass deployment on one machine, as separate processes.

``LocalStack`` is what ``kvcompass demo`` and the end-to-end tests run: the embedded
broker and Redis, one maintenance unit, and per region an edge replayer, an emulated
worker host (all of the region's workers, one port each) and a router; one WAN proxy
process adds the topology's one-way delay on every cross-region link. Every process is
the same service a container would run, configured only by ``KVC_*`` variables.

Start-up is ordered by dependency and each step waits for the component's readiness
with a deadline; a component that exits or does not get ready stops the whole stack
with a :class:`ComponentFailed` naming it and quoting its log.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from kvcompass.services.infra import Infra, InfraSettings, RunningInfra
from kvcompass.services.infra.processes import log_tail
from kvcompass.services.wanproxy import worker_endpoints_setting
from kvcompass.shm import remove_segments
from kvcompass.topology import Topology

__all__ = ["ComponentFailed", "LocalStack", "StackConfig", "read_metric"]

_POLL_S = 0.05
_PORT_FLOOR = 20_000  # stack ports come from [20000, start of the ephemeral range)


class ComponentFailed(RuntimeError):
    """One named component did not start (or died); ``str()`` says which and why."""

    def __init__(self, component: str, problem: str, log_path: Path | None = None) -> None:
        self.component = component
        tail = f"\nlast lines of {log_path}:\n{log_tail(log_path)}" if log_path else ""
        super().__init__(f"{component}: {problem}{tail}")


@dataclass(frozen=True)
class StackConfig:
    topology: Topology
    topology_ref: str  # a built-in name or a file path, passed to every service
    workdir: Path
    shards: int = 4
    policy: str = "kvcompass"
    time_scale: float = 1.0
    eviction: str = "lru"
    api_keys: Mapping[str, str] = field(default_factory=dict)  # key -> tenant
    ready_timeout_s: float = 120.0  # failure detection only: a busy machine is slow
    # Workers that get a host process of their own (``workers-<id>``), so that one
    # worker can be killed alone; the others share one host per region.
    separate_workers: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class _Component:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    ready: Callable[[], bool]
    popen: subprocess.Popen[bytes] | None = None
    status_port: int | None = None  # its /metrics, /healthz and /readyz


class LocalStack:
    """Start with :meth:`start` (or ``with``); :meth:`stop` stops everything it started."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.topology = config.topology
        self.tag = uuid.uuid4().hex[:6]
        self.logs = config.workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.shm_prefixes = {r.name: f"kvc{self.tag}{r.name}" for r in self.topology.regions}
        # Chosen together, after the broker and Redis took theirs (see _start_infra).
        self.worker_ports: dict[str, int] = {}
        self.router_ports: dict[str, int] = {}
        self._status_ports: list[int] = []
        self.infra: RunningInfra | None = None
        self._components: dict[str, _Component] = {}
        self._killed: dict[str, _Component] = {}  # by kill(), for restart()
        self._order: list[str] = []
        self._proxy_map: dict[str, dict[str, str]] = {}

    # -- public ---------------------------------------------------------------------------

    @property
    def router_urls(self) -> dict[str, str]:
        return {region: f"http://127.0.0.1:{p}" for region, p in self.router_ports.items()}

    def worker_url(self, worker_id: str) -> str:
        return f"http://127.0.0.1:{self.worker_ports[worker_id]}"

    def start(self, progress: Callable[[str], None] = lambda _: None) -> None:
        """Bring every component up, a dependency stage at a time, in parallel within one."""
        try:
            progress("broker + redis")
            self._start_infra()
            # Workers and the proxy need only the broker; the MU must own its shards
            # (and snapshot them) before an edge can bootstrap.
            progress("maintenance unit, workers, wan proxy")
            self._launch(
                self._mu(),
                *self._worker_hosts(),
                self._wanproxy(),
            )
            self._proxy_map = self._read_proxy_map()
            progress("edges")
            self._launch(*(self._edge(r.name) for r in self.topology.regions))
            self.start_routers(self.config.policy, progress)
        except BaseException:
            self.stop()
            raise

    def start_routers(self, policy: str, progress: Callable[[str], None] = lambda _: None) -> None:
        """(Re)start every region's router with ``policy`` (fresh estimates and beliefs)."""
        old = [self._components.pop(n) for n in list(self._order) if n.startswith("router-")]
        self._order = [n for n in self._order if not n.startswith("router-")]
        self._terminate(*old)
        progress(f"routers ({policy})")
        self._launch(*(self._router(r.name, policy) for r in self.topology.regions))

    def check_alive(self) -> None:
        """Raise :class:`ComponentFailed` for the first component that has exited."""
        for name in self._order:
            comp = self._components[name]
            if comp.popen is not None and comp.popen.poll() is not None:
                raise ComponentFailed(
                    name, f"exited with status {comp.popen.returncode}", comp.log_path
                )

    def kill(self, name: str) -> None:
        """SIGKILL one component (chaos in end-to-end tests)."""
        comp = self._components.pop(name)
        self._order.remove(name)
        if comp.popen is not None:
            comp.popen.kill()
            comp.popen.wait(30)
        self._killed[name] = comp

    def restart(self, name: str, *, wait: bool = True) -> None:
        """Start a killed or exited component again, as its supervisor would, and (with
        ``wait``) wait until it is ready."""
        comp = self._killed.pop(name, None)
        if comp is None:
            comp = self._components.pop(name)
            self._order.remove(name)
            if comp.popen is None or comp.popen.poll() is None:
                raise RuntimeError(f"{name} is running: kill it first")
        comp.popen = None
        self._launch(comp, wait=wait)

    @contextmanager
    def paused(self, name: str) -> Iterator[None]:
        """SIGSTOP one component for the block, SIGCONT after it (chaos: a hung process).
        Its listening sockets stay open, so the kernel still accepts connections to it,
        but nothing it would do (answer, emit an event) happens until the block ends."""
        popen = self._components[name].popen
        if popen is None or popen.poll() is not None:
            raise RuntimeError(f"{name} is not running")
        popen.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            popen.send_signal(signal.SIGCONT)

    def metric(self, name: str, sample: str) -> float | None:
        """An unlabelled sample on a running component's /metrics (None: absent)."""
        port = self._components[name].status_port
        return None if port is None else read_metric(port, sample)

    def exited(self) -> list[str]:
        """Components whose process has ended (not counting killed ones)."""
        return [
            n
            for n in self._order
            if (p := self._components[n].popen) is not None and p.poll() is not None
        ]

    def post_json(
        self, url: str, body: Mapping[str, Any], key: str | None = None, timeout: float = 30.0
    ) -> Any:
        """POST ``body`` as JSON (with ``Bearer key`` if given); the decoded answer."""
        headers = {"content-type": "application/json"}
        if key is not None:
            headers["authorization"] = f"Bearer {key}"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return json.loads(reply.read())

    def reset_workers(self) -> None:
        """Empty every worker's cache (publishing the evictions) and queues."""
        for worker in self.topology.workers:
            self.post_json(self.worker_url(worker.id) + "/admin/reset", {})

    def stop(self) -> None:
        """Stop the routers, then the edges, then the rest, then the broker and Redis."""
        stages = [
            [n for n in self._order if n.startswith("router-")],
            [n for n in self._order if n.startswith("edge-")],
            list(self._order),
        ]
        for names in stages:
            self._terminate(*(self._components.pop(n) for n in names if n in self._components))
        self._order.clear()
        if self.infra is not None:
            self.infra.stop()
            self.infra = None
        for prefix in self.shm_prefixes.values():
            remove_segments(prefix)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- components ----------------------------------------------------------------------

    def _start_infra(self) -> None:
        settings = InfraSettings.from_env(
            {},
            run_dir=self.config.workdir / "infra",
            shards=self.config.shards,
        )
        try:
            self.infra = Infra.start(settings)
        except Exception as exc:
            raise ComponentFailed("broker + redis", str(exc)) from exc
        workers, regions = self.topology.workers, self.topology.regions
        # Status ports: the MU, an edge and a worker host per region, the proxy, and the
        # routers of this start and of every restart (a few spare).
        ports = _free_ports(len(workers) + len(regions) + 2 + 3 * len(regions) + 16)
        self.worker_ports = {w.id: ports.pop() for w in workers}
        self.router_ports = {r.name: ports.pop() for r in regions}
        self._status_ports = ports

    def _base_env(self, name: str, **extra: str) -> dict[str, str]:
        assert self.infra is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVC_")}
        env.update(
            {
                "KVC_KAFKA_BOOTSTRAP": self.infra.kafka_bootstrap,
                "KVC_REDIS_URL": self.infra.redis_url,
                "KVC_SHARDS": str(self.config.shards),
                "KVC_TOPOLOGY": self.config.topology_ref,
                "KVC_LOG_JSON": "true",
            }
        )
        env.update(extra)
        env.update(self.config.extra_env)  # the operator's overrides win
        return env

    def _service(
        self, command: str, name: str, ready: Callable[[int], bool], **extra: str
    ) -> _Component:
        """A ``kvcompass <command>`` process with a status port for readiness."""
        if not self._status_ports:
            self._status_ports = _free_ports(8)
        port = self._status_ports.pop()
        env = self._base_env(name, KVC_METRICS_PORT=str(port), **extra)
        return _Component(
            name,
            [sys.executable, "-m", "kvcompass.services.cli", command],
            env,
            self.logs / f"{name}.log",
            lambda: ready(port),
            status_port=port,
        )

    def _mu(self) -> _Component:
        def owns_all(port: int) -> bool:
            owned = read_metric(port, "kvc_mu_owned_shards")
            return owned is not None and owned >= self.config.shards

        return self._service("mu", "mu", owns_all)

    def _edge(self, region: str) -> _Component:
        return self._service(
            "edge", f"edge-{region}", _ready, KVC_SHM_PREFIX=self.shm_prefixes[region]
        )

    def _worker_hosts(self) -> list[_Component]:
        alone = set(self.config.separate_workers)
        hosts = [self._workers(f"workers-{w}", [w]) for w in self.config.separate_workers]
        for region in self.topology.regions:
            ids = [w.id for w in region.workers if w.id not in alone]
            if ids:
                hosts.append(self._workers(f"workers-{region.name}", ids))
        return hosts

    def _workers(self, name: str, ids: list[str]) -> _Component:
        ports = ",".join(f"{w}={self.worker_ports[w]}" for w in ids)
        first = self.worker_ports[ids[0]]
        return self._service(
            "worker",
            name,
            lambda _port: _ready(first, "/readyz"),
            KVC_WORKER_IDS=",".join(ids),
            KVC_WORKER_PORTS=ports,
            KVC_TIME_SCALE=str(self.config.time_scale),
            KVC_EVICTION_POLICY=self.config.eviction,
        )

    def _wanproxy(self) -> _Component:
        targets = ",".join(f"{w}=127.0.0.1:{p}" for w, p in self.worker_ports.items())
        self._map_path = self.config.workdir / "wanproxy.json"
        self._map_path.unlink(missing_ok=True)
        return self._service(
            "wanproxy",
            "wanproxy",
            lambda _port: self._map_path.exists(),
            KVC_WANPROXY_TARGETS=targets,
            KVC_WANPROXY_MAP_FILE=str(self._map_path),
            KVC_TIME_SCALE=str(self.config.time_scale),
        )

    def _read_proxy_map(self) -> dict[str, dict[str, str]]:
        """origin region -> worker id -> URL to dial (the proxy's, for remote workers)."""
        raw: dict[str, dict[str, str]] = json.loads(self._map_path.read_text())
        return raw

    def _router(self, region: str, policy: str) -> _Component:
        # The proxy's map names the origin's own workers by their real address.
        endpoints = worker_endpoints_setting(self._proxy_map[region])
        port = self.router_ports[region]
        keys = ",".join(f"{k}={t}" for k, t in self.config.api_keys.items())
        return self._service(
            "router",
            f"router-{region}",
            lambda _status: _ready(port, "/readyz"),
            KVC_REGION=region,
            KVC_ROUTER_PORT=str(port),
            KVC_POLICY=policy,
            KVC_WORKER_ENDPOINTS=endpoints,
            KVC_SHM_PREFIX=self.shm_prefixes[region],
            KVC_API_KEYS=keys,
        )

    # -- processes -----------------------------------------------------------------------

    def _launch(self, *comps: _Component, wait: bool = True) -> None:
        """Start ``comps`` together, then wait until each is ready (one deadline)."""
        for comp in comps:
            with comp.log_path.open("ab") as log:
                comp.popen = subprocess.Popen(
                    comp.argv,
                    env=comp.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    # Own process group: the demo's Ctrl-C reaches only the demo, which
                    # then stops every component in order instead of all dying at once.
                    start_new_session=True,
                )
            self._components[comp.name] = comp
            self._order.append(comp.name)
        deadline = time.monotonic() + self.config.ready_timeout_s
        waiting = list(comps) if wait else []
        while waiting:
            for comp in list(waiting):
                assert comp.popen is not None
                code = comp.popen.poll()
                if code is not None:
                    raise ComponentFailed(comp.name, f"exited with status {code}", comp.log_path)
                if comp.ready():
                    waiting.remove(comp)
            if waiting and time.monotonic() > deadline:
                comp = waiting[0]
                raise ComponentFailed(
                    comp.name,
                    f"not ready within {self.config.ready_timeout_s:g} s",
                    comp.log_path,
                )
            time.sleep(_POLL_S)

    @staticmethod
    def _terminate(*comps: _Component) -> None:
        """SIGTERM all of ``comps``, then wait for each (SIGKILL after 20 s)."""
        running = [c.popen for c in comps if c.popen is not None and c.popen.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20.0
        for proc in running:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports that were free a moment ago, from below the kernel's
    ephemeral range, where no other process's bind(0) or outgoing connection lands: the
    many services starting at once (and any test suite beside us) cannot take one
    between this check and the component's own bind."""
    low, _ = _ephemeral_range()
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < n:
        port = rng.randrange(_PORT_FLOOR, low)
        if port in ports:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def read_metric(port: int, name: str) -> float | None:
    """The value of an unlabelled sample on ``127.0.0.1:port/metrics``; None while the
    endpoint does not answer or lacks the sample."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        sample, _, value = line.partition(" ")
        if sample == name:
            return float(value)
    return None


def _ready(port: int, path: str = "/readyz") -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return bool(reply.status == 200)
    except (OSError, urllib.error.HTTPError):
        return False


@contextmanager
def running_stack(config: StackConfig) -> Iterator[LocalStack]:
    stack = LocalStack(config)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
