"""One error model for the whole project.

Every error KVCompass raises on purpose derives from :class:`KVCError`, and says by its
class what the caller does with it:

- :class:`BadInput` — a message, request or file is malformed or does not fit this
  deployment. Nothing was changed; the caller dead-letters it (events), answers 4xx
  (requests) or refuses it (snapshots, settings) with the message.
- :class:`Transient` (``retriable = True``) — a broker, Redis or peer did not answer. The
  caller retries with backoff and logs it; past a deadline it gives up loudly.
- :class:`InvariantBroken` — in-memory state can no longer be trusted (a cuckoo move
  found no seed halfway through). The process stops *without* persisting anything or
  committing offsets, so the next owner restores the last good snapshot.
- :class:`ConfigError` — a setting is wrong; the service exits at start with one line.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["BadInput", "ConfigError", "InvariantBroken", "KVCError", "Transient"]


class KVCError(Exception):
    """Root of every error KVCompass raises on purpose."""

    #: True when the same call may succeed later (infrastructure, not input or state).
    retriable: ClassVar[bool] = False


class BadInput(KVCError, ValueError):
    """Input that cannot be used as given; nothing was changed."""


class Transient(KVCError):
    """A dependency (broker, Redis, peer) did not answer; retry with backoff."""

    retriable: ClassVar[bool] = True


class InvariantBroken(KVCError):
    """State that must never be persisted: crash, and let the next owner restore."""


class ConfigError(KVCError, ValueError):
    """A setting that cannot work (names the setting and the value)."""
