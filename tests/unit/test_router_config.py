"""The router's configuration pieces: worker endpoints, API keys, tokenizers, the chat
template and the settings' checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcompass.errors import ConfigError
from kvcompass.pipeline.clock import ManualClock
from kvcompass.routing import KVCompassPolicy
from kvcompass.routing.testing import StubReader
from kvcompass.services.router.endpoints import worker_urls
from kvcompass.services.router.openai import ApiError
from kvcompass.services.router.service import routing_policy
from kvcompass.services.router.settings import RouterSettings
from kvcompass.services.router.tenancy import Tenancy
from kvcompass.services.router.tokenizer import ByteTokenizer, chat_prompt, load
from kvcompass.settings import SettingsError
from kvcompass.topology import load_builtin

TOPOLOGY = load_builtin("testbed-3region")


def test_endpoints_from_a_list_and_from_a_file(tmp_path: Path) -> None:
    spec = "us-0=http://127.0.0.1:9100/, eu-1=http://127.0.0.1:9301"
    assert worker_urls(spec, TOPOLOGY) == {0: "http://127.0.0.1:9100", 9: "http://127.0.0.1:9301"}
    path = tmp_path / "endpoints.txt"
    path.write_text("# us edge\nus-0=http://127.0.0.1:9100\n\nasia-3=http://h:1  # via WAN\n")
    assert worker_urls(str(path), TOPOLOGY) == {0: "http://127.0.0.1:9100", 13: "http://h:1"}


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("", "names no worker"),
        ("us-9=http://127.0.0.1:1", "'us-9=http://127.0.0.1:1'"),
        ("us-0", "<worker id>=<url>"),
        ("us-0=ftp://x", "not an http URL"),
        ("us-0=http://", "not an http URL"),
    ],
)
def test_bad_endpoints_are_refused_with_the_entry(spec: str, needle: str) -> None:
    with pytest.raises(ConfigError, match="KVC_WORKER_ENDPOINTS") as info:
        worker_urls(spec, TOPOLOGY)
    assert needle in str(info.value)


def test_api_keys_name_tenants() -> None:
    tenancy = Tenancy("ka=tenant_a, kb = tenant_b")
    assert tenancy.tenant("Bearer ka") == "tenant_a"
    assert tenancy.tenant("bearer  kb ") == "tenant_b"
    for header in (None, "", "Bearer", "Bearer kc", "Basic ka", "ka", "Bearer ka2"):
        with pytest.raises(ApiError) as info:
            tenancy.tenant(header)
        assert info.value.status == 401
    assert Tenancy("").tenant(None) == "default"
    assert Tenancy("").tenant("Bearer anything") == "default"


def test_a_bad_key_entry_is_refused_without_echoing_keys() -> None:
    with pytest.raises(ConfigError) as info:
        Tenancy("secret-one=a,secret-two")
    assert "entry 2" in str(info.value)
    assert "secret" not in str(info.value)


def test_the_byte_tokenizer_and_the_chat_template() -> None:
    assert ByteTokenizer().encode("aé") == [97, 0xC3, 0xA9]
    one = chat_prompt([("system", "S"), ("user", "hi")])
    assert one == "<|system|>\nS\n<|user|>\nhi\n<|assistant|>\n"
    two = chat_prompt([("system", "S"), ("user", "hi"), ("assistant", "yo"), ("user", "more")])
    assert two.startswith(one.removesuffix("<|assistant|>\n"))


def test_a_tokenizers_json_file_is_used_when_configured(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))
    tok = load(str(path))
    assert tok.name == "tokenizer.json"
    assert tok.encode("hello world hello zzz") == [1, 2, 1, 0]
    assert isinstance(load("bytes"), ByteTokenizer)
    with pytest.raises(ConfigError, match="neither 'bytes' nor a file"):
        load(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="cannot load tokenizer"):
        load(str(tmp_path / "bad.json"))


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({}, "KVC_REGION"),
        ({"KVC_REGION": "us", "KVC_ROUTER_PORT": "0"}, "KVC_ROUTER_PORT"),
        ({"KVC_REGION": "us", "KVC_ROUTER_PROCESSES": "0"}, "KVC_ROUTER_PROCESSES"),
        ({"KVC_REGION": "us", "KVC_REQUEST_TIMEOUT_S": "0"}, "KVC_REQUEST_TIMEOUT_S"),
        ({"KVC_REGION": "us", "KVC_MAX_BODY_BYTES": "10"}, "KVC_MAX_BODY_BYTES"),
        ({"KVC_REGION": "us", "KVC_REMOTE_MARGIN_RTT": "-1"}, "KVC_REMOTE_MARGIN_RTT"),
        ({"KVC_REGION": "us", "KVC_PENDING_SLACK_S": "-1"}, "KVC_PENDING_SLACK_S"),
        ({"KVC_REGION": "us", "KVC_PENDING_CREDIT": "maybe"}, "KVC_PENDING_CREDIT"),
    ],
)
def test_settings_checks_name_the_variable(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError, match=needle):
        RouterSettings.from_env(env)


def test_settings_defaults() -> None:
    s = RouterSettings.from_env({"KVC_REGION": "eu"})
    assert (s.region, s.router_port, s.policy, s.tokenizer) == ("eu", 8000, "kvcompass", "bytes")
    masked = RouterSettings.from_env({"KVC_REGION": "eu", "KVC_API_KEYS": "k=t"}).as_dict()
    assert "k=t" not in str(masked["api_keys"])


def test_the_remote_margin_setting_reaches_kvcompass_score() -> None:
    topology = load_builtin("testbed-3region")
    region = topology.regions[0].name
    settings = RouterSettings.from_env({"KVC_REGION": region, "KVC_REMOTE_MARGIN_RTT": "1.5"})
    policy = routing_policy(settings, topology, StubReader(len(topology.workers)), ManualClock())
    assert isinstance(policy, KVCompassPolicy)
    for w, wan in zip(topology.workers, policy.score.wan, strict=True):
        rtt = topology.rtt_ms(region, w.region)
        assert wan == pytest.approx(rtt if w.region == region else 2.5 * rtt)


@pytest.mark.parametrize(("value", "on"), [("true", True), ("false", False)])
def test_the_pending_credit_settings_reach_kvcompass(value: str, on: bool) -> None:
    topology = load_builtin("testbed-3region")
    env = {
        "KVC_REGION": topology.regions[0].name,
        "KVC_PENDING_CREDIT": value,
        "KVC_PENDING_SLACK_S": "0.25",
    }
    settings = RouterSettings.from_env(env)
    policy = routing_policy(settings, topology, StubReader(len(topology.workers)), ManualClock())
    assert isinstance(policy, KVCompassPolicy)
    assert (policy.pending is not None) is on
    assert policy.pending is None or policy.pending.slack_s == 0.25


@pytest.mark.parametrize(("value", "on"), [("true", True), ("false", False)])
def test_the_prefix_chain_setting_reaches_kvcompass(value: str, on: bool) -> None:
    topology = load_builtin("testbed-3region")
    env = {"KVC_REGION": topology.regions[0].name, "KVC_PREFIX_CHAIN": value}
    settings = RouterSettings.from_env(env)
    policy = routing_policy(settings, topology, StubReader(len(topology.workers)), ManualClock())
    assert isinstance(policy, KVCompassPolicy)
    assert policy.config.prefix_chain is on


def test_a_bad_prefix_chain_setting_names_its_variable() -> None:
    with pytest.raises(ConfigError, match="KVC_PREFIX_CHAIN"):
        RouterSettings.from_env({"KVC_REGION": "us", "KVC_PREFIX_CHAIN": "sometimes"})


def test_the_capacity_price_settings_reach_kvcompass_score() -> None:
    topology = load_builtin("testbed-3region")
    env = {"KVC_REGION": topology.regions[0].name, "KVC_TAU_MS": "350", "KVC_LAMBDA_MAX": "8"}
    settings = RouterSettings.from_env(env)
    policy = routing_policy(settings, topology, StubReader(len(topology.workers)), ManualClock())
    assert isinstance(policy, KVCompassPolicy)
    assert (policy.score.tau_ms, policy.score.lambda_max) == (350.0, 8.0)
    assert policy.score.price([700.0] * len(topology.workers)) == pytest.approx(2.0)
    shipped = routing_policy(
        RouterSettings.from_env({"KVC_REGION": topology.regions[0].name}),
        topology,
        StubReader(len(topology.workers)),
        ManualClock(),
    )
    assert isinstance(shipped, KVCompassPolicy)
    assert shipped.score.price([700.0] * len(topology.workers)) == pytest.approx(70.0)


@pytest.mark.parametrize(
    ("variable", "value"), [("KVC_TAU_MS", "0"), ("KVC_TAU_MS", "nan"), ("KVC_LAMBDA_MAX", "-1")]
)
def test_a_bad_capacity_price_setting_names_its_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        RouterSettings.from_env({"KVC_REGION": "us", variable: value})
