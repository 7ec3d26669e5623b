# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2
"""A namespace: whose caches may match (one model identity, one sharing group).

Namespaces key the per-tenant planners, hashers and caches: a request's path looks one
up about five times. As a frozen dataclass its hash was a Python method (a call per
lookup, about 0.1 µs cold); here it is the type's own C slot over the hash computed at
construction, equal to ``hash((model, group))``. :mod:`kvcompass.keys` re-exports it.
"""

import struct

__all__ = ["Namespace"]


cdef class Namespace:
    """Whose caches may match: one model identity and one sharing group (tenant).
    Immutable; equal, with equal hashes, exactly when both strings are."""

    cdef readonly str model
    cdef readonly str group
    cdef Py_hash_t _hash
    cdef bytes _body

    def __init__(self, str model not None, str group not None="default"):
        if self._body is not None:
            raise TypeError("a Namespace is immutable")
        if not model or not group:
            raise ValueError("Namespace model and group must be non-empty strings")
        self.model = model
        self.group = group
        # String hashes differ between processes: a copy or pickle builds it afresh.
        self._hash = hash((model, group))
        encoded_model, encoded_group = model.encode(), group.encode()
        self._body = (
            struct.pack("<I", len(encoded_model)) + encoded_model
            + struct.pack("<I", len(encoded_group)) + encoded_group
        )

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if type(other) is not Namespace:
            return NotImplemented
        cdef Namespace that = <Namespace>other
        return self is that or (self.model == that.model and self.group == that.group)

    def __repr__(self):
        return f"Namespace(model={self.model!r}, group={self.group!r})"

    def __reduce__(self):
        return Namespace, (self.model, self.group)

    def key_prefix(self, key_hash):
        """The hash's format tag, then length-prefixed UTF-8 model and group.

        Length prefixes make the encoding injective (``("ab", "c")`` and ``("a", "bc")``
        differ), so keys from different namespaces are different digests.
        """
        from kvcompass.keys import key_format_tag

        return key_format_tag(key_hash) + self._body

    @property
    def prefix(self):
        """The SHA-256 key prefix (the paper's encoding)."""
        return self.key_prefix("sha256")
