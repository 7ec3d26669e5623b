"""The ``KVC_*`` variables a service names at start as read by no program: misspellings,
with the nearest known name, and never a variable some other program reads."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import kvcompass.services
from kvcompass.services.known_settings import OTHER_READERS, known_variables, unread_variables
from kvcompass.settings import EnvSettings


def test_misspelt_and_unknown_variables_are_named_with_the_nearest_known_one() -> None:
    environ = {
        "KVC_FLSH_MS": "5",  # the MU's KVC_FLUSH_MS
        "KVC_REMOTE_MARGIN": "1",  # the router's KVC_REMOTE_MARGIN_RTT
        "KVC_WHATEVER": "1",
        "KVC_SHARDS": "4",  # read by every pipeline service
        "KVC_REGION": "us",  # the router's and the worker's, not the MU's: still read
        "KVC_TRACES": "/t",  # kvcompass report's
        "PATH": "/bin",
    }
    assert unread_variables(environ) == [
        ("KVC_FLSH_MS", "KVC_FLUSH_MS"),
        ("KVC_REMOTE_MARGIN", "KVC_REMOTE_MARGIN_RTT"),
        ("KVC_WHATEVER", None),
    ]
    assert unread_variables({"PATH": "/bin"}) == []


def _subclasses(cls: type[EnvSettings]) -> set[type[EnvSettings]]:
    found: set[type[EnvSettings]] = set(cls.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found


def test_every_settings_object_of_every_service_is_known() -> None:
    # A new service, or a setting moved, must not make its own variables "unknown".
    for module in pkgutil.walk_packages(kvcompass.services.__path__, "kvcompass.services."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    classes = _subclasses(EnvSettings)
    assert len(classes) >= 6
    read = {c.env_name(f.name) for c in classes for f in dataclasses.fields(c)}
    assert read | set(OTHER_READERS) == set(known_variables())
