"""Which table and which 2-bit field hold each worker's tier (paper §3.2).

Every region has its own tables. A value packs one 2-bit tier field per worker of that
region: 32-bit values serve up to 16 workers, 64-bit values up to 32, and a larger region
uses several tables. Tables are numbered globally; every shard holds one of each.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import IntEnum

from kvcompass.keys import KeyHash
from kvcompass.topology import Topology

__all__ = ["IndexLayout", "TableSpec", "Tier", "holders", "with_tier"]


class Tier(IntEnum):
    """Where a worker holds a prefix: the 2-bit field value."""

    ABSENT = 0
    VRAM = 1
    DRAM = 2


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One region table: its value width and the global index of each field's worker."""

    table_id: int
    region: str
    value_bits: int
    workers: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class IndexLayout:
    tables: tuple[TableSpec, ...]
    #: For every worker index: (table id, field number).
    slots: tuple[tuple[int, int], ...]
    fingerprint_bits: int
    #: Not the tables' shape, but what their keys mean: see :meth:`digest`.
    key_hash: KeyHash = KeyHash.SHA256

    @classmethod
    def from_topology(cls, topology: Topology) -> IndexLayout:
        """32-bit values for regions of ≤ 16 workers, 64-bit beyond (or as configured)."""
        forced = topology.index.value_bits  # 0 = auto
        tables: list[TableSpec] = []
        slots: dict[int, tuple[int, int]] = {}
        for region in topology.regions:
            n = len(region.workers)
            bits = forced or (32 if n <= 16 else 64)
            per_table = bits // 2
            for start in range(0, n, per_table):
                members = region.workers[start : start + per_table]
                spec = TableSpec(len(tables), region.name, bits, tuple(w.index for w in members))
                for field, w in enumerate(members):
                    slots[w.index] = (spec.table_id, field)
                tables.append(spec)
        return cls(
            tables=tuple(tables),
            slots=tuple(slots[i] for i in range(len(slots))),
            fingerprint_bits=topology.index.fingerprint_bits,
            key_hash=topology.index.key_hash,
        )

    @property
    def n_workers(self) -> int:
        return len(self.slots)

    def tables_of(self, region: str) -> tuple[TableSpec, ...]:
        return tuple(t for t in self.tables if t.region == region)

    def digest(self) -> str:
        """A stable digest of everything the tables' contents depend on.

        Tables, their regions, value widths and workers (by global index), and the
        fingerprint width: a snapshot taken under another layout would put tiers in the
        wrong fields, so restorers compare this with the snapshot's. Also the key hash
        unless it is SHA-256 (whose digests predate the choice): a snapshot keyed by the
        other hash would hold entries no query finds and no event removes.
        """
        text = ";".join(
            f"{t.table_id}:{t.region}:{t.value_bits}:{','.join(map(str, t.workers))}"
            for t in self.tables
        )
        keys = "" if self.key_hash == KeyHash.SHA256 else f"|keys={self.key_hash}"
        text = f"kvc-layout/1|fp={self.fingerprint_bits}{keys}|{text}"
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def with_tier(value: int, field: int, tier: int) -> int:
    """``value`` with the 2-bit field ``field`` set to ``tier``."""
    shift = field << 1
    return (value & ~(3 << shift)) | (int(tier) << shift)


def holders(value: int) -> list[tuple[int, int]]:
    """(field, tier) of every nonzero field of a packed value."""
    out = []
    while value:
        bit = (value & -value).bit_length() - 1
        field = bit >> 1
        out.append((field, (value >> (field << 1)) & 3))
        value &= ~(3 << (field << 1))
    return out
