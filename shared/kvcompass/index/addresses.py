"""Arrays reached by address inside compiled code.

A numba call pays for every array argument it unboxes (about 0.1 µs each when warm,
several times that when the array objects are cold in the CPU cache), so a kernel that
touches many arrays takes one ``uint64`` descriptor of their addresses instead and wraps
each in place. The caller keeps every described array alive, and in place, for as long
as it uses the descriptor.
"""

from __future__ import annotations

from typing import Any

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy.typing import NDArray

__all__ = ["address", "address_of"]


def _address_typing(typingctx: Any, addr: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(types.uint64), codegen


#: An integer address as a pointer numba can wrap in an array (compiled code only):
#: ``numba.carray(address(a), n, dtype)``.
address: Any = intrinsic(_address_typing)


def address_of(array: NDArray[Any]) -> int:
    """Where ``array``'s data starts; refuses what compiled code must not write through
    an address (a read-only or non-contiguous array)."""
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError("only a writeable C-contiguous array can be described by address")
    return int(array.ctypes.data)
