"""structlog set-up for KVCompass processes.

Call :func:`configure` once from a service's ``__main__`` (never at import). Library code
only does ``log = structlog.get_logger(__name__)`` and logs snake_case events with
key/value fields. Standard-library loggers (aiokafka, redis, librdkafka via
confluent-kafka's ``logger`` option) go through the same processors and renderer.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from structlog.typing import Processor

__all__ = ["configure"]


def configure(level: str = "info", json: bool = True, *, stream: TextIO | None = None) -> None:
    """Send structlog and stdlib logs at ``level`` or above to ``stream`` (stderr).

    ``json=True`` writes one JSON object per line (ISO-8601 UTC timestamps, tracebacks as
    dicts); ``json=False`` writes console lines, coloured on a terminal.
    """
    try:
        threshold = logging.getLevelNamesMapping()[level.upper()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}") from None
    out = sys.stderr if stream is None else stream
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
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
