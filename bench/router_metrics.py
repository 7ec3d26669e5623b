"""What the router's metrics cost per request, one process vs a group's shared files.

    python bench/router_metrics.py

Runs the same loop twice, each in a fresh interpreter (multiprocess mode is chosen at
import): per request, the updates the router makes (``decided`` with the 14 candidates
of testbed-3region, ``requests`` and ``claims``). Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

_LOOP = """
import time
from types import SimpleNamespace
from prometheus_client import CollectorRegistry
from kvcompass.services.router.metrics import RouterMetrics

m = RouterMetrics(CollectorRegistry())
candidates = [SimpleNamespace(worker_id=f"w{i}", belief=0.9, queue_ms=3.0) for i in range(14)]
decision = SimpleNamespace(region="us", reason="score", candidates=candidates)
n, best = 20_000, float("inf")
for _ in range(3):
    t = time.perf_counter()
    for _ in range(n):
        m.decided(decision, 1e-5, "live")
        m.requests.labels("completions", "200").inc()
        m.claims(100, 90)
    best = min(best, (time.perf_counter() - t) / n)
print(best * 1e6)
"""


def per_request_us(env: dict[str, str]) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _LOOP], env=env, capture_output=True, text=True, check=True
    )
    return round(float(out.stdout), 1)


def main() -> None:
    alone = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    with tempfile.TemporaryDirectory() as directory:
        group = per_request_us({**alone, "PROMETHEUS_MULTIPROC_DIR": directory})
    one = per_request_us(alone)
    print(json.dumps({"one_process_us": one, "group_us": group, "ratio": round(group / one, 2)}))


if __name__ == "__main__":
    main()
