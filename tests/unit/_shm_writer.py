"""A SharedIndexWriter in an interpreter of its own, as an edge replayer runs it.

Usage: python _shm_writer.py PREFIX IMAGES_PICKLE

Loads the pickled (n_shards, n_tables, {(shard, table): view image}), marks every shard
ready, prints one JSON line (pid, incarnation, resource tracker pid or null), then serves
until stdin closes (a clean stop) or it is killed.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from multiprocessing import resource_tracker
from pathlib import Path

from kvcompass.shm import SharedIndexWriter


def main() -> None:
    prefix, images_path = sys.argv[1], Path(sys.argv[2])
    n_shards, n_tables, images = pickle.loads(images_path.read_bytes())
    with SharedIndexWriter(prefix, n_shards, n_tables) as writer:
        for (shard, table), image in images.items():
            writer.load_table(shard, table, image)
        for shard in range(n_shards):
            writer.set_position(shard, seq=1, epoch=1)
        tracker = resource_tracker._resource_tracker._pid  # type: ignore[attr-defined]
        info = {"pid": os.getpid(), "incarnation": writer.incarnation, "tracker_pid": tracker}
        print(json.dumps(info), flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
