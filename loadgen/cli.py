"""``kvcompass loadgen``: replay a workload against the edge routers, one request at a
time at its arrival time (open loop), and report per origin region."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvcompass.loadgen.driver import DriverConfig
from kvcompass.loadgen.inputs import input_file
from kvcompass.loadgen.outputs import output_file
from kvcompass.loadgen.replay import replay
from kvcompass.loadgen.summary import failures, render_side_by_side
from kvcompass.loadgen.workloads import (
    WORKLOADS,
    LiveRequest,
    bounded,
    make_workload,
    workload_config,
)
from kvcompass.topology import Topology, builtin_names, load_builtin, load_topology

__all__ = ["main", "parser", "workload", "workload_parameters"]


def _pairs(text: str) -> dict[str, str]:
    """NAME=VALUE[,NAME=VALUE...]; ValueError naming the first item that is not one, or
    a name given twice (the later would silently win)."""
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"{item!r} is not NAME=VALUE")
        if key.strip() in out:
            raise ValueError(f"{key.strip()!r} is given twice")
        out[key.strip()] = value.strip()
    return out


def _pairs_argument(text: str) -> dict[str, str]:
    """argparse type of ``--routers`` and ``--api-keys``: :func:`_pairs`, its error as
    argparse's usage line."""
    try:
        return _pairs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def workload_parameters(text: str) -> str:
    """argparse type of ``--set``: NAME=VALUE[,NAME=VALUE...], refused when read (a usage
    line) rather than as a traceback once the workload is built."""
    _pairs_argument(text)
    return text


def _weights(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of numbers") from None


def _parameters_help() -> str:
    parts = []
    for name in WORKLOADS:
        if name == "trace":
            continue
        rows = [
            f"  {param} (default {default!r}): {doc}"
            for param, default, doc in workload_config(name).parameters()
        ]
        parts.append(f"--workload {name} parameters (--set NAME=VALUE):\n" + "\n".join(rows))
    return "\n\n".join(parts)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvcompass loadgen",
        description=textwrap.fill(
            "Replay a workload against the edge routers: each request goes at its arrival "
            "time to its origin region's router (POST /v1/completions, token-id prompt), "
            "open loop. Writes one JSON record per request and prints a summary per origin "
            "region (TTFT, E2E, throughput, reused vs recomputed prefill, cross-region "
            "forwards, errors).",
            88,
        ),
        epilog=_parameters_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w = p.add_argument_group("workload")
    w.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="synthetic",
        help="mixed (ToolBench/LooGLE/APPS-like), wildchat, lmsys (multi-turn chats), "
        "synthetic, or trace (a Mooncake trace); the first four are synthetic look-alikes",
    )
    w.add_argument("--trace", type=Path, help="Mooncake JSONL trace (.gz/.xz) for --workload trace")
    w.add_argument(
        "--azure",
        type=Path,
        help="mixed/wildchat/lmsys: arrival times from an Azure trace CSV (.gz), scaled by --speed",
    )
    w.add_argument(
        "--azure-lengths",
        action="store_true",
        help="with --azure: the trace's input / output lengths too",
    )
    w.add_argument("--topology", default="testbed-3region", help="built-in name or TOML path")
    w.add_argument("--seed", type=int, default=0, help="seeds every draw (default 0)")
    w.add_argument(
        "--region-weights",
        type=_weights,
        default=(),
        help="population share per region, topology order (e.g. 8,2,4); default worker counts",
    )
    w.add_argument(
        "--rate", type=float, help="Poisson arrivals per second (trace: replaces its times)"
    )
    w.add_argument("--speed", type=float, default=1.0, help="trace / Azure time divided by this")
    w.add_argument("--duration", type=float, help="send requests arriving in the first S seconds")
    w.add_argument("--requests", type=int, help="send at most N requests")
    w.add_argument("--skip", type=int, default=0, help="trace records skipped from the start")
    w.add_argument("--tenants", default="default", help="trace: comma list of tenant names")
    w.add_argument("--max-prompt-tokens", type=int, help="cut longer prompts (keeps prefixes)")
    w.add_argument("--max-tokens", type=int, help="cap each request's max_tokens")
    w.add_argument(
        "--set",
        dest="params",
        action="append",
        default=[],
        type=workload_parameters,
        metavar="NAME=VALUE",
        help="a workload parameter (see below); repeatable",
    )
    d = p.add_argument_group("driver")
    d.add_argument(
        "--routers",
        type=_pairs_argument,
        default={},
        help="router URL per origin region: us=http://127.0.0.1:8000,eu=...",
    )
    d.add_argument(
        "--api-keys",
        type=_pairs_argument,
        default={},
        help="key=tenant pairs (the routers' KVC_API_KEYS); tenants without a key send none",
    )
    d.add_argument("--model", help="the body's model (default: the topology's model name)")
    d.add_argument(
        "--stream", action=argparse.BooleanOptionalAction, default=True, help="SSE (TTFT measured)"
    )
    d.add_argument("--timeout", type=float, default=120.0, help="seconds per request, in total")
    d.add_argument("--max-in-flight", type=int, default=4096, help="open requests before dropping")
    o = p.add_argument_group("output")
    o.add_argument("--out", type=Path, help="per-request records (JSONL)")
    o.add_argument("--summary-json", type=Path, help="the summary as JSON")
    o.add_argument("--name", default="run", help="the run's column name in the summary")
    o.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: on a terminal)",
    )
    o.add_argument("--dry-run", action="store_true", help="describe the workload; send nothing")
    return p


def _topology(name_or_path: str) -> Topology:
    if name_or_path in builtin_names():
        return load_builtin(name_or_path)
    return load_topology(Path(name_or_path))


def _check_bounds(args: argparse.Namespace) -> None:
    """ValueError naming the first workload option without meaning (a zero or negative
    bound would describe, replay or simulate no request, or empty prompts)."""
    for name, least in (
        ("requests", 1),
        ("max_prompt_tokens", 1),
        ("max_tokens", 1),
        ("seed", 0),
        ("skip", 0),
    ):
        value = getattr(args, name, None)
        if value is not None and not value >= least:
            raise ValueError(f"--{name.replace('_', '-')} must be at least {least}, got {value}")
    for name in ("duration", "speed"):
        value = getattr(args, name, None)
        if value is not None and not value > 0:
            raise ValueError(f"--{name} must be positive, got {value}")
    # An infinite --duration is no bound (allowed); an infinite --speed or --rate would
    # put every arrival at t = 0.
    for name in ("speed", "rate"):
        value = getattr(args, name, None)
        if value is not None and math.isinf(value):
            raise ValueError(f"--{name} must be finite, got {value}")


def check_bounded(
    workload: str, azure: object, duration: float | None, requests: int | None
) -> None:
    """ValueError unless an endless workload (a generated one without Azure arrivals) has
    a finite --duration or --requests: without either a replay, a dry run or a
    simulation never ends (an infinite --duration bounds nothing)."""
    if workload == "trace" or azure is not None or requests is not None:
        return
    if duration is None:
        raise ValueError(f"the {workload} workload is endless: give --duration or --requests")
    if math.isinf(duration):
        raise ValueError(
            f"the {workload} workload is endless and --duration inf bounds nothing: give a "
            "finite --duration or --requests"
        )


#: Azure arrivals are the trace's own times: a Poisson rate beside them would be ignored.
AZURE_RATE = (
    "a Poisson rate (--rate, --set rate=) is not read with --azure, whose arrivals are the "
    "trace's own (scale them with --speed)"
)


def _check_unread(args: argparse.Namespace) -> None:
    """ValueError naming an option the chosen workload would not read: a run that looks
    like a trace replay (its folder is even named after the trace) but drew another
    workload is worse than no run."""
    trace = args.workload == "trace"
    azure = getattr(args, "azure", None) is not None
    generated = "the mixed, wildchat and lmsys workloads"
    # (flag, given, read by this workload, what reads it)
    options = (
        ("trace", getattr(args, "trace", None) is not None, trace, "--workload trace"),
        ("skip", getattr(args, "skip", 0) != 0, trace, "--workload trace"),
        ("tenants", getattr(args, "tenants", "default") != "default", trace, "--workload trace"),
        (
            "speed",
            getattr(args, "speed", 1.0) != 1.0,
            trace or azure,
            "--workload trace and --azure",
        ),
        ("azure", azure, not trace, generated),
        ("azure-lengths", bool(getattr(args, "azure_lengths", False)), not trace, generated),
    )
    for flag, given, read, readers in options:
        if given and not read:
            raise ValueError(
                f"--{flag} is read only by {readers}, not by --workload {args.workload}"
            )


def _set_number(text: str, name: str, kind: type[int] | type[float]) -> Any:
    """``--set name=text`` as an int or float, or one ValueError naming it."""
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ValueError(f"--set {name} must be {what}, got {text!r}") from None


def workload(args: argparse.Namespace, topology: Topology) -> Iterator[LiveRequest]:
    """The requests the arguments describe, bounded by --duration / --requests."""
    _check_bounds(args)
    _check_unread(args)
    for name in ("trace", "azure"):
        if getattr(args, name, None) is not None:
            input_file(Path(getattr(args, name)), f"--{name}")
    params: dict[str, Any] = _pairs(",".join(args.params)) if args.params else {}
    seed = args.seed
    if "seed" in params:
        seed = _set_number(params.pop("seed"), "seed", int)
        if seed < 0:
            raise ValueError(f"--set seed must be at least 0, got {seed}")
    rate = _set_number(params.pop("rate"), "rate", float) if "rate" in params else args.rate
    if "azure" in params:
        input_file(Path(params["azure"]), "--set azure")
    azure = args.azure is not None or "azure" in params
    if rate is not None and azure and args.workload != "trace":
        raise ValueError(AZURE_RATE)
    if rate is not None and args.workload == "trace" and args.speed != 1.0:
        raise ValueError(
            "--speed scales the trace's own arrival times, which a Poisson rate (--rate, "
            "--set rate=) replaces: give one of them"
        )
    if args.max_prompt_tokens is not None:
        params["max_prompt_tokens"] = args.max_prompt_tokens
    if args.workload == "trace":
        if args.trace is None:
            raise ValueError("--workload trace needs --trace PATH")
        params.update(
            trace=args.trace,
            speed=args.speed,
            skip=args.skip,
            tenants=args.tenants,
            max_output_tokens=args.max_tokens,
        )
        if args.requests is not None:
            params["limit"] = args.requests
    elif args.azure is not None:
        takes = [
            w
            for w in WORKLOADS
            if w != "trace" and "azure" in {n for n, _, _ in workload_config(w).parameters()}
        ]
        if args.workload not in takes:
            raise ValueError(
                f"--azure replays its arrivals into the {', '.join(takes)} workloads, "
                f"not {args.workload} (give --workload)"
            )
        params.update(azure=str(args.azure), speed=args.speed, azure_lengths=args.azure_lengths)
    elif args.azure_lengths:
        raise ValueError("--azure-lengths needs --azure PATH")
    requests = make_workload(
        args.workload, topology, rate, seed, region_weights=args.region_weights, **params
    )
    if args.max_tokens is not None and args.workload != "trace":
        cap = args.max_tokens
        requests = (dataclasses.replace(r, max_tokens=min(r.max_tokens, cap)) for r in requests)
    return bounded(requests, args.duration, args.requests)


def _describe(requests: Sequence[LiveRequest]) -> str:
    lengths = np.array([len(r.tokens) for r in requests] or [0])
    regions = Counter(r.origin_region for r in requests)
    span = requests[-1].at_s if requests else 0.0
    sessions = len({r.session for r in requests})
    p50, p99 = np.percentile(lengths, [50, 99])
    return "\n".join(
        [
            f"requests {len(requests)} over {span:.1f} s, sessions {sessions}, "
            f"tenants {sorted({r.tenant for r in requests})}",
            "by origin: " + ", ".join(f"{k} {v}" for k, v in sorted(regions.items())),
            f"prompt tokens P50 {p50:.0f} / P99 {p99:.0f} / max {lengths.max()}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        topology = _topology(args.topology)
        check_bounded(args.workload, args.azure, args.duration, args.requests)
        requests = workload(args, topology)
        if args.out is not None:
            output_file(args.out, "--out")
        if args.summary_json is not None:
            output_file(args.summary_json, "--summary-json")
        if args.dry_run:
            print(_describe(list(requests)))
            return 0
        first = next(requests, None)  # the workload is lazy: peek, then put it back
        if first is None:
            raise ValueError(
                "no request arrives in the workload these options describe (a --duration "
                "shorter than the first arrival? --skip past the trace's end?): nothing "
                "to replay"
            )
        requests = itertools.chain((first,), requests)
        if not args.routers:
            raise ValueError("--routers is required (e.g. us=http://127.0.0.1:8000)")
        strangers = sorted(set(args.routers) - {r.name for r in topology.regions})
        if strangers:
            raise ValueError(
                f"--routers names no region of {topology.name}: {', '.join(strangers)} "
                f"(its regions: {', '.join(r.name for r in topology.regions)})"
            )
        api_keys = {tenant: key for key, tenant in args.api_keys.items()}
        config = DriverConfig(
            routers=args.routers,
            api_keys=api_keys,
            model=args.model or topology.model.name,
            stream=args.stream,
            timeout_s=args.timeout,
            max_in_flight=args.max_in_flight,
        )
    except (ValueError, KeyError, OSError) as exc:
        print(f"kvcompass loadgen: {exc}", file=sys.stderr)
        return 2
    show = sys.stderr.isatty() if args.progress is None else args.progress
    regions = [r.name for r in topology.regions]
    result = replay(
        requests,
        config,
        name=args.name,
        regions=regions,
        out=args.out,
        progress=show,
        total=args.requests,
    )
    summary = result.summary
    print(render_side_by_side([summary]))
    failed = failures(result.records)
    if failed is not None:
        print(failed)  # what the table's error counts were
    if args.summary_json:
        try:
            args.summary_json.write_text(json.dumps(dataclasses.asdict(summary), indent=2) + "\n")
        except OSError as exc:
            print(f"kvcompass loadgen: cannot write {args.summary_json}: {exc}", file=sys.stderr)
            return 2
    if result.write_error is not None:
        print(
            f"kvcompass loadgen: {args.out} is incomplete ({result.write_error}); the "
            "summary above covers every request",
            file=sys.stderr,
        )
        return 2
    if result.interrupted:
        print(
            "kvcompass loadgen: interrupted; the summary covers finished requests", file=sys.stderr
        )
        return 130
    if result.records and not any(r.ok for r in result.records):
        print("kvcompass loadgen: every request failed (their errors are above)", file=sys.stderr)
        return 1
    return 0
