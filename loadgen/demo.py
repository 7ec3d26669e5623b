"""``kvcompass demo``: the whole live request path on one machine, KVCompass against a
local-region-only baseline on the same workload.

It starts the embedded broker and Redis, a maintenance unit, one edge (replayer and
router) per region, every emulated worker of the topology and the WAN delay proxy
(:class:`~kvcompass.loadgen.stack.LocalStack`), then replays one seeded workload twice:
first with every router on ``local-least-loaded`` (each request stays in its origin
region, on the worker with the shortest queue, caches ignored), then, after emptying
every cache, with ``kvcompass``. It prints the two runs side by side per region, writes
the records, the summaries and a figure into ``--out``, and stops everything, also on
Ctrl-C. If a component fails to start, it exits with status 1 and a message naming it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, fields
from importlib import resources
from pathlib import Path

from kvcompass.loadgen.ctrl_c import CtrlC
from kvcompass.loadgen.driver import DriverConfig
from kvcompass.loadgen.figures import ttft_figure
from kvcompass.loadgen.outputs import output_folder
from kvcompass.loadgen.records import RequestRecord
from kvcompass.loadgen.replay import Replay, replay
from kvcompass.loadgen.scenario import DemoScenario
from kvcompass.loadgen.stack import ComponentFailed, LocalStack, StackConfig
from kvcompass.loadgen.summary import RunSummary, render_side_by_side
from kvcompass.loadgen.testing import PollTimeout, poll_until
from kvcompass.loadgen.workloads import (
    LiveRequest,
    RegionShares,
    SyntheticConfig,
    SyntheticWorkload,
)
from kvcompass.loadgen.workloads.request import bounded
from kvcompass.routing import PAPER_PRICE, RoutingConfig
from kvcompass.topology import Topology, builtin_names, load_builtin, load_topology

__all__ = ["default_scenario", "demo_workload", "main"]

BASELINE = "local-least-loaded"
KVCOMPASS = "kvcompass"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcompass demo",
        description=(
            "Start a whole KVCompass deployment on this machine (broker, Redis, MU, an "
            "edge per region, the topology's emulated workers behind a WAN delay proxy), "
            "replay one workload with a local-only least-loaded router and then with "
            "KVCompass, and compare them per region. About 3 minutes on 2 cores."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--topology",
        default="testbed-3region",
        choices=builtin_names(),
        help="the deployment to start: its regions, workers and round trips",
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="arrivals per run")
    parser.add_argument("--rate", type=float, default=3.0, help="mean arrivals per second")
    parser.add_argument("--seed", type=int, default=7, help="workload seed (both runs)")
    parser.add_argument(
        "--out", type=Path, default=Path("run/demo"), help="records, summaries, logs, figure"
    )
    parser.add_argument(
        "--levels",
        choices=("paper", "long-context"),
        default="long-context",
        help=(
            "index levels: the paper's L per region pair, or those plus doublings up to "
            "the model's context (a 16K-token local hit then reads 16384, not 4096)"
        ),
    )
    parser.add_argument(
        "--remote-margin-rtt",
        type=float,
        default=RoutingConfig.remote_margin_rtt,
        help="beyond the paper: round trips KVCompass's score adds to a worker in another "
        "region (the routers' KVC_REMOTE_MARGIN_RTT; 0 = the paper's score; default "
        "%(default)s)",
    )
    parser.add_argument(
        "--pending-credit",
        action=argparse.BooleanOptionalAction,
        default=RoutingConfig.pending_credit,
        help="beyond the paper: the routers credit a prefix they have just sent to a worker "
        "of their region until the index reports it (their KVC_PENDING_CREDIT; default on)",
    )
    parser.add_argument(
        "--prefix-chain",
        action=argparse.BooleanOptionalAction,
        default=RoutingConfig.prefix_chain,
        help="beyond the paper: the routers count a worker's index hit only where it extends "
        "the worker's shorter hits (their KVC_PREFIX_CHAIN; default on)",
    )
    parser.add_argument(
        "--tau-ms",
        type=float,
        default=RoutingConfig.tau_ms,
        help="τ of KVCompass's capacity price, min queue / τ (the routers' KVC_TAU_MS; "
        f"default %(default)s; the paper's price: {PAPER_PRICE['tau_ms']:g})",
    )
    parser.add_argument(
        "--lambda-max",
        type=float,
        default=RoutingConfig.lambda_max,
        help="the capacity price's cap λmax (the routers' KVC_LAMBDA_MAX; default "
        f"%(default)s; the paper's: {PAPER_PRICE['lambda_max']:g})",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="real seconds per emulated second for workers and WAN (1.0 = real time)",
    )
    return parser


def default_scenario() -> DemoScenario:
    """What ``kvcompass demo`` replays without flags (its topology by built-in name)."""
    args = _parser().parse_args([])
    return _scenario(args, args.topology)


def _scenario(args: argparse.Namespace, topology: str) -> DemoScenario:
    """The run's scenario: every other field is the flag of the same name."""
    flags = {f.name: getattr(args, f.name) for f in fields(DemoScenario) if f.name != "topology"}
    return DemoScenario(topology=topology, **flags)


def demo_workload(topology: Topology, seconds: float, rate: float, seed: int) -> list[LiveRequest]:
    """Tenants whose long documents and system prompts are shared by users in every
    region (origins by the regions' worker shares), so a region often asks for a prefix
    another region has already computed: the case cross-region discovery is for."""
    config = SyntheticConfig(
        seed=seed,
        rate=rate,
        tenants=2,
        document_share=0.5,
        documents_per_tenant=4,
        document_tokens_min=8_192,
        document_tokens_max=24_576,
        answer_tokens_max=64,
        max_prompt_tokens=32_768,
    )
    workload = SyntheticWorkload(config, RegionShares.of(topology))
    return list(bounded(workload.requests(), duration_s=seconds))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out: Path = args.out
    try:
        _scenario(args, args.topology)  # every flag checked before anything starts
        output_folder(out)
    except ValueError as exc:
        print(f"kvcompass demo: {exc}", file=sys.stderr)
        return 2
    topology_ref = args.topology
    if args.levels == "long-context":
        topology_ref = str(_with_long_context_levels(args.topology, out))
    topology = (
        load_topology(topology_ref)
        if args.levels == "long-context"
        else load_builtin(args.topology)
    )
    requests = demo_workload(topology, args.seconds, args.rate, args.seed)
    if not requests:  # before any component starts: two empty runs compare nothing
        print(
            f"kvcompass demo: no request arrives in --seconds {args.seconds:g} at --rate "
            f"{args.rate:g}: nothing to compare (give more seconds or a higher rate)",
            file=sys.stderr,
        )
        return 2
    # Beside the records, for `kvcompass sim agree` (a file name: the folder may move).
    recorded = Path(topology_ref).name if args.levels == "long-context" else args.topology
    _scenario(args, recorded).write(out)
    tenants = sorted({r.tenant for r in requests})
    api_keys = {f"demo-key-{t}": t for t in tenants}
    config = StackConfig(
        topology=topology,
        topology_ref=topology_ref,
        workdir=out,
        policy=BASELINE,
        time_scale=args.time_scale,
        api_keys=api_keys,
        extra_env={
            "KVC_REMOTE_MARGIN_RTT": str(args.remote_margin_rtt),
            "KVC_PENDING_CREDIT": str(args.pending_credit).lower(),
            "KVC_PREFIX_CHAIN": str(args.prefix_chain).lower(),
            "KVC_TAU_MS": str(args.tau_ms),
            "KVC_LAMBDA_MAX": str(args.lambda_max),
        },
    )
    t0 = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - t0:5.1f} s] {message}", flush=True)

    print(
        f"KVCompass demo: {len(requests)} requests over {args.seconds:g} s from "
        f"{len(tenants)} tenants on {topology.name} "
        f"({len(topology.workers)} workers in {len(topology.regions)} regions); "
        f"logs in {out / 'logs'}",
        flush=True,
    )
    stack = LocalStack(config)
    with CtrlC() as ctrl_c:
        try:
            stack.start(progress=lambda what: say(f"starting {what}"))
            say(f"up: routers {stack.router_urls}")
            runs: list[RunSummary] = []
            records: dict[str, list[RequestRecord]] = {}
            for policy in (BASELINE, KVCOMPASS):
                if policy != BASELINE:
                    say("emptying every worker's cache for the second run")
                    stack.reset_workers()
                    stack.start_routers(policy, progress=lambda what: say(f"restarting {what}"))
                    _wait_index_empty(stack, requests, api_keys)
                ctrl_c.check()
                say(f"replaying with {policy}")
                result = _replay(stack, requests, api_keys, topology, policy, out, ctrl_c)
                stack.check_alive()
                if result.interrupted:
                    raise KeyboardInterrupt
                if result.write_error is not None:  # a full disk, say: stop, say which file
                    print(
                        f"kvcompass demo: cannot write {policy}'s records under {out}: "
                        f"{result.write_error}",
                        file=sys.stderr,
                    )
                    return 1
                runs.append(result.summary)
                records[policy] = result.records
            ctrl_c.check()
            say("done; stopping")
        except ComponentFailed as exc:
            print(f"kvcompass demo: {exc}", file=sys.stderr)
            return 1
        except PollTimeout as exc:
            print(f"kvcompass demo: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("\nkvcompass demo: interrupted; stopping every component", file=sys.stderr)
            return 130
        finally:
            stack.stop()
    print()
    print(render_side_by_side(runs))
    (out / "summary.json").write_text(json.dumps([asdict(r) for r in runs], indent=2))
    figure = ttft_figure(records, runs, out / "ttft.png")
    print(f"\nfigure: {figure}")
    print(f"\nrecords and summaries in {out}; whole run {time.monotonic() - t0:.0f} s")
    return 0


def _with_long_context_levels(name: str, out: Path) -> Path:
    """A copy of the built-in topology ``name`` with ``long_context_levels = true``."""
    text = resources.files("kvcompass").joinpath("topologies", f"{name}.toml").read_text()
    setting = re.compile(r"^long_context_levels\s*=.*$", re.MULTILINE)
    if setting.search(text):
        text = setting.sub("long_context_levels = true", text, count=1)
    else:
        text = text.replace("\n[index]\n", "\n[index]\nlong_context_levels = true\n", 1)
    path = out / f"{name}-long-context.toml"
    path.write_text(text)
    return path


def _replay(
    stack: LocalStack,
    requests: list[LiveRequest],
    api_keys: dict[str, str],
    topology: Topology,
    policy: str,
    out: Path,
    ctrl_c: CtrlC,
) -> Replay:
    driver = DriverConfig(
        routers=stack.router_urls,
        api_keys={tenant: key for key, tenant in api_keys.items()},
        model=topology.model.name,
        stream=True,
        timeout_s=60.0,
    )
    return replay(
        requests,
        driver,
        name=policy,
        regions=[r.name for r in topology.regions],
        out=out / f"records-{policy}.jsonl",
        progress=True,
        total=len(requests),
        ctrl_c=ctrl_c,
    )


def _wait_index_empty(
    stack: LocalStack, requests: list[LiveRequest], api_keys: dict[str, str]
) -> None:
    """Until no edge sees any worker holding a prefix of the workload's prompts."""
    key_of = {tenant: key for key, tenant in api_keys.items()}
    sample = requests[:: max(1, len(requests) // 20)]

    def empty() -> bool:
        for request in sample:
            body = {"model": stack.topology.model.name, "prompt": list(request.tokens)}
            for url in stack.router_urls.values():
                decision = stack.post_json(url + "/v1/route", body, key=key_of[request.tenant])
                if any(c["matched_tokens"] and not c["pending"] for c in decision["candidates"]):
                    return False
        return True

    poll_until(empty, 60, "the reset workers' evictions reaching every edge", interval=0.2)
