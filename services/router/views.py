"""The edge replayer's shared-memory views, attached lazily: the router may start before
its edge has published them, and keeps answering /readyz with why it is not ready.

Once the views have been live, losing them degrades routing instead of refusing
requests (an edge that lost the broker marks every shard not ready; a dead edge's
views disappear): for ``stale_s`` seconds :meth:`EdgeViews.match` answers from the last
state the edge still maps, and after that, or when nothing is mapped, with an empty
match, so the policy routes by load and WAN alone. A region's gateways keep serving
through an index outage; what they lose is cache reuse, which the metrics show.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, Protocol

from kvcompass.errors import KVCError
from kvcompass.index.discovery import Match, MultiLevelQuery
from kvcompass.index.layout import IndexLayout
from kvcompass.index.reader import IndexNotReady
from kvcompass.shm import SharedIndexReader

__all__ = ["EdgeViews", "IndexMode", "IndexStatus"]

#: What answered a match: the live views, the last loaded ones, or nothing.
IndexMode = Literal["live", "stale", "none"]


class IndexStatus(Protocol):
    """What the router's API needs to know about its index."""

    @property
    def mode(self) -> IndexMode:
        """What answered the latest match."""
        ...

    def check(self) -> tuple[bool, str]:
        """(live now, why not)."""
        ...

    def age_s(self) -> float:
        """Seconds since the views were last live (0 while they are)."""
        ...


class EdgeViews:
    """An :class:`~kvcompass.index.reader.IndexReader` over ``prefix``'s views; until
    the edge has published them, ``check()`` is False and ``match`` raises IndexNotReady.
    After they were live once, ``match`` degrades as the module doc says."""

    def __init__(
        self,
        prefix: str,
        layout: IndexLayout,
        stale_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._prefix = prefix
        self._layout = layout
        self._stale_s = stale_s
        self._clock = clock
        self._reader: SharedIndexReader | None = None
        self._live_at: float | None = None
        self._live = False
        self.mode: IndexMode = "none"
        self.detail = "not attached"

    def _attached(self) -> SharedIndexReader:
        if self._reader is None:
            try:
                self._reader = SharedIndexReader(self._prefix, self._layout)
            except FileNotFoundError:
                self.detail = f"no edge has published shared-memory prefix {self._prefix!r}"
                raise IndexNotReady(self.detail) from None
        return self._reader

    def _seen_live(self) -> None:
        self._live = True
        self._live_at = self._clock()

    def ready(self) -> bool:
        """The views are attached, loaded and caught up now."""
        try:
            ok = self._attached().ready()
        except KVCError as exc:
            self.detail = str(exc)
            ok = False
        else:
            self.detail = "" if ok else "the edge's views are not loaded or not caught up"
        if ok:
            self._seen_live()
        else:
            self._live = False
        return ok

    def check(self) -> tuple[bool, str]:
        if self.ready():
            return True, ""
        if self._live_at is None:
            return False, self.detail
        age = self.age_s()
        how = (
            "routing from the last loaded views while the edge still maps them"
            if age <= self._stale_s
            else f"routing without the index (views older than {self._stale_s:g} s)"
        )
        return False, f"{self.detail}; last live {age:.1f} s ago; {how}"

    def age_s(self) -> float:
        if self._live or self._live_at is None:
            return 0.0
        return self._clock() - self._live_at

    def match(self, query: MultiLevelQuery) -> Match:
        try:
            found = self._attached().match(query)
        except IndexNotReady:
            if self._live_at is None:
                raise  # never loaded: nothing to degrade to (and /readyz says so)
            self._live = False
            return self._degraded(query)
        self._seen_live()
        self.mode = "live"
        return found

    def _degraded(self, query: MultiLevelQuery) -> Match:
        if self._reader is not None and self.age_s() <= self._stale_s:
            try:
                found = self._reader.match(query, stale_ok=True)
            except IndexNotReady:
                pass  # the edge is gone or swapping tables in: no views to read
            else:
                self.mode = "stale"
                return found
        self.mode = "none"
        n = self._layout.n_workers
        return Match([0] * n, [0] * n)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
