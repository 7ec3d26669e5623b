"""One /metrics for a router group: what processes of a group write to the shared
directory is merged as each metric says (counters summed, gauges by their mode, the
false-claim rate recomputed), a dead member's live gauges leave the aggregate while
its counts stay, and the last member to leave removes the directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvcompass.services.router.group_metrics import (
    MULTIPROC_ENV,
    GroupCollector,
    forget_process,
    leave,
)

# One group member: its metrics, as the router's code sets them.
_MEMBER = """
import json, os, sys
from prometheus_client import CollectorRegistry
from kvcompass.services.router.metrics import RouterMetrics

spec = json.loads(sys.argv[1])
m = RouterMetrics(CollectorRegistry())
for _ in range(spec["requests"]):
    m.requests.labels("completions", "200").inc()
m.claims(spec["claimed"], spec["reused"])
m.index_live.set(spec["live"])
m.index_age.set(spec["age"])
m.queue_ages({"eu": spec["age"]})
print(os.getpid())
"""


def _member(directory: Path, **spec: float) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _MEMBER, json.dumps(spec)],
        env={**os.environ, MULTIPROC_ENV: str(directory)},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def _scrape(directory: Path) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(GroupCollector(str(directory)))
    text = generate_latest(registry).decode()
    samples = [
        (s.name + json.dumps(s.labels, sort_keys=True), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    by_name = dict(samples)
    assert len(by_name) == len(samples), f"a sample twice: {text}"
    return by_name


_REQUESTS = 'kvc_router_requests_total{"endpoint": "completions", "status": "200"}'


def test_the_scrape_merges_every_member_as_each_metric_says(tmp_path: Path) -> None:
    _member(tmp_path, requests=3, claimed=100, reused=100, live=1, age=0.0)
    _member(tmp_path, requests=4, claimed=300, reused=100, live=0, age=7.5)
    got = _scrape(tmp_path)
    assert got[_REQUESTS] == 7
    assert got["kvc_router_claimed_tokens_total{}"] == 400
    # (0 + 200) / 400: the group's ratio, not the max or sum of the members' 0 and 0.67.
    assert got["kvc_router_false_claim_rate{}"] == 0.5
    assert got["kvc_router_index_live{}"] == 0  # any member without views shows
    assert got["kvc_router_index_age_seconds{}"] == 7.5  # the oldest view in use
    assert got['kvc_router_queue_vector_age_seconds{"region": "eu"}'] == 7.5


def test_a_dead_member_keeps_its_counts_and_loses_its_live_gauges(tmp_path: Path) -> None:
    _member(tmp_path, requests=3, claimed=0, reused=0, live=1, age=0.0)
    dead = _member(tmp_path, requests=4, claimed=0, reused=0, live=0, age=9.0)
    forget_process(str(tmp_path), dead)
    got = _scrape(tmp_path)
    assert got[_REQUESTS] == 7
    assert got["kvc_router_index_live{}"] == 1
    assert got["kvc_router_index_age_seconds{}"] == 0.0


def test_the_last_member_to_leave_removes_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "group"
    directory.mkdir()
    primary = _member(directory, requests=1, claimed=0, reused=0, live=1, age=0.0)  # exited
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        first, last = sleeper.pid, os.getpid()  # two extras, both still running
        for pid in (first, last):
            (directory / f"counter_{pid}.db").touch()
        assert not leave(str(directory), first), "the other extra still runs"
        assert directory.is_dir()
        # The first is still alive (draining), but it has left: the last one out removes.
        assert leave(str(directory), last)
        assert not directory.exists()
        assert not leave(str(directory), primary)  # already gone: nothing to do
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_member_leaving_a_running_primary_keeps_the_directory(tmp_path: Path) -> None:
    (tmp_path / f"counter_{os.getpid()}.db").touch()  # the primary: this process
    extra = _member(tmp_path, requests=1, claimed=0, reused=0, live=1, age=0.0)
    assert not leave(str(tmp_path), extra)
    assert (tmp_path / f"counter_{os.getpid()}.db").exists()
