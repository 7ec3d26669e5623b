"""API keys to tenants: ``Authorization: Bearer <key>`` names the key namespace group.

Keys are compared in constant time; an unknown or missing key is refused (401) whenever
keys are configured. Without keys every request is tenant ``default``.
"""

from __future__ import annotations

import hmac

from kvcompass.errors import ConfigError
from kvcompass.services.router.openai import ApiError

__all__ = ["DEFAULT_TENANT", "Tenancy"]

DEFAULT_TENANT = "default"


class Tenancy:
    def __init__(self, spec: str) -> None:
        """``spec``: ``"key1=tenant_a,key2=tenant_b"`` (``KVC_API_KEYS``); empty = open."""
        self._keys: list[tuple[bytes, str]] = []
        for item in filter(None, (part.strip() for part in spec.split(","))):
            key, sep, tenant = item.partition("=")
            if not sep or not key.strip() or not tenant.strip():
                # Never echo a key: name the entry by position only.
                raise ConfigError(f"KVC_API_KEYS entry {len(self._keys) + 1} is not key=tenant")
            self._keys.append((key.strip().encode(), tenant.strip()))

    @property
    def open(self) -> bool:
        return not self._keys

    def tenant(self, authorization: str | None) -> str:
        """The tenant of a request's ``Authorization`` header, or ApiError 401."""
        if self.open:
            return DEFAULT_TENANT
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(
                401,
                "missing API key: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                type="authentication_error",
            )
        given = key.strip().encode()
        found = None
        for known, tenant in self._keys:  # every key compared: timing tells nothing
            if hmac.compare_digest(known, given):
                found = tenant
        if found is None:
            raise ApiError(
                401, "invalid API key", code="invalid_api_key", type="authentication_error"
            )
        return found
