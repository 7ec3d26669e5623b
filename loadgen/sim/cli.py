"""``kvcompass sim run|sweep``: the event-driven simulator from the command line."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import textwrap
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvcompass.loadgen.cli import AZURE_RATE, workload_parameters
from kvcompass.loadgen.ctrl_c import sigterm_as_ctrl_c
from kvcompass.loadgen.inputs import input_file
from kvcompass.loadgen.outputs import output_folder
from kvcompass.loadgen.sim.cell import ABLATIONS, Cell, run_cell
from kvcompass.loadgen.sim.grid import product, run_grid
from kvcompass.loadgen.sim.grid_file import read_grid_file
from kvcompass.loadgen.sim.records import SimResult
from kvcompass.loadgen.workloads import WORKLOADS
from kvcompass.routing import PAPER_PRICE, POLICY_NAMES, RoutingConfig
from kvcompass.worker import EvictionPolicy

__all__ = ["main", "parser"]


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of numbers") from None


def _cell_arguments(p: argparse.ArgumentParser, sweep: bool) -> None:
    g = p.add_argument_group("simulation")
    g.add_argument("--topology", default="sim-8region", help="built-in name or TOML path")
    if not sweep:
        g.add_argument("--policy", default="kvcompass", choices=POLICY_NAMES, help="routing")
        g.add_argument(
            "--rate",
            type=float,
            help="Poisson arrivals per second (default 100; --workload trace without it: "
            "the trace's own arrival times divided by --speed)",
        )
        g.add_argument("--seed", type=int, default=0, help="seeds the workload and the sim")
    g.add_argument("--duration", type=float, default=30.0, help="simulated seconds of arrivals")
    g.add_argument(
        "--ablation",
        dest="ablations",
        action="append",
        choices=ABLATIONS,
        default=[],
        help="switch one KVCompass score term off (repeatable; Fig. 15)",
    )
    g.add_argument(
        "--remote-margin-rtt",
        type=float,
        default=RoutingConfig.remote_margin_rtt,
        help="beyond the paper: round trips KVCompass's score adds to a worker in another "
        "region, for its stale queue estimate (0: the paper's score; default %(default)s, "
        "as the router ships)",
    )
    g.add_argument(
        "--pending-credit",
        action=argparse.BooleanOptionalAction,
        default=RoutingConfig.pending_credit,
        help="beyond the paper: KVCompass credits a prefix it has just sent to a worker of "
        "its region until the index reports it (--no-pending-credit: the paper's score; "
        "on by default, as the router ships)",
    )
    g.add_argument(
        "--prefix-chain",
        action=argparse.BooleanOptionalAction,
        default=RoutingConfig.prefix_chain,
        help="beyond the paper: KVCompass counts a worker's index hit at a length only if "
        "it also hit at the region's previous length, turning away false locators "
        "(--no-prefix-chain: the paper's lookup; on by default, as the router ships)",
    )
    g.add_argument(
        "--tau-ms",
        type=float,
        default=RoutingConfig.tau_ms,
        help="τ of KVCompass's capacity price λ = min(λmax, min queue / τ) (default "
        f"%(default)s ms, as the router ships; the paper cells' reading of the paper: "
        f"{PAPER_PRICE['tau_ms']:g})",
    )
    g.add_argument(
        "--lambda-max",
        type=float,
        default=RoutingConfig.lambda_max,
        help="λmax, the capacity price's cap (default %(default)s, as the router ships; the "
        f"paper's: {PAPER_PRICE['lambda_max']:g})",
    )
    g.add_argument("--update-delay-ms", type=float, default=0.0, help="MU → edge patch delay")
    g.add_argument("--update-loss", type=float, default=0.0, help="patch batch loss (0..1)")
    g.add_argument("--jitter-pct", type=float, default=0.0, help="± WAN one-way jitter (%%)")
    g.add_argument(
        "--flush-ms",
        type=float,
        default=5.0,
        help="the maintenance units' patch flush period in simulated ms (default: the live "
        "MU's KVC_FLUSH_MS); longer is faster to simulate and staler at the edges",
    )
    g.add_argument(
        "--resync",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="edges detect gaps and reload from a writer snapshot, as the live edges do "
        "(beyond the paper, whose edges apply whatever arrives: --no-resync)",
    )
    g.add_argument(
        "--serving-overhead-ms",
        type=float,
        default=0.0,
        help="fixed per-request serving time the live path pays and the paper's model has "
        "not (HTTP parse and forward, SSE); kvcompass sim agree measures it",
    )
    g.add_argument(
        "--eviction", choices=[str(e) for e in EvictionPolicy], default="lru", help="cache policy"
    )
    g.add_argument("--sample-every", type=float, default=1.0, help="load sample period (s)")
    w = p.add_argument_group("workload (as kvcompass loadgen)")
    w.add_argument("--workload", choices=WORKLOADS, default="synthetic", help="generator")
    w.add_argument("--trace", type=Path, help="Mooncake JSONL trace for --workload trace")
    w.add_argument("--azure", type=Path, help="arrival times from an Azure trace CSV")
    w.add_argument("--azure-lengths", action="store_true", help="with --azure: its lengths too")
    w.add_argument("--requests", type=int, help="at most N requests")
    w.add_argument("--region-weights", type=_floats, default=(), help="population share per region")
    w.add_argument(
        "--set",
        dest="params",
        action="append",
        default=[],
        type=workload_parameters,
        metavar="NAME=VALUE",
        help="a synthetic workload parameter (kvcompass loadgen --help lists them)",
    )
    w.add_argument("--speed", type=float, default=1.0, help="trace / Azure time divided by this")
    w.add_argument("--skip", type=int, default=0, help="trace records skipped from the start")
    w.add_argument("--tenants", default="default", help="trace: comma list of tenant names")
    w.add_argument("--max-prompt-tokens", type=int, help="cut longer prompts")
    w.add_argument("--max-tokens", type=int, help="cap each request's max_tokens")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvcompass sim",
        description=textwrap.fill(
            "Simulate a deployment on virtual time with the real routing, index and worker "
            "code: per-request records, per-worker load and a summary.",
            88,
        ),
    )
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="one configuration: print a summary, write a folder",
        description="Simulate one configuration (a policy at a rate for a seed, on a "
        "topology, with one workload) and print its summary: TTFT and E2E percentiles, "
        "throughput, reuse, cross-region share, peak load factor. --out also writes "
        "requests.csv (one row per request), load.csv (per-worker load over time) and "
        "summary.json.",
    )
    _cell_arguments(run, sweep=False)
    run.add_argument("--out", type=Path, help="folder for requests.csv, load.csv, summary.json")
    run.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar"
    )
    sweep = sub.add_parser(
        "sweep",
        help="a grid of policies × rates × seeds in parallel processes (resumes)",
        description="Run every cell of the grid not already done under --out (one folder "
        "per cell, named by its settings), then write --out/index.csv. The grid comes from "
        "flags, or a TOML file whose keys are policies, rates, seeds and any option of a "
        "cell (flags given too are overridden).",
    )
    _cell_arguments(sweep, sweep=True)
    # Parsed by agreement.main (see main); listed here for --help.
    sub.add_parser(
        "agree", help="compare with a live demo run's records (kvcompass sim agree --help)"
    )
    sweep.add_argument("--grid", type=Path, help="TOML file: policies, rates, seeds, options")
    sweep.add_argument("--policies", default="kvcompass", help="comma list of policies")
    sweep.add_argument("--rates", type=_floats, default=(100.0,), help="comma list of rates")
    sweep.add_argument("--seeds", default="0", help="comma list of seeds")
    sweep.add_argument("--jobs", type=int, help="processes (default: CPU count)")
    sweep.add_argument("--out", type=Path, required=True, help="results folder")
    return p


def _cell(args: argparse.Namespace, **override: Any) -> Cell:
    names = {f.name for f in dataclasses.fields(Cell)}
    values = {k: v for k, v in vars(args).items() if k in names and v is not None}
    values |= {"ablations": tuple(args.ablations), "params": tuple(args.params)}
    values["sample_every_s"] = args.sample_every
    if args.command == "run" and args.rate is None and args.workload == "trace":
        values["trace_times"] = True
    if args.command == "run" and args.rate is not None and args.azure is not None:
        raise ValueError(AZURE_RATE)
    # A TOML grid gives lists; a cell is hashable (the grid keys its folders by cell).
    values |= {k: tuple(v) if isinstance(v, list) else v for k, v in override.items()}
    return Cell(**values)


def _table(result: SimResult) -> str:
    s = result.summary()
    rows = [
        ("requests", f"{s['requests']}"),
        ("TTFT P50 / P99 (ms)", f"{s.get('ttft_p50_ms', 0):.1f} / {s.get('ttft_p99_ms', 0):.1f}"),
        ("E2E P50 / P99 (ms)", f"{s.get('e2e_p50_ms', 0):.1f} / {s.get('e2e_p99_ms', 0):.1f}"),
        ("mean queueing (ms)", f"{s.get('queue_mean_ms', 0):.1f}"),
        ("throughput (req/s)", f"{s.get('throughput_req_per_s', 0):.1f}"),
        ("throughput (tokens/s)", f"{s.get('throughput_tokens_per_s', 0):.0f}"),
        ("reused prefill share", f"{s.get('reuse_share', 0):.3f}"),
        ("cross-region share", f"{s.get('cross_region_share', 0):.3f}"),
        ("peak load factor", f"{s.get('peak_load_factor', 0):.2f}"),
        (
            "wall s / sim req per wall s",
            f"{s['wall_s']:.1f} / {s.get('sim_requests_per_wall_s', 0):.0f}",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _run(args: argparse.Namespace) -> int:
    cell = _cell(args)
    if args.out is not None:
        output_folder(args.out)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    if show:
        from tqdm import tqdm

        bar = tqdm(total=cell.duration, unit="sim s", desc=cell.policy)

        def progress(now: float) -> None:
            bar.update(min(now, cell.duration or now) - bar.n)

        result = run_cell(cell, progress)
        bar.close()
    else:
        result = run_cell(cell)
    print(_table(result))
    if args.out is not None:
        print(f"wrote {result.write(args.out)}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    if args.jobs is not None and args.jobs < 1:  # -1 ran serially, 0 on every core
        raise ValueError(f"--jobs must be at least 1 (or left out: CPU count), got {args.jobs}")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    rates = list(args.rates)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    override: dict[str, Any] = {}
    if args.grid is not None:
        grid_file = input_file(args.grid, "--grid")
        policies, rates, seeds, override = read_grid_file(grid_file, policies, rates, seeds)
    unknown = sorted(set(policies) - set(POLICY_NAMES))
    if unknown:
        raise ValueError(f"unknown policies {unknown}; known: {', '.join(POLICY_NAMES)}")
    for name, values in (("policies", policies), ("rates", rates), ("seeds", seeds)):
        if not values:  # an empty product: the sweep would run nothing and say done
            where = f"--{name}" if args.grid is None else f"--{name} or {name} in {args.grid}"
            raise ValueError(f"the grid has no {name} ({where} names none): nothing to run")
    grid = product(_cell(args, **override), policies, rates, seeds)
    output_folder(args.out)
    jobs = (os.cpu_count() or 1) if args.jobs is None else args.jobs
    run_grid(grid, args.out, jobs=jobs, progress=True)
    print(f"wrote {args.out / 'index.csv'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["agree"]:
        from kvcompass.loadgen.sim.agreement import main as agree_main

        return agree_main(argv[1:])
    args = parser().parse_args(argv)
    try:
        with sigterm_as_ctrl_c():
            return _run(args) if args.command == "run" else _sweep(args)
    except (ValueError, KeyError, OSError, tomllib.TOMLDecodeError) as exc:
        print(f"kvcompass sim: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        kept = (
            "nothing written"
            if args.command == "run"
            else f"the cells finished so far are kept under {args.out}: the same command "
            "runs the rest"
        )
        print(f"kvcompass sim: interrupted; {kept}", file=sys.stderr)
        return 130
