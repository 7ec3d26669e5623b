"""The simulator against the live demo on one shared scenario: how far apart they are.

``kvcompass demo`` replays :func:`~kvcompass.loadgen.demo.demo_workload` (seeded) on the
live stack and writes ``records-<policy>.jsonl``. Here the same requests run through
:func:`simulate` on the same topology and the two are compared request by request
(joined on ``request_id``, live failures left out): TTFT and E2E percentiles, the share
of prefill reused, the share served in another region, and how often both picked the
same worker. The paper never quantified its simulator's error; this states ours.

Stated tolerance (:data:`TOLERANCE`): P50 and P90 TTFT and P50 E2E within 25 % of the
live value, reuse and cross-region shares within 0.10. What the simulator leaves out
and the live run pays: HTTP and SSE handling, Python scheduling on a busy machine, the
broker's and replayer's latency beyond ``update_delay_ms``, the real clock's drift
between processes. Live times are divided by the demo's ``--time-scale``.

The first of these is near-constant per request, so it is measured
(:func:`measured_overhead`) and simulated as ``SimConfig.serving_overhead_ms``: the
comparison runs the simulator twice, once as the paper's model (no overhead) to measure
it, once with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvcompass.loadgen.demo import default_scenario, demo_workload
from kvcompass.loadgen.inputs import input_file
from kvcompass.loadgen.outputs import output_file
from kvcompass.loadgen.records import RequestRecord, read_records
from kvcompass.loadgen.scenario import SCENARIO_FILE, DemoScenario
from kvcompass.loadgen.sim.cell import topology_of
from kvcompass.loadgen.sim.config import SimConfig
from kvcompass.loadgen.sim.fingerprint import code_fingerprint
from kvcompass.loadgen.sim.records import SimRecord
from kvcompass.loadgen.sim.simulator import simulate
from kvcompass.loadgen.workloads import LiveRequest
from kvcompass.routing import POLICY_NAMES, routing_config
from kvcompass.topology import Topology

__all__ = ["TOLERANCE", "Gap", "compare", "main", "measured_overhead", "scenario_of"]

#: metric -> (kind, bound): "rel" |sim/live − 1| ≤ bound, "abs" |sim − live| ≤ bound.
TOLERANCE: dict[str, tuple[str, float]] = {
    "ttft_p50_ms": ("rel", 0.25),
    "ttft_p90_ms": ("rel", 0.25),
    "e2e_p50_ms": ("rel", 0.25),
    "reuse_share": ("abs", 0.10),
    "cross_region_share": ("abs", 0.10),
}


@dataclass(frozen=True)
class Gap:
    metric: str
    sim: float
    live: float
    gap: float  # relative or absolute, as the metric's tolerance says
    bound: float

    @property
    def within(self) -> bool:
        return abs(self.gap) <= self.bound


def _metrics(
    ttft: Sequence[float], e2e: Sequence[float], reused: int, prompt: int, cross: int, n: int
) -> dict[str, float]:
    return {
        "ttft_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_p90_ms": float(np.percentile(ttft, 90)),
        "e2e_p50_ms": float(np.percentile(e2e, 50)),
        "reuse_share": reused / max(prompt, 1),
        "cross_region_share": cross / max(n, 1),
    }


def _finished(live: Sequence[RequestRecord]) -> dict[str, RequestRecord]:
    return {r.request_id: r for r in live if r.ok and r.ttft_ms is not None}


def measured_overhead(
    sim: Sequence[SimRecord], live: Sequence[RequestRecord], time_scale: float = 1.0
) -> tuple[float, int]:
    """The live path's fixed per-request time the model leaves out (ms), and how many
    requests the estimate rests on.

    For a request the simulator served without queueing, on the same worker and with
    the same reused tokens as the live run, the model's TTFT (without any overhead) is
    lookup + WAN round trip + reload + prefill of the very work the live worker did, so
    the live TTFT's excess over it is what the model does not have. The median of those
    excesses: a live request can still have queued behind one the model did not
    (emulated workers share a busy machine), which only adds, so the mean would be
    pulled up by a few while the median is not."""
    live_ok = _finished(live)
    excess = []
    for s in sim:
        r = live_ok.get(s.request_id)
        if (
            r is None
            or s.queue_ms > 0
            or s.worker != r.worker
            or s.reused_tokens != r.reused_tokens
        ):
            continue
        excess.append((r.ttft_ms or 0.0) / time_scale - (s.ttft_ms - s.overhead_ms))
    if not excess:
        raise ValueError(
            "no request ran unqueued on the same worker with the same reuse "
            f"(of {len(live_ok)} finished live requests)"
        )
    return float(np.median(excess)), len(excess)


def compare(
    sim: Sequence[SimRecord], live: Sequence[RequestRecord], time_scale: float = 1.0
) -> tuple[list[Gap], dict[str, Any]]:
    """Gaps on the requests both sides finished, and facts about the join."""
    live_ok = _finished(live)
    both = [s for s in sim if s.request_id in live_ok]
    if not both:
        raise ValueError("no request finished on both sides (are the workloads the same?)")
    pairs = [(s, live_ok[s.request_id]) for s in both]
    sim_m = _metrics(
        [s.ttft_ms for s in both],
        [s.e2e_ms for s in both],
        sum(s.reused_tokens for s in both),
        sum(s.prompt_tokens for s in both),
        sum(s.worker_region != s.origin for s in both),
        len(both),
    )
    lives = [r for _, r in pairs]
    live_m = _metrics(
        [(r.ttft_ms or 0.0) / time_scale for r in lives],
        [(r.e2e_ms or 0.0) / time_scale for r in lives],
        sum(r.reused_tokens or 0 for r in lives),
        sum(r.prompt_tokens for r in lives),
        sum(r.cross_region for r in lives),
        len(lives),
    )
    gaps = []
    for metric, (kind, bound) in TOLERANCE.items():
        a, b = sim_m[metric], live_m[metric]
        gap = (a / b - 1.0 if b else float("inf")) if kind == "rel" else a - b
        gaps.append(Gap(metric, a, b, gap, bound))
    facts = {
        "joined": len(both),
        "live_failed": len(live) - len(live_ok),
        "not_in_live": len(sim) - len(both),
        "same_worker_share": sum(s.worker == r.worker for s, r in pairs) / len(pairs),
    }
    return gaps, facts


def render(gaps: Sequence[Gap], facts: dict[str, Any]) -> str:
    lines = [f"{'metric':<20} {'sim':>10} {'live':>10} {'gap':>8} {'bound':>6}  ok"]
    for g in gaps:
        lines.append(
            f"{g.metric:<20} {g.sim:>10.3f} {g.live:>10.3f} {g.gap:>+8.3f} {g.bound:>6.2f}  "
            + ("yes" if g.within else "NO")
        )
    shown = (f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in facts.items())
    lines.append(", ".join(shown))
    return "\n".join(lines)


def scenario_of(
    recorded: DemoScenario | None, folder: Path, given: Mapping[str, Any]
) -> DemoScenario:
    """The scenario the demo recorded in ``folder`` (:meth:`DemoScenario.read`), which the
    flags ``given`` may restate but not contradict (ValueError naming both); without a
    recording, ``given`` over the demo's defaults."""
    if recorded is None:
        return dataclasses.replace(default_scenario(), **given)
    for name, value in given.items():
        theirs = getattr(recorded, name)
        if name == "topology":
            theirs = recorded.topology_ref(folder)
            if _same_topology(value, theirs):
                continue
        elif value == theirs:
            continue
        flag = "--" + name.replace("_", "-")
        raise ValueError(
            f"{flag} {value} contradicts the demo's {theirs}, recorded in "
            f"{folder / SCENARIO_FILE}: omit the flag"
        )
    return recorded


def _same_topology(given: str, recorded: str) -> bool:
    if given == recorded:
        return True
    mine, theirs = Path(given), Path(recorded)
    return mine.is_file() and theirs.is_file() and mine.resolve() == theirs.resolve()


def _config(
    args: argparse.Namespace, scenario: DemoScenario, topology: Topology, overhead: float
) -> SimConfig:
    return SimConfig(
        topology,
        policy=args.policy,
        seed=scenario.seed,
        update_delay_ms=args.update_delay_ms,
        serving_overhead_ms=overhead,
        routing=routing_config(scenario),
    )


def _measure(
    args: argparse.Namespace,
    scenario: DemoScenario,
    topology: Topology,
    requests: Sequence[LiveRequest],
    live: Sequence[RequestRecord],
) -> float:
    """The overhead measured against the paper's model (printed)."""
    paper = simulate(_config(args, scenario, topology, 0.0), requests).records
    overhead, n = measured_overhead(paper, live, scenario.time_scale)
    print(
        f"serving overhead {overhead:.1f} ms: the median of live TTFT minus the model's "
        f"over {n} requests the simulator ran unqueued on the live worker, same reuse"
    )
    return overhead


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="kvcompass sim agree",
        description="Compare the simulator with a live demo run's records (same scenario).",
    )
    p.add_argument("--live", type=Path, required=True, help="records-<policy>.jsonl of the demo")
    p.add_argument(
        "--policy", default="kvcompass", choices=POLICY_NAMES, help="the policy of that live run"
    )
    p.add_argument("--update-delay-ms", type=float, default=0.0, help="MU → edge delay to model")
    demo = p.add_argument_group(
        "the demo's scenario",
        f"Read from the {SCENARIO_FILE} the demo wrote beside --live; a flag may restate "
        "it, not contradict it. Without that file: these flags, defaulting to the demo's.",
    )
    demo.add_argument("--topology", help="the demo's topology (name or TOML)")
    demo.add_argument("--seconds", type=float, help="the demo's --seconds")
    demo.add_argument("--rate", type=float, help="the demo's --rate")
    demo.add_argument("--seed", type=int, help="the demo's --seed")
    demo.add_argument("--time-scale", type=float, help="the demo's --time-scale")
    demo.add_argument("--remote-margin-rtt", type=float, help="the demo's --remote-margin-rtt")
    demo.add_argument(
        "--pending-credit",
        action=argparse.BooleanOptionalAction,
        help="the demo's --pending-credit",
    )
    demo.add_argument(
        "--prefix-chain",
        action=argparse.BooleanOptionalAction,
        help="the demo's --prefix-chain",
    )
    demo.add_argument("--tau-ms", type=float, help="the demo's --tau-ms")
    demo.add_argument("--lambda-max", type=float, help="the demo's --lambda-max")
    p.add_argument(
        "--serving-overhead-ms",
        type=float,
        help="per-request serving overhead to simulate (default: measured on --live)",
    )
    p.add_argument("--json", type=Path, help="write the gaps here as JSON")
    args = p.parse_args(argv)
    folder = args.live.parent
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(DemoScenario)
        if getattr(args, f.name) is not None
    }
    try:
        if args.json is not None:
            output_file(args.json, "--json")
        recorded = DemoScenario.read(folder)
        scenario = scenario_of(recorded, folder, given)
        input_file(args.live, "--live")
        if recorded is None:
            print(
                f"kvcompass sim agree: no {SCENARIO_FILE} beside {args.live}; simulating "
                f"{scenario} (the flags, else the demo's defaults)",
                file=sys.stderr,
            )
        topology = topology_of(scenario.topology_ref(folder))
        live = list(read_records(args.live))
        requests = demo_workload(topology, scenario.seconds, scenario.rate, scenario.seed)
        overhead = args.serving_overhead_ms
        if overhead is None:
            overhead = _measure(args, scenario, topology, requests, live)
        config = _config(args, scenario, topology, overhead)  # checks the flags' values
    except (OSError, ValueError, KeyError) as exc:
        print(f"kvcompass sim agree: {exc}", file=sys.stderr)
        return 2
    gaps, facts = compare(simulate(config, requests).records, live, scenario.time_scale)
    facts["serving_overhead_ms"] = overhead
    print(render(gaps, facts))
    if args.json is not None:
        rows = [g.__dict__ | {"within": g.within} for g in gaps]
        # What was compared: the scenario simulated and the code that simulated it.
        provenance = {"scenario": dataclasses.asdict(scenario), "code": code_fingerprint()}
        report = {"gaps": rows, "facts": facts} | provenance
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(g.within for g in gaps) else 1
