"""The multi-level Ludo discovery index (paper §3.2): maintenance tables and keyless views.

Nothing here performs I/O. Maintenance tables return absolute-state patches; views apply
them, and both snapshot to checksummed images (see :mod:`kvcompass.index.image`).
"""

from kvcompass.index.errors import GenerationMismatch, IndexCorrupt, SnapshotError, TableFull
from kvcompass.index.geometry import DEFAULT_LOAD_LIMIT, TableGeometry
from kvcompass.index.ludo import LudoTable
from kvcompass.index.patches import BucketImages, OthelloReset, TablePatch, WordImages
from kvcompass.index.view import LudoView

__all__ = [
    "DEFAULT_LOAD_LIMIT",
    "BucketImages",
    "GenerationMismatch",
    "IndexCorrupt",
    "LudoTable",
    "LudoView",
    "OthelloReset",
    "SnapshotError",
    "TableFull",
    "TableGeometry",
    "TablePatch",
    "WordImages",
]
