"""``kvcompass router`` as a process in a real cluster (broker, Redis, MU, edge replayer,
emulated workers): it becomes ready once the edge's views are, forwards completions,
claims a prefix the workers' events made the index hold, gets it reused, keeps tenants
apart, and stops cleanly on SIGTERM."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvcompass.loadgen.testing import LocalCluster, poll_until
from kvcompass.services.infra import RunningInfra
from kvcompass.services.router.testing import StubWorker, free_port, serve_in_thread
from kvcompass.topology import load_builtin

pytestmark = pytest.mark.integration

TOPOLOGY = load_builtin("testbed-3region")
MODEL = TOPOLOGY.model.name


@pytest.fixture
def cluster(infra: RunningInfra, tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(
        infra.kafka_bootstrap, infra.redis_url, tmp_path, shards=2, topology="testbed-3region"
    )
    try:
        yield c
    finally:
        c.close()


def _free_range(n: int) -> int:
    """A base port whose next ``n`` ports were free a moment ago."""
    for _ in range(50):
        base = free_port()
        if all(_free(base + i) for i in range(n)):
            return base
    raise RuntimeError(f"no {n} consecutive free ports")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_the_router_process_forwards_claims_and_reuses_across_the_real_pipeline(
    cluster: LocalCluster,
) -> None:
    cluster.start_mu()
    cluster.start_edge()
    base = _free_range(len(TOPOLOGY.workers))
    cluster.start("worker", "workers", KVC_WORKER_IDS="region:us", KVC_WORKER_PORT_BASE=str(base),
                  KVC_TIME_SCALE="0.05")  # fmt: skip
    endpoints = ",".join(
        f"{w.id}=http://127.0.0.1:{base + w.index}" for w in TOPOLOGY.workers if w.region == "us"
    )
    port = free_port()
    router = cluster.start(
        "router", "router", KVC_REGION="us", KVC_ROUTER_PORT=str(port),
        KVC_WORKER_ENDPOINTS=endpoints, KVC_API_KEYS="ka=tenant_a,kb=tenant_b",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    cluster.wait_ready("router")
    assert httpx.get(url + "/readyz").status_code == 200

    prompt = list(range(1000, 1000 + 4096))
    body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": 2}

    def post(path: str, key: str = "ka") -> httpx.Response:
        return httpx.post(url + path, json=body, headers={"authorization": f"Bearer {key}"},
                          timeout=30)  # fmt: skip

    first = post("/v1/completions")
    assert first.status_code == 200, first.text
    worker = first.headers["x-kvc-worker"]
    assert first.headers["x-kvc-region"] == "us"
    assert first.json()["kvc"]["worker"] == worker

    # The worker's admit events reach the MU, its patches the edge's views, the router.
    def claimed() -> dict[str, Any] | None:
        d: dict[str, Any] = post("/v1/route").json()
        return d if d["claimed_tokens"] > 0 else None

    decision = poll_until(claimed, 60, "the router claims the prefix the worker holds")
    assert decision["worker"] == worker
    again = post("/v1/completions")
    assert again.status_code == 200
    assert again.headers["x-kvc-worker"] == worker
    claimed_tokens = int(again.headers["x-kvc-claimed-tokens"])
    assert claimed_tokens > 0
    assert again.json()["kvc"]["reused_tokens"] >= claimed_tokens

    other = post("/v1/route", key="kb").json()  # tenant B matches nothing of tenant A's
    assert other["claimed_tokens"] == 0
    assert all(c["matched_tokens"] == 0 for c in other["candidates"])
    assert post("/v1/completions", key="nope").status_code == 401

    # A stream from the emulated worker, through the router: one event per token.
    streamed = httpx.post(
        url + "/v1/completions",
        json={**body, "max_tokens": 3, "stream": True},
        headers={"authorization": "Bearer ka"},
        timeout=30,
    )
    events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert len(events) == 4, streamed.text
    assert events[-1] == "data: [DONE]"
    assert '"kvc"' in events[-2]

    metrics = httpx.get(url + "/metrics").text
    assert 'kvc_router_requests_total{endpoint="completions",status="200"} 3.0' in metrics
    assert cluster.stop(router) == 0


def test_router_processes_share_one_port_and_stop_together(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    with contextlib.ExitStack() as stack:
        stub, router, port = _router_group(cluster, stack, 3)
        children = Path(f"/proc/{router.pid}/task/{router.pid}/children")
        pids = poll_until(
            lambda: [int(p) for p in children.read_text().split()] or None, 30, "children"
        )
        assert len(pids) == 2

        url = f"http://127.0.0.1:{port}/v1/completions"
        body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 1}

        def all_serving() -> bool:
            # New connections are spread by the kernel; each process counts its own.
            for _ in range(30):
                with httpx.Client() as client:
                    assert client.post(url, json=body, timeout=10).status_code == 200
            return len(stub.requests) >= 30

        def three_listeners() -> set[str] | None:
            found = _listeners(port)
            return found if len(found) == 3 else None

        listening = poll_until(three_listeners, 60, "three processes listening on the port")
        poll_until(all_serving, 60, "requests served through the shared port")
        for pid in [router.pid, *pids]:
            assert _sockets(pid) & listening, f"process {pid} does not listen on {port}"
        assert cluster.stop(router) == 0
        for pid in pids:
            assert (
                not Path(f"/proc/{pid}").exists()
                or "zombie" in Path(f"/proc/{pid}/status").read_text()
            ), f"child {pid} outlived the router"


def _router_group(
    cluster: LocalCluster, stack: contextlib.ExitStack, processes: int
) -> tuple[StubWorker, subprocess.Popen[bytes], int]:
    """A stub worker for every worker id and a router group of ``processes`` in front of it:
    the stub, the primary, the API port."""
    stub = StubWorker("us-0", "us")
    stub_url = stack.enter_context(serve_in_thread(stub.app()))
    endpoints = ",".join(f"{w.id}={stub_url}" for w in TOPOLOGY.workers)
    port = free_port()
    router = cluster.start(
        "router", "router", KVC_REGION="us", KVC_ROUTER_PORT=str(port),
        KVC_WORKER_ENDPOINTS=endpoints, KVC_ROUTER_PROCESSES=str(processes),
    )  # fmt: skip
    return stub, router, port


def _listeners(port: int) -> set[str]:
    """Inodes of the sockets listening on ``port`` (/proc/net/tcp, state 0A)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":
            inodes.add(fields[9])
    return inodes


def _sockets(pid: int) -> set[str]:
    """Socket inodes of ``pid``'s open files."""
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                out.add(target[8:-1])
    return out


def test_a_router_group_counts_every_process_on_the_primarys_metrics(
    cluster: LocalCluster,
) -> None:
    """KVC_ROUTER_PROCESSES=2: the primary's /metrics counts the requests both processes
    served; an extra SIGKILLed is restarted and what it served is counted once."""
    with contextlib.ExitStack() as stack:
        _, router, port = _router_group(cluster, stack, 2)
        served: collections.Counter[int] = collections.Counter()  # responses per router pid
        body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 1}

        def serve_until(pid_served: Callable[[], bool], what: str) -> None:
            def batch() -> bool:
                for _ in range(10):
                    with httpx.Client() as client:  # a new connection: the kernel picks
                        reply = client.post(
                            f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=10
                        )
                    assert reply.status_code == 200, reply.text
                    served[int(reply.headers["x-kvc-router-pid"])] += 1
                return pid_served()

            poll_until(batch, 60, what)

        def counted(metrics_port: int) -> float:
            return _requests_total(f"http://127.0.0.1:{metrics_port}/metrics")

        serve_until(lambda: len(served) == 2, "both processes serving")
        assert router.pid in served
        assert counted(cluster.status_ports["router"]) == served.total()
        assert counted(port) == served.total()  # whichever process answers the API port

        extra = next(pid for pid in served if pid != router.pid)
        os.kill(extra, signal.SIGKILL)
        restarted = poll_until(
            lambda: [p for p in _children(router.pid) if p != extra], 30, "the extra restarted"
        )
        serve_until(lambda: restarted[0] in served, "the restarted extra serving")
        assert served[extra] > 0
        assert counted(cluster.status_ports["router"]) == served.total()
        environ = Path(f"/proc/{restarted[0]}/environ").read_bytes().split(b"\0")
        directory = Path(
            next(v for v in environ if v.startswith(b"PROMETHEUS_MULTIPROC_DIR="))
            .split(b"=", 1)[1]
            .decode()
        )
        assert directory.is_dir()
        assert cluster.stop(router) == 0
        assert not directory.exists()  # the next run of the group starts from no counts


def _children(pid: int) -> list[int]:
    """Child pids of every thread of ``pid`` (a restart comes from a thread's fork)."""
    pids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            pids += [int(child) for child in (task / "children").read_text().split()]
    return pids


def _requests_total(url: str) -> float:
    families = text_string_to_metric_families(httpx.get(url, timeout=10).text)
    return sum(
        s.value
        for f in families
        if f.name == "kvc_router_requests"
        for s in f.samples
        if s.name == "kvc_router_requests_total"
    )


def test_extras_drain_and_exit_when_the_primary_is_sigkilled(cluster: LocalCluster) -> None:
    """A SIGKILLed primary runs no exit code: its extra notices it has been orphaned,
    drains and exits, and nothing is left listening on the port or in the temp dir."""
    with contextlib.ExitStack() as stack:
        _, router, port = _router_group(cluster, stack, 2)
        poll_until(lambda: len(_listeners(port)) == 2 or None, 60, "both processes listening")
        (extra,) = _children(router.pid)
        stack.callback(_kill_if_alive, extra)  # an orphan must not outlive a failed test
        os.kill(router.pid, signal.SIGKILL)
        router.wait(timeout=30)

        def extra_gone() -> bool:
            status = Path(f"/proc/{extra}/status")
            return not status.exists() or "zombie" in status.read_text()

        poll_until(extra_gone, 30, "the orphaned extra exiting")
        assert not _listeners(port)
        # The extra, last out, removed the group's metrics directory the primary could not.
        assert not list(Path(tempfile.gettempdir()).glob(f"kvc-router-{router.pid}-*"))


def _kill_if_alive(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
