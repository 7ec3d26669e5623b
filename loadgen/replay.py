"""One replay as a function call (``kvcompass loadgen`` and the demo use it): drive the
requests, write the records, show progress, summarise."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from kvcompass.loadgen.ctrl_c import CtrlC
from kvcompass.loadgen.driver import DriverConfig, drive
from kvcompass.loadgen.records import RequestRecord, write_record
from kvcompass.loadgen.summary import RunSummary, summarize
from kvcompass.loadgen.workloads import LiveRequest

__all__ = ["Replay", "replay"]


@dataclass(frozen=True)
class Replay:
    summary: RunSummary
    records: list[RequestRecord]
    interrupted: bool  # Ctrl-C: the summary covers the requests that had finished
    #: Why the records file is incomplete (a full disk, say), or None. The replay goes on
    #: without it: the summary and ``records`` hold every request.
    write_error: OSError | None = None


def replay(
    requests: Iterable[LiveRequest],
    config: DriverConfig,
    *,
    name: str,
    regions: Sequence[str],
    out: Path | None = None,
    progress: bool = False,
    total: int | None = None,
    ctrl_c: CtrlC | None = None,
) -> Replay:
    """Run ``requests`` against the routers in a new event loop (blocks until the last
    answer). ``out``: JSONL records, one line as each request ends; ``total``: the
    progress bar's length, if known; ``ctrl_c``: the caller's, if it owns SIGINT already.
    Ctrl-C ends the run early (``Replay.interrupted``)."""
    records: list[RequestRecord] = []
    write_error: OSError | None = None
    # Closed by hand below, where a failed flush of its last lines becomes write_error.
    sink = open(out, "w") if out is not None else None  # noqa: SIM115
    with ExitStack() as stack:
        interrupt = stack.enter_context(nullcontext(ctrl_c) if ctrl_c else CtrlC())
        bar = stack.enter_context(tqdm(total=total, unit="req", disable=not progress))
        errors = 0

        def on_record(record: RequestRecord) -> None:
            nonlocal errors, write_error
            records.append(record)
            if sink is not None and write_error is None:
                try:
                    write_record(sink, record)
                except OSError as exc:  # the answers still count; the file stops here
                    write_error = exc
            errors += not record.ok
            bar.update(1)
            bar.set_postfix(errors=errors, refresh=False)

        start = time.perf_counter()
        try:
            duration_s = interrupt.run(drive(requests, config, on_record)).duration_s
            interrupted = False
        except KeyboardInterrupt:
            duration_s = time.perf_counter() - start
            interrupted = True
        finally:
            if sink is not None:
                try:
                    sink.close()  # closed even if its last buffered lines fail
                except OSError as exc:
                    write_error = write_error or exc
    return Replay(summarize(name, records, duration_s, regions), records, interrupted, write_error)
