"""An edge replayer in a thread of the test process, so a test can wrap its source
(fault injection) and read its health and counters as data."""

from __future__ import annotations

import threading
from collections.abc import Callable
from subprocess import Popen

from _pipeline import Cluster
from prometheus_client import CollectorRegistry

from kvcompass.loadgen.testing import LocalCluster, poll_until
from kvcompass.services.edge.replayer import EdgeReplayer, Poll
from kvcompass.services.edge.settings import EdgeSettings
from kvcompass.services.health import Health
from kvcompass.services.runtime import load_any_topology

__all__ = ["ThreadedEdge"]


class ThreadedEdge:
    """``EdgeReplayer`` entered and run in a thread; :meth:`stop` re-raises its error."""

    def __init__(
        self,
        cluster: LocalCluster,
        *,
        wrap_source: Callable[[Poll], Poll] | None = None,
        **env: str,
    ) -> None:
        settings = EdgeSettings.from_env(cluster.env(**env))
        self.health = Health()
        self.registry = CollectorRegistry()
        self.replayer = EdgeReplayer(
            settings,
            load_any_topology(settings.topology),
            kafka_bootstrap=cluster.kafka_bootstrap,
            redis_url=cluster.redis_url,
            health=self.health,
            registry=self.registry,
            wrap_source=wrap_source,
        )
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._entered = threading.Event()
        self._thread = threading.Thread(target=self._main, name="edge", daemon=True)

    def _main(self) -> None:
        try:
            with self.replayer:
                self._entered.set()
                self.replayer.run(self._stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread by stop()
            self.error = exc

    def start(self) -> ThreadedEdge:
        self._thread.start()
        poll_until(lambda: self._entered.is_set() or self.error, 30, "edge entered")
        if self.error is not None:
            raise self.error
        return self

    def metric(self, name: str, **labels: str) -> float:
        """A sample's value, summed over the labels not given (0 when absent)."""
        total = 0.0
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    total += sample.value
        return total

    def finish(self, cluster: Cluster, mu_procs: list[Popen[bytes]]) -> None:
        """As ``Cluster.finish`` for a process edge: drain the MUs, wait for this edge at
        their final snapshots, compare the views, stop."""
        cluster.wait_mu_caught_up()
        for proc in mu_procs:
            assert cluster.stop(proc) == 0, "maintenance unit did not drain cleanly"
        cluster.wait_edge_at(cluster.snapshot_positions())
        assert cluster.assert_edge_matches() > 0
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "edge replayer did not stop"
        if self.error is not None:
            raise self.error
