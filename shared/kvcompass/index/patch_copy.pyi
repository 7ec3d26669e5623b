"""Types of the compiled patch copies (patch_copy.pyx); the docstrings are there."""

from typing import Any

import numpy as np

from kvcompass.index.patches import BucketImages, WordImages

__all__ = ["DESCRIPTOR_ROWS", "apply_images", "take_dirty"]

DESCRIPTOR_ROWS: dict[str, int]

def take_dirty(
    descriptor: int,
    cells: int,
    cell_size: int,
    cell_dtype: np.dtype[Any],
    fps: int,
    fp_size: int,
    fp_dtype: np.dtype[Any],
    words: bool,
) -> tuple[BucketImages | None, WordImages | None]: ...
def apply_images(
    target: tuple[int, int, int, int, int, int, int, int],
    images: BucketImages | None,
    words: WordImages | None,
) -> bool: ...
