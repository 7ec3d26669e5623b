"""KVCompass: a discovery plane for Internet-scale prefix KV cache sharing.

The core library: topology, prefix keys, latency-derived levels and the multi-level Ludo
discovery index. Nothing in this package performs network I/O.
"""

__version__ = "0.1.0"
