"""Readiness as data: named conditions a service keeps up to date, served on ``/readyz``.

A service sets one condition per dependency or duty (``broker``, ``redis``,
``shards_loaded``, ...). It is ready when every condition it has set is ok; the first
one that is not names the reason. Thread-safe: client callbacks and the main loop both
write it, the HTTP server reads it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["Condition", "Health"]


@dataclass(frozen=True, slots=True)
class Condition:
    ok: bool
    detail: str = ""


class Health:
    """The service's readiness conditions, by name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conditions: dict[str, Condition] = {}

    def set(self, name: str, ok: bool, detail: str = "") -> bool:
        """Record a condition; True when this changed whether it is ok (log it then)."""
        with self._lock:
            before = self._conditions.get(name)
            self._conditions[name] = Condition(ok, detail)
            return before is None or before.ok != ok

    def ready(self) -> bool:
        with self._lock:
            return bool(self._conditions) and all(c.ok for c in self._conditions.values())

    def report(self) -> dict[str, Condition]:
        """Every condition, for ``/readyz`` bodies and logs."""
        with self._lock:
            return dict(self._conditions)
