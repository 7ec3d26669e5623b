"""Errors of the infrastructure launcher; all derive from :class:`InfraError`."""

from __future__ import annotations

__all__ = [
    "AlreadyRunning",
    "InfraError",
    "ServerStartError",
    "StateFileError",
    "TopicError",
    "TopicPartitionMismatch",
]


class InfraError(RuntimeError):
    """The launcher could not do what was asked; the message says why."""


class ServerStartError(InfraError):
    """A server did not come up (binary missing, exited early, or port never answered)."""


class AlreadyRunning(InfraError):
    """The run directory's state file names servers that are still alive."""


class StateFileError(InfraError):
    """The state file exists but cannot be read."""


class TopicError(InfraError):
    """Creating or verifying the topics failed."""


class TopicPartitionMismatch(TopicError):
    """An existing topic has a different partition count than the settings ask for."""
