"""The WAN emulation: a TCP delay proxy per (origin region, remote worker) link, so a
cross-region forward pays the topology's latency in real socket time on one machine."""

from kvcompass.services.wanproxy.proxy import Link, WanProxy, plan_links, worker_endpoints_setting
from kvcompass.services.wanproxy.settings import WanProxySettings, parse_targets

__all__ = [
    "Link",
    "WanProxy",
    "WanProxySettings",
    "parse_targets",
    "plan_links",
    "worker_endpoints_setting",
]
