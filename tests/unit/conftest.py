"""Shared test setup for the unit tests."""

from __future__ import annotations

import contextlib
import warnings

# When a Hypothesis test fails, its pytest plugin imports libcst to suggest a patch, and
# libcst triggers a DeprecationWarning (mypy_extensions.TypedDict) that the project's
# ``filterwarnings = error`` turns into an INTERNALERROR hiding the failing example.
# Importing it once here, with that warning ignored, keeps failure reports readable.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    # Without libcst the plugin skips the patch itself.
    with contextlib.suppress(ImportError):
        import hypothesis.extra._patching  # noqa: F401
