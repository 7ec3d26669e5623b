"""Arrays reached by address inside compiled code.

A numba call pays for every array argument it unboxes (about 0.1 µs each when warm,
several times that when the array objects are cold in the CPU cache), so a kernel that
touches many arrays takes one ``uint64`` descriptor of their addresses instead and wraps
each in place. The caller keeps every described array alive, and in place, for as long
as it uses the descriptor.

A kernel whose data is cold also asks for lines by address before it reads them
(:data:`prefetch`), so that misses which do not depend on each other overlap.
"""

from __future__ import annotations

from typing import Any

from llvmlite import binding, ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy.typing import NDArray

__all__ = ["address", "address_of", "prefetch"]


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


# The intrinsic's name carries its pointer type: opaque ("p0") from LLVM 15 on, i8* before.
_PREFETCH = "llvm.prefetch.p0" if binding.llvm_version_info[0] >= 15 else "llvm.prefetch.p0i8"


def _prefetch_typing(typingctx: Any, addr: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        # llvm.prefetch(address, read, keep in every cache level, data)
        ptr = builder.inttoptr(args[0], cgutils.voidptr_t)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, i32, i32, i32])
        fn = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
            builder.module, fnty, _PREFETCH
        )
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(types.uint64), codegen


#: Start loading the cache line at an integer address (compiled code only). A hint:
#: it never faults and changes nothing the program reads.
prefetch: Any = intrinsic(_prefetch_typing)
