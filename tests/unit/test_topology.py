"""Topology files: built-ins match the paper, and every invalid input names file + field."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from kvcompass.errors import ConfigError
from kvcompass.keys import KeyHash
from kvcompass.topology import (
    AUTO_VALUE_BITS,
    IndexSettings,
    ModelSettings,
    Region,
    Topology,
    TopologyError,
    Worker,
    builtin_names,
    load_builtin,
    load_topology,
)

BUILTINS = ("na-4region", "sim-16region", "sim-8region", "testbed-3region")

# Per-region worker counts as the paper states them (region order = file order).
WORKER_COUNTS = {
    name: {region: int(n) for region, n in (pair.split("=") for pair in spec.split())}
    for name, spec in {
        "testbed-3region": "us=8 eu=2 asia=4",
        "sim-8region": "us=30 cn=13 de=8 jp=3 sg=3 uk=3 kr=2 au=2",
        "sim-16region": "us_east=26 us_west=14 cn=12 de=10 ie=10 jp=8 uk=8 sg=7 in=6 au=5 "
        "ca=5 kr=4 br=4 it=4 bh=3 za=2",
        "na-4region": "pa=2 oh=4 ny=1 calgary=4",
    }.items()
}


def off_diagonal(t: Topology) -> np.ndarray:
    return t.one_way_ms[~np.eye(len(t.regions), dtype=bool)]


# --- built-ins -----------------------------------------------------------------------------


def test_builtin_names_lists_the_four_paper_topologies() -> None:
    assert set(BUILTINS) <= set(builtin_names())


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_loads_with_paper_worker_counts(name: str) -> None:
    t = load_builtin(name)
    assert t.name == name
    assert {r.name: len(r.workers) for r in t.regions} == WORKER_COUNTS[name]
    assert [r.name for r in t.regions] == list(WORKER_COUNTS[name])  # file order kept
    assert len(t.workers) == sum(WORKER_COUNTS[name].values())
    assert t.index == IndexSettings(16, AUTO_VALUE_BITS, 0, 6, 128)
    assert t.gamma_ms_per_token > 0


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_wan_is_symmetric_positive_with_zero_diagonal(name: str) -> None:
    t = load_builtin(name)
    assert t.one_way_ms.dtype == np.float64
    assert np.array_equal(t.one_way_ms, t.one_way_ms.T)
    assert np.all(np.diag(t.one_way_ms) == 0)
    assert np.all(off_diagonal(t) > 0)
    assert not t.one_way_ms.flags.writeable


@pytest.mark.parametrize("name", BUILTINS)
def test_worker_ids_and_indices_follow_topology_order(name: str) -> None:
    t = load_builtin(name)
    for i, w in enumerate(t.workers):
        assert w.index == i
        assert t.worker(w.id) is w
    for r in t.regions:
        assert [w.id for w in r.workers] == [f"{r.name}-{k}" for k in range(len(r.workers))]
        assert all(w.region == r.name for w in r.workers)


def test_testbed_matches_paper() -> None:
    t = load_builtin("testbed-3region")
    assert t.wan_ms("us", "eu") == t.wan_ms("eu", "us") == 160.0
    assert t.wan_ms("us", "asia") == 126.0
    assert t.wan_ms("eu", "asia") == 149.0
    assert all(w.beta_ms_per_token == 0.085 for w in t.workers)
    assert t.region("eu").beta_ms_per_token == 0.085


def test_sim_8region_rtt_spans_paper_range() -> None:
    t = load_builtin("sim-8region")
    rtt = 2 * off_diagonal(t)
    assert rtt.min() == pytest.approx(12.0)
    assert rtt.max() == pytest.approx(150.0)
    # A100 model from the paper: 32 GB VRAM, 128 GB DRAM (GiB), PCIe 4.0 at 25 GB/s.
    assert {w.vram_bytes for w in t.workers} == {32 << 30}
    assert {w.dram_bytes for w in t.workers} == {128 << 30}
    assert t.gamma_ms_per_token == pytest.approx(128 * 1024 / 25e9 * 1e3, rel=1e-3)


def test_sim_16region_one_way_spans_paper_range() -> None:
    t = load_builtin("sim-16region")
    assert off_diagonal(t).min() == pytest.approx(9.0)
    assert off_diagonal(t).max() == pytest.approx(144.0)


def test_na_4region_latency_groups_match_paper() -> None:
    t = load_builtin("na-4region")
    east = [t.wan_ms(a, b) for a, b in itertools.combinations(("pa", "oh", "ny"), 2)]
    to_calgary = [t.wan_ms(a, "calgary") for a in ("pa", "oh", "ny")]
    assert (min(east), max(east)) == (5.8, 16.6)
    assert (min(to_calgary), max(to_calgary)) == (24.9, 37.4)
    assert all(w.beta_ms_per_token == 0.085 for w in t.workers)


def test_rtt_is_twice_one_way_and_same_region_uses_intra_setting() -> None:
    t = load_builtin("sim-8region")
    for a, b in itertools.product([r.name for r in t.regions], repeat=2):
        assert t.rtt_ms(a, b) == 2 * t.wan_ms(a, b)
    assert t.wan_ms("de", "de") == t.intra_region_one_way_ms == 0.5
    assert t.wan_ms("de", "uk") == t.one_way_ms[t.region_index("de"), t.region_index("uk")]


def test_unknown_names_raise_key_error() -> None:
    t = load_builtin("testbed-3region")
    with pytest.raises(KeyError, match="mars"):
        t.region("mars")
    with pytest.raises(KeyError, match="us-99"):
        t.worker("us-99")
    with pytest.raises(TopologyError, match="no built-in topology 'nowhere'; known: ") as info:
        load_builtin("nowhere")
    assert isinstance(info.value, ConfigError)
    assert isinstance(info.value, ValueError)


def test_loaded_topologies_compare_by_value() -> None:
    a, b = load_builtin("na-4region"), load_builtin("na-4region")
    assert a == b
    assert hash(a) == hash(b)
    assert a != load_builtin("testbed-3region")


def test_direct_construction_checks_the_matrix() -> None:
    region = Region("a", (Worker("a-0", "a", 0, 0.1, 1, 0),))
    other = Region("b", (Worker("b-0", "b", 1, 0.1, 1, 0),))
    settings = IndexSettings(16, 0, 0)
    with pytest.raises(ValueError, match="symmetric"):
        Topology("t", "", (region, other), np.array([[0, 1], [2, 0]]), 0.0, settings)
    with pytest.raises(ValueError, match="2x2"):
        Topology("t", "", (region, other), np.zeros((3, 3)), 0.0, settings)


# --- files written by tests ----------------------------------------------------------------

VALID = """\
name = "tiny"
description = "three regions for loader tests"

[index]
block_size = 16
value_bits = "auto"
fingerprint_bits = 0
levels = 6
local_min_tokens = 128

[cost]
gamma_ms_per_token = 0.005

[worker_defaults]
beta_ms_per_token = 0.1
vram_bytes = 1000
dram_bytes = 2000

[[regions]]
name = "us"
workers = 2

[[regions]]
name = "eu"
workers = 1
beta_ms_per_token = 0.2

[[regions]]
name = "asia"
workers = [{ beta_ms_per_token = 0.3 }, { id = "tokyo", beta_ms_per_token = 0.5 }, {}]

[wan]
"us-eu" = 40.0
"us-asia" = 60
"eu-asia" = 80.5
"""


def write(tmp_path: Path, text: str, name: str = "topo.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_valid_file_with_explicit_workers_and_overrides(tmp_path: Path) -> None:
    t = load_topology(write(tmp_path, VALID))
    assert [w.id for w in t.workers] == ["us-0", "us-1", "eu-0", "asia-0", "tokyo", "asia-2"]
    assert [w.index for w in t.workers] == list(range(6))
    assert t.worker("tokyo").region == "asia"
    assert t.worker("eu-0").beta_ms_per_token == 0.2
    assert t.worker("asia-2").beta_ms_per_token == 0.1  # falls back to [worker_defaults]
    assert t.region("asia").beta_ms_per_token == 0.3  # median of 0.3, 0.5, 0.1
    assert t.wan_ms("asia", "us") == 60.0
    assert t.intra_region_one_way_ms == 0.5  # default
    assert t.worker("us-1").vram_bytes == 1000


def test_key_hash_and_long_context_levels_default_and_read(tmp_path: Path) -> None:
    t = load_topology(write(tmp_path, VALID))
    assert (t.index.key_hash, t.index.long_context_levels) == (KeyHash.XXH3, False)
    text = VALID.replace(
        "levels = 6", 'levels = 6\nkey_hash = "sha256"\nlong_context_levels = true'
    )
    t = load_topology(write(tmp_path, text))
    assert (t.index.key_hash, t.index.long_context_levels) == (KeyHash.SHA256, True)
    with pytest.raises(ValueError, match="md5"):
        IndexSettings(16, 0, 0, key_hash="md5")  # type: ignore[arg-type]


def test_value_bits_numbers_are_stored_as_ints(tmp_path: Path) -> None:
    t = load_topology(write(tmp_path, VALID.replace('value_bits = "auto"', "value_bits = 64")))
    assert t.index.value_bits == 64


def mutate(old: str, new: str) -> str:
    """VALID with ``old`` replaced by ``new``; an empty ``old`` appends ``new``."""
    if not old:
        return VALID + new
    assert old in VALID, old
    return VALID.replace(old, new, 1)


NO_DEFAULT_BETA = ("beta_ms_per_token = 0.1\n", "")
# (case id, text in VALID, replacement, dotted field named, message fragment)
INVALID_CASES = [
    ("missing-name", 'name = "tiny"\n', "", "name", "is required"),
    ("extra-top", "[index]", "colour = 1\n[index]", "colour", "unknown field"),
    ("typo", "levels = 6", "levels = 6\nlevel = 7", "index.level", "unknown field"),
    ("levels-0", "levels = 6", "levels = 0", "index.levels", "must be >= 1, got 0"),
    ("levels-type", "levels = 6", 'levels = "six"', "index.levels", "must be an integer"),
    ("block-0", "block_size = 16", "block_size = 0", "index.block_size", ">= 1"),
    ("block-float", "block_size = 16", "block_size = 16.0", "index.block_size", "integer"),
    ("bits-48", '"auto"', "48", "index.value_bits", '"auto", 32 or 64, got 48'),
    ("bits-bool", '"auto"', "true", "index.value_bits", "got True"),
    ("fp-17", "fingerprint_bits = 0", "fingerprint_bits = 17", "index.fingerprint_bits", "0..16"),
    ("fp-neg", "fingerprint_bits = 0", "fingerprint_bits = -1", "index.fingerprint_bits", "0..16"),
    ("no-local-min", "local_min_tokens = 128\n", "", "index.local_min_tokens", "is required"),
    ("hash-md5", "levels = 6", 'levels = 6\nkey_hash = "md5"', "index.key_hash", '"xxh3"'),
    ("hash-list", "levels = 6", "levels = 6\nkey_hash = []", "index.key_hash", "one of"),
    (
        "long-str",
        "levels = 6",
        'levels = 6\nlong_context_levels = "yes"',
        "index.long_context_levels",
        "true or false",
    ),
    ("gamma", "= 0.005", "= -1", "cost.gamma_ms_per_token", "non-negative number"),
    ("beta-0", "= 0.1\n", "= 0\n", "worker_defaults.beta_ms_per_token", "positive number"),
    ("beta-neg", "= 0.2", "= -0.2", "regions[1].beta_ms_per_token", "positive number"),
    ("beta-none", *NO_DEFAULT_BETA, "regions[0].beta_ms_per_token", "is required"),
    ("worker-extra", "0.3 }", "0.3, gpu = 1 }", "regions[2].workers[0].gpu", "unknown field"),
    ("dup-region", 'name = "eu"', 'name = "us"', "regions[1].name", "duplicate region"),
    ("dup-worker", '"tokyo"', '"us-1"', "regions[2].workers", "duplicate worker id 'us-1'"),
    ("region-dash", 'name = "eu"', 'name = "e-u"', "regions[1].name", "must match"),
    ("workers-0", "workers = 1", "workers = 0", "regions[1].workers", "positive count"),
    ("wan-neg", "= 40.0", "= -3", 'wan."us-eu"', "positive number of milliseconds, got -3"),
    ("wan-type", "= 40.0", '= "far"', 'wan."us-eu"', "positive number of milliseconds"),
    ("wan-missing", '"eu-asia" = 80.5\n', "", 'wan."eu-asia"', "is required"),
    ("wan-dup", "", '"eu-us" = 40.0\n', 'wan."eu-us"', 'already given as "us-eu"'),
    ("wan-unknown", "", '"us-mars" = 1.0\n', 'wan."us-mars"', "two different regions"),
    ("wan-self", "", '"us-us" = 1.0\n', 'wan."us-us"', "two different regions"),
]
INVALID = [pytest.param(mutate(old, new), f, m, id=i) for i, old, new, f, m in INVALID_CASES]


def test_explicit_worker_without_any_beta_names_the_worker(tmp_path: Path) -> None:
    # Only "us" gets a β; the third asia worker ({}) has none at any level.
    text = mutate(*NO_DEFAULT_BETA).replace('"us"', '"us"\nbeta_ms_per_token = 1', 1)
    with pytest.raises(TopologyError) as info:
        load_topology(write(tmp_path, text))
    assert info.value.field == "regions[2].workers[2].beta_ms_per_token"


@pytest.mark.parametrize(("text", "field", "message"), INVALID)
def test_invalid_file_names_file_and_field(
    tmp_path: Path, text: str, field: str, message: str
) -> None:
    path = write(tmp_path, text, "bad-topo.toml")
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    err = info.value
    assert isinstance(err, ConfigError)
    assert isinstance(err, ValueError)
    assert (err.path, err.field) == (str(path), field)
    assert message in err.message
    assert str(err).startswith(f"{path}: {field}: ")


def test_wan_error_reads_like_the_operator_docs(tmp_path: Path) -> None:
    text = mutate('"us-eu" = 40.0', '"us-eu" = -3')
    path = write(tmp_path, text, "sim-8region.toml")
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    expected = 'wan."us-eu": must be a positive number of milliseconds, got -3'
    assert str(info.value) == f"{path}: {expected}"


def test_bad_toml_syntax_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("levels = 6", "levels = = 6"), "broken.toml")
    with pytest.raises(TopologyError, match=r"broken\.toml: invalid TOML: .*line"):
        load_topology(path)


def test_regions_must_be_an_array_of_tables(tmp_path: Path) -> None:
    head = VALID.split("[[regions]]")[0]
    path = write(tmp_path, 'regions = "us"\n' + head)
    with pytest.raises(TopologyError, match=r"regions: must be a non-empty array"):
        load_topology(path)


def test_missing_file_is_a_topology_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="cannot read file"):
        load_topology(tmp_path / "absent.toml")


def test_model_table_defaults_to_llama_8b_and_reads_overrides(tmp_path: Path) -> None:
    assert load_topology(write(tmp_path, VALID)).model == ModelSettings()
    assert ModelSettings().kv_bytes_per_token == 32 * 8 * 128 * 2 * 2
    custom = (
        VALID + '\n[model]\nname = "tiny-lm"\nkv_bytes_per_token = 4096\ncontext_tokens = 8192\n'
    )
    model = load_topology(write(tmp_path, custom)).model
    assert (model.name, model.kv_bytes_per_token, model.context_tokens) == ("tiny-lm", 4096, 8192)
    assert model.decode_ms_per_step == ModelSettings().decode_ms_per_step


def test_model_table_rejects_unknown_fields_and_bad_values(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match=r"model\.kv_bytes: unknown field"):
        load_topology(write(tmp_path, VALID + "\n[model]\nkv_bytes = 1\n"))
    with pytest.raises(TopologyError, match=r"model\.decode_ms_per_step: must be a positive"):
        load_topology(write(tmp_path, VALID + "\n[model]\ndecode_ms_per_step = 0\n"))
