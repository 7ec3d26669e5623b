"""A router process matches prompts on an edge's live shared-memory views and gets the
maintenance unit's answers, also after the edge replayer was killed and restarted."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _pipeline import N_SHARDS, NS, TOPOLOGY_TOML, Cluster, prompts

from kvcompass.index.discovery import DiscoveryView, Match, QueryPlanner
from kvcompass.loadgen.testing import poll_until

pytestmark = pytest.mark.integration

ROUTER = Path(__file__).with_name("_router.py")


class Router:
    """The router subprocess: one request line in, one JSON answer out."""

    def __init__(self, cluster: Cluster, queries: list[np.ndarray], tmp: Path) -> None:
        archive = tmp / "prompts.npz"
        np.savez(archive, **{str(i): q for i, q in enumerate(queries)})  # type: ignore[arg-type]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(ROUTER),
                cluster.shm_prefix,
                str(TOPOLOGY_TOML),
                str(archive),
                NS.model,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert json.loads(self._line()) == {"attached": True}

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"router exited with {self.proc.poll()}"
        return line

    def ask(self, region: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(region + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self._line())
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.close()
        status = self.proc.wait(timeout=30)
        self.proc.stdout.close()
        assert status == 0


def mu_answers(cluster: Cluster, queries: list[np.ndarray], region: str) -> list[list[Any]]:
    """What the MU's current snapshots answer for the queries, matched in-process."""
    images = {}
    for shard in range(N_SHARDS):
        snapshot = cluster.store.load(shard, with_keys=False)
        assert snapshot is not None
        images.update({(shard, t): image for t, image in snapshot.views.items()})
    view = DiscoveryView.from_images(cluster.layout, N_SHARDS, images)
    planner = QueryPlanner(cluster.plan, region, NS)
    matches: list[Match] = [view.match(planner.query(q)) for q in queries]
    return [[m.lengths, m.tiers] for m in matches]


@pytest.fixture
def cluster(infra: Any, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(infra.kafka_bootstrap, infra.redis_url, tmp_path)
    try:
        yield c
    finally:
        c.close()


def test_a_router_process_matches_on_live_views_across_an_edge_restart(
    cluster: Cluster, tmp_path: Path
) -> None:
    rng = np.random.default_rng(31)
    family = prompts(rng, 60)
    queries = family[:24]
    regions = [r.name for r in cluster.topology.regions]
    mu = cluster.start_mu()
    edge = cluster.start_edge("edge-1")
    cluster.random_traffic(rng, 250, family)
    cluster.wait_edge_at(cluster.wait_mu_caught_up())
    router = Router(cluster, queries, tmp_path)
    try:
        poll_until(lambda: router.ask(regions[0])["ready"], 30, "router sees ready views")

        # Stop the MU so its final snapshot is the state the edge must serve.
        assert cluster.stop(mu) == 0
        cluster.wait_edge_at(cluster.snapshot_positions())
        held = 0
        for region in regions:
            answer = router.ask(region)
            assert answer["ready"], answer
            want = mu_answers(cluster, queries, region)
            assert answer["matches"] == want, region
            held += sum(1 for lengths, _ in want for n in lengths if n)
        assert held > 50, "the scenario should leave many prefixes held"

        cluster.stop(edge, signal.SIGKILL)
        dead = router.ask(regions[0])
        assert dead["ready"] is False, "a dead edge's views were answered as ready"

        mu = cluster.start_mu("mu-2")
        cluster.random_traffic(rng, 200, family)  # published while no edge runs
        edge = cluster.start_edge("edge-2")
        cluster.random_traffic(rng, 100, family)
        cluster.wait_mu_caught_up()
        assert cluster.stop(mu) == 0
        cluster.wait_edge_at(cluster.snapshot_positions())
        # The same router process, attached to the killed edge, follows the new one.
        poll_until(lambda: router.ask(regions[0])["ready"], 30, "router re-attached")
        for region in regions:
            answer = router.ask(region)
            assert answer["ready"], answer
            assert answer["matches"] == mu_answers(cluster, queries, region), region
    finally:
        router.close()
    assert cluster.stop(edge) == 0
