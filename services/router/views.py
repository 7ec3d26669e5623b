"""The edge replayer's shared-memory views, attached lazily: the router may start before
its edge has published them, and keeps answering /readyz with why it is not ready."""

from __future__ import annotations

from kvcompass.errors import KVCError
from kvcompass.index.discovery import Match, MultiLevelQuery
from kvcompass.index.layout import IndexLayout
from kvcompass.index.reader import IndexNotReady
from kvcompass.shm import SharedIndexReader

__all__ = ["EdgeViews"]


class EdgeViews:
    """An :class:`~kvcompass.index.reader.IndexReader` over ``prefix``'s views; until
    the edge has published them, ``ready()`` is False and ``match`` raises IndexNotReady."""

    def __init__(self, prefix: str, layout: IndexLayout) -> None:
        self._prefix = prefix
        self._layout = layout
        self._reader: SharedIndexReader | None = None
        self.detail = "not attached"

    def _attached(self) -> SharedIndexReader:
        if self._reader is None:
            try:
                self._reader = SharedIndexReader(self._prefix, self._layout)
            except FileNotFoundError:
                self.detail = f"no edge has published shared-memory prefix {self._prefix!r}"
                raise IndexNotReady(self.detail) from None
        return self._reader

    def ready(self) -> bool:
        try:
            ok = self._attached().ready()
        except KVCError as exc:
            self.detail = str(exc)
            return False
        self.detail = "" if ok else "the edge's views are not loaded or not caught up"
        return ok

    def match(self, query: MultiLevelQuery) -> Match:
        return self._attached().match(query)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
