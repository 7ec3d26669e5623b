"""Typed, frozen settings read from ``KVC_*`` environment variables: the machinery.

A process declares one frozen dataclass (a subclass of :class:`EnvSettings`, usually via
its own layer's shared bases) and reads it once, at start::

    @dataclass(frozen=True, kw_only=True)
    class MaintSettings(EnvSettings):
        flush_ms: float = setting(20.0, "Patch flush window in milliseconds.")

    settings = MaintSettings.from_env()          # KVC_FLUSH_MS, KVC_SHARDS, ...

A field named ``flush_ms`` is read from ``KVC_FLUSH_MS`` (``setting(env=...)`` overrides
the name). Supported types: ``str``, ``int``, ``float``, ``bool``, ``Path``, ``Literal``
of strings, ``tuple[str, ...]`` (comma-separated) and ``X | None`` (an empty value means
None). A bad value raises :class:`SettingsError` (a
:class:`~kvcompass.errors.ConfigError`) naming the variable and the value. Tests construct
the dataclass directly or use ``monkeypatch.setenv``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
from collections.abc import Mapping
from pathlib import Path
from typing import (
    Any,
    ClassVar,
    Literal,
    NamedTuple,
    Self,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)
from urllib.parse import urlsplit, urlunsplit

from kvcompass.errors import ConfigError

__all__ = [
    "EnvSettings",
    "SettingDoc",
    "SettingsError",
    "redact_url",
    "setting",
]

T = TypeVar("T")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class SettingsError(ConfigError):
    """A setting has a bad value; the message names its environment variable."""


class SettingDoc(NamedTuple):
    """One row of a settings table (for READMEs and ``--help``)."""

    env: str
    type: str
    default: str
    doc: str


def setting(default: T, doc: str, *, env: str | None = None, secret: bool = False) -> T:
    """Declare a settings field with its documentation.

    ``env`` replaces the derived variable name; ``secret`` masks the value in
    :meth:`EnvSettings.as_dict`.
    """
    return dataclasses.field(default=default, metadata={"doc": doc, "env": env, "secret": secret})


def redact_url(value: str) -> str:
    """``redis://user:pw@host`` → ``redis://user:***@host``; other strings unchanged."""
    parts = urlsplit(value)
    if not parts.scheme or parts.password is None:
        return value
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvSettings:
    """Base of every settings object: ``from_env``, validation hook, documentation."""

    env_prefix: ClassVar[str] = "KVC_"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check cross-field and range constraints; raise via :meth:`invalid`."""

    def invalid(self, name: str, problem: str) -> SettingsError:
        """An error for field ``name`` that names its variable and current value."""
        value = getattr(self, name)
        return SettingsError(f"{self.env_name(name)}={value!r}: {problem}")

    @classmethod
    def env_name(cls, name: str) -> str:
        """The environment variable read for field ``name``."""
        for f in dataclasses.fields(cls):
            if f.name == name:
                return f.metadata.get("env") or cls.env_prefix + name.upper()
        raise KeyError(name)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """Read every field from ``environ`` (default ``os.environ``).

        ``overrides`` are already-typed values (e.g. from CLI flags) and win over the
        environment.
        """
        env = os.environ if environ is None else environ
        hints = get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            if f.name in overrides:
                values[f.name] = overrides.pop(f.name)
                continue
            var = cls.env_name(f.name)
            raw = env.get(var)
            if raw is not None:
                values[f.name] = _parse(raw, hints[f.name], var)
        if overrides:
            raise TypeError(f"{cls.__name__} has no settings {sorted(overrides)}")
        return cls(**values)

    @classmethod
    def describe(cls) -> list[SettingDoc]:
        """One :class:`SettingDoc` per field, in declaration order."""
        hints = get_type_hints(cls)
        rows = []
        for f in dataclasses.fields(cls):
            default = "" if f.default is dataclasses.MISSING else _render(f.default)
            type_name = _type_name(hints[f.name])
            rows.append(SettingDoc(cls.env_name(f.name), type_name, default, f.metadata["doc"]))
        return rows

    def as_dict(self) -> dict[str, Any]:
        """Field values for a start-up log line, with secrets and URL passwords masked."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("secret") and value is not None:
                value = "***"
            elif isinstance(value, str):
                value = redact_url(value)
            elif isinstance(value, Path):
                value = str(value)
            out[f.name] = value
        return out


def _parse(raw: str, hint: Any, var: str) -> Any:
    """Convert the text of ``var`` to ``hint``; raise SettingsError naming ``var``."""
    origin = get_origin(hint)
    args = get_args(hint)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"{var}: unsupported settings type {hint}")
        return None if raw.strip() == "" else _parse(raw, inner[0], var)
    text = raw.strip()
    if origin is Literal:
        if text.lower() in args:
            return text.lower()
        raise SettingsError(f"{var}={raw!r}: expected one of {', '.join(map(str, args))}")
    if origin is tuple and args[-1] is Ellipsis and args[0] is str:
        return tuple(part.strip() for part in text.split(",") if part.strip())
    if hint is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise SettingsError(f"{var}={raw!r}: expected a boolean (true/false, 1/0, yes/no)")
    if hint in (int, float):
        try:
            value = hint(text)
        except ValueError:
            kind = "an integer" if hint is int else "a number"
            raise SettingsError(f"{var}={raw!r}: expected {kind}") from None
        # NaN passes every "x <= 0" range check (and inf most), and no setting means
        # either: refused here, for every float setting at once.
        if not math.isfinite(value):
            raise SettingsError(f"{var}={raw!r}: expected a finite number")
        return value
    if hint is str:
        return raw
    if hint is Path:
        return Path(text).expanduser()
    raise TypeError(f"{var}: unsupported settings type {hint}")


def _type_name(hint: Any) -> str:
    """``int``, ``path``, ``str, optional``, ``choice``, ``list`` (no pipes: table-safe)."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(hint) if a is not type(None)]
        return f"{_type_name(inner[0])}, optional"
    if origin is Literal:
        return "choice"
    if origin is tuple:
        return "list"
    return "path" if hint is Path else str(getattr(hint, "__name__", hint))


def _render(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)
