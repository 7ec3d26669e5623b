"""Settings of a worker host (``KVC_*`` environment variables)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvcompass.services.settings import PipelineSettings
from kvcompass.settings import setting
from kvcompass.topology import Topology, Worker

__all__ = ["WorkerSettings"]


@dataclass(frozen=True, kw_only=True)
class WorkerSettings(PipelineSettings):
    """Which workers this process hosts, where they listen and how fast time runs."""

    worker_ids: str = setting(
        "",
        "Workers this process hosts: comma-separated ids (us-0,us-1) or region:NAME for "
        "all of a region's; empty = every worker of the topology.",
    )
    worker_host: str = setting("127.0.0.1", "Address the workers' HTTP ports listen on.")
    worker_port_base: int = setting(
        9100, "Worker i of the topology (its global index) listens on this port + i."
    )
    worker_ports: str = setting(
        "", "Explicit ports as id=port pairs (us-0=9100,us-1=9101); override the base."
    )
    time_scale: float = setting(
        1.0,
        "Real seconds per emulated second: 1.0 runs the cost model in real time, 0.01 "
        "100 times faster. Timings in responses are emulated milliseconds.",
    )
    eviction_policy: Literal["lru", "lfu", "fifo"] = setting(
        "lru", "Which cached block leaves a tier first (paper Fig. 6)."
    )
    queue_local_period_s: float = setting(
        0.02, "Seconds between queue vectors to the workers' own region on kvc.queues."
    )
    queue_broadcast_period_s: float = setting(
        0.1,
        "Seconds between queue vectors to the other regions (Δ), skipped toward a region "
        "that received the vector on a response within that period.",
    )

    def validate(self) -> None:
        super().validate()
        if not 0 < self.worker_port_base <= 65535:
            raise self.invalid("worker_port_base", "must be a TCP port (1-65535)")
        if self.time_scale <= 0:
            raise self.invalid("time_scale", "must be positive")
        for name in ("queue_local_period_s", "queue_broadcast_period_s"):
            if getattr(self, name) <= 0:
                raise self.invalid(name, "must be positive")
        self._explicit_ports()

    def hosted(self, topology: Topology) -> list[tuple[Worker, int]]:
        """The hosted workers with their ports, in topology order."""
        spec = self.worker_ids.strip()
        if not spec:
            workers = list(topology.workers)
        elif spec.startswith("region:"):
            name = spec.removeprefix("region:")
            try:
                workers = list(topology.region(name).workers)
            except KeyError:
                raise self.invalid("worker_ids", f"no region {name!r} in {topology.name}") from None
        else:
            by_id = {w.id: w for w in topology.workers}
            ids = [i.strip() for i in spec.split(",") if i.strip()]
            unknown = [i for i in ids if i not in by_id]
            if unknown:
                raise self.invalid("worker_ids", f"no workers {unknown} in {topology.name}")
            workers = sorted({by_id[i] for i in ids}, key=lambda w: w.index)
        explicit = self._explicit_ports()
        ports = [(w, explicit.get(w.id, self.worker_port_base + w.index)) for w in workers]
        if any(not 0 < p <= 65535 for _, p in ports):
            raise self.invalid("worker_port_base", "puts a worker beyond port 65535")
        if len({p for _, p in ports}) != len(ports):
            raise self.invalid("worker_ports", "two hosted workers share a port")
        return ports

    def _explicit_ports(self) -> dict[str, int]:
        ports = {}
        for pair in filter(None, (p.strip() for p in self.worker_ports.split(","))):
            worker_id, _, port = pair.partition("=")
            if not port.isdigit():
                raise self.invalid("worker_ports", f"{pair!r} is not id=port")
            ports[worker_id.strip()] = int(port)
        return ports
