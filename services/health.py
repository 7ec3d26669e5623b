"""Readiness as data: named conditions a service keeps up to date, served on ``/readyz``.

A service sets one condition per dependency or duty (``broker``, ``redis``,
``shards_loaded``, ...). It is ready when every required condition it has set is ok;
the first one that is not names the reason. An *advisory* condition (:meth:`advise`) is
reported but does not gate readiness: a degraded dependency the service works around.
Thread-safe: client callbacks and the main loop both write it, the HTTP server reads it.
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
        self._advisory: set[str] = set()

    def set(self, name: str, ok: bool, detail: str = "") -> bool:
        """Record a condition; True when this changed whether it is ok (log it then)."""
        with self._lock:
            before = self._conditions.get(name)
            self._conditions[name] = Condition(ok, detail)
            return before is None or before.ok != ok

    def advise(self, name: str) -> None:
        """From now on ``name`` is reported but no longer gates readiness."""
        with self._lock:
            self._advisory.add(name)

    def ready(self) -> bool:
        with self._lock:
            return bool(self._conditions) and all(
                c.ok for n, c in self._conditions.items() if n not in self._advisory
            )

    def report(self) -> dict[str, Condition]:
        """Every condition, for ``/readyz`` bodies and logs."""
        with self._lock:
            return dict(self._conditions)

    def conditions_json(self) -> dict[str, dict[str, object]]:
        """Every condition as ``/readyz`` bodies show it (with whether it gates)."""
        with self._lock:
            return {
                n: {"ok": c.ok, "detail": c.detail, "required": n not in self._advisory}
                for n, c in self._conditions.items()
            }
