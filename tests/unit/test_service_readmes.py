"""Each service README's settings table is exactly what the service reads (the table is
rendered by ``settings_table``; regenerate it with ``python -m kvcompass.services.readme``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcompass.services.edge.settings import EdgeSettings
from kvcompass.services.maintenance.settings import MaintenanceSettings
from kvcompass.services.readme import settings_table
from kvcompass.services.router.settings import RouterSettings
from kvcompass.services.wanproxy.settings import WanProxySettings
from kvcompass.services.worker.settings import WorkerSettings
from kvcompass.settings import EnvSettings

SERVICES = Path(__file__).resolve().parents[2] / "services"


@pytest.mark.parametrize(
    ("readme", "settings"),
    [
        ("maintenance/README.md", MaintenanceSettings),
        ("edge/README.md", EdgeSettings),
        ("router/README.md", RouterSettings),
        ("worker/README.md", WorkerSettings),
        ("wanproxy/README.md", WanProxySettings),
    ],
)
def test_readme_settings_table_matches_the_settings_class(
    readme: str, settings: type[EnvSettings]
) -> None:
    text = (SERVICES / readme).read_text()
    assert settings_table(settings) in text, (
        f"services/{readme}: settings table is stale; run python -m kvcompass.services.readme"
    )
