"""Rewrite the settings table of each service README from its settings class.

Usage: python -m kvcompass.services.readme   (run after changing a setting; a unit test
checks the tables are current).
"""

from __future__ import annotations

import re
from pathlib import Path

from kvcompass.services.edge.settings import EdgeSettings
from kvcompass.services.maintenance.settings import MaintenanceSettings
from kvcompass.services.router.settings import RouterSettings
from kvcompass.services.wanproxy.settings import WanProxySettings
from kvcompass.services.worker.settings import WorkerSettings
from kvcompass.settings import EnvSettings

__all__ = ["settings_table"]

_HEADER = "| variable | type | default | meaning |\n|---|---|---|---|\n"
_TABLE = re.compile(
    r"\| variable \| type \| default \| meaning \|\n\|---\|---\|---\|---\|\n(?:\|.*\|\n)*"
)


def settings_table(settings: type[EnvSettings]) -> str:
    """The markdown table of every ``KVC_*`` variable ``settings`` reads."""
    rows = "".join(
        f"| `{row.env}` | {row.type} | `{row.default}` | {row.doc} |\n"
        for row in settings.describe()
    )
    return _HEADER + rows


def main() -> None:
    services = Path(__file__).resolve().parent
    for readme, settings in (
        ("maintenance/README.md", MaintenanceSettings),
        ("edge/README.md", EdgeSettings),
        ("worker/README.md", WorkerSettings),
        ("router/README.md", RouterSettings),
        ("wanproxy/README.md", WanProxySettings),
    ):
        path = services / readme
        text = path.read_text()
        table = settings_table(settings)
        new, count = _TABLE.subn(table.replace("\\", "\\\\"), text)  # literal text
        if count != 1:
            raise SystemExit(f"{path}: expected one settings table, found {count}")
        path.write_text(new)


if __name__ == "__main__":
    main()
