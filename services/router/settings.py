"""Settings of an edge router (``KVC_*`` environment variables)."""

from __future__ import annotations

from dataclasses import dataclass

from kvcompass.routing import PAPER_PRICE, RoutingConfig
from kvcompass.services.settings import PipelineSettings
from kvcompass.settings import setting

__all__ = ["RouterSettings"]


@dataclass(frozen=True, kw_only=True)
class RouterSettings(PipelineSettings):
    """Where the router listens, whom it routes for, where the workers are, its limits."""

    region: str = setting("", "This edge's region (the origin of every request it routes).")
    router_host: str = setting("127.0.0.1", "Address the OpenAI-compatible API listens on.")
    router_port: int = setting(8000, "Port of the API (also /metrics, /healthz, /readyz).")
    router_processes: int = setting(
        1,
        "Router processes sharing the port (SO_REUSEPORT), the edge's shared-memory "
        "views and one /metrics; each keeps its own policy state.",
    )
    router_group_parent: int = setting(
        0,
        "Set by a router group's primary on the extra processes it starts: its pid. An "
        "extra drains and exits once that process is gone, even after a SIGKILL. 0: none.",
    )
    policy: str = setting(
        "kvcompass",
        "Routing policy: kvcompass or a baseline (a kvcompass.routing.POLICY_NAMES name).",
    )
    remote_margin_rtt: float = setting(
        RoutingConfig.remote_margin_rtt,
        "Beyond the paper: round trips KVCompass's score adds to a worker in another region, "
        "pricing its stale queue estimate (0: the paper's score; see "
        "loadgen/reports/README.md, 'a remote margin').",
    )
    pending_credit: bool = setting(
        RoutingConfig.pending_credit,
        "Beyond the paper: KVCompass credits a prefix it has just sent to a worker of this "
        "region until the index reports it, so a burst of one new prefix is not recomputed "
        "on every worker while the first request waits (false: the paper's score).",
    )
    pending_slack_s: float = setting(
        RoutingConfig.pending_slack_s,
        "How long past the queue estimate it routed on a sent prefix stays credited (s).",
    )
    prefix_chain: bool = setting(
        RoutingConfig.prefix_chain,
        "Beyond the paper: KVCompass counts a worker's index hit at a length only if the "
        "worker also hit at the region's previous length (at a region's first queried "
        "length: at the longest length the region registers below it), which turns away "
        "most false locators of the keyless index (false: the paper's lookup, every hit "
        "counts).",
    )
    tau_ms: float = setting(
        RoutingConfig.tau_ms,
        "τ of KVCompass's capacity price λ = min(λmax, least queue estimate / τ), in ms. "
        "Beyond the paper, the default prices recomputation steeply once no worker is idle "
        f"(the paper's price: τ {PAPER_PRICE['tau_ms']:g} ms with λmax "
        f"{PAPER_PRICE['lambda_max']:g}; see loadgen/reports/README.md, 'The capacity price "
        "as shipped').",
    )
    lambda_max: float = setting(
        RoutingConfig.lambda_max, "λmax, the cap of KVCompass's capacity price (see KVC_TAU_MS)."
    )
    worker_endpoints: str = setting(
        "",
        "Worker URLs: 'us-0=http://127.0.0.1:9100,eu-0=...' or the path of a file with one "
        "id=url per line. Remote workers point at the WAN proxy.",
    )
    shm_prefix: str = setting("kvc-edge", "Shared-memory prefix of this edge's replayer.")
    api_keys: str = setting(
        "",
        "Bearer keys and their tenant: 'key1=tenant_a,key2=tenant_b'. Empty = no "
        "authentication, every request in tenant 'default'.",
        secret=True,
    )
    tokenizer: str = setting(
        "bytes",
        "How text prompts become token ids: 'bytes' (UTF-8 bytes) or the path of a "
        "Hugging Face tokenizers JSON file.",
    )
    connect_timeout_s: float = setting(1.0, "Seconds to open a connection to a worker.")
    request_timeout_s: float = setting(
        120.0, "Seconds a non-streaming worker response may take in total."
    )
    stream_idle_timeout_s: float = setting(
        30.0, "Seconds a streaming response may go without a chunk (first chunk included)."
    )
    max_body_bytes: int = setting(
        8 << 20, "Largest accepted request body (bytes); larger gets 413."
    )
    index_stale_s: float = setting(
        30.0,
        "After the edge's views stop being live (it lost the broker, is reloading, or "
        "died), route from their last loaded state for this many seconds, then without "
        "the index (by load and WAN alone). Either way the router stays ready.",
    )
    queue_max_age_s: float = setting(
        1.0,
        "Queue vectors older than this (by their sent_at_ns) are skipped: the topic is "
        "read from its start (the embedded broker cannot seek by time), so this makes a "
        "long topic replay quickly.",
    )

    def validate(self) -> None:
        super().validate()
        if not self.region:
            raise self.invalid("region", "must name one of the topology's regions")
        if not 0 < self.router_port <= 65535:
            raise self.invalid("router_port", "must be a TCP port (1-65535)")
        if self.router_processes < 1:
            raise self.invalid("router_processes", "must be at least 1")
        for name in (
            "connect_timeout_s",
            "request_timeout_s",
            "stream_idle_timeout_s",
            "queue_max_age_s",
            "index_stale_s",
        ):
            if getattr(self, name) <= 0:
                raise self.invalid(name, "must be positive")
        if not self.remote_margin_rtt >= 0:
            raise self.invalid("remote_margin_rtt", "must be >= 0")
        if not self.pending_slack_s >= 0:
            raise self.invalid("pending_slack_s", "must be >= 0")
        if not self.tau_ms > 0:
            raise self.invalid("tau_ms", "must be positive")
        if not self.lambda_max >= 0:
            raise self.invalid("lambda_max", "must be >= 0")
        if self.max_body_bytes < 1024:
            raise self.invalid("max_body_bytes", "must be at least 1024")
