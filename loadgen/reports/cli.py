"""``kvcompass report <artefact>``: regenerate one of the paper's figures or tables.

Each artefact writes ``<artefact>.png``, ``.csv`` and ``.json`` into ``--out`` and prints
its table. Simulator-based artefacts keep their runs under ``<out>/grid/`` and skip runs
already complete there, so an interrupted report resumes and fig13/fig14 reuse fig12's.
``all`` makes every artefact in turn (table5 last: it reads fig12's runs) and prints how
long each took; ``--figures DIR`` copies each PNG there (the README's ``docs/figures``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from importlib import import_module
from pathlib import Path

from kvcompass.loadgen.ctrl_c import sigterm_as_ctrl_c
from kvcompass.loadgen.outputs import output_folder
from kvcompass.loadgen.reports.cells import WORKLOADS
from kvcompass.loadgen.reports.common import Artefact, repo_root

__all__ = ["ALL_ORDER", "ARTEFACTS", "Maker", "main"]

Maker = Callable[[argparse.Namespace], Artefact]


#: The artefacts that read the Mooncake traces (``--traces``).
TRACE_ARTEFACTS = ("fig2", "fig5b")
#: The artefacts drawn per workload (``--workloads``).
WORKLOAD_ARTEFACTS = ("fig12", "fig16")


def traces_dir(given: str | None) -> Path:
    """--traces, else $KVC_TRACES, else the first ``shared/traces`` above the checkout;
    ValueError unless it holds both Mooncake traces."""
    from kvcompass.loadgen.reports.fig2 import TRACES

    if given or os.environ.get("KVC_TRACES"):
        folder: Path | None = Path(given or os.environ["KVC_TRACES"])
    else:
        beside = (p / "shared" / "traces" for p in repo_root().parents)
        folder = next((f for f in beside if f.is_dir()), None)
    if folder is None:
        raise ValueError("no traces folder found beside the checkout; pass --traces DIR")
    missing = [name for name in TRACES if not (folder / name).is_file()]
    if missing:
        raise ValueError(
            f"--traces {folder}: no {', '.join(missing)} there (the folder of the Mooncake "
            "traces; else $KVC_TRACES, else shared/traces beside the checkout)"
        )
    return folder


def _fig2(a: argparse.Namespace) -> Artefact:
    from kvcompass.loadgen.reports.fig2 import run_fig2

    return run_fig2(Path(a.traces), a.out, seeds=3 if a.quick else 20)


def _fig5b(a: argparse.Namespace) -> Artefact:
    from kvcompass.loadgen.reports.fig5b import run_fig5b

    return run_fig5b(Path(a.traces), a.out, limit=4000 if a.quick else None)


def _table5(a: argparse.Namespace) -> Artefact:
    from kvcompass.loadgen.reports.table5 import end_to_end, run_table5

    capacity, queries = (50_000, 100_000) if a.quick else (200_000, 500_000)
    art = run_table5(a.out, capacity=capacity, queries=queries)
    print(end_to_end(a.out, a.quick))
    return art


def _simulated(module: str) -> Maker:
    """A simulator report's maker: ``run_<module>(out, quick=, jobs=)``, imported only when
    it runs (``--help`` stays fast)."""

    def make(a: argparse.Namespace) -> Artefact:
        run: Callable[..., Artefact] = getattr(
            import_module(f"{__package__}.{module}"), f"run_{module}"
        )
        return run(a.out, quick=a.quick, jobs=a.jobs)

    return make


def _fig12(a: argparse.Namespace) -> Artefact:
    from kvcompass.loadgen.reports.fig12 import run_fig12

    return run_fig12(a.out, quick=a.quick, jobs=a.jobs, workloads=a.workloads or WORKLOADS)


def _fig16(a: argparse.Namespace) -> Artefact:
    from kvcompass.loadgen.reports.fig12 import run_fig12

    workloads = a.workloads or WORKLOADS
    return run_fig12(a.out, quick=a.quick, jobs=a.jobs, scale="fig16", workloads=workloads)


#: artefact → (what it shows, how to make it)
ARTEFACTS: dict[str, tuple[str, Maker]] = {
    "fig2": ("share of reusable prefixes cached only in another region (traces)", _fig2),
    "fig5b": ("latency-derived levels vs fixed grids, by table budget (traces)", _fig5b),
    "table5": ("structural false hits of the keyless index by load, ± fingerprints", _table5),
    "fig9": ("mean queueing delay vs offered load, with the M/G/1 curve (sim)", _simulated("fig9")),
    "fig12": ("P99 TTFT, throughput vs rate; TTFT/E2E CDFs at 1.5 λ0; sim-8region (sim)", _fig12),
    "headline": (
        "every scheme's P99 TTFT and throughput ÷ KVCompass's, 3 seeds (sim)",
        _simulated("headline"),
    ),
    "margin": (
        "beyond the paper: KVCompass with a remote margin, 3 seeds (sim)",
        _simulated("margin"),
    ),
    "run-length": (
        "beyond the paper: every scheme's P99 ÷ KVCompass's by run length, 1.5 λ0 (sim)",
        _simulated("run_length"),
    ),
    "fig13": ("prefill tokens reused vs recomputed per scheme, 1.5 λ0 (sim)", _simulated("fig13")),
    "fig14": ("per-worker load factor heatmaps and peaks, 1.5 λ0 (sim)", _simulated("fig14")),
    "fig15": ("ablations: throughput with one mechanism off (sim)", _simulated("fig15")),
    "fig16": ("Fig. 12 on sim-16region, 128 workers (sim)", _fig16),
    "shipped-grid": (
        "beyond the paper: KVCompass as shipped vs the paper's score, Figs. 12 + 16 (sim)",
        _simulated("shipped_grid"),
    ),
    "price": (
        "beyond the paper: KVCompass at each capacity price, Figs. 12 + 16 (sim)",
        _simulated("price"),
    ),
    "peak": ("peak load factor, KVCompass vs Oracle, on long runs (sim)", _simulated("peak")),
    "table4": ("WAN jitter, update loss/delay, loss with resync (sim)", _simulated("table4")),
}


def _parser() -> argparse.ArgumentParser:
    width = max(map(len, ARTEFACTS))
    listing = "\n".join(f"  {name:{width}} {what}" for name, (what, _) in ARTEFACTS.items())
    p = argparse.ArgumentParser(
        prog="kvcompass report",
        description="Regenerate one paper artefact: PNG + CSV + JSON, and a table on stdout.",
        epilog=f"artefacts:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("artefact", choices=[*ARTEFACTS, "all"], metavar="ARTEFACT")
    p.add_argument(
        "--quick", action="store_true", help="small sizes (each artefact ≤ 5 min on 2 cores)"
    )
    p.add_argument("--out", type=Path, default=Path("results/reports"), help="output folder")
    p.add_argument("--jobs", type=int, default=1, help="parallel simulation processes")
    p.add_argument(
        "--workloads",
        nargs="+",
        choices=WORKLOADS,
        help="fig12/fig16: the workloads, one row of panels each (default: all three)",
    )
    p.add_argument("--traces", default=None, help="folder of the Mooncake traces (fig2, fig5b)")
    p.add_argument(
        "--figures", type=Path, default=None, help="also copy each PNG here (e.g. docs/figures)"
    )
    return p


#: ``all``: fig12 before headline, run-length, fig13 and fig14 (they reuse its cells),
#: headline before margin (likewise), fig16 before shipped-grid (it reuses fig12's and
#: fig16's cells), table5 after fig12 (it reads its cells).
ALL_ORDER = (
    "fig2",
    "fig5b",
    "fig9",
    "fig12",
    "headline",
    "margin",
    "run-length",
    "fig13",
    "fig14",
    "fig15",
    "fig16",
    "shipped-grid",
    "price",
    "peak",
    "table4",
    "table5",
)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.jobs < 1:
        print("kvcompass report: --jobs must be at least 1", file=sys.stderr)
        return 2
    names = ALL_ORDER if args.artefact == "all" else (args.artefact,)
    # Everything an operator can get wrong is checked before the first simulation.
    try:
        for flag, readers in (("workloads", WORKLOAD_ARTEFACTS), ("traces", TRACE_ARTEFACTS)):
            if getattr(args, flag) is not None and not set(names) & set(readers):
                # Ignored, `table4 --workloads lmsys` would quietly be Mixed's Table 4.
                raise ValueError(
                    f"--{flag} is read only by {' and '.join(readers)} (and all), not by "
                    f"{args.artefact}"
                )
        output_folder(args.out)
        if args.figures is not None:
            output_folder(args.figures, "--figures")
        if set(names) & set(TRACE_ARTEFACTS):
            args.traces = traces_dir(args.traces)
    except ValueError as exc:
        print(f"kvcompass report: {exc}", file=sys.stderr)
        return 2
    took: list[tuple[str, float]] = []
    for name in names:
        started = time.monotonic()
        try:
            with sigterm_as_ctrl_c():
                art = ARTEFACTS[name][1](args)
        except KeyboardInterrupt:
            print(
                f"kvcompass report: interrupted in {name}; the simulations finished so far "
                f"are kept under {args.out}: the same command runs the rest",
                file=sys.stderr,
            )
            return 130
        except OSError as exc:  # the machine's, not the report's: a full disk, say
            print(
                f"kvcompass report: {name} stopped writing under {args.out}: {exc}; the "
                "simulations finished so far are kept: the same command runs the rest",
                file=sys.stderr,
            )
            return 2
        took.append((name, time.monotonic() - started))
        print(art.table())
        print(f"wrote {args.out / art.name}.{{png,csv,json}}")
        png = args.out / f"{art.name}.png"
        if args.figures is not None and png.exists():
            shutil.copyfile(png, args.figures / png.name)
            print(f"copied {png.name} to {args.figures}")
    if len(took) > 1:
        width = max(len(name) for name, _ in took)
        print("\n".join(f"{name:{width}} {seconds:7.0f} s" for name, seconds in took))
    return 0
