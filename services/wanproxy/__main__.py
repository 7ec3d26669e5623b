"""Usage: python -m kvcompass.services.wanproxy   (or ``kvcompass wanproxy``; ``--help``)

Starts the WAN proxy's listeners, prints the endpoint map as one JSON line on stdout
(and writes ``KVC_WANPROXY_MAP_FILE``), then relays until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import structlog

from kvcompass import log as kvc_log
from kvcompass.errors import ConfigError
from kvcompass.services.known_settings import warn_unread_variables
from kvcompass.services.wanproxy.proxy import WanProxy, plan_links
from kvcompass.services.wanproxy.settings import WanProxySettings, parse_targets
from kvcompass.topology import Topology, builtin_names, load_builtin, load_topology

__all__ = ["main", "usage"]

SUMMARY = (
    "The WAN emulation: one TCP listener per (origin region, worker of another region) "
    "that relays to the worker and adds the topology's one-way latency between the two "
    "regions in each direction, without capping throughput. Prints the endpoint map "
    "(origin → worker → URL; an origin's own workers map to their real address) for the "
    "edge routers' KVC_WORKER_ENDPOINTS."
)


def usage() -> str:
    lines = [
        "Usage: kvcompass wanproxy   (no arguments: settings come from KVC_* variables)",
        "",
        *textwrap.wrap(SUMMARY, 88),
        "",
        "Settings (environment variable, type, default):",
    ]
    for row in WanProxySettings.describe():
        default = f", default {row.default}" if row.default else ""
        lines.append(f"  {row.env} ({row.type}{default})")
        lines.extend(textwrap.wrap(row.doc, 88, initial_indent=" " * 6, subsequent_indent=" " * 6))
    lines += ["", "Exit statuses: 0 stopped by a signal; 2 bad setting or a port in use."]
    return "\n".join(lines)


def _topology(name_or_path: str) -> Topology:
    if name_or_path in builtin_names():
        return load_builtin(name_or_path)
    return load_topology(Path(name_or_path))


def _write_map(path: Path, endpoints: dict[str, dict[str, str]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(endpoints, indent=2) + "\n")
    os.replace(tmp, path)  # readers polling for the file never see half of it


async def serve(settings: WanProxySettings, topology: Topology) -> None:
    """Run the proxy until SIGTERM / SIGINT."""
    log = structlog.get_logger("kvcompass.wanproxy")
    targets = parse_targets(settings.targets)
    links = plan_links(topology, targets, settings.origins, settings.port_base)
    proxy = WanProxy(
        topology,
        targets,
        links,
        listen_host=settings.listen_host,
        jitter_pct=settings.jitter_pct,
        time_scale=settings.time_scale,
        buffer_chunks=settings.buffer_chunks,
        seed=settings.seed,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with proxy:
        if settings.map_file is not None:
            _write_map(settings.map_file, proxy.endpoints)
        print(json.dumps(proxy.endpoints), flush=True)
        log.info("listening", links=len(links), time_scale=settings.time_scale)
        await stop.wait()
        log.info("stopping", open_connections=proxy.open_connections)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["-h"], ["--help"]):
        print(usage())
        return 0
    if args:
        print("kvcompass wanproxy: takes no arguments (see --help)", file=sys.stderr)
        return 2
    kvc_log.configure(json=not sys.stderr.isatty(), service="wanproxy")
    log = structlog.get_logger("kvcompass.wanproxy")
    try:
        settings = WanProxySettings.from_env()
        kvc_log.configure(
            settings.log_level,
            not sys.stderr.isatty() if settings.log_json is None else settings.log_json,
            service="wanproxy",
        )
        warn_unread_variables(log)
        topology = _topology(settings.topology)
        asyncio.run(serve(settings, topology))
    except (ConfigError, KeyError, OSError) as exc:
        log.error("start_refused", error=str(exc), error_type=type(exc).__name__, exit_status=2)
        return 2
    log.info("stopped", exit_status=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
