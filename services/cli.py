"""The ``kvcompass`` command line (it sits above the core, the services and loadgen).

Usage: kvcompass demo [--seconds S] [--rate R] [--seed N] [--out DIR]   (--help)
       kvcompass index-demo [--topology NAME] [--entries N] [--fingerprint-bits B]
       kvcompass infra up|status|down [--json]
       kvcompass mu [--help]     (a maintenance unit; settings from KVC_* variables)
       kvcompass edge [--help]   (an edge replayer; settings from KVC_* variables)
       kvcompass router [--help] (an edge router; settings from KVC_* variables)
       kvcompass worker [--help] (emulated GPU workers; settings from KVC_* variables)
       kvcompass wanproxy [--help]   (the WAN delay proxy; settings from KVC_* variables)
       kvcompass loadgen [options]   (replay a workload against the edge routers; --help)
       kvcompass report ARTEFACT [--quick] [--out DIR] [--jobs N]   (a paper figure; --help)
       kvcompass sim run|sweep|agree [options] (the event-driven simulator; --help)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from kvcompass.topology import builtin_names

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcompass",
        description="KVCompass: the index demo, the local broker and Redis, and the services.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "index-demo",
        help="build a discovery index from synthetic prompts; print memory, speed, false hits",
        description="Build the maintenance tables of a discovery index from synthetic prompt "
        "families (each prompt cached by one to three workers, in VRAM or DRAM), derive the "
        "keyless edge views from them, and print view memory (bits per entry), batch and "
        "per-request lookup speed, and the false-hit rate of never-inserted prefixes. No "
        "broker or Redis: everything runs in this process.",
    )
    demo.add_argument(
        "--topology",
        default="testbed-3region",
        choices=builtin_names(),
        help="whose workers, regions and registration lengths (default: %(default)s)",
    )
    demo.add_argument(
        "--entries",
        type=int,
        default=1_000_000,
        help="index entries to build (default: %(default)s; ~300 bytes of memory each, "
        "refused up front when more than the machine has available)",
    )
    demo.add_argument(
        "--fingerprint-bits",
        type=int,
        default=None,
        help="per-cell fingerprint bits (default: the topology's setting; 0 = the paper)",
    )
    demo.add_argument(
        "--seed", type=int, default=7, help="seeds the synthetic prompts (default: %(default)s)"
    )
    # Parsed by the commands themselves (see main); listed here for --help.
    sub.add_parser(
        "demo",
        help="start a whole deployment here and compare KVCompass with local-only routing",
    )
    sub.add_parser("infra", help="start, inspect or stop the local Kafka broker and Redis")
    sub.add_parser("mu", help="run a maintenance unit (kvcompass mu --help: its settings)")
    sub.add_parser("edge", help="run an edge replayer (kvcompass edge --help: its settings)")
    sub.add_parser("router", help="run an edge router (kvcompass router --help: its settings)")
    sub.add_parser(
        "worker", help="run emulated GPU workers (kvcompass worker --help: its settings)"
    )
    sub.add_parser(
        "wanproxy", help="run the WAN delay proxy (kvcompass wanproxy --help: its settings)"
    )
    sub.add_parser(
        "loadgen", help="replay a workload against the edge routers (kvcompass loadgen --help)"
    )
    sub.add_parser("report", help="regenerate a paper figure or table (kvcompass report --help)")
    sub.add_parser(
        "sim", help="simulate a deployment on virtual time (kvcompass sim run|sweep --help)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _command(argv)
    except KeyboardInterrupt:
        # The services, demo, loadgen, sim and report handle Ctrl-C themselves; this
        # covers the short commands that do not (index-demo, sim agree, infra).
        print(f"{' '.join(['kvcompass', *argv[:1]])}: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:
        if not _unbuilt(exc):
            raise
        print(
            f"kvcompass: {exc.name} is not compiled in this checkout; build it with "
            "`pip install -e .` (./scripts/test and ./scripts/demo do)",
            file=sys.stderr,
        )
        return 2


def _unbuilt(exc: ModuleNotFoundError) -> bool:
    """Whether ``exc`` names one of this checkout's Cython modules (a .pyx beside it)."""
    name = exc.name or ""
    if not name.startswith("kvcompass."):
        return False
    import kvcompass

    package = Path(kvcompass.__file__).parent
    return package.joinpath(*name.split(".")[1:]).with_suffix(".pyx").is_file()


def _command(argv: list[str]) -> int:
    # Each command imports its own clients only when it runs.
    if argv[:1] == ["demo"]:
        from kvcompass.loadgen.demo import main as demo_main

        return demo_main(argv[1:])
    if argv[:1] == ["infra"]:
        from kvcompass.services.infra.commands import main as infra_main

        return infra_main(argv[1:], prog="kvcompass infra")
    if argv[:1] == ["mu"]:
        from kvcompass.services.maintenance.__main__ import SPEC as MU
        from kvcompass.services.runtime import run_service

        return run_service(MU, argv[1:])
    if argv[:1] == ["wanproxy"]:
        from kvcompass.services.wanproxy.__main__ import main as wanproxy_main

        return wanproxy_main(argv[1:])
    if argv[:1] == ["loadgen"]:
        from kvcompass.loadgen.cli import main as loadgen_main

        return loadgen_main(argv[1:])
    if argv[:1] == ["report"]:
        from kvcompass.loadgen.reports.cli import main as report_main

        return report_main(argv[1:])
    if argv[:1] == ["sim"]:
        from kvcompass.loadgen.sim.cli import main as sim_main

        return sim_main(argv[1:])
    if argv[:1] == ["edge"]:
        from kvcompass.services.edge.__main__ import SPEC as EDGE
        from kvcompass.services.runtime import run_service

        return run_service(EDGE, argv[1:])
    if argv[:1] == ["router"]:
        from kvcompass.services.router.__main__ import SPEC as ROUTER
        from kvcompass.services.runtime import run_service

        return run_service(ROUTER, argv[1:])
    if argv[:1] == ["worker"]:
        from kvcompass.services.runtime import run_service
        from kvcompass.services.worker.__main__ import SPEC as WORKER

        return run_service(WORKER, argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "index-demo":
        from kvcompass.loadgen.index_demo import available_memory, check_fits, run_index_demo

        try:
            if args.entries < 1:
                raise ValueError(f"--entries must be positive, got {args.entries}")
            if args.seed < 0:
                raise ValueError(f"--seed must be >= 0, got {args.seed}")
            check_fits(args.entries, available_memory())
            report = run_index_demo(args.topology, args.entries, args.fingerprint_bits, args.seed)
        except ValueError as exc:  # the settings' own checks (fingerprint bits)
            print(f"kvcompass index-demo: {exc}", file=sys.stderr)
            return 2
        print(report.render())
        return 0
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
