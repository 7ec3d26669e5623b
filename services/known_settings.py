"""Every ``KVC_*`` variable some KVCompass program reads, to name one that none reads.

A misspelt variable (``KVC_FLSH_MS``) would otherwise leave its setting at the default
without a word. Services share environments (one ConfigMap or env file for a whole
region), so a variable another service reads is not suspect: only one that no program
reads is, and each service logs it once at start with the nearest known name.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from kvcompass.settings import EnvSettings

__all__ = ["known_variables", "unread_variables", "warn_unread_variables"]

#: Read outside the services' settings objects, and by whom.
OTHER_READERS = {
    "KVC_TRACES": "kvcompass report (fig2, fig5b)",
    "KVC_VENV": "scripts/_env.sh",
    "KVC_TEST_BACKEND": "the integration tests",
}


@functools.cache
def known_variables() -> frozenset[str]:
    """The variables of every service's settings, and :data:`OTHER_READERS`."""
    from kvcompass.services.edge.settings import EdgeSettings
    from kvcompass.services.infra.settings import InfraSettings
    from kvcompass.services.maintenance.settings import MaintenanceSettings
    from kvcompass.services.router.settings import RouterSettings
    from kvcompass.services.wanproxy.settings import WanProxySettings
    from kvcompass.services.worker.settings import WorkerSettings

    classes: Iterable[type[EnvSettings]] = (
        EdgeSettings,
        InfraSettings,
        MaintenanceSettings,
        RouterSettings,
        WanProxySettings,
        WorkerSettings,
    )
    names = {c.env_name(f.name) for c in classes for f in dataclasses.fields(c)}
    return frozenset(names | set(OTHER_READERS))


def unread_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Each ``KVC_*`` variable of ``environ`` that no program reads, with the nearest
    known name (None when none is near), in name order."""
    prefix = EnvSettings.env_prefix
    strangers = sorted(v for v in environ if v.startswith(prefix))
    if not strangers:
        return []
    known = known_variables()
    return [
        (var, next(iter(difflib.get_close_matches(var, known, n=1, cutoff=0.8)), None))
        for var in strangers
        if var not in known
    ]


class _Warns(Protocol):
    def warning(self, event: str, **context: Any) -> Any: ...


def warn_unread_variables(log: _Warns, environ: Mapping[str, str] | None = None) -> None:
    """One ``unknown_setting`` warning per variable no program reads (a service's start)."""
    for variable, near in unread_variables(os.environ if environ is None else environ):
        log.warning(
            "unknown_setting",
            variable=variable,
            did_you_mean=near,
            effect="none: no KVCompass program reads it",
        )
