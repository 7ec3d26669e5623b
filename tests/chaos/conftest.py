"""Chaos tests: faults injected into a real broker, Redis and pipeline processes.

The broker and Redis fixtures are the integration tests' (``tests/integration/conftest.py``,
loaded here under its own name so both directories can run in one session), and the test
cluster is theirs too (``tests/integration/_pipeline.py``, importable from here).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
sys.path.insert(0, str(_INTEGRATION))

_spec = importlib.util.spec_from_file_location("kvc_chaos_fixtures", _INTEGRATION / "conftest.py")
assert _spec is not None
assert _spec.loader is not None
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)

infra = _fixtures.infra
kafka_bootstrap = _fixtures.kafka_bootstrap
redis_url = _fixtures.redis_url
topic_factory = _fixtures.topic_factory
run_dir = _fixtures.run_dir
wait_for = _fixtures.wait_for_fixture


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here is a chaos test (``-m 'not chaos'`` leaves them out)."""
    for item in items:
        if item.path.resolve().is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.chaos)
