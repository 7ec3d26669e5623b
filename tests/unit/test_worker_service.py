"""The worker service's pure parts: which workers and ports, and how request bodies are
checked."""

from __future__ import annotations

from typing import Any

import pytest

from kvcompass.services.worker.api import ApiError, _parse_completion, _parse_migration
from kvcompass.services.worker.settings import WorkerSettings
from kvcompass.settings import SettingsError
from kvcompass.topology import load_builtin
from kvcompass.worker import MigrationMode

TOPOLOGY = load_builtin("testbed-3region")


def hosted(**env: Any) -> list[tuple[str, int]]:
    settings = WorkerSettings(**env)
    return [(w.id, port) for w, port in settings.hosted(TOPOLOGY)]


def test_a_region_spec_hosts_its_workers_at_base_plus_global_index() -> None:
    assert hosted(worker_ids="region:eu", worker_port_base=9100) == [
        ("eu-0", 9108),
        ("eu-1", 9109),
    ]
    assert len(hosted()) == 14


def test_explicit_ports_override_the_base() -> None:
    assert hosted(worker_ids="asia-1, us-0", worker_ports="us-0=7000") == [
        ("us-0", 7000),
        ("asia-1", 9111),
    ]


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"worker_ids": "region:mars"}, "KVC_WORKER_IDS"),
        ({"worker_ids": "us-0,xx-9"}, "KVC_WORKER_IDS"),
        ({"worker_ports": "us-0=7000,us-1=7000", "worker_ids": "us-0,us-1"}, "KVC_WORKER_PORTS"),
    ],
)
def test_bad_worker_specs_name_their_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        hosted(**env)


def test_settings_refuse_a_bad_time_scale_or_port_list() -> None:
    with pytest.raises(SettingsError, match="KVC_TIME_SCALE"):
        WorkerSettings(time_scale=0.0)
    with pytest.raises(SettingsError, match="KVC_WORKER_PORTS"):
        WorkerSettings(worker_ports="us-0:7000")


def completion(**body: Any) -> dict[str, Any]:
    return {"model": "llama-3.1-8b", "prompt": [1, 2, 3], **body}


def test_a_completion_body_becomes_a_request_in_its_tenant_namespace() -> None:
    parsed = _parse_completion(
        completion(max_tokens=4, kvc={"namespace": "t1", "request_id": "r", "claimed_tokens": 2}),
        TOPOLOGY,
    )
    assert parsed.request.namespace.group == "t1"
    assert list(parsed.request.tokens) == [1, 2, 3]
    assert parsed.request.max_tokens == 4
    assert parsed.claimed_tokens == 2
    default = _parse_completion(completion(max_tokens=None), TOPOLOGY).request
    assert default.namespace.group == "default"
    assert default.max_tokens == 16


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (completion(model="gpt-4"), 404, "model_not_found"),
        (completion(prompt=[]), 400, "invalid_prompt"),
        (completion(prompt="hello"), 400, "invalid_prompt"),
        (completion(prompt=[1, -2]), 400, "invalid_prompt"),
        (completion(prompt=[1, 2**32]), 400, "invalid_prompt"),
        (completion(prompt=[1.5]), 400, "invalid_prompt"),
        (completion(max_tokens=0), 400, "invalid_value"),
        (completion(max_tokens=True), 400, "invalid_value"),
        (completion(prompt=[1] * 131_070, max_tokens=16), 400, "context_length_exceeded"),
        (completion(stream="yes"), 400, "invalid_stream"),
        (completion(kvc={"origin_region": "mars"}), 400, "invalid_kvc"),
        (completion(kvc={"namespace": 3}), 400, "invalid_namespace"),
    ],
)
def test_bad_completion_bodies_get_openai_style_errors(
    body: dict[str, Any], status: int, code: str
) -> None:
    with pytest.raises(ApiError) as refused:
        _parse_completion(body, TOPOLOGY)
    assert (refused.value.status, refused.value.code) == (status, code)
    error = refused.value.response()
    assert error.status_code == status


def test_a_copy_needs_a_source_in_the_same_region() -> None:
    _, _, mode = _parse_migration({"prompt": [1], "mode": "copy", "source": "us-1"}, TOPOLOGY, "us")
    assert mode is MigrationMode.COPY
    for source in ("eu-0", None):
        with pytest.raises(ApiError, match="source"):
            _parse_migration({"prompt": [1], "mode": "copy", "source": source}, TOPOLOGY, "us")
    with pytest.raises(ApiError, match="mode"):
        _parse_migration({"prompt": [1], "mode": "teleport"}, TOPOLOGY, "us")
