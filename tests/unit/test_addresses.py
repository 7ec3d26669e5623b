"""The prefetch hint the index kernels use: a real prefetch instruction, and harmless."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numpy.typing import NDArray

from kvcompass.index.addresses import address_of, prefetch


def _hinted_sum_py(values: NDArray[np.int64], at: np.uint64, ahead: np.uint64) -> int:
    total = 0
    for i in range(len(values)):
        prefetch(at + np.uint64(i * 8) + ahead)
        total += values[i]
    return total


_hinted_sum: Any = numba.njit(_hinted_sum_py)


def test_prefetch_compiles_to_a_prefetch_instruction_and_changes_no_result() -> None:
    values = np.arange(1000, dtype=np.int64)
    assert _hinted_sum(values, np.uint64(address_of(values)), np.uint64(512)) == 499500
    (signature,) = _hinted_sum.signatures
    instructions = [
        line.split()[0]
        for line in _hinted_sum.inspect_asm(signature).splitlines()
        if line.startswith("\t")
    ]
    # x86's prefetcht0/1/2/nta, or AArch64's prfm.
    assert any(i.startswith("prefetch") or i == "prfm" for i in instructions)


def test_prefetch_of_an_address_nothing_maps_does_not_fault() -> None:
    # Past the end of the array by far, and the null page: a hint never faults.
    values = np.arange(8, dtype=np.int64)
    assert _hinted_sum(values, np.uint64(address_of(values)), np.uint64(1 << 40)) == 28
    assert _hinted_sum(values, np.uint64(0), np.uint64(0)) == 28
