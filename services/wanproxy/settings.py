"""Settings of the WAN delay proxy (``KVC_*`` environment variables)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvcompass.services.settings import ServiceSettings
from kvcompass.settings import setting

__all__ = ["WanProxySettings", "parse_targets"]


@dataclass(frozen=True, kw_only=True)
class WanProxySettings(ServiceSettings):
    """Which workers to put behind the emulated WAN, where to listen, how to delay."""

    topology: str = setting(
        "testbed-3region", "Built-in topology name or path of a topology TOML file."
    )
    targets: str = setting(
        "",
        "The workers' real endpoints: 'us-0=127.0.0.1:9100,eu-0=127.0.0.1:9300,...' "
        "(http:// optional), or the path of a file holding that text or a JSON object "
        "{worker id: address}. Workers left out are left out of the map.",
        env="KVC_WANPROXY_TARGETS",
    )
    origins: tuple[str, ...] = setting(
        (),
        "Origin regions to build links for (comma list); empty = every region.",
        env="KVC_WANPROXY_ORIGINS",
    )
    listen_host: str = setting(
        "127.0.0.1", "Address the link listeners bind.", env="KVC_WANPROXY_LISTEN_HOST"
    )
    port_base: int = setting(
        0,
        "First listener port; links take port_base, port_base+1, ... in map order "
        "(origin, then worker, topology order). 0 = ports the OS picks.",
        env="KVC_WANPROXY_PORT_BASE",
    )
    map_file: Path | None = setting(  # noqa: RUF009
        None,
        "Write the endpoint map (JSON: origin → worker → URL) here once every listener is "
        "bound (atomically: a reader never sees half a file); it is also printed on stdout.",
        env="KVC_WANPROXY_MAP_FILE",
    )
    jitter_pct: float = setting(
        0.0,
        "Per-chunk delay jitter, ± percent of the link's one-way delay (uniform); chunks "
        "still leave in order.",
        env="KVC_WANPROXY_JITTER_PCT",
    )
    time_scale: float = setting(
        1.0,
        "Real seconds per emulated second, as for the workers: delays are the topology's "
        "latencies times this (1.0 = real time, 0.1 = ten times shorter).",
        env="KVC_TIME_SCALE",
    )
    buffer_chunks: int = setting(
        1024,
        "Chunks (up to 64 KiB each) held in flight per direction before reading pauses: "
        "64 MiB by default, 400 MB/s over a 160 ms link, far above any test's need.",
        env="KVC_WANPROXY_BUFFER_CHUNKS",
    )
    seed: int | None = setting(None, "Seed of the jitter; empty = random.", env="KVC_WANPROXY_SEED")

    def validate(self) -> None:
        super().validate()
        if not 0 <= self.port_base <= 65535:
            raise self.invalid("port_base", "must be a TCP port (0 = OS-chosen)")
        if not 0 <= self.jitter_pct < 100:
            raise self.invalid("jitter_pct", "must be in [0, 100)")
        if self.time_scale < 0:
            raise self.invalid("time_scale", "must be >= 0")
        if self.buffer_chunks < 1:
            raise self.invalid("buffer_chunks", "must be at least 1")
        try:
            parse_targets(self.targets)
        except ValueError as exc:
            raise self.invalid("targets", str(exc)) from None


def parse_targets(value: str) -> dict[str, tuple[str, int]]:
    """Worker id → (host, port) from the inline text or the file it names."""
    text = value.strip()
    if text and "=" not in text and Path(text).is_file():
        text = Path(text).read_text().strip()
    pairs: list[tuple[str, str]]
    if text.startswith("{"):
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("a JSON targets file must hold an object")
        pairs = [(str(k), str(v)) for k, v in raw.items()]
    else:
        pairs = []
        for item in filter(None, (p.strip() for p in text.split(","))):
            worker, sep, address = item.partition("=")
            if not sep:
                raise ValueError(f"{item!r} is not worker=host:port")
            pairs.append((worker.strip(), address.strip()))
    out: dict[str, tuple[str, int]] = {}
    for worker, address in pairs:
        host, sep, port = address.removeprefix("http://").rstrip("/").rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{worker}: {address!r} is not host:port")
        if worker in out:
            raise ValueError(f"{worker} is listed twice")
        out[worker] = (host, int(port))
    return out
