"""structlog set-up for KVCompass processes.

Call :func:`configure` once from a service's entry point (never at import). Library code
only does ``log = structlog.get_logger(__name__)`` and logs snake_case events with
key/value fields; loops bind the shard or partition they work on (``log.bind(shard=3)``).
Standard-library loggers (redis, ...) go through the same processors and renderer,
and every line, from either source, names the service and the process id, so lines of
several services merged into one stream stay attributable.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["configure"]


def configure(
    level: str = "info", json: bool = True, *, service: str, stream: TextIO | None = None
) -> None:
    """Send structlog and stdlib logs at ``level`` or above to ``stream`` (stderr).

    ``json=True`` writes one JSON object per line (ISO-8601 UTC timestamps, tracebacks as
    one field of dicts); ``json=False`` writes console lines, coloured on a terminal.
    ``service`` (``mu``, ``edge``, ``infra``, ...) and the pid are added to every line.
    """
    try:
        threshold = logging.getLevelNamesMapping()[level.upper()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}") from None
    out = sys.stderr if stream is None else stream
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        _Origin(service),
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: list[Processor]
    if json:
        # Tracebacks as dicts, without frame locals (they may hold credentials).
        tracebacks = structlog.processors.ExceptionRenderer(
            structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
        )
        renderer = [tracebacks, structlog.processors.JSONRenderer()]
    else:
        renderer = [structlog.dev.ConsoleRenderer(colors=out.isatty())]
    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), *renderer],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(threshold)


class _Origin:
    """Adds ``service`` and ``pid`` (read per line: a forked child logs its own pid)."""

    def __init__(self, service: str) -> None:
        self._service = service

    def __call__(self, logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
        event.setdefault("service", self._service)
        event.setdefault("pid", os.getpid())
        return event
