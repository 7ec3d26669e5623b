"""Where each worker answers: ``KVC_WORKER_ENDPOINTS`` parsed and checked against the
topology (every id known; remote workers may point at the WAN proxy)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from kvcompass.errors import ConfigError
from kvcompass.topology import Topology

__all__ = ["worker_urls"]


def _entries(spec: str) -> list[str]:
    if "=" not in spec and spec.strip() and Path(spec.strip()).expanduser().is_file():
        text = Path(spec.strip()).expanduser().read_text()
        lines = (line.split("#", 1)[0] for line in text.splitlines())
        return [line.strip() for line in lines if line.strip()]
    return [part.strip() for part in spec.split(",") if part.strip()]


def worker_urls(spec: str, topology: Topology) -> dict[int, str]:
    """Global worker index → base URL (no trailing slash). Workers without an endpoint
    are allowed (a policy that picks one gets 503); unknown ids and bad URLs are not."""
    by_id = {w.id: w.index for w in topology.workers}
    urls: dict[int, str] = {}
    for entry in _entries(spec):
        worker_id, sep, url = entry.partition("=")
        worker_id, url = worker_id.strip(), url.strip().rstrip("/")
        if not sep or worker_id not in by_id:
            raise ConfigError(
                f"KVC_WORKER_ENDPOINTS: {entry!r} is not <worker id>=<url> with a worker of "
                f"the topology ({', '.join(by_id)})"
            )
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"KVC_WORKER_ENDPOINTS: {worker_id}={url!r} is not an http URL")
        urls[by_id[worker_id]] = url
    if not urls:
        raise ConfigError("KVC_WORKER_ENDPOINTS names no worker")
    return urls
