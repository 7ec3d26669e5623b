"""The services' clock-free retry policies: Backoff (Redis) and BrokerOutage (the broker)."""

from __future__ import annotations

import pytest

from kvcompass.errors import Transient
from kvcompass.services.backoff import Backoff
from kvcompass.services.kafka import BrokerLost, BrokerOutage


def test_backoff_doubles_up_to_its_cap_and_a_success_resets_it() -> None:
    backoff = Backoff(0.25, 1.0)
    assert backoff.due(0.0)
    waits = []
    for now in (0.0, 10.0, 20.0, 30.0):
        backoff.failed(now)
        waits.append(backoff.delay)
        assert not backoff.due(now + backoff.delay - 0.01)
        assert backoff.due(now + backoff.delay)
    assert waits == [0.25, 0.5, 1.0, 1.0]
    backoff.succeeded()
    assert backoff.delay == 0.0
    assert backoff.due(30.0)


def test_broker_outage_probes_once_per_period_then_gives_up_naming_the_setting() -> None:
    outage = BrokerOutage(100.0, 5.0, "broker:9092")
    assert not outage.probe_due(100.5)
    assert outage.probe_due(101.0)
    assert not outage.probe_due(101.5)
    assert outage.probe_due(102.0)
    assert not outage.probe_due(102.9)
    assert outage.probe_due(103.0)
    with pytest.raises(BrokerLost, match="KVC_BROKER_TIMEOUT_S=5") as lost:
        outage.probe_due(105.1)
    assert isinstance(lost.value, Transient)  # exit status 3: a dependency lost
    assert "KVC_KAFKA_BOOTSTRAP=broker:9092" in str(lost.value)
