"""A maintenance unit refuses what cannot work at start, with one error naming the setting."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _pipeline import Cluster, prompts

from kvcompass.errors import ConfigError, KVCError, Transient
from kvcompass.services.health import Health
from kvcompass.services.infra import RunningInfra
from kvcompass.services.maintenance.service import MaintenanceUnit
from kvcompass.services.maintenance.settings import MaintenanceSettings

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(infra: RunningInfra, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(infra.kafka_bootstrap, infra.redis_url, tmp_path)
    try:
        yield c
    finally:
        c.close()


def _unit(cluster: Cluster, *, redis_url: str | None = None, **change: Any) -> MaintenanceUnit:
    return MaintenanceUnit(
        MaintenanceSettings.from_env(cluster.env(), **change),
        cluster.topology,
        kafka_bootstrap=cluster.kafka_bootstrap,
        redis_url=redis_url or cluster.redis_url,
        health=Health(),
    )


@pytest.mark.parametrize(
    ("change", "error", "text"),
    [
        (
            {"shards": 4},
            ConfigError,
            r"^topic 'kvc\.\w+\.events' exists with 3 partitions but 4 are required "
            r"\(KVC_SHARDS=4; or set KVC_SHARDS=3",
        ),
        (
            {"topic_patches": "kvc.nowhere"},
            ConfigError,
            r"^KVC_TOPIC_PATCHES='kvc\.nowhere': no such topic on ",
        ),
        (
            {"redis_url": "redis://127.0.0.1:1/0"},
            Transient,
            r"^KVC_REDIS_URL='redis://127\.0\.0\.1:1/0': Redis did not answer",
        ),
        (
            {"redis_url": "http://127.0.0.1/0"},
            ConfigError,
            r"^KVC_REDIS_URL='http://127\.0\.0\.1/0': ",
        ),
    ],
)
def test_a_setting_that_cannot_work_is_refused_at_start(
    cluster: Cluster, change: dict[str, Any], error: type[KVCError], text: str
) -> None:
    unit = _unit(cluster, **change)
    with pytest.raises(error, match=text), unit:
        pytest.fail("entered a unit that cannot work")
    assert unit.owned == {}


def test_a_snapshot_of_another_group_is_refused(cluster: Cluster) -> None:
    """Two consumer groups with one snapshot prefix would overwrite each other's shards."""
    rng = np.random.default_rng(31)
    mu = cluster.start_mu()
    cluster.random_traffic(rng, 30, prompts(rng, 20))
    cluster.wait_mu_caught_up()
    assert cluster.stop(mu) == 0
    unit = _unit(cluster, group_id=f"other-{cluster.tag}")
    with pytest.raises(ConfigError, match="belongs to 'kvc-"), unit:
        unit.run(threading.Event())
