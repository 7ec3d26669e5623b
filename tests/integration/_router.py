"""A stand-in router process for tests: attaches a SharedIndexReader to an edge's views
once, then answers ``match`` for a fixed set of prompts on every request line.

Usage: python _router.py <shm prefix> <topology.toml> <prompts.npz> <namespace>
Each stdin line names an edge region; each answer is one JSON line on stdout:
``{"ready": false, "reason": ...}`` or ``{"ready": true, "matches": [[lengths, tiers], ...]}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from kvcompass.index.discovery import QueryPlanner
from kvcompass.index.layout import IndexLayout
from kvcompass.index.reader import IndexNotReady
from kvcompass.keys import Namespace
from kvcompass.levels import plan_levels
from kvcompass.shm import SharedIndexReader
from kvcompass.topology import load_topology


def main() -> None:
    prefix, topology_path, prompts_path, namespace = sys.argv[1:5]
    topology = load_topology(Path(topology_path))
    layout = IndexLayout.from_topology(topology)
    plan = plan_levels(topology)
    with np.load(prompts_path) as archive:
        prompts = [archive[name] for name in sorted(archive.files, key=int)]
    reader = SharedIndexReader(prefix, layout)  # once: it must follow edge restarts itself
    print(json.dumps({"attached": True}), flush=True)
    for line in sys.stdin:
        region = line.strip()
        planner = QueryPlanner(plan, region, Namespace(namespace))
        try:
            if not reader.ready():
                answer: dict[str, object] = {"ready": False, "reason": "not ready"}
            else:
                matches = [reader.match(planner.query(p)) for p in prompts]
                answer = {"ready": True, "matches": [[m.lengths, m.tiers] for m in matches]}
        except IndexNotReady as exc:
            answer = {"ready": False, "reason": str(exc)}
        print(json.dumps(answer), flush=True)
    reader.close()


if __name__ == "__main__":
    main()
