"""Types of the compiled XXH3 digests (xxh3.pyx); the docstrings are there."""

from array import array
from collections.abc import Iterable

__all__ = ["digests_at"]

def digests_at(head: bytes, body: object, ends: Iterable[int], mask: int) -> array[int]: ...
