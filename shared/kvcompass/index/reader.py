"""The one lookup interface of the discovery index: a prompt's query in, per-worker matches out.

Routers program against :class:`IndexReader`. :class:`~kvcompass.index.discovery.DiscoveryView`
implements it in-process and :class:`~kvcompass.shm.SharedIndexReader` over the edge
replayer's shared-memory views (in compiled code, ``kvcompass.index.probe``); tests check
that they give the same answers.
"""

from __future__ import annotations

from typing import Protocol

from kvcompass.errors import Transient
from kvcompass.index.discovery import Match, MultiLevelQuery

__all__ = ["IndexNotReady", "IndexReader"]


class IndexNotReady(Transient):
    """The reader cannot answer now: no live writer, a shard not loaded yet, or a writer
    that restarted. Retry later; the reader re-attaches to a new writer by itself."""


class IndexReader(Protocol):
    def match(self, query: MultiLevelQuery) -> Match:
        """Per worker, the longest matched prefix length of ``query`` and its tier.

        Raises :class:`IndexNotReady` when the index cannot answer from live state.
        """
        ...

    def ready(self) -> bool:
        """True when :meth:`match` answers from a live, fully loaded index."""
        ...
