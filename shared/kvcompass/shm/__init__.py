"""Edge views in shared memory: one writer (the replayer), many lock-free readers.

Segments are files in ``/dev/shm`` (POSIX shared memory, Linux): a control segment
``<prefix>-ctl`` plus one segment per table generation holding that table's view image
(:mod:`kvcompass.index.image`). The control segment has a header naming the writer
(a random incarnation and its pid), then per shard a sequence lock counter, the last
applied patch seq, the epoch, a ready flag and a table-segments version, then per table
its generation and the name of its current segment.

Readers never lock. They read the shard's counter, look up, and read it again: an odd or
changed counter means the writer was mid-batch, so they retry (a sequence lock). A table
that grew lives in a new segment; the writer publishes its name and bumps the shard's
segments version under the same sequence lock, and readers re-attach. This relies on the
writer's stores becoming visible in order, which x86-64 guarantees.

Writer lifetime is told by the kernel, not by Python's resource tracker (never involved
here: a dead writer's segments stay until the next writer with the prefix removes them).
The writer holds two open-file-description locks on ``<prefix>.lock``: byte 0 excludes a
second writer of the prefix, byte ``incarnation`` says "this incarnation lives". The
kernel drops both when the writer closes or dies, even by SIGKILL. Before every answer a
reader asks the kernel whether its writer's byte is still locked (one ``fcntl``); if not,
it re-attaches to a new writer's control segment by name, or reports not-ready.
"""

from kvcompass.shm.lifetime import PrefixInUse
from kvcompass.shm.reader import SharedIndexReader, TornRead
from kvcompass.shm.segments import SHM_DIR
from kvcompass.shm.writer import SharedIndexWriter, remove_segments

__all__ = [
    "SHM_DIR",
    "PrefixInUse",
    "SharedIndexReader",
    "SharedIndexWriter",
    "TornRead",
    "remove_segments",
]
